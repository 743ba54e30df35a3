#!/usr/bin/env python3
"""Where a kernel's warps wait, from ncu's SASS source page.

Reads what `ncu -i REPORT --page source --csv --print-source sass` prints (a
section per profiled kernel: a "Kernel Name" line, a header line, one line per
SASS instruction with its stall samples by reason) and prints, per kernel:
the samples by stall reason and the instructions that hold the most samples,
each with its top reasons. ncu may print the same kernel's section more than
once; identical sections count once. A kernel profiled at several launches
keeps its first section (the others are counted).

    python3 scripts/ncu_stalls.py long-sass.csv
    python3 scripts/ncu_stalls.py long-sass.csv.xz --kernel indexer_scores --top 20

Session 24 found the indexer scores kernel's largest stall this way (the key
scale loaded after the products: docs/measured/h200-2026-12-04-s24).
"""

import argparse
import csv
import io
import lzma
import sys
from collections import Counter

SAMPLES = "Warp Stall Sampling (All Samples)"


def read_sections(text):
    """The CSV's kernel sections: [(name, header, rows)] in file order."""
    sections = []
    name, header, rows = None, None, []
    for rec in csv.reader(io.StringIO(text)):
        if not rec:
            continue
        if rec[0] == "Kernel Name":
            if name is not None and header is not None:
                sections.append((name, header, rows))
            name, header, rows = rec[1] if len(rec) > 1 else "?", None, []
        elif rec[0] == "Address":
            header = rec
        elif header is not None:
            rows.append(rec)
    if name is not None and header is not None:
        sections.append((name, header, rows))
    return sections


def kernels(sections):
    """One section per kernel name (the first), with how many others it had
    (identical repeats are not counted)."""
    out, seen = {}, {}
    for name, header, rows in sections:
        if name not in out:
            out[name] = (header, rows)
            seen[name] = [rows]
        elif all(rows != r for r in seen[name]):
            seen[name].append(rows)
    return [(name, h, r, len(seen[name]) - 1) for name, (h, r) in out.items()]


def num(v):
    try:
        return int(float(v or 0))
    except ValueError:
        return 0


def summarize(header, rows):
    """Samples by stall reason, and per instruction (samples, source, reasons)."""
    col = {h: i for i, h in enumerate(header)}
    if SAMPLES not in col or "Source" not in col:
        raise ValueError("not ncu's SASS source page: no %r / 'Source' column" % SAMPLES)
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    total = Counter()
    per = []
    for r in rows:
        if len(r) < len(header):
            continue
        rs = Counter({s[6:]: num(r[col[s]]) for s in reasons})
        total.update(rs)
        per.append((num(r[col[SAMPLES]]), r[col["Source"]].strip(), r[col["Address"]], rs))
    total = Counter({k: v for k, v in total.items() if v})
    per.sort(key=lambda x: -x[0])
    return total, per


def report(name, header, rows, repeats, top, out):
    total, per = summarize(header, rows)
    n = sum(total.values())
    more = " (%d other launches' sections not counted)" % repeats if repeats else ""
    print("%s: %d stall samples over %d instructions%s" % (name, n, len(rows), more), file=out)
    for reason, v in total.most_common():
        print("  %-20s %7d  %5.1f%%" % (reason, v, 100.0 * v / max(n, 1)), file=out)
    print("  top instructions (samples, share, reasons):", file=out)
    for s, src, addr, rs in per[:top]:
        if s == 0:
            break
        why = " ".join("%s=%d" % (k, v) for k, v in rs.most_common(3) if v)
        print("  %6d %5.1f%%  %-48s %s" % (s, 100.0 * s / max(n, 1), src[:48], why), file=out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output (.xz read as well)")
    ap.add_argument("--kernel", default="", help="only kernels whose name contains this")
    ap.add_argument("--top", type=int, default=15, help="instructions to list per kernel")
    a = ap.parse_args(argv)
    opener = lzma.open if a.csv.endswith(".xz") else open
    with opener(a.csv, "rt", encoding="utf-8", errors="replace") as f:
        text = f.read()
    ks = [k for k in kernels(read_sections(text)) if a.kernel in k[0]]
    if not ks:
        print("no kernel section%s in %s: is it ncu's --page source --csv --print-source sass output?"
              % (" matching %r" % a.kernel if a.kernel else "", a.csv), file=sys.stderr)
        return 2
    for i, (name, header, rows, rep) in enumerate(ks):
        if i:
            print(file=sys.stdout)
        try:
            report(name, header, rows, rep, a.top, sys.stdout)
        except ValueError as e:
            print("%s: %s" % (name, e), file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
