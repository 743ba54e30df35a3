#!/usr/bin/env python3
"""Train TileRT-Go's tiny *trained* checkpoints: a DeepSeek-V3.2-shaped and a GLM-5-shaped model of a
few million parameters on the King James Bible (public domain), in HF transformers' own model classes,
exported as FP8 checkpoints in the HF layout the converter and the engines read.

Three steps (see scripts/README.md, "Trained tiny models"):

  corpus     the KJV text from Debian's bible-kjv package (`apt-get install bible-kjv`: the `bible`
             program decompresses bible-kjv-text's /usr/lib/bible.data), one verse per line, chapters
             separated by a blank line; every 20th chapter is held out for validation.
  tokenizer  a byte-level BPE tokenizer per family trained on the training chapters with HF
             `tokenizers` (the family's real pre-tokenizer regex and special tokens), written as a
             real tokenizer.json + tokenizer_config.json + generation_config.json + config.json.
  train      the model (run on the GPU machine): next-token loss on windows longer than index_topk,
             the MTP layer trained on t+2, the indexer trained as DeepSeek-V3.2's paper describes, then
             FP8 export (e4m3, 128x128 block scales, W = w * s[i//128][j//128]).

Training schedule (fractions of --steps):
  1. dense warm-up (45%): every indexer selects all tokens (index_topk lifted), the main model and
     the MTP layer are trained (loss = LM + 0.3 * MTP); the indexers are not touched.
  2. indexer warm-up (5%, at least 50 steps): the model is frozen and attends densely; each indexer
     is fitted with KL(p || softmax(I)) to its layer's attention distribution p (the heads' attention
     probabilities summed and L1-normalised), per query.
  3. sparse training (the rest): index_topk is active (queries past index_topk attend to the
     indexer's top-k only); the model trains on LM + 0.3 * MTP; each indexer keeps training on the
     KL restricted to its selected set, its inputs detached from the model's graph. The last 15% of
     all steps train through FP8 fake quantisation of every weight that is exported as FP8 (straight-
     through gradients), so the exported checkpoint is the function that was trained.
The MoE gate's e_score_correction_bias is updated aux-loss-free (DeepSeek-V3): +/- 1e-3 per step
towards equal expert load.

MTP (DeepSeek-V3's MTP module, which the engines implement): at position t the block's input is
eh_proj(cat(enorm(embed(token[t+1])), hnorm(h[t]))) with h the main model's final normed hidden state;
it is HF's own decoder-layer class at layer_idx = num_hidden_layers (sparse MoE, own indexer), then
shared_head.norm and the head; it predicts token[t+2]. Embedding and head are shared with the main
model while training (as in DeepSeek-V3) and exported as the copies real checkpoints carry.

Deterministic given --seed and the step count on the same software and GPU (torch deterministic
algorithms; the data windows come from a seeded generator). --steps 0 picks the count from
--budget-s after timing the first 60 steps (which do not depend on it) and records it, so
`--steps N` reproduces the run.
"""

import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import argparse
import copy
import hashlib
import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
import time

BLOCK = 128
FP8_MAX = 448.0

# The real tokenizers' pre-tokenizer patterns (tokenizer/synth.go uses the same ones).
GLM_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
DS_DIGITS = r"\p{N}{1,3}"
DS_CJK = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
DS_MAIN = ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
           "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+")

DS_SPECIALS = [
    "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>",
    "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>",
    "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
    "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>",
    "<｜tool▁sep｜>", "<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>",
]
GLM_SPECIALS = [
    "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>",
    "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
    "<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
    "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "/nothink",
]
DS_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }}"
               "{% elif m['role'] == 'user' %}<｜User｜>{{ m['content'] }}{% elif m['role'] == 'assistant' %}<｜Assistant｜></think>"
               "{{ m['content'] }}<｜end▁of▁sentence｜>{% endif %}{% endfor %}{% if add_generation_prompt %}<｜Assistant｜></think>{% endif %}")
GLM_TEMPLATE = ("[gMASK]<sop>{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{% endfor %}"
                "{% if add_generation_prompt %}<|assistant|>\n<think></think>{% endif %}")

# The two models. MLA kv_lora_rank 512 / rope 64 and index_head_dim 128 are the real models' (the
# vLLM cache layouts depend on them); hidden 192, q_lora 96/160, moe_intermediate 64 and the GLM
# o_proj input 192 are not multiples of 128, so partial FP8 blocks stay exercised.
MODELS = {
    "deepseek": dict(
        name="deepseek-v3.2-tiny-kjv", model_type="deepseek_v32", architectures=["DeepseekV32ForCausalLM"],
        vocab_size=2048, hidden_size=192, intermediate_size=512, moe_intermediate_size=64,
        num_hidden_layers=3, first_k_dense_replace=1, num_nextn_predict_layers=1,
        num_attention_heads=4, q_lora_rank=96, kv_lora_rank=512, qk_nope_head_dim=64, qk_rope_head_dim=64,
        v_head_dim=64, n_routed_experts=16, n_shared_experts=1, num_experts_per_tok=4, n_group=4, topk_group=2,
        index_n_heads=8, index_head_dim=128, index_topk=32, max_position_embeddings=163840,
        rms_norm_eps=1e-6, rope_theta=10000, yarn=True),
    "glm": dict(
        name="glm-5-tiny-kjv", model_type="glm_moe_dsa", architectures=["GlmMoeDsaForCausalLM"],
        vocab_size=2048, hidden_size=256, intermediate_size=512, moe_intermediate_size=64,
        num_hidden_layers=3, first_k_dense_replace=1, num_nextn_predict_layers=1,
        num_attention_heads=4, q_lora_rank=160, kv_lora_rank=512, qk_nope_head_dim=64, qk_rope_head_dim=64,
        v_head_dim=48, n_routed_experts=16, n_shared_experts=1, num_experts_per_tok=4, n_group=1, topk_group=1,
        index_n_heads=8, index_head_dim=128, index_topk=32, max_position_embeddings=202752,
        rms_norm_eps=1e-5, rope_theta=1e6, yarn=False),
}

MTP_EXTRA = ("embed_tokens.weight", "enorm.weight", "hnorm.weight", "eh_proj.weight",
             "shared_head.norm.weight", "shared_head.head.weight")
# Weights stored FP8 with weight_scale_inv (everything else bf16; e_score_correction_bias f32), as in
# the released checkpoints and model/names.go.
FP8_SUFFIXES = ("q_a_proj.weight", "q_b_proj.weight", "kv_a_proj_with_mqa.weight", "kv_b_proj.weight",
                "o_proj.weight", "indexer.wq_b.weight", "indexer.wk.weight",
                "gate_proj.weight", "up_proj.weight", "down_proj.weight")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------- corpus

def cmd_corpus(a):
    """KJV text from the `bible` program (Debian package bible-kjv, data from bible-kjv-text)."""
    exe = shutil.which("bible")
    if not exe:
        raise SystemExit("the `bible` program is missing: apt-get install bible-kjv (it reads bible-kjv-text's data)")
    raw = subprocess.run([exe, "-p", a.data_dir, "gen1:1-rev22:21"], check=True, capture_output=True,
                         env=dict(os.environ, COLUMNS="80")).stdout.decode("utf-8")
    chapters, verses, cur = [], [], None
    lines = raw.split("\n")
    verse_re = re.compile(r"^\s+(\d+) (.*)$")
    expect_header = True
    for ln in lines:
        if ln.strip() == "":
            if cur is not None:
                verses.append(cur)
                cur = None
            expect_header = True
            continue
        m = verse_re.match(ln)
        if expect_header and not m:
            if verses:
                chapters.append(verses)
            verses = []
            expect_header = False
            continue
        expect_header = False
        if m:
            if cur is not None:
                verses.append(cur)
            cur = m.group(2).strip()
        else:
            cur = (cur + " " + ln.strip()) if cur is not None else ln.strip()
    if cur is not None:
        verses.append(cur)
    if verses:
        chapters.append(verses)
    if len(chapters) != 1189:
        raise SystemExit(f"parsed {len(chapters)} chapters, want 1189 (did the bible program's output format change?)")
    train = [c for k, c in enumerate(chapters) if k % 20 != 7]
    val = [c for k, c in enumerate(chapters) if k % 20 == 7]
    os.makedirs(a.out, exist_ok=True)
    for name, part in (("train.txt", train), ("val.txt", val)):
        with open(os.path.join(a.out, name), "w") as f:
            f.write("\n\n".join("\n".join(c) for c in part) + "\n")
    nv = sum(len(c) for c in chapters)
    log(f"corpus: {len(chapters)} chapters, {nv} verses -> {a.out}/train.txt ({len(train)} chapters), val.txt ({len(val)})")


def read_chapters(path):
    with open(path) as f:
        return [c for c in f.read().split("\n\n") if c.strip()]


# ---------------------------------------------------------------- tokenizer

def cmd_tokenizer(a):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    m = MODELS[a.family]
    specials = GLM_SPECIALS if a.family == "glm" else DS_SPECIALS
    tok = Tokenizer(models.BPE())
    bl = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)
    if a.family == "glm":
        splits = [pre_tokenizers.Split(Regex(GLM_SPLIT), behavior="isolated", invert=False)]
    else:
        splits = [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False) for p in (DS_DIGITS, DS_CJK, DS_MAIN)]
    tok.pre_tokenizer = pre_tokenizers.Sequence(splits + [bl])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=m["vocab_size"] - len(specials), min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    text = read_chapters(os.path.join(a.corpus, "train.txt"))
    tok.train_from_iterator(text, trainer=trainer)
    if tok.get_vocab_size() != m["vocab_size"] - len(specials):
        raise SystemExit(f"BPE vocabulary {tok.get_vocab_size()}, want {m['vocab_size'] - len(specials)}")
    tok.add_special_tokens(specials)
    ids = {s: tok.token_to_id(s) for s in specials}
    if sorted(ids.values()) != list(range(m["vocab_size"] - len(specials), m["vocab_size"])):
        raise SystemExit(f"special ids {ids} are not the last ones")
    os.makedirs(a.out, exist_ok=True)
    tok.save(os.path.join(a.out, "tokenizer.json"))
    cfg, tc, gen = hf_config(m, ids)
    for fn, obj in (("config.json", cfg), ("tokenizer_config.json", tc), ("generation_config.json", gen)):
        with open(os.path.join(a.out, fn), "w") as f:
            json.dump(obj, f, indent=2, sort_keys=True, ensure_ascii=False)
            f.write("\n")
    sample = "And God said, Let there be light: and there was light."
    enc = tok.encode(sample)
    log(f"tokenizer {a.family}: {tok.get_vocab_size()} ids; {sample!r} -> {len(enc.ids)} tokens {enc.tokens}")


def hf_config(m, ids):
    """config.json, tokenizer_config.json and generation_config.json as model/synth writes them."""
    c = {
        "model_type": m["model_type"], "architectures": m["architectures"], "vocab_size": m["vocab_size"],
        "hidden_size": m["hidden_size"], "intermediate_size": m["intermediate_size"],
        "moe_intermediate_size": m["moe_intermediate_size"], "num_hidden_layers": m["num_hidden_layers"],
        "num_attention_heads": m["num_attention_heads"], "num_key_value_heads": m["num_attention_heads"],
        "n_shared_experts": m["n_shared_experts"], "n_routed_experts": m["n_routed_experts"],
        "routed_scaling_factor": 2.5, "kv_lora_rank": m["kv_lora_rank"], "q_lora_rank": m["q_lora_rank"],
        "qk_rope_head_dim": m["qk_rope_head_dim"], "v_head_dim": m["v_head_dim"],
        "qk_nope_head_dim": m["qk_nope_head_dim"], "n_group": m["n_group"], "topk_group": m["topk_group"],
        "num_experts_per_tok": m["num_experts_per_tok"], "norm_topk_prob": True, "hidden_act": "silu",
        "max_position_embeddings": m["max_position_embeddings"], "initializer_range": 0.02,
        "rms_norm_eps": m["rms_norm_eps"], "use_cache": True, "tie_word_embeddings": False,
        "attention_bias": False, "attention_dropout": 0.0, "index_topk": m["index_topk"],
        "index_head_dim": m["index_head_dim"], "index_n_heads": m["index_n_heads"],
        "first_k_dense_replace": m["first_k_dense_replace"], "num_nextn_predict_layers": m["num_nextn_predict_layers"],
        "moe_layer_freq": 1, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "ep_size": 1, "dtype": "bfloat16",
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "weight_block_size": [BLOCK, BLOCK]},
    }
    tc = {"add_eos_token": False, "clean_up_tokenization_spaces": False, "legacy": True,
          "model_max_length": m["max_position_embeddings"], "tokenizer_class": "PreTrainedTokenizerFast"}
    gen = {"_from_model_config": True, "do_sample": True, "top_p": 0.95}
    if m["model_type"] == "deepseek_v32":
        c["rope_theta"] = m["rope_theta"]
        bos, eos = ids["<｜begin▁of▁sentence｜>"], ids["<｜end▁of▁sentence｜>"]
        c["bos_token_id"], c["eos_token_id"] = bos, eos
        tc.update(add_bos_token=True, bos_token="<｜begin▁of▁sentence｜>", eos_token="<｜end▁of▁sentence｜>",
                  pad_token="<｜▁pad▁｜>", chat_template=DS_TEMPLATE)
        gen.update(bos_token_id=bos, eos_token_id=eos, temperature=0.6)
    else:
        c["rope_interleave"] = True
        c["indexer_rope_interleave"] = True
        eos = [ids["<|endoftext|>"], ids["<|user|>"], ids["<|observation|>"]]
        c["eos_token_id"], c["pad_token_id"] = eos, ids["<|endoftext|>"]
        tc.update(add_bos_token=False, eos_token="<|endoftext|>", pad_token="<|endoftext|>", chat_template=GLM_TEMPLATE)
        gen.update(eos_token_id=eos, pad_token_id=ids["<|endoftext|>"], temperature=1.0)
    if m["yarn"]:
        c["rope_scaling"] = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                             "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}
    else:
        c["rope_parameters"] = {"rope_type": "default", "rope_theta": m["rope_theta"]}
    return c, tc, gen


# ---------------------------------------------------------------- model pieces (torch)

def block_scales(w):
    """128x128 block scales s (amax / 448) of a 2-D weight; partial blocks have their own scale."""
    import torch
    import torch.nn.functional as F
    r, c = w.shape
    br, bc = math.ceil(r / BLOCK), math.ceil(c / BLOCK)
    pad = F.pad(w.detach().abs(), (0, bc * BLOCK - c, 0, br * BLOCK - r))
    amax = pad.view(br, BLOCK, bc, BLOCK).amax(dim=(1, 3))
    return (amax / FP8_MAX).clamp_min(1e-12).float()


def expand_scales(s, shape):
    r, c = shape
    return s.repeat_interleave(BLOCK, 0)[:r].repeat_interleave(BLOCK, 1)[:, :c]


def quant_fp8(w):
    """(e4m3 codes, weight_scale_inv) with DeepSeek's formula W = w * s[i//128][j//128]."""
    import torch
    s = block_scales(w)
    q = (w.detach().float() / expand_scales(s, w.shape)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, s


def fake_fp8(w):
    """Straight-through FP8 round trip of a 2-D weight (or of each matrix of a 3-D stack)."""
    import torch
    if w.dim() == 3:
        return torch.stack([fake_fp8(x) for x in w.unbind(0)])
    q, s = quant_fp8(w)
    return w + (q.float() * expand_scales(s, w.shape) - w).detach()


def make_parametrizations():
    import torch.nn as nn

    class FP8Param(nn.Module):
        def forward(self, w):
            return fake_fp8(w)

    class FP8GateUp(nn.Module):
        """Experts' fused [E, 2I, H]: gate and up are separate FP8 tensors in the checkpoint."""

        def forward(self, w):
            i = w.shape[1] // 2
            return __import__("torch").cat([fake_fp8(w[:, :i]), fake_fp8(w[:, i:])], dim=1)

    return FP8Param, FP8GateUp


class Trainer:
    def __init__(self, a, m, model_dir, device):
        import torch
        import torch.nn as nn
        from transformers import AutoConfig, AutoModelForCausalLM

        self.torch = torch
        self.a, self.m, self.dev = a, m, device
        with open(os.path.join(model_dir, "config.json")) as f:
            self.raw_cfg = json.load(f)
        cfg = dict(self.raw_cfg)
        cfg.pop("quantization_config", None)
        cfg["dtype"] = "float32"
        with tempfile.TemporaryDirectory(prefix="train_tiny_") as tmp:
            with open(os.path.join(tmp, "config.json"), "w") as f:
                json.dump(cfg, f)
            config = AutoConfig.from_pretrained(tmp)
        config._attn_implementation = "eager"  # the KL target needs the attention probabilities
        torch.manual_seed(a.seed)
        self.model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager",
                                                      experts_implementation="eager").to(device)
        self.config = self.model.config
        n = self.n = config.num_hidden_layers
        hc = copy.deepcopy(self.config)
        hc.num_hidden_layers = n + 1
        if getattr(hc, "mlp_layer_types", None) is not None:
            hc.mlp_layer_types = list(hc.mlp_layer_types)[:n] + ["sparse"]
        if getattr(hc, "layer_types", None) is not None:
            hc.layer_types = list(hc.layer_types)[:n] + [hc.layer_types[0]]
        if getattr(hc, "indexer_types", None) is not None:
            hc.indexer_types = list(hc.indexer_types)[:n] + ["full"]
        self.mtp_config = hc
        layer_cls = type(self.model.model.layers[0])
        norm_cls = type(self.model.model.norm)
        H, eps = config.hidden_size, config.rms_norm_eps
        mtp = nn.Module()
        mtp.layer = layer_cls(hc, layer_idx=n)
        mtp.enorm = norm_cls(H, eps)
        mtp.hnorm = norm_cls(H, eps)
        mtp.head_norm = norm_cls(H, eps)
        mtp.eh_proj = nn.Linear(2 * H, H, bias=False)
        self.mtp = mtp.to(device)
        # HF's initialisation for the new block (normal(0, initializer_range), norms 1, biases 0).
        for mod in self.mtp.modules():
            self.model._init_weights(mod)
        self.modmod = sys.modules[type(self.model.model.layers[0].self_attn.indexer).__module__]
        self.attn_mods = [l.self_attn for l in self.model.model.layers] + [self.mtp.layer.self_attn]
        self.indexers = [am.indexer for am in self.attn_mods]
        self.gates = [mod for mod in list(self.model.modules()) + list(self.mtp.modules())
                      if type(mod).__name__.endswith("TopkRouter")]
        self.interleaved_indexer = self.raw_cfg.get("model_type") == "glm_moe_dsa"
        self.capture = False
        self.cap_attn, self.cap_idx, self.cap_sel = {}, {}, {}
        for k, am in enumerate(self.attn_mods):
            am.register_forward_hook(self._attn_hook(k))
            am.indexer.register_forward_pre_hook(self._idx_pre_hook(k), with_kwargs=True)
            am.indexer.register_forward_hook(self._idx_hook(k))
        self.loads = {}
        for k, g in enumerate(self.gates):
            g.register_forward_hook(self._gate_hook(k))
        idx_params = {id(p) for ix in self.indexers for p in ix.parameters()}
        self.main_params = [p for p in list(self.model.parameters()) + list(self.mtp.parameters())
                            if id(p) not in idx_params]
        self.idx_params = [p for ix in self.indexers for p in ix.parameters()]
        self.set_topk(None)

    # ---- hooks
    def _attn_hook(self, k):
        def hook(mod, inp, out):
            if self.capture:
                self.cap_attn[k] = out[1]
        return hook

    def _idx_pre_hook(self, k):
        def hook(mod, args, kwargs):
            if self.capture:
                hs, q_resid, pe, mask = args[0], args[1], args[2], args[3]
                self.cap_idx[k] = (hs.detach(), q_resid.detach(), (pe[0].detach(), pe[1].detach()), mask)
        return hook

    def _idx_hook(self, k):
        def hook(mod, args, out):
            if self.capture:
                self.cap_sel[k] = out
        return hook

    def _gate_hook(self, k):
        def hook(mod, args, out):
            if mod.training:
                cnt = self.torch.bincount(out[2].flatten(), minlength=mod.num_experts)
                self.loads[k] = cnt if k not in self.loads else self.loads[k] + cnt
        return hook

    def set_topk(self, k):
        for ix in self.indexers:
            ix.index_topk = k if k is not None else 1 << 30

    # ---- indexer scores with gradients (HF's Indexer.forward without no_grad and without the top-k)
    def index_scores(self, ix, hs, q_resid, pe):
        torch = self.torch
        B, S, _ = hs.shape
        cos, sin = pe
        q = ix.wq_b(q_resid).view(B, S, ix.n_heads, ix.head_dim)
        q_rot, q_pass = torch.split(q, [ix.qk_rope_head_dim, ix.head_dim - ix.qk_rope_head_dim], dim=-1)
        k = ix.k_norm(ix.wk(hs)).unsqueeze(2)
        k_rot, k_pass = torch.split(k, [ix.qk_rope_head_dim, ix.head_dim - ix.qk_rope_head_dim], dim=-1)
        if self.interleaved_indexer:
            q_rot, k_rot = self.modmod.apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
        else:
            q_rot, k_rot = self.modmod.apply_rotary_pos_emb(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
        q = torch.cat([q_rot, q_pass], dim=-1)
        k = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
        scores = torch.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * ix.softmax_scale)
        w = ix.weights_proj(hs).float() * (ix.n_heads ** -0.5)
        return torch.matmul(w.unsqueeze(-2), scores).squeeze(-2)  # [B, S, T]

    def indexer_kl(self, sparse):
        """Sum over layers of the mean per-query KL(p || softmax(I)) (restricted to the selected set when sparse)."""
        torch = self.torch
        total = 0.0
        for k, ix in enumerate(self.indexers):
            hs, q_resid, pe, _ = self.cap_idx[k]
            attn = self.cap_attn[k].detach().float()  # [B, H, S, T]
            p = attn.sum(1)
            p = p / p.sum(-1, keepdim=True).clamp_min(1e-12)
            sc = self.index_scores(ix, hs, q_resid, pe)
            B, S, T = sc.shape
            causal = torch.ones(S, T, dtype=torch.bool, device=sc.device).tril()
            allowed = causal.expand(B, S, T)
            if sparse:
                sel = torch.zeros(B, S, T, dtype=torch.bool, device=sc.device)
                sel.scatter_(-1, self.cap_sel[k].long(), True)
                allowed = allowed & sel
            logq = torch.log_softmax(sc.masked_fill(~allowed, float("-inf")), dim=-1)
            pl = torch.where(p > 0, p * (torch.log(p.clamp_min(1e-30)) - logq.masked_fill(~allowed, 0)), torch.zeros_like(p))
            total = total + pl.sum(-1).mean()
        return total

    # ---- forward
    def forward(self, x, nxt, capture=False):
        """Main logits [B,S,V] and MTP logits [B,S,V] (position t predicts x[t+2] from h[t] and nxt[t]=x[t+1])."""
        torch = self.torch
        from transformers.masking_utils import create_causal_mask
        self.capture = capture
        self.cap_attn, self.cap_idx, self.cap_sel = {}, {}, {}
        h = self.model.model(input_ids=x, use_cache=False).last_hidden_state
        logits = self.model.lm_head(h)
        e = self.model.model.embed_tokens(nxt)
        mt = self.mtp
        z = mt.eh_proj(torch.cat([mt.enorm(e), mt.hnorm(h)], dim=-1))
        B, S = x.shape
        pos = torch.arange(S, device=x.device).unsqueeze(0).expand(B, S)
        mask = create_causal_mask(config=self.mtp_config, inputs_embeds=z, attention_mask=None,
                                  past_key_values=None, position_ids=pos, allow_is_causal_skip=False)
        pe = self.model.model.rotary_emb(z, position_ids=pos)
        out = mt.layer(z, attention_mask=mask, position_ids=pos, past_key_values=None, use_cache=False,
                       position_embeddings=pe)
        if isinstance(out, tuple):
            out = out[0]
        mlogits = self.model.lm_head(mt.head_norm(out))
        self.capture = False
        return logits, mlogits

    def train_mode(self, on):
        self.model.train(on)
        self.mtp.train(on)

    def update_bias(self, rate=1e-3):
        """Aux-loss-free balancing: raise the bias of under-loaded experts, lower over-loaded ones."""
        torch = self.torch
        with torch.no_grad():
            for k, g in enumerate(self.gates):
                if k in self.loads:
                    cnt = self.loads[k].float()
                    g.e_score_correction_bias.add_(rate * torch.sign(cnt.mean() - cnt))
        self.loads = {}


def cmd_train(a):
    import torch
    import torch.nn.functional as F
    import transformers
    from tokenizers import Tokenizer
    from torch.nn.utils import parametrize

    t_start = time.time()
    m = MODELS[a.family]
    dev = torch.device(a.device)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.use_deterministic_algorithms(True, warn_only=True)
    os.makedirs(a.out, exist_ok=True)
    for fn in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copyfile(os.path.join(a.tokenizer_dir, fn), os.path.join(a.out, fn))
    tok = Tokenizer.from_file(os.path.join(a.out, "tokenizer.json"))
    with open(os.path.join(a.out, "config.json")) as f:
        raw = json.load(f)
    eos = raw["eos_token_id"][0] if isinstance(raw["eos_token_id"], list) else raw["eos_token_id"]
    bos = raw.get("bos_token_id")

    def encode(path):
        ids = []
        for ch in read_chapters(path):
            if bos is not None:
                ids.append(bos)
            ids.extend(tok.encode(ch + "\n").ids)
            ids.append(eos)
        return torch.tensor(ids, dtype=torch.long)

    train_ids, val_ids = encode(os.path.join(a.corpus, "train.txt")), encode(os.path.join(a.corpus, "val.txt"))
    V = m["vocab_size"]
    counts = torch.bincount(train_ids, minlength=V).double() + 1.0
    unigram_val = float(-(counts / counts.sum()).log()[val_ids].mean())
    log(f"{m['name']}: train {len(train_ids)} tokens, val {len(val_ids)}; unigram val loss {unigram_val:.4f}")

    tr = Trainer(a, m, a.out, dev)
    n_main = sum(p.numel() for p in tr.main_params)
    n_idx = sum(p.numel() for p in tr.idx_params)
    log(f"{m['name']}: {n_main + n_idx} parameters ({n_idx} in indexers), device {dev}")

    B, S = a.batch, a.seq_len
    if S <= m["index_topk"]:
        raise SystemExit("--seq-len must exceed index_topk so the sparse path trains")
    gen = torch.Generator().manual_seed(a.seed)

    # The indexer loss re-computes HF's index scores with gradients: check the replica against HF's
    # own selection (the scores at HF's chosen positions are the top-k of ours) before training.
    with torch.no_grad():
        tr.set_topk(m["index_topk"])
        tr.train_mode(False)
        xs = train_ids[:2 * S].view(2, S).to(dev)
        tr.forward(xs, xs, capture=True)
        for k, ix in enumerate(tr.indexers):
            hs, q_resid, pe, _ = tr.cap_idx[k]
            sc = tr.index_scores(ix, hs, q_resid, pe)[:, m["index_topk"]:]
            sc = sc.masked_fill(~torch.ones(S, S, dtype=torch.bool, device=dev).tril()[m["index_topk"]:], float("-inf"))
            hf = sc.gather(-1, tr.cap_sel[k][:, m["index_topk"]:].long()).sort(-1, descending=True).values
            ours = sc.topk(m["index_topk"], dim=-1).values
            err = float((hf - ours).abs().max() / ours.abs().max().clamp_min(1e-30))
            if not err < 1e-5:
                raise SystemExit(f"indexer {k}: the score replica disagrees with HF's selection (rel {err:.3g})")
        tr.set_topk(None)
    log(f"{m['name']}: indexer score replica matches HF's top-k selection on all {len(tr.indexers)} indexers")

    def batch():
        starts = torch.randint(0, len(train_ids) - S - 2, (B,), generator=gen)
        w = torch.stack([train_ids[s:s + S + 2] for s in starts.tolist()]).to(dev)
        return w[:, :S], w[:, 1:S + 1], w[:, 2:S + 2]

    decay = [p for p in tr.main_params if p.dim() >= 2]
    no_decay = [p for p in tr.main_params if p.dim() < 2]
    fused = dev.type == "cuda"
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=fused)
    iopt = torch.optim.AdamW(tr.idx_params, lr=a.indexer_lr, betas=(0.9, 0.95), weight_decay=0.0, fused=fused)
    warm = 60

    def lr_at(step, total):
        if step < warm:
            return a.lr * (step + 1) / warm
        prog = min(1.0, (step - warm) / max(1, total - warm))
        return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * prog)))

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    hist = []
    losses = {}

    def main_step(step, total_main, sparse):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total_main)
        x, y, y2 = batch()
        tr.train_mode(True)
        lg, mlg = tr.forward(x, y, capture=sparse)
        loss = F.cross_entropy(lg.reshape(-1, V), y.reshape(-1))
        mloss = F.cross_entropy(mlg.reshape(-1, V), y2.reshape(-1))
        opt.zero_grad(set_to_none=True)
        (loss + a.mtp_weight * mloss).backward()
        torch.nn.utils.clip_grad_norm_(tr.main_params, 1.0)
        opt.step()
        tr.update_bias()
        kl = None
        if sparse:
            iopt.zero_grad(set_to_none=True)
            klt = tr.indexer_kl(sparse=True)
            klt.backward()
            iopt.step()
            kl = klt
        return loss, mloss, kl

    def indexer_step():
        x, y, _ = batch()
        tr.train_mode(False)
        with torch.no_grad():
            tr.forward(x, y, capture=True)
        iopt.zero_grad(set_to_none=True)
        kl = tr.indexer_kl(sparse=False)
        kl.backward()
        iopt.step()
        return kl

    def plan(total):
        """(stage-1 steps, stage-2 steps, stage-3 steps) of a run of `total` steps."""
        n1 = int(0.45 * total)
        n2 = max(50, int(0.05 * total))
        return n1, n2, max(1, total - n1 - n2)

    # Stage 1. With --steps 0 the count is unknown until the first `warm` steps are timed (their LR
    # does not depend on it).
    tr.set_topk(None)
    t1 = time.time()
    step = 0
    steps = a.steps
    t_cal = None
    while True:
        if steps and step >= plan(steps)[0]:
            break
        n1, n2, n3 = plan(steps) if steps else (0, 0, 10 ** 9)
        loss, mloss, _ = main_step(step, n1 + n3, sparse=False)
        step += 1
        if step == 10:
            sync()
            t_cal = time.time()
        if not steps and step == warm:
            sync()
            per = (time.time() - t_cal) / (warm - 10)
            # A stage-3 step costs ~1.35x a dense one (indexer KL), a stage-2 step ~0.6x.
            left = a.budget_s - (time.time() - t_start) - 25
            steps = max(300, min(a.max_steps, int(warm + left / (per * (0.45 + 0.05 * 0.6 + 0.5 * 1.35)))))
            log(f"{m['name']}: {per * 1000:.1f} ms/step dense; budget {a.budget_s}s -> --steps {steps}")
        if step % 100 == 0:
            log(f"{m['name']} s1 step {step}: loss {loss.item():.4f} mtp {mloss.item():.4f}")
            hist.append(dict(stage=1, step=step, loss=round(loss.item(), 4), mtp=round(mloss.item(), 4)))
    sync()
    n1, n2, n3 = plan(steps)
    s1_time = time.time() - t1
    losses["stage1"] = dict(loss=loss.item(), mtp=mloss.item())

    # Stage 2: indexer warm-up, dense attention, model frozen.
    t2 = time.time()
    for i in range(n2):
        kl = indexer_step()
        if (i + 1) % 50 == 0:
            log(f"{m['name']} s2 step {i + 1}: indexer KL {kl.item():.4f}")
            hist.append(dict(stage=2, step=i + 1, kl=round(kl.item(), 4)))
    sync()
    losses["stage2"] = dict(indexer_kl=kl.item())
    s2_time = time.time() - t2

    # Stage 3: sparse training; the last 15% of all steps through FP8 fake quantisation.
    t3 = time.time()
    tr.set_topk(m["index_topk"])
    qat_from = max(0, n3 - int(0.15 * steps))
    qat = False
    FP8Param, FP8GateUp = make_parametrizations()
    for i in range(n3):
        if i == qat_from and not a.no_qat:
            for name, mod in list(tr.model.named_modules()) + [("mtp." + k, v) for k, v in tr.mtp.named_modules()]:
                if isinstance(mod, torch.nn.Linear) and any((name + ".weight").endswith(s) for s in FP8_SUFFIXES):
                    parametrize.register_parametrization(mod, "weight", FP8Param())
                elif type(mod).__name__.endswith("Experts"):
                    parametrize.register_parametrization(mod, "gate_up_proj", FP8GateUp())
                    parametrize.register_parametrization(mod, "down_proj", FP8Param())
            qat = True
            log(f"{m['name']}: FP8 fake quantisation from stage-3 step {i}")
        loss, mloss, kl = main_step(n1 + i, n1 + n3, sparse=True)
        if (i + 1) % 100 == 0:
            log(f"{m['name']} s3 step {i + 1}: loss {loss.item():.4f} mtp {mloss.item():.4f} indexer KL {kl.item():.4f}")
            hist.append(dict(stage=3, step=i + 1, loss=round(loss.item(), 4), mtp=round(mloss.item(), 4),
                             kl=round(kl.item(), 4)))
        # Only a run whose step count came from --budget-s may be cut short (an explicit --steps run
        # must reproduce exactly, however slow the machine).
        if not a.steps and time.time() - t_start > a.budget_s * 1.35 + 60:
            log(f"{m['name']}: WARNING: stopping stage 3 at step {i + 1}/{n3}: past 1.35x the time budget")
            n3 = i + 1
            break
    sync()
    losses["stage3"] = dict(loss=loss.item(), mtp=mloss.item(), indexer_kl=kl.item())
    s3_time = time.time() - t3
    if qat:
        for mod in list(tr.model.modules()) + list(tr.mtp.modules()):
            if parametrize.is_parametrized(mod):
                for pn in list(mod.parametrizations.keys()):
                    parametrize.remove_parametrizations(mod, pn, leave_parametrized=False)
    train_time = time.time() - t_start

    # Export, then judge the exported checkpoint (reloaded from its files, as HF and the engines see it).
    files = export(tr, a.out)
    ev = evaluate_exported(a.out, val_ids, dev, S)
    shas = {fn: sha256_file(os.path.join(a.out, fn)) for fn in sorted(os.listdir(a.out))
            if fn not in ("TRAINING.json", "SHA256SUMS")}
    with open(os.path.join(a.out, "SHA256SUMS"), "w") as f:
        for fn, h in shas.items():
            f.write(f"{h}  {fn}\n")
    rec = {
        "model": m["name"], "family": m["model_type"], "seed": a.seed,
        "command": "python3 scripts/train_tiny.py train " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in (("family", a.family), ("corpus", a.corpus),
                                                           ("tokenizer_dir", a.tokenizer_dir), ("out", a.out),
                                                           ("seed", a.seed), ("steps", steps), ("batch", B),
                                                           ("seq_len", S), ("lr", a.lr), ("indexer_lr", a.indexer_lr),
                                                           ("mtp_weight", a.mtp_weight), ("device", a.device))),
        "steps": {"total": steps, "stage1_dense": n1, "stage2_indexer_warmup": n2, "stage3_sparse": n3,
                  "stage3_fp8_qat_from": qat_from if qat else None},
        "tokens_seen": (n1 + n3) * B * S, "batch": B, "seq_len": S, "index_topk": m["index_topk"],
        "seconds": {"stage1": round(s1_time, 1), "stage2": round(s2_time, 1), "stage3": round(s3_time, 1),
                    "train_total": round(train_time, 1), "with_export_and_eval": round(time.time() - t_start, 1)},
        "final_train_losses": {k: {kk: round(vv, 4) for kk, vv in v.items()} for k, v in losses.items()},
        "validation": dict(ev, unigram_loss=round(unigram_val, 4), train_tokens=len(train_ids), val_tokens=len(val_ids)),
        "parameters": {"total": n_main + n_idx, "indexers": n_idx},
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"},
        "corpus": "King James Version (1611, public domain) from Debian bible-kjv-text 4.38 via bible-kjv; "
                  "every 20th chapter (index % 20 == 7) held out",
        "files_sha256": shas,
        "history": hist,
    }
    with open(os.path.join(a.out, "TRAINING.json"), "w") as f:
        json.dump(rec, f, indent=1)
        f.write("\n")
    log(json.dumps({k: rec[k] for k in ("model", "steps", "seconds", "final_train_losses", "validation")}))
    log(f"{m['name']}: wrote {len(files)} files to {a.out} in {time.time() - t_start:.1f}s")


def export(tr, out):
    """The checkpoint in the released layout: FP8 weights + weight_scale_inv, bf16 rest, per-expert names,
    the MTP block at layer num_hidden_layers with its own copies of embedding and head; two shards."""
    import torch
    from safetensors.torch import save_file

    sd = {}
    n = tr.n

    def put(name, t):
        t = t.detach().float().cpu().contiguous()
        if name.endswith("e_score_correction_bias"):
            sd[name] = t.float()
        elif any(name.endswith(s) for s in FP8_SUFFIXES) and t.dim() == 2:
            q, s = quant_fp8(t)
            sd[name] = q.contiguous()
            sd[name + "_scale_inv"] = s.contiguous()
        else:
            sd[name] = t.to(torch.bfloat16).contiguous()

    def put_module(prefix, msd):
        for k, v in msd.items():
            if k.endswith("experts.gate_up_proj"):
                base = prefix + k[: -len("gate_up_proj")]
                i = v.shape[1] // 2
                for e in range(v.shape[0]):
                    put(f"{base}{e}.gate_proj.weight", v[e, :i])
                    put(f"{base}{e}.up_proj.weight", v[e, i:])
            elif k.endswith("experts.down_proj"):
                base = prefix + k[: -len("down_proj")]
                for e in range(v.shape[0]):
                    put(f"{base}{e}.down_proj.weight", v[e])
            else:
                put(prefix + k, v)

    put_module("", tr.model.state_dict())
    lp = f"model.layers.{n}."
    put_module(lp, tr.mtp.layer.state_dict())
    put(lp + "embed_tokens.weight", tr.model.model.embed_tokens.weight)
    put(lp + "enorm.weight", tr.mtp.enorm.weight)
    put(lp + "hnorm.weight", tr.mtp.hnorm.weight)
    put(lp + "eh_proj.weight", tr.mtp.eh_proj.weight)
    put(lp + "shared_head.norm.weight", tr.mtp.head_norm.weight)
    put(lp + "shared_head.head.weight", tr.model.lm_head.weight)
    # Two shards split at the MTP block, with the index real checkpoints have.
    names = sorted(sd)
    shard_of = {k: (2 if k.startswith(lp) else 1) for k in names}
    files = []
    wm = {}
    for i in (1, 2):
        fn = f"model-0000{i}-of-00002.safetensors"
        part = {k: sd[k] for k in names if shard_of[k] == i}
        save_file(part, os.path.join(out, fn), metadata={"format": "pt"})
        files.append(fn)
        wm.update({k: fn for k in part})
    total = sum(t.numel() * t.element_size() for t in sd.values())
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(wm.items()))}, f, indent=1)
        f.write("\n")
    return files


def evaluate_exported(out, val_ids, dev, S):
    """Reload the exported FP8 files (dequantised with DeepSeek's formula) into HF: missing/unexpected
    tensors, validation loss (sparse as configured, and dense), MTP loss and MTP top-1 == main top-1 at t+1."""
    import torch
    import torch.nn.functional as F
    from safetensors import safe_open
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    with open(os.path.join(out, "config.json")) as f:
        raw = json.load(f)
    n = raw["num_hidden_layers"]
    t = {}
    for fn in sorted(os.listdir(out)):
        if fn.endswith(".safetensors"):
            with safe_open(os.path.join(out, fn), framework="pt") as f:
                for k in f.keys():
                    t[k] = f.get_tensor(k)
    deq = {}
    for k, v in t.items():
        if k.endswith("_scale_inv"):
            continue
        if v.dtype == torch.float8_e4m3fn:
            s = t[k + "_scale_inv"]
            deq[k] = v.float() * expand_scales(s, v.shape)
        else:
            deq[k] = v.float()
    cfg = dict(raw)
    cfg.pop("quantization_config", None)
    cfg["dtype"] = "float32"
    with tempfile.TemporaryDirectory(prefix="train_tiny_eval_") as tmp:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(cfg, f)
        save_file({k: v.contiguous() for k, v in deq.items()}, os.path.join(tmp, "model.safetensors"))
        model, info = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32, attn_implementation="eager",
                                                           experts_implementation="eager", output_loading_info=True)
    lp = f"model.layers.{n}."
    unexpected = sorted(info.get("unexpected_keys", []))
    hf_load = {"missing": sorted(info.get("missing_keys", [])),
               "unexpected_outside_mtp": [k for k in unexpected if not k.startswith(lp)],
               "unexpected_mtp_block": len([k for k in unexpected if k.startswith(lp)]),
               "mismatched": [str(x) for x in info.get("mismatched_keys", [])]}
    if hf_load["missing"] or hf_load["unexpected_outside_mtp"] or hf_load["mismatched"]:
        raise SystemExit(f"HF load of the export: {hf_load}")
    model = model.to(dev).eval()
    # The MTP block as scripts/hf_golden.py builds it (strict load of the checkpoint's layer-n tensors).
    tr = Trainer.__new__(Trainer)
    tr.torch = torch
    tr.model, tr.config, tr.n = model, model.config, n
    hc = copy.deepcopy(model.config)
    hc.num_hidden_layers = n + 1
    if getattr(hc, "mlp_layer_types", None) is not None:
        hc.mlp_layer_types = list(hc.mlp_layer_types)[:n] + ["sparse"]
    if getattr(hc, "layer_types", None) is not None:
        hc.layer_types = list(hc.layer_types)[:n] + [hc.layer_types[0]]
    if getattr(hc, "indexer_types", None) is not None:
        hc.indexer_types = list(hc.indexer_types)[:n] + ["full"]
    tr.mtp_config = hc
    layer = type(model.model.layers[0])(hc, layer_idx=n)
    lsd = {}
    for k, v in deq.items():
        if k.startswith(lp) and k[len(lp):] not in MTP_EXTRA:
            lsd[k[len(lp):]] = v
    fused = {}
    for k in list(lsd):
        mm = re.match(r"mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$", k)
        if mm:
            fused.setdefault(mm.group(2), {})[int(mm.group(1))] = lsd.pop(k)
    ne = len(fused["gate_proj"])
    lsd["mlp.experts.gate_up_proj"] = torch.stack([torch.cat([fused["gate_proj"][e], fused["up_proj"][e]], 0) for e in range(ne)])
    lsd["mlp.experts.down_proj"] = torch.stack([fused["down_proj"][e] for e in range(ne)])
    layer.load_state_dict(lsd, strict=True)
    norm_cls = type(model.model.norm)
    H, eps = hc.hidden_size, hc.rms_norm_eps
    import torch.nn as nn
    mtp = nn.Module()
    mtp.layer = layer
    mtp.enorm, mtp.hnorm, mtp.head_norm = norm_cls(H, eps), norm_cls(H, eps), norm_cls(H, eps)
    mtp.enorm.weight.data.copy_(deq[lp + "enorm.weight"])
    mtp.hnorm.weight.data.copy_(deq[lp + "hnorm.weight"])
    mtp.head_norm.weight.data.copy_(deq[lp + "shared_head.norm.weight"])
    mtp.eh_proj = nn.Linear(2 * H, H, bias=False)
    mtp.eh_proj.weight.data.copy_(deq[lp + "eh_proj.weight"])
    tr.mtp = mtp.to(dev).eval()
    tr.capture = False
    tr.indexers = [l.self_attn.indexer for l in model.model.layers] + [layer.self_attn.indexer]
    topk = raw["index_topk"]
    res = {"hf_load": hf_load}
    nw = (len(val_ids) - 2) // S
    for mode in ("sparse", "dense"):
        tr.set_topk(topk if mode == "sparse" else None)
        tot = mtot = agree = cnt = 0.0
        with torch.no_grad():
            for i in range(0, nw, 16):
                ws = [val_ids[j * S: j * S + S + 2] for j in range(i, min(nw, i + 16))]
                w = torch.stack(ws).to(dev)
                x, y, y2 = w[:, :S], w[:, 1:S + 1], w[:, 2:S + 2]
                lg, mlg = tr.forward(x, y)
                tot += float(F.cross_entropy(lg.reshape(-1, lg.shape[-1]), y.reshape(-1), reduction="sum"))
                mtot += float(F.cross_entropy(mlg.reshape(-1, lg.shape[-1]), y2.reshape(-1), reduction="sum"))
                # Speculation proxy: the MTP draft at t equals the main model's argmax at t+1.
                agree += float((mlg[:, :-1].argmax(-1) == lg[:, 1:].argmax(-1)).sum())
                cnt += x.numel()
        pos = cnt - nw
        res[mode] = {"loss": round(tot / cnt, 4), "mtp_loss": round(mtot / cnt, 4),
                     "mtp_top1_matches_main_next": round(agree / pos, 4)}
    res["windows"] = nw
    return res


# Trainer.set_topk is used on a Trainer made without __init__ in evaluate_exported.
def _set_topk(self, k):
    for ix in self.indexers:
        ix.index_topk = k if k is not None else 1 << 30


Trainer.set_topk = _set_topk


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("corpus", help="extract the KJV text (needs the bible-kjv package)")
    c.add_argument("--out", required=True)
    c.add_argument("--data-dir", default="/usr/lib", help="where bible.data is (bible-kjv-text)")
    t = sub.add_parser("tokenizer", help="train a family's byte-level BPE tokenizer and write its configs")
    t.add_argument("--family", choices=sorted(MODELS), required=True)
    t.add_argument("--corpus", required=True)
    t.add_argument("--out", required=True)
    r = sub.add_parser("train", help="train, export FP8 and evaluate one model")
    r.add_argument("--family", choices=sorted(MODELS), required=True)
    r.add_argument("--corpus", required=True)
    r.add_argument("--tokenizer-dir", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--steps", type=int, default=0, help="0: from --budget-s after timing the first steps")
    r.add_argument("--budget-s", type=float, default=150)
    r.add_argument("--max-steps", type=int, default=2500, help="cap of the step count --budget-s picks "
                   "(2500 x 32 x 256 tokens is ~20 passes over the training text)")
    r.add_argument("--batch", type=int, default=32)
    r.add_argument("--seq-len", type=int, default=256)
    r.add_argument("--lr", type=float, default=3e-3)
    r.add_argument("--indexer-lr", type=float, default=1e-3)
    r.add_argument("--mtp-weight", type=float, default=0.3)
    r.add_argument("--no-qat", action="store_true")
    r.add_argument("--device", default="cuda")
    a = ap.parse_args()
    {"corpus": cmd_corpus, "tokenizer": cmd_tokenizer, "train": cmd_train}[a.cmd](a)


if __name__ == "__main__":
    main()
