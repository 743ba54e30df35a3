"""Real vLLM 0.33 around the TileRT connector, on a CPU-only machine.

Everything is vLLM's own -- its config (EngineArgs), KV-cache planning
(get_global_kv_cache_groups / get_kv_cache_configs), allocation
(allocate_kv_cache: the 4-D strided views of one shared buffer), the
Scheduler or AsyncScheduler, the connector factory loading the plugin by
module path, and the V2 model runner's worker-side wrapper
(ActiveKVConnector) with its hook order -- except the model forward, which
writes known bytes at the positions each step computes.

Not a pytest module: test_vllm_real.py uses it (and skips without vLLM).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import socket
import string
import struct
import tempfile
import threading
from dataclasses import dataclass, field

import torch

PAGE = 64
MLA_TOKEN = 656
IDX_TOKEN = 132


def synth_config(model_type: str, layers: int, out_dir: str) -> str:
    """A minimal HF config.json of the model's architecture (vLLM needs one
    to build its ModelConfig; weights are never loaded)."""
    os.makedirs(out_dir, exist_ok=True)
    arch = {"deepseek_v32": "DeepseekV32ForCausalLM", "glm_moe_dsa": "GlmMoeDsaForCausalLM"}[model_type]
    cfg = {
        "architectures": [arch], "model_type": model_type, "hidden_size": 256, "intermediate_size": 512,
        "moe_intermediate_size": 64, "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 4,
        "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
        "first_k_dense_replace": 1, "moe_layer_freq": 1, "kv_lora_rank": 512, "q_lora_rank": 96,
        "qk_nope_head_dim": 32, "qk_rope_head_dim": 64, "v_head_dim": 32, "vocab_size": 1024,
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "rope_theta": 10000, "index_head_dim": 128,
        "index_n_heads": 4, "index_topk": 32, "num_nextn_predict_layers": 1, "topk_method": "noaux_tc",
        "scoring_func": "sigmoid", "norm_topk_prob": True, "routed_scaling_factor": 2.5, "tie_word_embeddings": False,
        "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "bfloat16",
    }
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f)
    return out_dir


# --------------------------------------------------------------------------
# The sidecar's socket side (the Go sidecar is tested against the plugin in
# roles/prefillshim; here only what vLLM's side hands over matters).
# --------------------------------------------------------------------------


class FakeSidecar:
    def __init__(self, refuse=None):
        self.root = tempfile.mkdtemp(prefix="tvs")
        self.path = os.path.join(self.root, "s.sock")
        self.staging = os.path.join(self.root, "staging")
        os.mkdir(self.staging)
        self.refuse = refuse
        self.stages: list[dict] = []
        self.files: dict[str, bytes] = {}
        self.connections = 0
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(self.path)
        self.srv.listen(8)
        threading.Thread(target=self._serve, daemon=True).start()

    @staticmethod
    def _recv(c, n):
        buf = b""
        while len(buf) < n:
            chunk = c.recv(n - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        return buf

    def _serve(self):
        while True:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._conn, args=(c,), daemon=True).start()

    def _conn(self, c):
        try:
            while True:
                (n,) = struct.unpack(">I", self._recv(c, 4))
                m = json.loads(self._recv(c, n))
                if m["type"] == "hello":
                    r = {"type": "hello", "protocol_version": 1, "staging_dir": self.staging,
                         "staging_bytes": 1 << 30, "transport": "tcp"}
                elif m["type"] == "poll":
                    r = {"type": "released", "released": []}
                else:
                    self.stages.append(m)
                    with open(m["path"], "rb") as f:
                        self.files[m["rid"]] = f.read()
                    os.unlink(m["path"])
                    r = ({"type": "error", "rid": m["rid"], "error": self.refuse, "message": "test"}
                         if self.refuse else {"type": "queued", "rid": m["rid"], "queue_depth": 1})
                b = json.dumps(r).encode()
                c.sendall(struct.pack(">I", len(b)) + b)
        except (EOFError, OSError):
            c.close()

    def close(self):
        self.srv.close()


# --------------------------------------------------------------------------
# vLLM
# --------------------------------------------------------------------------


@dataclass
class Setup:
    model: str = "deepseek_v32"  # or glm_moe_dsa
    layers: int = 61  # num_hidden_layers; the MTP layer is one more
    block_size: int = 64
    layout: str = "LBNHC"  # or BLNHC
    async_scheduling: bool = False
    chunk: int = 256  # max_num_batched_tokens: prompts longer than this are chunked
    num_blocks: int = 96
    hma: bool = False
    extra: dict = field(default_factory=dict)
    mtp: bool = True
    indexer_skip: tuple = ()  # backbone layers without an indexer cache (GLM-5's shared top-k)
    max_len: int = 2048


def make_config(s: Setup, socket_path: str, root: str):
    from vllm.engine.arg_utils import EngineArgs

    model_dir = synth_config(s.model, s.layers, os.path.join(root, f"{s.model}-{s.layers}"))
    extra = {"tilert_host": "10.0.0.9", "tilert_ctrl_port": 5556, "tilert_model":
             "deepseek-v3.2" if s.model == "deepseek_v32" else "glm5",
             "tilert_max_seq_len": 8192, "tilert_sidecar_socket": socket_path, **s.extra}
    args = EngineArgs(model=model_dir, kv_cache_dtype="fp8_ds_mla", block_size=s.block_size, enforce_eager=True,
                      max_model_len=s.max_len, skip_tokenizer_init=True, load_format="dummy",
                      max_num_batched_tokens=s.chunk, max_num_seqs=8, async_scheduling=s.async_scheduling,
                      num_gpu_blocks_override=s.num_blocks, enable_prefix_caching=True,
                      kv_transfer_config={"kv_connector": "TileRTConnector",
                                          "kv_connector_module_path": "tilert.pd_vllm.prefill_connector",
                                          "kv_role": "kv_producer", "kv_connector_extra_config": extra})
    cfg = args.create_engine_config()
    # vLLM's CPU platform rewrites what a GPU deployment runs with (block
    # size 16, no chunked prefill or prefix caching): put the GPU values back.
    cfg.cache_config.block_size = s.block_size
    cfg.cache_config.enable_prefix_caching = True
    cfg.scheduler_config.enable_chunked_prefill = True
    cfg.scheduler_config.max_num_batched_tokens = s.chunk
    cfg.scheduler_config.async_scheduling = s.async_scheduling
    cfg.scheduler_config.disable_hybrid_kv_cache_manager = not s.hma
    return cfg


def kv_specs(s: Setup) -> dict:
    """Per-layer specs exactly as vLLM 0.33's DeepSeek-V3.2 / GLM-5 layers
    return them (MLAAttention.get_kv_cache_spec, DeepseekV32IndexerCache)."""
    from vllm.v1.kv_cache_interface import MLAAttentionSpec, SparseCacheRole, get_kv_quant_mode

    specs = {}
    for i in range(s.layers + (1 if s.mtp else 0)):
        has_idx = i not in s.indexer_skip
        specs[f"model.layers.{i}.self_attn.attn"] = MLAAttentionSpec(
            block_size=s.block_size, num_kv_heads=1, max_tp_shards=1, head_size=576, dtype=torch.uint8,
            cache_dtype_str="fp8_ds_mla", kv_quant_mode=get_kv_quant_mode("fp8_ds_mla"), state_content_bytes=656,
            is_index_group_leader=has_idx)
        if has_idx:
            specs[f"model.layers.{i}.self_attn.indexer.k_cache"] = MLAAttentionSpec(
                block_size=s.block_size, num_kv_heads=1, max_tp_shards=1, head_size=IDX_TOKEN, dtype=torch.uint8,
                cache_role=SparseCacheRole.INDEXER)
    return specs


def plan_and_allocate(cfg, s: Setup):
    """vLLM's planning and allocation: (kv_cache_config, {layer: tensor})."""
    from vllm.v1.attention.backends.utils import resolve_kv_cache_layout
    from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs
    from vllm.v1.core.kv_cache_utils import generate_scheduler_kv_cache_config
    from vllm.v1.worker.utils import allocate_kv_cache

    specs = kv_specs(s)
    layout = resolve_kv_cache_layout(cfg, [[s.layout]], specs.values())
    groups = get_global_kv_cache_groups(cfg, [specs])
    kc = get_kv_cache_configs(cfg, [specs], [1 << 40], groups)[0]
    kc.kv_cache_layout = cfg.cache_config.kv_cache_layout
    sched_kc = generate_scheduler_kv_cache_config([kc])
    cfg.cache_config.num_gpu_blocks = sched_kc.num_blocks
    # The attention kernels' block is 64 tokens (FlashMLA sparse, the
    # indexer); vLLM splits larger manager blocks into kernel blocks only
    # for layer-compact layouts (prepare_kernel_block_sizes' rule).
    block_outer = any(t.block_stride > t.layer_stride for t in kc.kv_cache_tensors)
    kernel = [s.block_size if block_outer else min(s.block_size, PAGE) for _ in kc.kv_cache_groups]
    caches = allocate_kv_cache(kc, torch.device("cpu"), layout, kernel)
    for t in caches.values():  # stale bytes: earlier requests' leftovers
        t.view(torch.uint8).fill_(0xA5) if t.dtype == torch.uint8 else None
    return kc, sched_kc, caches


_DIST = False


def init_distributed(cfg) -> None:
    """A one-process gloo world, as a single-GPU worker has (the worker-side
    connector factory syncs its engine id over the TP group)."""
    global _DIST
    if _DIST:
        return
    from vllm.config import set_current_vllm_config
    from vllm.distributed.parallel_state import ensure_model_parallel_initialized, init_distributed_environment

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with set_current_vllm_config(cfg):
        init_distributed_environment(world_size=1, rank=0, distributed_init_method=f"tcp://127.0.0.1:{port}",
                                     local_rank=0, backend="gloo")
        ensure_model_parallel_initialized(1, 1, backend="gloo")
    _DIST = True


def random_suffix(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_lowercase + string.digits) for _ in range(8))


class Engine:
    """The engine core's loop around a real scheduler and the worker-side
    connector wrapper, with a fake forward."""

    def __init__(self, s: Setup, sidecar_path: str, root: str):
        from vllm.distributed.kv_transfer import kv_transfer_state
        from vllm.distributed.kv_transfer.kv_transfer_state import ensure_kv_transfer_initialized, get_kv_transfer_group
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.structured_output import StructuredOutputManager
        from vllm.v1.worker.gpu.kv_connector import get_kv_connector

        self.s = s
        self.cfg = make_config(s, sidecar_path, root)
        self.kc, self.sched_kc, self.caches = plan_and_allocate(self.cfg, s)
        cls = AsyncScheduler if s.async_scheduling else Scheduler
        self.sched = cls(vllm_config=self.cfg, kv_cache_config=self.sched_kc,
                         structured_output_manager=StructuredOutputManager(self.cfg), block_size=s.block_size)
        kv_transfer_state._KV_CONNECTOR_AGENT = None
        init_distributed(self.cfg)
        ensure_kv_transfer_initialized(self.cfg, self.kc)
        self.worker = get_kv_transfer_group()
        self.runner_conn = get_kv_connector(self.cfg, self.caches)  # V2's ActiveKVConnector
        hash_fn = get_hash_fn_by_name(self.cfg.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self.hasher = get_request_block_hasher(s.block_size, hash_fn)
        self.rng = random.Random(7)
        self.block_tables: dict[str, list[list[int]]] = {}
        self.written: dict[str, int] = {}  # positions written per request
        self.salt: dict[str, int] = {}
        self.finished: list = []
        self.hooks: list[str] = []
        self._pending = []  # (scheduler_output, runner output) for the async engine loop
        self.resumed: set[str] = set()  # requests vLLM preempted and rescheduled
        self._wrap_hooks()

    def _wrap_hooks(self):
        w = self.worker
        for name in ("handle_preemptions", "bind_connector_metadata", "start_load_kv", "finish_forward",
                     "wait_for_save", "get_finished", "clear_connector_metadata"):
            orig = getattr(w, name)

            def wrapped(*a, _o=orig, _n=name, **k):
                self.hooks.append(_n)
                return _o(*a, **k)

            setattr(w, name, wrapped)

    def add(self, name: str, prompt: list[int], params: dict | None, max_tokens: int = 1) -> str:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        rid = f"{name}-{random_suffix(self.rng)}"  # as vLLM's front end names requests
        sp = SamplingParams(max_tokens=max_tokens, extra_args={"kv_transfer_params": params} if params else None)
        req = Request(request_id=rid, prompt_token_ids=list(prompt), sampling_params=sp, pooling_params=None,
                      block_hasher=self.hasher)
        self.salt[rid] = len(self.salt) * 31 + 5
        self.sched.add_request(req)
        return rid

    # -- the fake forward -------------------------------------------------

    def row_bytes(self, rid: str, layer: int, kind: str, positions: torch.Tensor) -> torch.Tensor:
        """The known bytes the forward writes: a function of request, layer,
        kind and position."""
        width = MLA_TOKEN if kind == "mla" else IDX_TOKEN
        p = positions.to(torch.int64)[:, None]
        j = torch.arange(width, dtype=torch.int64)[None, :]
        k = 1 if kind == "mla" else 2
        return ((p * 7 + j * 3 + layer * 13 + k * 101 + self.salt[rid]) % 251).to(torch.uint8)

    def _write(self, rid, positions, layers=None):
        table = self.block_tables[rid]
        lay = self._layer_views()
        for (layer, kind), (t, group) in lay.items():
            if layers is not None and layer not in layers:
                continue
            ids = table[group]
            rows = self.row_bytes(rid, layer, kind, positions)
            n_tok = t.shape[-2]  # kernel block tokens
            ratio = self.s.block_size // n_tok
            for i, pos in enumerate(positions.tolist()):
                kb = ids[pos // self.s.block_size] * ratio + (pos % self.s.block_size) // n_tok
                off = pos % n_tok
                blk = t[kb].reshape(-1)  # one block's bytes (a view)
                if kind == "mla":
                    blk[off * MLA_TOKEN:(off + 1) * MLA_TOKEN] = rows[i]
                else:  # block-major: values, then float32 scales
                    blk[off * 128:(off + 1) * 128] = rows[i][:128]
                    blk[n_tok * 128 + off * 4:n_tok * 128 + off * 4 + 4] = rows[i][128:]

    def _layer_views(self):
        if not hasattr(self, "_lv"):
            group_of = {n: g for g, grp in enumerate(self.kc.kv_cache_groups) for n in grp.layer_names}
            self._lv = {}
            for name, t in self.caches.items():
                layer = int(name.split(".")[2])
                kind = "indexer" if ".indexer." in name else "mla"
                self._lv[(layer, kind)] = (t.view(torch.uint8) if t.dtype != torch.uint8 else t, group_of[name])
        return self._lv

    def expected(self, rid: str, seq_len: int) -> dict:
        """Per region, the used spans' expected bytes: {(layer, kind): [(start, bytes)]}."""
        out = {}
        pos = torch.arange(seq_len)
        for (layer, kind) in self._layer_views():
            rows = self.row_bytes(rid, layer, kind, pos)
            spans = []
            if kind == "mla":
                spans.append((0, rows.reshape(-1).numpy().tobytes()))
            else:
                for p in range(math.ceil(seq_len / PAGE)):
                    r = rows[p * PAGE:(p + 1) * PAGE]
                    base = p * PAGE * IDX_TOKEN
                    spans.append((base, r[:, :128].reshape(-1).numpy().tobytes()))
                    spans.append((base + PAGE * 128, r[:, 128:].reshape(-1).numpy().tobytes()))
            out[(layer, kind)] = spans
        return out

    # -- one engine step ----------------------------------------------------

    def step(self, drop_outputs: bool = False):
        """schedule -> worker (V2 hook order) -> update_from_output. With the
        AsyncScheduler the next step is scheduled before this one's output
        is processed, as the engine core's batch queue does."""
        from vllm.v1.outputs import ModelRunnerOutput

        out = self.sched.schedule()
        for nr in out.scheduled_new_reqs:
            self.block_tables[nr.req_id] = [list(g) for g in nr.block_ids]
        cr = out.scheduled_cached_reqs
        self.resumed |= set(cr.resumed_req_ids)
        for i, rid in enumerate(cr.req_ids):
            nb = cr.new_block_ids[i]
            if rid in cr.resumed_req_ids:
                self.block_tables[rid] = [list(g) for g in nb] if nb is not None else [[] for _ in self.kc.kv_cache_groups]
            elif nb is not None:
                for g, ids in enumerate(nb):
                    self.block_tables[rid][g].extend(ids)
        computed = {nr.req_id: nr.num_computed_tokens for nr in out.scheduled_new_reqs}
        computed.update(dict(zip(cr.req_ids, cr.num_computed_tokens)))

        rc = self.runner_conn
        rc.pre_forward(out)
        mtp_layer = self.s.layers if self.s.mtp else None
        sampled = {}
        for rid, n in out.num_scheduled_tokens.items():
            req = self.sched.requests[rid]
            start = computed[rid]
            pos = torch.arange(start, start + n)
            prompt_len = len(req.prompt_token_ids)
            pos = pos[pos < prompt_len + max(0, req.num_output_tokens)]
            backbone = set(range(self.s.layers))
            self._write(rid, pos, layers=backbone)
            if start + n >= prompt_len:
                sampled[rid] = [7 + len(sampled)]
        rc.finish_forward()
        kv_out = rc.post_forward(out.finished_req_ids, defer_finalize=self.s.mtp)
        if self.s.mtp:  # the drafter writes the MTP layer after post_forward (V2 order)
            for rid, n in out.num_scheduled_tokens.items():
                start = computed[rid]
                req = self.sched.requests[rid]
                pos = torch.arange(start, start + n)
                pos = pos[pos < len(req.prompt_token_ids) + max(0, req.num_output_tokens)]
                self._write(rid, pos, layers={mtp_layer})
            rc.finalize_step()
        ids = list(out.num_scheduled_tokens)
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=[sampled.get(r, []) for r in ids], kv_connector_output=kv_out)
        if self.s.async_scheduling:
            self._pending.append((out, mro))
            if len(self._pending) >= 2:
                self._process(*self._pending.pop(0))
        else:
            self._process(out, mro)
        return out

    def _process(self, out, mro):
        outs = self.sched.update_from_output(out, mro)
        for eco in outs.values():
            for o in eco.outputs:
                if o.finish_reason is not None:
                    self.finished.append(o.request_id)

    def drain(self, steps: int = 20):
        for _ in range(steps):
            self.step()
        while self._pending:
            self._process(*self._pending.pop(0))

    def free_blocks(self) -> int:
        return self.sched.kv_cache_manager.block_pool.get_num_free_blocks()

    def close(self):
        from vllm.distributed.kv_transfer import kv_transfer_state

        self.worker.shutdown()
        kv_transfer_state._KV_CONNECTOR_AGENT = None


def digest(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()[:16]
