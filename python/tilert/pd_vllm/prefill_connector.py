"""TileRT prefill connector for vLLM V1 (a pure kv_producer).

Loaded by vLLM from the launch command line::

    --kv-transfer-config '{"kv_connector": "TileRTConnector",
        "kv_connector_module_path": "tilert.pd_vllm.prefill_connector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"tilert_host": ..., "tilert_ctrl_port": 5556,
                                      "tilert_model": "glm5", "tilert_max_seq_len": 202752}}'

What it does, and nothing more:

* It claims only requests whose ``kv_transfer_params`` carry ``tilert_host``
  and ``tilert_rid`` (the TileRT router sets both, plus ``tilert_ctrl_port``).
  For every other request it is a strict no-op, so native-pool traffic can
  share the prefill instance and even a forward batch.
* It never loads KV and never touches scheduling or sampling:
  ``get_num_new_matched_tokens`` is always ``(0, False)``.
* In ``wait_for_save`` -- after the forward and the MTP drafter wrote this
  step's cache entries -- it hands each claimed request whose prompt is now
  complete to the ``tilert connector-sidecar``, which ships it to the decode
  node in the background (docs/PROTOCOL.md section 8). Two ways:

  - zero-copy (``ipc``): once, at the first hand-off, the plugin gives the
    sidecar CUDA IPC handles of vLLM's cache allocation and each layer's
    geometry; per request it sends only block ids. The sidecar maps the cache
    and sends the blocks from this GPU's memory. The request's blocks stay
    allocated (``request_finished`` returns True) until the sidecar says it
    has read them; ``get_finished`` then reports the request so vLLM frees
    them. The forward never copies anything.
  - ``shm``: the plugin copies the request's blocks into a staging file in
    /dev/shm inside ``wait_for_save`` and the sidecar ships the file (for
    machines where CUDA IPC is not available, or CPU tensors).

  ``tilert_transfer`` in ``kv_connector_extra_config`` picks ``ipc``, ``shm``
  or ``auto`` (the default: ipc when the caches are CUDA tensors and the
  sidecar can map them).

Layouts are vLLM's own, read from the registered tensors (cache_layout.py):
fp8_ds_mla 656 bytes per token, token-interleaved; the indexer key cache
8448 bytes per 64-token block. Whole pages are copied byte for byte.

Only the first tensor-parallel rank ships: MLA latents and indexer keys are
replicated across TP ranks. Pipeline and context parallelism are refused at
start-up (they split layers or tokens across ranks).
"""

from __future__ import annotations

import base64
import logging
import math
import mmap
import os
import queue
import re
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

try:  # vLLM >= 0.11: the hybrid KV cache manager's connector interface
    from vllm.distributed.kv_transfer.kv_connector.v1.base import SupportsHMA
except ImportError:  # pragma: no cover - older vLLM

    class SupportsHMA:  # type: ignore[no-redef]
        pass


from .cache_layout import (  # noqa: E402
    PAGE_TOKENS,
    LayerCache,
    LayoutError,
    describe,
    dtype_label,
    parse_layer_name,
)
from .sidecar_client import SidecarClient, SidecarError  # noqa: E402

__all__ = ["TileRTConnector", "TileRTConnectorMetadata", "SendSpec", "claim_params", "parse_layer_name",
           "SidecarClient", "SidecarError", "LayoutError", "BLOCK_SIZE"]

logger = logging.getLogger("tilert.pd_vllm")

BLOCK_SIZE = PAGE_TOKENS
DEFAULT_SOCKET = "/tmp/tilert-sidecar.sock"
TRANSFER_MODES = ("auto", "ipc", "shm")


def claim_params(kv_transfer_params: Any) -> dict | None:
    """The request's TileRT routing, or None when it is not ours."""
    if isinstance(kv_transfer_params, dict) and kv_transfer_params.get("tilert_host"):
        return kv_transfer_params
    return None


def _tp_rank() -> int:
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except Exception:  # not initialised (tests) or not importable: single rank
        return 0


def check_config(vllm_config) -> None:
    """Refuse, at start-up, configurations whose state the decode node cannot
    take, naming the setting."""
    ktc = vllm_config.kv_transfer_config
    extra = dict(getattr(ktc, "kv_connector_extra_config", None) or {})
    if not extra.get("tilert_model"):
        raise ValueError("TileRTConnector: kv_connector_extra_config.tilert_model is required (glm5 or deepseek-v3.2)")
    mode = str(extra.get("tilert_transfer") or "auto")
    if mode not in TRANSFER_MODES:
        raise ValueError(f"TileRTConnector: kv_connector_extra_config.tilert_transfer is {mode!r}; use one of {TRANSFER_MODES}")
    role = getattr(ktc, "kv_role", "kv_producer")
    if role == "kv_consumer":
        raise ValueError("TileRTConnector is a producer: set kv_role to kv_producer (the TileRT decode node consumes)")
    pc = getattr(vllm_config, "parallel_config", None)
    for attr, flag, why in (
        ("pipeline_parallel_size", "--pipeline-parallel-size", "splits the layers across ranks"),
        ("decode_context_parallel_size", "--decode-context-parallel-size", "shards each request's tokens across ranks"),
        ("prefill_context_parallel_size", "--prefill-context-parallel-size", "shards each request's tokens across ranks"),
    ):
        n = int(getattr(pc, attr, 1) or 1) if pc is not None else 1
        if n > 1:
            raise ValueError(f"TileRTConnector: {flag} {n} {why}; the connector ships one rank's whole cache. "
                             f"Run the TileRT prefill with {flag} 1")
    cc = getattr(vllm_config, "cache_config", None)
    bs = int(getattr(cc, "block_size", None) or PAGE_TOKENS)
    if bs % PAGE_TOKENS:
        raise ValueError(f"TileRTConnector: --block-size {bs} is not a multiple of {PAGE_TOKENS}, the decode node's "
                         f"page; run vLLM with --block-size {PAGE_TOKENS}")


@dataclass
class SendSpec:
    """One claimed request whose prefill completes in this step."""

    req_id: str
    rid: str
    host: str
    ctrl_port: int
    seq_len: int
    last_prompt_token: int
    block_ids: list[list[int]]  # scheduler blocks, per KV cache group


@dataclass
class TileRTConnectorMetadata(KVConnectorMetadata):
    sends: list[SendSpec] = field(default_factory=list)


@dataclass
class _Claim:
    rid: str
    host: str
    ctrl_port: int
    prompt_token_ids: list[int]
    block_ids: list[list[int]] = field(default_factory=list)


def _block_lists(ids) -> list[list[int]]:
    """vLLM's per-group block ids (tuple of lists) as lists."""
    return [list(g) for g in ids] if ids else []


class TileRTConnector(KVConnectorBase_V1, SupportsHMA):
    """vLLM V1 KV connector: hands TileRT-bound requests' state to the sidecar."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        check_config(vllm_config)
        ktc = vllm_config.kv_transfer_config
        extra = dict(getattr(ktc, "kv_connector_extra_config", None) or {})
        self.default_host = extra.get("tilert_host")
        self.default_ctrl_port = int(extra.get("tilert_ctrl_port") or 5556)
        self.model = str(extra["tilert_model"])
        self.max_seq_len = int(extra.get("tilert_max_seq_len") or 0)
        self.transfer = str(extra.get("tilert_transfer") or "auto")
        self.socket_path = str(extra.get("tilert_sidecar_socket") or os.environ.get("TILERT_SIDECAR_SOCKET") or DEFAULT_SOCKET)
        cc = getattr(vllm_config, "cache_config", None)
        self.block_size = int(getattr(cc, "block_size", None) or PAGE_TOKENS)
        self._kv_cache_cfg = kv_cache_config

        # scheduler side
        self._claims: dict[str, _Claim] = {}
        self._shipped: set[str] = set()  # req ids whose blocks the worker holds until get_finished
        # worker side
        self._layers: list[LayerCache] = []
        self.kv_cache_dtype: str | None = None
        self._sidecar: SidecarClient | None = None
        self._seq = 0
        self._lock = threading.Lock()
        self._pending: dict[str, str] = {}  # req id -> "staging" | "released"
        self._finished_seen: set[str] = set()
        self._ipc_state: str | None = None  # None: undecided, "on", "off"
        self._ipc_msg: dict | None = None
        self._sender: threading.Thread | None = None
        self._send_q: queue.Queue | None = None
        self.staged: list[str] = []  # rids handed to the sidecar (for tests and logs)
        self.mode_used: str | None = None

    # ------------------------------------------------------------------
    # Scheduler side
    # ------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int | None, bool]:
        # A pure producer never loads external KV.
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        p = claim_params(getattr(request, "kv_transfer_params", None))
        if p is None or request.request_id in self._claims:
            return
        rid = p.get("tilert_rid")
        if not rid:
            # vLLM appends random characters to its request ids, so its id is
            # never a name the router or the decode node know.
            logger.error("TileRTConnector: request %s has tilert_host but no tilert_rid in kv_transfer_params; "
                         "not shipped (send requests through the TileRT router)", request.request_id)
            return
        prompt = list(request.prompt_token_ids or [])
        if not prompt:
            logger.error("TileRTConnector: request %s has no prompt token ids; not shipped", request.request_id)
            return
        if self.max_seq_len and len(prompt) > self.max_seq_len:
            logger.error("TileRTConnector: request %s has %d prompt tokens, tilert_max_seq_len is %d; not shipped",
                         request.request_id, len(prompt), self.max_seq_len)
            return
        self._claims[request.request_id] = _Claim(
            rid=str(rid),
            host=str(p.get("tilert_host") or self.default_host),
            ctrl_port=int(p.get("tilert_ctrl_port") or self.default_ctrl_port),
            prompt_token_ids=prompt,
        )

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        meta = TileRTConnectorMetadata()
        if not self._claims:
            return meta
        for new in scheduler_output.scheduled_new_reqs:
            c = self._claims.get(new.req_id)
            if c is not None:
                c.block_ids = _block_lists(new.block_ids)
                self._maybe_send(meta, new.req_id, c, new.num_computed_tokens, scheduler_output)
        cached = scheduler_output.scheduled_cached_reqs
        resumed = getattr(cached, "resumed_req_ids", set()) or set()
        for i, req_id in enumerate(cached.req_ids):
            c = self._claims.get(req_id)
            if c is None:
                continue
            nb = cached.new_block_ids[i]
            if nb is not None:
                if req_id in resumed:  # preempted and rescheduled: a fresh block table
                    c.block_ids = _block_lists(nb)
                else:
                    if not c.block_ids:
                        c.block_ids = [[] for _ in nb]
                    for g, ids in enumerate(nb):
                        c.block_ids[g].extend(ids)
            elif req_id in resumed:
                c.block_ids = []
            self._maybe_send(meta, req_id, c, cached.num_computed_tokens[i], scheduler_output)
        return meta

    def _maybe_send(self, meta, req_id: str, c: _Claim, num_computed: int, scheduler_output) -> None:
        # Ship once, in the step whose forward computes the last prompt token
        # (chunked prefill spreads a prompt over several steps).
        n = len(c.prompt_token_ids)
        if num_computed + scheduler_output.num_scheduled_tokens.get(req_id, 0) < n:
            return
        need = math.ceil(n / self.block_size)
        if not c.block_ids or any(len(g) < need for g in c.block_ids):
            logger.error("TileRTConnector: request %s (rid %s) has blocks %s for %d prompt tokens; not shipped",
                         req_id, c.rid, [len(g) for g in c.block_ids], n)
        else:
            meta.sends.append(SendSpec(req_id=req_id, rid=c.rid, host=c.host, ctrl_port=c.ctrl_port, seq_len=n,
                                       last_prompt_token=int(c.prompt_token_ids[-1]),
                                       block_ids=[g[:need] for g in c.block_ids]))
            self._shipped.add(req_id)
        del self._claims[req_id]

    def request_finished(self, request, block_ids) -> tuple[bool, dict[str, Any] | None]:
        # A shipped request's blocks stay allocated until the worker reports
        # it in get_finished (the sidecar may read them straight from the
        # GPU). A request that finished before its prefill completed
        # (aborted) just drops its claim.
        self._claims.pop(request.request_id, None)
        if request.request_id in self._shipped:
            self._shipped.discard(request.request_id)
            return True, None
        return False, None

    def request_finished_all_groups(self, request, block_ids) -> tuple[bool, dict[str, Any] | None]:
        # The hybrid KV cache manager's variant: same answer for all groups.
        return self.request_finished(request, block_ids)

    # ------------------------------------------------------------------
    # Worker side
    # ------------------------------------------------------------------

    def _group_of(self) -> tuple[dict[str, int], dict[int, int]]:
        """Layer name -> KV cache group, and group -> scheduler block size,
        from the KV cache config vLLM handed the connector."""
        layer_group: dict[str, int] = {}
        group_bs: dict[int, int] = {}
        groups = getattr(self._kv_cache_cfg, "kv_cache_groups", None) or []
        for g, grp in enumerate(groups):
            for name in getattr(grp, "layer_names", []):
                layer_group[name] = g
            spec = getattr(grp, "kv_cache_spec", None)
            group_bs[g] = int(getattr(spec, "block_size", None) or self.block_size)
        return layer_group, group_bs

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        layer_group, group_bs = self._group_of()
        layers, skipped = [], []
        for name, t in kv_caches.items():
            parsed = parse_layer_name(name)
            if parsed is None:
                skipped.append(name)
                continue
            g = layer_group.get(name, 0)
            layers.append(describe(name, parsed[0], parsed[1], t, g, group_bs.get(g, self.block_size)))
        if skipped:
            logger.warning("TileRTConnector: KV caches %s are not MLA or indexer caches of a numbered layer; "
                           "not shipped", skipped)
        layers.sort(key=lambda lc: (lc.layer, lc.kind != "mla"))
        seen = set()
        for lc in layers:
            if (lc.layer, lc.kind) in seen:
                raise LayoutError(f"two {lc.kind} caches for layer {lc.layer} ({lc.name})")
            seen.add((lc.layer, lc.kind))
        self.kv_cache_dtype = dtype_label(layers)
        self._layers = layers
        self._ipc_state = None
        self._ipc_msg = None

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata, **kwargs: Any) -> None:
        # Everything happens in wait_for_save, once every layer (and the MTP
        # drafter's) has written this step's cache entries.
        return None

    def wait_for_save(self):
        if not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        sends = getattr(meta, "sends", None)
        if not sends:
            return
        if _tp_rank() != 0:
            # Other ranks hold the same bytes and ship nothing; their blocks
            # may be freed as soon as vLLM asks.
            with self._lock:
                for spec in sends:
                    self._pending[spec.req_id] = "released"
            return
        for spec in sends:
            with self._lock:
                self._pending[spec.req_id] = "staging"
            try:
                if self._use_ipc():
                    self._queue_ipc(spec)
                    continue
                self._stage_shm(spec)
            except Exception as e:  # never break the forward of everyone else
                logger.error("TileRTConnector: request %s (rid %s) not shipped: %s", spec.req_id, spec.rid, e)
            with self._lock:
                self._pending[spec.req_id] = "released"

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        with self._lock:
            self._finished_seen.update(finished_req_ids)
            waiting = any(v == "staging" for v in self._pending.values())
        if waiting and self._ipc_state == "on":
            self._poll_released()
        with self._lock:
            done = {r for r, st in self._pending.items() if st == "released" and r in self._finished_seen}
            for r in done:
                del self._pending[r]
                self._finished_seen.discard(r)
            # Ids vLLM finished that we never held (native traffic) are not ours to keep.
            self._finished_seen &= set(self._pending)
        return (done or None), None

    def shutdown(self):
        if self._send_q is not None:
            self._send_q.put(None)
            if self._sender is not None:
                self._sender.join(timeout=10)
            self._send_q = None
            self._sender = None
        if self._sidecar is not None:
            self._sidecar.close()
            self._sidecar = None

    # -- sidecar ---------------------------------------------------------

    def _sidecar_client(self) -> SidecarClient:
        if self._sidecar is None:
            self._sidecar = SidecarClient(self.socket_path, on_connect=self._on_connect)
        return self._sidecar

    def _on_connect(self, client: SidecarClient) -> None:
        # A (re)connected sidecar knows nothing of our caches.
        if self._ipc_state == "on" and self._ipc_msg is not None:
            r = client._round_trip(self._ipc_msg)
            if r.get("type") != "registered":
                self._ipc_state = "off"
                logger.error("TileRTConnector: the sidecar no longer maps the KV cache (%s); using /dev/shm staging",
                             r.get("message"))

    # -- zero-copy -------------------------------------------------------

    def _use_ipc(self) -> bool:
        if self._ipc_state is None:
            self._ipc_state = "off"
            if self.transfer == "shm":
                pass
            elif not self._layers or any(not lc.tensor.is_cuda for lc in self._layers):
                if self.transfer == "ipc":
                    logger.error("TileRTConnector: tilert_transfer ipc needs CUDA KV caches; using /dev/shm staging")
            else:
                try:
                    self._register_ipc()
                    self._ipc_state = "on"
                except Exception as e:
                    (logger.error if self.transfer == "ipc" else logger.warning)(
                        "TileRTConnector: zero-copy hand-off unavailable (%s); using /dev/shm staging", e)
        self.mode_used = "ipc" if self._ipc_state == "on" else "shm"
        return self._ipc_state == "on"

    def _register_ipc(self) -> None:
        client = self._sidecar_client()
        hello = client.ensure()
        if not hello.get("ipc"):
            raise SidecarError("the sidecar cannot map CUDA memory (started without a GPU?)")
        msg = ipc_register_message(self._layers)
        r = client.request(msg)
        if r.get("type") != "registered":
            raise SidecarError(f"sidecar refused the cache: {r.get('error')}: {r.get('message')}")
        self._ipc_msg = msg

    def _queue_ipc(self, spec: SendSpec) -> None:
        # The forward's kernels may still be running: the sender thread waits
        # for this event before the sidecar may read the blocks.
        ev = self._new_event()
        frame = self._stage_blocks_frame(spec)
        if self._send_q is None:
            self._send_q = queue.Queue()
            self._sender = threading.Thread(target=self._send_loop, name="tilert-connector-sender", daemon=True)
            self._sender.start()
        self._send_q.put((spec, ev, frame))

    def _new_event(self):
        """A CUDA event recorded on the forward's stream (after its kernels)."""
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(self._layers[0].tensor.device))
        return ev

    def _send_loop(self) -> None:
        while True:
            item = self._send_q.get()
            if item is None:
                return
            spec, ev, frame = item
            try:
                ev.synchronize()
                reply = self._sidecar_client().request(frame)
                if reply.get("type") != "queued":
                    raise SidecarError(f"sidecar refused: {reply.get('error')}: {reply.get('message')}")
                with self._lock:
                    self.staged.append(spec.rid)
                continue  # released when the sidecar says so
            except Exception as e:
                logger.error("TileRTConnector: request %s (rid %s) not shipped: %s", spec.req_id, spec.rid, e)
            with self._lock:
                self._pending[spec.req_id] = "released"

    def _stage_blocks_frame(self, spec: SendSpec) -> dict:
        groups: dict[int, list[int]] = {}
        for lc in self._layers:
            kb = lc.kernel_blocks(spec.block_ids[lc.group], spec.seq_len)
            if lc.group in groups and groups[lc.group] != kb:
                raise LayoutError(f"layers of group {lc.group} disagree on kernel blocks")
            groups[lc.group] = kb
        return {"type": "stage_blocks", "tag": spec.req_id, "rid": spec.rid, "tilert_host": spec.host,
                "tilert_ctrl_port": spec.ctrl_port, "model": self.model, "kv_cache_dtype": self.kv_cache_dtype,
                "seq_len": spec.seq_len, "mtp_len": spec.seq_len, "last_prompt_token": spec.last_prompt_token,
                "blocks": [groups.get(g, []) for g in range(max(groups) + 1)]}

    def _poll_released(self) -> None:
        try:
            r = self._sidecar_client().request({"type": "poll"}, retry=False)
            tags = r.get("released") or []
        except Exception as e:
            # The sidecar is gone: nothing reads the blocks any more.
            logger.error("TileRTConnector: sidecar unreachable (%s); releasing the blocks of %d requests", e,
                         len(self._pending))
            tags = list(self._pending)
        with self._lock:
            for t in tags:
                if t in self._pending:
                    self._pending[t] = "released"

    # -- /dev/shm staging ------------------------------------------------

    def _stage_shm(self, spec: SendSpec) -> None:
        if not self._layers:
            raise SidecarError("no KV caches registered")
        client = self._sidecar_client()
        staging = client.staging_dir()
        with self._lock:
            self._seq += 1
            seq = self._seq
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", spec.rid)[:100].lstrip(".") or "rid"
        path = os.path.join(staging, f"{safe}-{os.getpid()}-{seq}.kv")

        regions, plan = [], []
        offset = 0
        for lc in self._layers:
            n = lc.region_bytes(spec.seq_len)
            kb = lc.kernel_blocks(spec.block_ids[lc.group], spec.seq_len)
            regions.append({"layer": lc.layer, "kind": lc.kind, "offset": offset, "bytes": n})
            plan.append((lc, kb, offset, n))
            offset += n
        total = offset
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, total)
            with mmap.mmap(fd, total) as mm:
                dst = torch.frombuffer(mm, dtype=torch.uint8)
                try:
                    idx_cache: dict[tuple, torch.Tensor] = {}
                    for lc, kb, off, n in plan:
                        key = (lc.tensor.device, tuple(kb))
                        idx = idx_cache.get(key)
                        if idx is None:
                            idx = torch.tensor(kb, dtype=torch.long, device=lc.tensor.device)
                            idx_cache[key] = idx
                        rows = lc.byte_rows().index_select(0, idx)
                        dst[off:off + n].copy_(rows.reshape(-1)[:n])
                finally:
                    del dst
        except BaseException:
            os.close(fd)
            _unlink(path)
            raise
        os.close(fd)

        msg = {"type": "stage", "rid": spec.rid, "tilert_host": spec.host, "tilert_ctrl_port": spec.ctrl_port,
               "model": self.model, "kv_cache_dtype": self.kv_cache_dtype, "seq_len": spec.seq_len,
               "mtp_len": spec.seq_len, "last_prompt_token": spec.last_prompt_token, "path": path,
               "file_bytes": total, "regions": regions}
        try:
            reply = client.request(msg)
        except SidecarError:
            _unlink(path)  # nobody took it
            raise
        if reply.get("type") != "queued":
            # The sidecar deleted the file (it owns it once it read the frame).
            raise SidecarError(f"sidecar refused: {reply.get('error')}: {reply.get('message')}")
        self.staged.append(spec.rid)
        logger.debug("TileRTConnector: staged rid %s: %d tokens, %d bytes in %d regions",
                     spec.rid, spec.seq_len, total, len(regions))


CUDA_IPC_HANDLE_BYTES = 64


def raw_ipc_handle(h) -> bytes:
    """The 64-byte cudaIpcMemHandle_t inside what torch's
    ``storage._share_cuda_()`` returns: older torch gives it bare; newer
    torch prefixes a version byte and a type byte, ``'c'`` for a plain
    cudaMalloc block, ``'e'`` for an expandable segment (not one handle)."""
    h = bytes(h)
    if len(h) == CUDA_IPC_HANDLE_BYTES:
        return h
    if len(h) == CUDA_IPC_HANDLE_BYTES + 2 and h[1] == ord("c"):
        return h[2:]
    if len(h) >= 2 and h[1] == ord("e"):
        raise SidecarError("vLLM's KV cache sits in PyTorch expandable segments, which have no single CUDA IPC handle; "
                           "unset PYTORCH_CUDA_ALLOC_CONF=expandable_segments for the zero-copy hand-off")
    raise SidecarError(f"unrecognised CUDA IPC handle of {len(h)} bytes from torch {torch.__version__}")


def ipc_register_message(layers: list[LayerCache]) -> dict:
    """The ``register_cache`` frame: CUDA IPC handles of the allocations
    holding the caches and each layer's geometry inside them."""
    allocs: dict[tuple, int] = {}
    out_allocs, out_layers = [], []
    for lc in layers:
        st = lc.tensor.untyped_storage()
        share = st._share_cuda_()
        # (device, handle, storage bytes, offset of the storage in the
        # allocation the handle names, ...): torch.multiprocessing's format.
        device, handle, size, storage_off = share[0], raw_ipc_handle(share[1]), share[2], share[3]
        key = (int(device), handle)
        if key not in allocs:
            allocs[key] = len(out_allocs)
            out_allocs.append({"device": int(device), "handle": base64.b64encode(bytes(handle)).decode(),
                               "bytes": int(storage_off) + int(size)})
        base = int(storage_off) + (lc.tensor.data_ptr() - st.data_ptr())
        out_layers.append({"layer": lc.layer, "kind": lc.kind, "alloc": allocs[key], "offset": base,
                           "block_stride": lc.block_stride, "block_bytes": lc.block_bytes,
                           "num_blocks": int(lc.tensor.shape[0]), "group": lc.group,
                           "page_bytes": lc.page_bytes})
    return {"type": "register_cache", "allocs": out_allocs, "layers": out_layers}


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
