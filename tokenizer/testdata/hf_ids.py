#!/usr/bin/env python3
"""Encode/decode texts with the HF `tokenizers` library for the Go cross-check.

Input (JSON): {"tokenizers": {name: path to tokenizer.json}, "texts": [...]}
Output (JSON): {"versions": {...}, "results": {name: {"ids": [[...]],
  "ids_special": [[...]], "decoded": [...], "decoded_skip": [...], "pretok": [[...]]}}}
ids are without special-token templates, ids_special with them; decoded is
decode(ids_special), decoded_skip is decode(ids_special, skip_special_tokens=True)
and pretok the pre-tokenizer's pieces (byte-level alphabet) of the raw text.
"""
import argparse
import json
import platform
import sys

import tokenizers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--in", dest="inp", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with open(args.inp, encoding="utf-8") as f:
        req = json.load(f)
    results = {}
    for name, path in sorted(req["tokenizers"].items()):
        tok = tokenizers.Tokenizer.from_file(path)
        r = {"ids": [], "ids_special": [], "decoded": [], "decoded_skip": [], "pretok": []}
        for text in req["texts"]:
            plain = tok.encode(text, add_special_tokens=False).ids
            withsp = tok.encode(text, add_special_tokens=True).ids
            r["ids"].append(plain)
            r["ids_special"].append(withsp)
            r["decoded"].append(tok.decode(withsp, skip_special_tokens=False))
            r["decoded_skip"].append(tok.decode(withsp, skip_special_tokens=True))
            # pre-tokenizer alone (no added tokens, no normalizer), byte-level pieces
            r["pretok"].append([p for p, _ in tok.pre_tokenizer.pre_tokenize_str(text)])
        results[name] = r
    out = {
        "versions": {"tokenizers": tokenizers.__version__, "python": platform.python_version()},
        "results": results,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
