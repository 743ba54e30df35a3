#!/usr/bin/env python3
"""HF transformers against tilert on one checkpoint, in one command on one GPU (or the CPU).

What a user comparing the two would do, batch 1, greedy:
  1. build the checkpoint (``--preset``: ``tilert synth``, unless ``--model-dir`` already holds one):
     an HF-layout FP8 checkpoint (e4m3 weights with 128x128 ``weight_scale_inv`` blocks);
  2. tilert on that directory: ``tilert bench decode --device cuda --prompt-len L`` per context L
     (a real prefill of L random tokens, then greedy decode steps: prefill time and step p50), and
     ``tilert bench decode --context 1024,8192`` (imported random caches; step against the byte floor);
  3. HF transformers on the same tensors: FP8 dequantised to bf16 here with DeepSeek's formula
     W[i,j] = w[i,j] * s[i//128][j//128] (transformers' own FP8 path needs the ``kernels`` package at these
     dimensions and gets partial blocks wrong; see DESIGN.md "Known traps"), the model built on the GPU
     in bf16 and every parameter and buffer checked to come from the checkpoint; its fastest working
     setting among the attention/experts implementations tried (recorded); prefill = one forward of L
     tokens with the cache (logits of the last position, as generate asks), decode = one forward per
     token on that cache with arg-max, synchronised per token as a streaming user would;
  4. one table (HF ms/token, tilert ms/token, speedup in tokens/s; prefill HF vs tilert) and JSON.

Run on the H200 (see scripts/README.md, "HF baseline"):
    make build && python3 scripts/hf_bench.py --tilert ./tilert --preset deepseek-v3.2-moe \\
        --model-dir /tmp/ds-moe --contexts 1024,8192 --json /tmp/hf-bench.json

``--device cpu`` runs both engines on the CPU (tilert ``--device cpu``, HF in ``--hf-dtype``, bf16 by
default): its figures say nothing about speed; on a tiny preset it proves every stage, the table and the
JSON in seconds (python/tests/test_hf_bench.py).
"""

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time

BLOCK = 128


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- tilert

def run_tilert(binary, args, env_extra=None):
    env = dict(os.environ)
    env.update(env_extra or {})
    log("$", " ".join([binary] + args), " ".join(f"{k}={v}" for k, v in (env_extra or {}).items()))
    t0 = time.time()
    p = subprocess.run([binary] + args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stderr.write(p.stdout)
    if p.returncode != 0:
        raise SystemExit(f"tilert {' '.join(args)} failed with exit code {p.returncode}")
    return p.stdout, time.time() - t0


def tilert_bench(binary, model_dir, device, contexts, tokens, with_context, before, precision="float32"):
    out = {"prefill": {}, "context": None, "before": {}, "prefill_precision": precision}
    with tempfile.TemporaryDirectory(prefix="hf_bench_") as tmp:
        for L in contexts:
            js = os.path.join(tmp, f"prefill-{L}.json")
            _, wall = run_tilert(binary, ["bench", "decode", "--device", device, "--model-dir", model_dir,
                                          "--prompt-len", str(L), "--tokens", str(tokens), "--json", js,
                                          "--prefill-precision", precision],
                                 {"TILERT_GPU_GEMM": os.environ.get("TILERT_GPU_GEMM", "1")})
            with open(js) as f:
                r = json.load(f)
            r["wall_s"] = wall
            out["prefill"][str(L)] = r
        for L in before:
            js = os.path.join(tmp, f"before-{L}.json")
            _, wall = run_tilert(binary, ["bench", "decode", "--device", device, "--model-dir", model_dir,
                                          "--prompt-len", str(L), "--tokens", "4", "--json", js],
                                 {"TILERT_GPU_GEMM": "0"})
            with open(js) as f:
                r = json.load(f)
            r["wall_s"] = wall
            out["before"][str(L)] = r
        if with_context:
            js = os.path.join(tmp, "context.json")
            text, _ = run_tilert(binary, ["bench", "decode", "--device", device, "--model-dir", model_dir,
                                          "--context", ",".join(str(c) for c in contexts), "--json", js])
            with open(js) as f:
                out["context"] = json.load(f)
            out["context_text"] = text
    return out


# ---------------------------------------------------------------- HF

def shard_files(model_dir):
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            return json.load(f)["weight_map"]
    from safetensors import safe_open
    wm = {}
    for fn in sorted(os.listdir(model_dir)):
        if fn.endswith(".safetensors"):
            with safe_open(os.path.join(model_dir, fn), framework="pt") as f:
                for k in f.keys():
                    wm[k] = fn
    if not wm:
        raise SystemExit(f"{model_dir}: no *.safetensors")
    return wm


class Checkpoint:
    """Tensors on the device on demand, FP8 ones dequantised to dtype with DeepSeek's formula."""

    def __init__(self, model_dir, torch, device, dtype):
        from safetensors import safe_open
        self.torch, self.dir, self.dtype = torch, model_dir, dtype
        self.wm = shard_files(model_dir)
        self.files = {fn: safe_open(os.path.join(model_dir, fn), framework="pt", device=device)
                      for fn in sorted(set(self.wm.values()))}
        self.used = set()

    def names(self):
        return [k for k in self.wm if not k.endswith(".weight_scale_inv")]

    def get(self, name):
        torch = self.torch
        t = self.files[self.wm[name]].get_tensor(name)
        self.used.add(name)
        sk = name + "_scale_inv"
        if t.dtype == torch.float8_e4m3fn:
            if sk not in self.wm:
                raise SystemExit(f"{name}: FP8 without {sk}")
            s = self.files[self.wm[sk]].get_tensor(sk).float()
            rows, cols = t.shape
            if tuple(s.shape) != (math.ceil(rows / BLOCK), math.ceil(cols / BLOCK)):
                raise SystemExit(f"{sk}: shape {tuple(s.shape)} for weight {(rows, cols)}")
            full = s.repeat_interleave(BLOCK, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :cols]
            return (t.float() * full).to(self.dtype)
        return t.to(self.dtype) if t.is_floating_point() else t


def load_hf(model_dir, torch, device, dtype):
    from transformers import AutoConfig, AutoModelForCausalLM
    with open(os.path.join(model_dir, "config.json")) as f:
        raw = json.load(f)
    raw.pop("quantization_config", None)
    n_layers = int(raw["num_hidden_layers"])
    with tempfile.TemporaryDirectory(prefix="hf_bench_cfg_") as tmp:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(raw, f)
        cfg = AutoConfig.from_pretrained(tmp)
    t0 = time.time()
    with torch.device(device):
        # transformers' default attention (sdpa where the model supports it); trials switch later.
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.eval()
    ck = Checkpoint(model_dir, torch, device, dtype)
    want = {k for k in ck.names() if not (k.startswith("model.layers.") and int(k.split(".")[2]) >= n_layers)}
    set_names = set()
    params = {k for k, _ in model.named_parameters()}
    with torch.no_grad():
        tensors = dict(model.named_parameters())
        tensors.update({k: v for k, v in model.named_buffers() if k in want})
        for name, p in tensors.items():
            if name in want:
                v = ck.get(name)
                if tuple(v.shape) != tuple(p.shape):
                    raise SystemExit(f"{name}: checkpoint {tuple(v.shape)}, model {tuple(p.shape)}")
                p.copy_(v.to(p.dtype))
                set_names.add(name)
                continue
            base, _, leaf = name.rpartition(".")
            if not base.endswith("mlp.experts") or leaf not in ("gate_up_proj", "down_proj"):
                raise SystemExit(f"model parameter {name} {tuple(p.shape)} has no checkpoint tensor")
            # Fused experts: [E, 2I, H] (gate then up) and [E, H, I], or their transposes.
            for e in range(p.shape[0]):
                if leaf == "gate_up_proj":
                    v = torch.cat([ck.get(f"{base}.{e}.gate_proj.weight"), ck.get(f"{base}.{e}.up_proj.weight")], 0)
                else:
                    v = ck.get(f"{base}.{e}.down_proj.weight")
                if tuple(v.shape) != tuple(p.shape[1:]):
                    v = v.t()
                if tuple(v.shape) != tuple(p.shape[1:]):
                    raise SystemExit(f"{name}[{e}]: checkpoint {tuple(v.shape)}, model {tuple(p.shape[1:])}")
                p[e].copy_(v.to(p.dtype))
            set_names.add(name)
    missing = sorted(want - ck.used)
    if missing:
        raise SystemExit(f"checkpoint tensors the model never took: {missing[:5]} ({len(missing)})")
    took = time.time() - t0
    log(f"hf: {len(set_names)} parameters/buffers from the checkpoint in {took:.1f}s")
    # What the JSON shows of the load (the checks above already stopped on any gap).
    info = {"checkpoint_tensors": len(want), "checkpoint_tensors_taken": len(want & ck.used),
            "checkpoint_tensors_left_out": len(ck.names()) - len(want),  # layers >= num_hidden_layers: MTP
            "model_parameters": len(params), "model_parameters_from_checkpoint": len(params & set_names),
            "model_buffers_from_checkpoint": len(set_names - params), "seconds": took}
    return model, info


def set_impl(model, attn, experts):
    """Switch the attention and experts implementations of a loaded model; False if refused."""
    try:
        if hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation(attn)
        else:
            model.config._attn_implementation = attn
        if hasattr(model, "set_experts_implementation"):
            model.set_experts_implementation(experts)
        else:
            model.config._experts_implementation = experts
        return True
    except Exception as ex:  # an implementation this install lacks
        log(f"hf: {attn}/{experts} refused: {ex}")
        return False


def hf_run(model, torch, device, L, steps, seed, vocab):
    g = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.randint(0, vocab * 3 // 4, (1, L), generator=g).to(device)
    with torch.no_grad():
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        except TypeError:  # a model without logits_to_keep: full logits
            out = model(input_ids=ids, use_cache=True)
        tok = out.logits[:, -1].argmax(-1)
        first = int(tok.item())
        prefill = (time.perf_counter() - t0) * 1e3
        pkv = out.past_key_values
        del out
        times = []
        toks = [first]
        for _ in range(steps):
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model(input_ids=tok[:, None], past_key_values=pkv, use_cache=True)
            tok = out.logits[:, -1].argmax(-1)
            toks.append(int(tok.item()))
            times.append((time.perf_counter() - t0) * 1e3)
            pkv = out.past_key_values
            del out
    del pkv
    times.sort()
    return {"prefill_ms": prefill, "step_p50_ms": times[len(times) // 2], "step_p90_ms": times[len(times) * 9 // 10],
            "steps": steps, "tokens": toks[:8], "step_ms_sorted": [round(t, 3) for t in times]}


def empty_cache(torch, device):
    if device == "cuda":
        torch.cuda.empty_cache()


def hf_bench(model_dir, device, dtype_name, contexts, steps, seed, settings, repeats=2):
    import torch
    import transformers
    dtype = getattr(torch, dtype_name)
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        name = torch.cuda.get_device_name(0)
    else:
        name = f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    with open(os.path.join(model_dir, "config.json")) as f:
        vocab = int(json.load(f)["vocab_size"])
    model, loaded = load_hf(model_dir, torch, device, dtype)
    res = {"torch": torch.__version__, "transformers": transformers.__version__,
           "device": name, "dtype": dtype_name, "batch": 1, "loaded": loaded, "repeats": repeats,
           "trials": [], "contexts": {}}
    # Every setting at every context, each timed `repeats` times after a warm-up at that length: HF's
    # batch-1 step time moves between runs of one setting (allocator state, expert routing of the
    # tokens), so each context is held against the fastest working setting's fastest run, not
    # against one trial.
    best = {}
    worked = []
    for attn, experts in settings:
        if not set_impl(model, attn, experts):
            continue
        for L in contexts:
            k = str(L)
            runs = []
            try:
                hf_run(model, torch, device, L, 2, seed + 1, vocab)  # warm-up at this length (kernels, allocator)
                for _ in range(repeats):
                    runs.append(hf_run(model, torch, device, L, steps, seed, vocab))
            except Exception as ex:  # a setting this install cannot run here, e.g. out of memory
                log(f"hf: {attn}/{experts} at {L} failed: {type(ex).__name__}: {ex}")
                res["trials"].append({"attn": attn, "experts": experts, "context": L,
                                      "error": f"{type(ex).__name__}: {ex}"[:300]})
                empty_cache(torch, device)
                continue
            r = min(runs, key=lambda x: (x["step_p50_ms"], x["prefill_ms"]))
            r = dict(r, attn=attn, experts=experts, context=L, runs_step_p50_ms=[x["step_p50_ms"] for x in runs],
                     experts_in_config=getattr(model.config, "_experts_implementation", None),
                     attn_in_config=getattr(model.config, "_attn_implementation", None))
            res["trials"].append(r)
            if (attn, experts) not in worked:
                worked.append((attn, experts))
            log(f"hf: {attn}/{experts} at {L}: prefill {r['prefill_ms']:.1f} ms, step p50 "
                f"{' / '.join(f'{x:.2f}' for x in r['runs_step_p50_ms'])} ms")
            if k not in best or (r["step_p50_ms"], r["prefill_ms"]) < (best[k]["step_p50_ms"], best[k]["prefill_ms"]):
                best[k] = r
            empty_cache(torch, device)
    if not best:
        raise SystemExit("no HF setting worked")
    for L in contexts:
        k = str(L)
        res["contexts"][k] = best.get(k) or {"error": "no setting worked at this context (see trials)"}
        if k in best:
            log(f"hf: context {L}: fastest {best[k]['attn']}/{best[k]['experts']}: prefill "
                f"{best[k]['prefill_ms']:.1f} ms, step p50 {best[k]['step_p50_ms']:.2f} ms")
    first = best.get(str(contexts[0])) or next(iter(best.values()))
    res["setting"] = {"attn_implementation": first["attn"], "experts_implementation": first["experts"],
                      "torch_compile": False, "per_context": {k: f"{v['attn']}:{v['experts']}" for k, v in best.items()}}
    return res


# ---------------------------------------------------------------- table

def table(contexts, hf, tl):
    rows = []
    lines = ["context  HF ms/tok  tilert ms/tok  tok/s ratio  | HF prefill ms  tilert prefill ms  prefill ratio"
             "  | tilert ms/tok (--context)"]
    for L in contexts:
        k = str(L)
        h = hf["contexts"].get(k) if hf else None
        if h and "error" in h:
            h = None
        t = tl["prefill"].get(k) if tl else None
        ctx = None
        if tl and tl.get("context"):
            for row in tl["context"].get("rows", tl["context"].get("contexts", [])) or []:
                if int(row.get("context", -1)) == L and int(row.get("slots", 1)) == 1:
                    ctx = row.get("step_p50_ms")
        row = {"context": L,
               "hf_ms_per_token": h and h["step_p50_ms"], "tilert_ms_per_token": t and t["step_p50_ms"],
               "hf_prefill_ms": h and h["prefill_ms"], "tilert_prefill_ms": t and t["prefill_ms_per_slot"],
               "tilert_ms_per_token_context_bench": ctx}
        row["tokens_per_s_ratio"] = (row["hf_ms_per_token"] / row["tilert_ms_per_token"]
                                     if h and t and t["step_p50_ms"] else None)
        row["prefill_ratio"] = (row["hf_prefill_ms"] / row["tilert_prefill_ms"]
                                if h and t and t["prefill_ms_per_slot"] else None)
        rows.append(row)

        def f(v, fmt, unit=""):
            # A missing figure keeps its column's width, so the rows stay aligned.
            return format(v, fmt) + unit if v is not None else "-".rjust(len(format(0.0, fmt) + unit))
        lines.append(f"{L:7d}  {f(row['hf_ms_per_token'], '9.2f')}  {f(row['tilert_ms_per_token'], '13.2f')}  "
                     f"{f(row['tokens_per_s_ratio'], '10.2f', 'x')}  | {f(row['hf_prefill_ms'], '13.1f')}  "
                     f"{f(row['tilert_prefill_ms'], '17.1f')}  {f(row['prefill_ratio'], '12.2f', 'x')}  | {f(ctx, '9.2f')}")
    return rows, "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", required=True, help="HF FP8 checkpoint (built here with --preset when absent)")
    ap.add_argument("--preset", help="tilert synth preset to build into --model-dir when it does not exist")
    ap.add_argument("--seed", type=int, default=0, help="synth seed and prompt seed")
    ap.add_argument("--tilert", help="tilert binary (omit for HF only)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="where both engines run; cpu only proves the plumbing (its figures say nothing about speed)")
    ap.add_argument("--hf-dtype", choices=("bfloat16", "float32"), default="bfloat16", help="HF weights and activations")
    ap.add_argument("--contexts", default="1024,8192")
    ap.add_argument("--tokens", type=int, default=32, help="decode steps timed per context")
    ap.add_argument("--no-context-bench", action="store_true", help="skip tilert bench decode --context")
    ap.add_argument("--before", default="", help="contexts to also prefill with TILERT_GPU_GEMM=0 (the GEMV path); "
                    "the main runs take TILERT_GPU_GEMM from the environment, default 1 (tensor-core prefill)")
    ap.add_argument("--prefill-precision", choices=("float32", "fast"), default="float32",
                    help="tilert's prefill arithmetic in the per-context runs: float32 (products exact, tilert's "
                         "default) or fast (x rounded once to fp16 per GEMM, as HF's bf16 prefill)")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--settings", default="sdpa:eager,eager:eager,sdpa:grouped_mm",
                    help="HF attention:experts implementations to try; the fastest working one is used "
                         "(batched_mm is left out: it asked for 56 GiB more at 1024 tokens on the H200)")
    ap.add_argument("--repeats", type=int, default=2, help="timed runs of each HF setting at each context; the fastest counts")
    ap.add_argument("--json", help="write the result here")
    a = ap.parse_args()
    try:
        contexts = [int(c) for c in a.contexts.split(",") if c]
        before = [int(c) for c in a.before.split(",") if c]
    except ValueError as ex:
        ap.error(f"--contexts/--before: {ex}: give comma-separated token counts, e.g. --contexts 1024,8192")
    if a.repeats < 1:
        ap.error(f"--repeats {a.repeats}: give at least 1")
    if not contexts or min(contexts + before) < 1 or a.tokens < 1:
        ap.error("--contexts (and --before) need positive token counts and --tokens at least 1, e.g. --contexts 1024 --tokens 32")
    settings = [tuple(s.split(":")) for s in a.settings.split(",") if s]
    if not settings or any(len(s) != 2 or not all(s) for s in settings):
        ap.error(f"--settings {a.settings!r}: give attention:experts pairs, e.g. sdpa:eager,sdpa:grouped_mm")
    if not os.path.isdir(a.model_dir):
        if not (a.preset and a.tilert):
            raise SystemExit(f"{a.model_dir} does not exist: pass --preset and --tilert to build it")
        _, wall = run_tilert(a.tilert, ["synth", "--preset", a.preset, "--out", a.model_dir, "--seed", str(a.seed)])
        log(f"synth: {wall:.1f}s")
    res = {"model_dir": a.model_dir, "preset": a.preset, "device": a.device, "contexts": contexts,
           "host": platform.node()}
    tl = None
    if a.tilert:
        tl = tilert_bench(a.tilert, a.model_dir, a.device, contexts, a.tokens, not a.no_context_bench, before,
                          a.prefill_precision)
        res["tilert"] = tl
    hf = None
    if not a.skip_hf:
        hf = hf_bench(a.model_dir, a.device, a.hf_dtype, contexts, a.tokens, a.seed, settings, a.repeats)
        res["hf"] = hf
    rows, text = table(contexts, hf, tl)
    res["rows"] = rows
    if hf:
        per = ", ".join(f"{k}: {v}" for k, v in hf["setting"]["per_context"].items())
        text += (f"\nHF transformers {hf['transformers']} (torch {hf['torch']}, {hf['device']}): {hf['dtype']}, batch 1, "
                 f"fastest attn:experts per context ({per}) of {len(hf['trials'])} trials, "
                 f"best of {hf['repeats']} runs each, no torch.compile")
    if tl:
        text += f"\ntilert prefill precision: {a.prefill_precision} (--prefill-precision)"
    for L, r in (tl or {}).get("before", {}).items():
        how = "GEMVs, chunk 32" if a.device == "cuda" else "no effect on the CPU engine: the same path"
        text += f"\ntilert prefill {L} tokens before (TILERT_GPU_GEMM=0: {how}): {r['prefill_ms_per_slot']:.1f} ms"
    print(text)
    res["table"] = text
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
