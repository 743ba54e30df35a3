"""Checks a synthetic checkpoint against HF transformers (run by synth_test.go).

Usage: python hf_check.py CHECKPOINT_DIR [--forward]

Prints one JSON object: the config values transformers resolved, tensors that HF's model expects
but the checkpoint lacks (or with other shapes), and with --forward the logit statistics of a
forward pass over the dequantised weights. Exits 1 on any mismatch.
"""

import json
import os
import sys

import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM


def load_checkpoint(d):
    idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    out = {}
    for shard in sorted(set(idx["weight_map"].values())):
        with safe_open(os.path.join(d, shard), "pt") as f:
            for k in f.keys():
                out[k] = f.get_tensor(k)
    return out


def dequant(tensors):
    # DeepSeek's block formula W[i,j] = w[i,j] * s[i//128][j//128] (see DESIGN known traps).
    out = {}
    for k, v in tensors.items():
        if k.endswith("weight_scale_inv"):
            continue
        if v.dtype == torch.float8_e4m3fn:
            s = tensors[k[: -len("weight")] + "weight_scale_inv"]
            r, c = v.shape
            s = s.repeat_interleave(128, 0)[:r].repeat_interleave(128, 1)[:, :c]
            out[k] = v.float() * s
        else:
            out[k] = v.float()
    return out


def main():
    d = sys.argv[1]
    forward = "--forward" in sys.argv
    cfg = AutoConfig.from_pretrained(d)
    report = {
        "model_type": cfg.model_type,
        "rope_parameters": cfg.rope_parameters,
        "mlp_layer_types": cfg.mlp_layer_types,
        "head_dim": cfg.head_dim,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id,
    }
    if hasattr(cfg, "indexer_types"):
        report["indexer_types"] = cfg.indexer_types
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(cfg)
    report["scaling"] = m.model.layers[0].self_attn.scaling
    expected = {}
    for k, v in m.state_dict().items():
        shape = list(v.shape)
        if k.endswith("mlp.experts.gate_up_proj"):
            p = k[: -len("gate_up_proj")]
            for e in range(shape[0]):
                expected[f"{p}{e}.gate_proj.weight"] = [shape[1] // 2, shape[2]]
                expected[f"{p}{e}.up_proj.weight"] = [shape[1] // 2, shape[2]]
        elif k.endswith("mlp.experts.down_proj"):
            p = k[: -len("down_proj")]
            for e in range(shape[0]):
                expected[f"{p}{e}.down_proj.weight"] = [shape[1], shape[2]]
        else:
            expected[k] = shape
    tensors = load_checkpoint(d)
    mtp = f"model.layers.{cfg.num_hidden_layers}."
    have = {k: list(v.shape) for k, v in tensors.items() if not k.endswith("weight_scale_inv") and not k.startswith(mtp)}
    report["missing"] = sorted(k for k in expected if k not in have)
    report["unexpected"] = sorted(k for k in have if k not in expected)
    report["shape_mismatch"] = sorted(k for k in expected if k in have and have[k] != expected[k])
    report["dtypes"] = sorted({f"{k.split('.')[-2]}.{k.split('.')[-1]}:{str(v.dtype)}" for k, v in tensors.items()})
    report["mtp_tensors"] = sorted(k[len(mtp):] for k in tensors if k.startswith(mtp) and "experts." not in k)
    ok = not (report["missing"] or report["unexpected"] or report["shape_mismatch"])
    if forward and ok:
        w = dequant(tensors)
        torch.manual_seed(0)
        mf = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        sd = {}
        for k in mf.state_dict():
            if k.endswith("mlp.experts.gate_up_proj"):
                p = k[: -len("gate_up_proj")]
                n = mf.config.n_routed_experts
                sd[k] = torch.stack([torch.cat([w[f"{p}{e}.gate_proj.weight"], w[f"{p}{e}.up_proj.weight"]]) for e in range(n)])
            elif k.endswith("mlp.experts.down_proj"):
                p = k[: -len("down_proj")]
                sd[k] = torch.stack([w[f"{p}{e}.down_proj.weight"] for e in range(mf.config.n_routed_experts)])
            else:
                sd[k] = w[k]
        mf.load_state_dict(sd, strict=True)
        mf.eval()
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, 900, (1, 160), generator=g)
        with torch.no_grad():
            out = mf(ids, output_hidden_states=True)
        lg = out.logits[0]
        top2 = lg.topk(2, dim=-1).values
        report["logits"] = {
            "std": lg.std(dim=-1).mean().item(),
            "max_abs": lg.abs().max().item(),
            "spread_mean": (lg.max(dim=-1).values - lg.min(dim=-1).values).mean().item(),
            "top1_top2_gap_min": (top2[:, 0] - top2[:, 1]).min().item(),
            "top1_top2_gap_median": (top2[:, 0] - top2[:, 1]).median().item(),
            "distinct_argmax": int(lg.argmax(-1).unique().numel()),
        }
        report["hidden_rms"] = [h[0].pow(2).mean().sqrt().item() for h in out.hidden_states]
    print(json.dumps(report))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
