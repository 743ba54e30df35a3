"""scripts/hf_bench.py end to end on the CPU (--device cpu) on the tiny presets.

The figures mean nothing for speed; what is checked is that every stage runs (synth, tilert's prefill,
--before and --context benches, HF's load, setting trials and timed contexts) and that the table and
the JSON hold both engines' figures for each context, with HF's model loaded from every checkpoint
tensor. Needs transformers with deepseek_v32 and glm_moe_dsa (>= 5.17: the vLLM venv of
`make test-vllm` has it) and go (or TILERT_BIN); skipped, saying which is missing, otherwise.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONTEXTS = [64, 256]  # 256 > index_topk (32): the indexer's sparse path runs on both sides
TOKENS = 3


def _has(mod):
    try:
        return importlib.util.find_spec(mod) is not None
    except ImportError:  # a parent package that is missing
        return False


def _missing():
    for mod in ("torch", "safetensors", "transformers", "transformers.models.deepseek_v32",
                "transformers.models.glm_moe_dsa"):
        if not _has(mod):
            return mod
    return None


pytestmark = pytest.mark.skipif(_missing() is not None,
                                reason=f"hf_bench CPU smoke test needs {_missing()} (transformers >= 5.17, as in the "
                                       "vLLM venv of make test-vllm)")


@pytest.fixture(scope="module")
def tilert_bin(tmp_path_factory):
    if os.environ.get("TILERT_BIN"):
        return os.environ["TILERT_BIN"]
    if shutil.which("go") is None:
        pytest.skip("hf_bench CPU smoke test needs the tilert binary: no go on PATH and TILERT_BIN unset")
    out = tmp_path_factory.mktemp("bin") / "tilert"
    subprocess.run(["go", "build", "-trimpath", "-o", str(out), "."], cwd=ROOT, check=True,
                   env={**os.environ, "CGO_ENABLED": "0"})
    return str(out)


def _checkpoint_names(model_dir):
    """The checkpoint's tensor names, read here without the script's code."""
    from safetensors import safe_open
    names = []
    for fn in sorted(os.listdir(model_dir)):
        if fn.endswith(".safetensors"):
            with safe_open(os.path.join(model_dir, fn), framework="pt") as f:
                names.extend(f.keys())
    return names


@pytest.mark.parametrize("preset,family", [("deepseek-v3.2-tiny", "deepseek_v32"), ("glm-5-tiny", "glm_moe_dsa")])
def test_hf_bench_cpu(tmp_path, tilert_bin, preset, family):
    model_dir, out = tmp_path / "ckpt", tmp_path / "hf-bench.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "hf_bench.py"), "--device", "cpu", "--tilert", tilert_bin,
           "--preset", preset, "--model-dir", str(model_dir), "--contexts", ",".join(map(str, CONTEXTS)),
           "--tokens", str(TOKENS), "--before", str(CONTEXTS[0]), "--prefill-precision", "fast", "--json", str(out)]
    p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    assert p.returncode == 0, f"{' '.join(cmd)}\nexit {p.returncode}\n{p.stderr[-4000:]}"
    res = json.loads(out.read_text())
    assert res["device"] == "cpu" and res["contexts"] == CONTEXTS

    # tilert: a prefill run per context, the --before run and the --context bench, all on the CPU.
    tl = res["tilert"]
    assert tl["prefill_precision"] == "fast" and "tilert prefill precision: fast" in res["table"]
    for L in CONTEXTS:
        r = tl["prefill"][str(L)]
        assert (r["device"], r["model"], r["prompt_len"], r["tokens_per_slot"]) == ("cpu", family, L, TOKENS)
        assert r["steps"] == TOKENS - 1 and r["step_p50_ms"] > 0 and r["prefill_ms_per_slot"] > 0
    assert tl["before"][str(CONTEXTS[0])]["prefill_ms_per_slot"] > 0
    assert tl["context"]["device"] == "cpu"
    assert [(c["context"], c["slots"]) for c in tl["context"]["contexts"]] == [(L, 1) for L in CONTEXTS]

    # HF: on the CPU, every checkpoint tensor of the main layers taken, every model parameter set from one.
    hf = res["hf"]
    assert hf["device"].startswith("cpu") and hf["dtype"] == "bfloat16"
    with open(model_dir / "config.json") as f:
        n_layers = json.load(f)["num_hidden_layers"]
    names = [n for n in _checkpoint_names(model_dir) if not n.endswith(".weight_scale_inv")]
    mtp = [n for n in names if n.startswith("model.layers.") and int(n.split(".")[2]) >= n_layers]
    ld = hf["loaded"]
    assert ld["checkpoint_tensors"] == ld["checkpoint_tensors_taken"] == len(names) - len(mtp) > 0
    assert ld["checkpoint_tensors_left_out"] == len(mtp) > 0
    assert ld["model_parameters"] == ld["model_parameters_from_checkpoint"] > 0
    assert any("error" not in t for t in hf["trials"]), hf["trials"]
    assert (hf["setting"]["attn_implementation"], hf["setting"]["experts_implementation"]) in \
        [(t["attn"], t["experts"]) for t in hf["trials"] if "error" not in t]
    for L in CONTEXTS:
        h = hf["contexts"][str(L)]
        assert "error" not in h, h
        assert h["steps"] == TOKENS and h["step_p50_ms"] > 0 and h["prefill_ms"] > 0
        # Held against the fastest working setting's fastest run at this context.
        ok = [t for t in hf["trials"] if t["context"] == L and "error" not in t]
        assert h["step_p50_ms"] == min(t["step_p50_ms"] for t in ok)
        assert h["step_p50_ms"] == min(h["runs_step_p50_ms"]) and len(h["runs_step_p50_ms"]) == hf["repeats"]
        assert hf["setting"]["per_context"][str(L)] == f"{h['attn']}:{h['experts']}"

    # The table: both engines' figures and their ratios for each context, as in the JSON.
    assert [r["context"] for r in res["rows"]] == CONTEXTS
    lines = res["table"].splitlines()
    for L, row in zip(CONTEXTS, res["rows"]):
        assert row["hf_ms_per_token"] == hf["contexts"][str(L)]["step_p50_ms"]
        assert row["tilert_ms_per_token"] == tl["prefill"][str(L)]["step_p50_ms"]
        assert row["hf_prefill_ms"] == hf["contexts"][str(L)]["prefill_ms"]
        assert row["tilert_prefill_ms"] == tl["prefill"][str(L)]["prefill_ms_per_slot"]
        assert row["tilert_ms_per_token_context_bench"] > 0
        assert row["tokens_per_s_ratio"] == pytest.approx(row["hf_ms_per_token"] / row["tilert_ms_per_token"])
        assert row["prefill_ratio"] == pytest.approx(row["hf_prefill_ms"] / row["tilert_prefill_ms"])
        line = next(ln for ln in lines if ln.split()[:1] == [str(L)])
        assert " - " not in f" {line} ", line  # no missing figure
        assert f"{row['hf_ms_per_token']:.2f}" in line and f"{row['tilert_ms_per_token']:.2f}" in line
    assert p.stdout.strip() == res["table"]
