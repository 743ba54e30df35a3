"""TileRT prefill connector for vLLM V1 (a pure kv_producer).

Loaded by vLLM from the launch command line::

    --kv-transfer-config '{"kv_connector": "TileRTConnector",
        "kv_connector_module_path": "tilert.pd_vllm.prefill_connector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"tilert_host": ..., "tilert_ctrl_port": 5556,
                                      "tilert_model": "glm5", "tilert_max_seq_len": 202752}}'

What it does, and nothing more:

* It claims only requests whose ``kv_transfer_params`` carry ``tilert_host``
  (the TileRT router sets ``tilert_host``, ``tilert_ctrl_port``, ``tilert_rid``).
  For every other request it is a strict no-op, so native-pool traffic can
  share the prefill instance and even a forward batch.
* It never loads KV and never touches scheduling or sampling:
  ``get_num_new_matched_tokens`` is always ``(0, False)`` and
  ``request_finished`` always ``(False, None)`` (vLLM frees blocks as usual).
* In ``wait_for_save`` -- inside the forward window, after the MTP drafter has
  written its layer and before any block can be recycled -- it copies a claimed
  request's blocks of every registered layer cache (MLA and indexer key caches,
  the MTP draft layer included) into a staging file in shared memory and tells
  the ``tilert connector-sidecar`` over its unix socket. The sidecar ships the
  file to the decode node in the background (docs/PROTOCOL.md section 8).

Layouts are vLLM's own (block size 64): fp8_ds_mla 656 bytes per token,
token-interleaved inside a block; the indexer key cache 8448 bytes per
64-token block. Whole blocks are copied byte for byte, so the decode node
receives exactly vLLM's bytes.

Only the first tensor-parallel rank stages: MLA latents and indexer keys are
replicated across TP ranks. Pipeline parallelism is not supported.
"""

from __future__ import annotations

import json
import logging
import math
import mmap
import os
import re
import socket
import struct
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

logger = logging.getLogger("tilert.pd_vllm")

BLOCK_SIZE = 64
DEFAULT_SOCKET = "/tmp/tilert-sidecar.sock"
SOCKET_VERSION = 1
MAX_FRAME = 16 << 20

_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def claim_params(kv_transfer_params: Any) -> dict | None:
    """The request's TileRT routing, or None when it is not ours."""
    if isinstance(kv_transfer_params, dict) and kv_transfer_params.get("tilert_host"):
        return kv_transfer_params
    return None


def parse_layer_name(name: str) -> tuple[int, str]:
    """(layer index, "mla" | "indexer") of a vLLM cache layer name, e.g.
    ``model.layers.3.self_attn.attn`` or ``model.layers.3.self_attn.indexer.k_cache``.
    The MTP draft layer is ``model.layers.<num_hidden_layers>....``."""
    m = _LAYER_RE.search(name)
    if not m:
        raise ValueError(f"TileRTConnector: cannot tell the layer of KV cache {name!r}")
    return int(m.group(1)), ("indexer" if ".indexer." in name or name.endswith(".indexer") else "mla")


def _tp_rank() -> int:
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except Exception:  # not initialised (tests) or not importable: single rank
        return 0


@dataclass
class SendSpec:
    """One claimed request whose prefill completes in this step."""

    req_id: str
    rid: str
    host: str
    ctrl_port: int
    seq_len: int
    last_prompt_token: int
    block_ids: list[int]


@dataclass
class TileRTConnectorMetadata(KVConnectorMetadata):
    sends: list[SendSpec] = field(default_factory=list)


@dataclass
class _Claim:
    rid: str
    host: str
    ctrl_port: int
    prompt_token_ids: list[int]
    block_ids: list[int] = field(default_factory=list)


class SidecarError(RuntimeError):
    pass


class SidecarClient:
    """The plugin's side of the sidecar socket (length-prefixed JSON frames)."""

    def __init__(self, path: str, timeout: float = 10.0):
        self.path = path
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self.hello: dict | None = None

    def _connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self.path)
        except OSError:
            s.close()
            raise
        self._sock = s
        hello = self._round_trip({"type": "hello"})
        if hello.get("type") != "hello" or hello.get("protocol_version") != SOCKET_VERSION:
            self.close()
            raise SidecarError(f"sidecar at {self.path} answered hello with {hello!r}")
        self.hello = hello

    def _recv_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self._sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("sidecar closed the socket")
            buf += chunk
        return bytes(buf)

    def _round_trip(self, msg: dict) -> dict:
        payload = json.dumps(msg, separators=(",", ":")).encode()
        if len(payload) > MAX_FRAME:
            raise SidecarError(f"frame of {len(payload)} bytes exceeds {MAX_FRAME}")
        self._sock.sendall(struct.pack(">I", len(payload)) + payload)
        (n,) = struct.unpack(">I", self._recv_exact(4))
        if n == 0 or n > MAX_FRAME:
            raise SidecarError(f"sidecar sent a frame of {n} bytes")
        return json.loads(self._recv_exact(n))

    def staging_dir(self) -> str:
        if self._sock is None:
            self._connect()
        return self.hello["staging_dir"]

    def request(self, msg: dict) -> dict:
        """Send one message, reconnecting once if the connection had dropped."""
        for attempt in (0, 1):
            try:
                if self._sock is None:
                    self._connect()
                return self._round_trip(msg)
            except (OSError, ConnectionError, ValueError) as e:
                self.close()
                if attempt == 1:
                    raise SidecarError(f"sidecar at {self.path}: {e}") from e
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None


class TileRTConnector(KVConnectorBase_V1):
    """vLLM V1 KV connector: stages TileRT-bound requests' state for the sidecar."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        ktc = vllm_config.kv_transfer_config
        extra = dict(getattr(ktc, "kv_connector_extra_config", None) or {})
        self.default_host = extra.get("tilert_host")
        self.default_ctrl_port = int(extra.get("tilert_ctrl_port") or 5556)
        self.model = str(extra.get("tilert_model") or "")
        self.max_seq_len = int(extra.get("tilert_max_seq_len") or 0)
        self.socket_path = str(extra.get("tilert_sidecar_socket") or os.environ.get("TILERT_SIDECAR_SOCKET") or DEFAULT_SOCKET)
        if not self.model:
            raise ValueError("TileRTConnector: kv_connector_extra_config.tilert_model is required (glm5 or deepseek-v3.2)")
        cache_dtype = str(getattr(getattr(vllm_config, "cache_config", None), "cache_dtype", "auto") or "auto")
        self.kv_cache_dtype = "fp8_ds_mla" if cache_dtype in ("fp8_ds_mla", "fp8") else "bfloat16"

        # scheduler side
        self._claims: dict[str, _Claim] = {}
        # worker side
        self._layers: list[tuple[int, str, str, torch.Tensor]] = []  # (layer, kind, name, cache)
        self._sidecar: SidecarClient | None = None
        self._seq = 0
        self._lock = threading.Lock()
        self.staged: list[str] = []  # rids handed to the sidecar (for tests and logs)

    # ------------------------------------------------------------------
    # Scheduler side
    # ------------------------------------------------------------------

    def _routing(self, request) -> dict | None:
        return claim_params(getattr(request, "kv_transfer_params", None))

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int | None, bool]:
        # A pure producer never loads external KV.
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        p = self._routing(request)
        if p is None:
            return
        prompt = list(request.prompt_token_ids or [])
        if not prompt:
            logger.error("TileRTConnector: request %s has no prompt token ids; not shipped", request.request_id)
            return
        if self.max_seq_len and len(prompt) > self.max_seq_len:
            logger.error("TileRTConnector: request %s has %d prompt tokens, tilert_max_seq_len is %d; not shipped",
                         request.request_id, len(prompt), self.max_seq_len)
            return
        if request.request_id not in self._claims:
            self._claims[request.request_id] = _Claim(
                rid=str(p.get("tilert_rid") or request.request_id),
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
                c.block_ids = list(new.block_ids[0]) if new.block_ids else []
                self._maybe_send(meta, new.req_id, c, new.num_computed_tokens, scheduler_output)
        cached = scheduler_output.scheduled_cached_reqs
        resumed = getattr(cached, "resumed_req_ids", set()) or set()
        for i, req_id in enumerate(cached.req_ids):
            c = self._claims.get(req_id)
            if c is None:
                continue
            nb = cached.new_block_ids[i]
            if nb is not None:
                if req_id in resumed:
                    c.block_ids = list(nb[0])
                else:
                    c.block_ids.extend(nb[0])
            self._maybe_send(meta, req_id, c, cached.num_computed_tokens[i], scheduler_output)
        return meta

    def _maybe_send(self, meta, req_id: str, c: _Claim, num_computed: int, scheduler_output) -> None:
        # Ship once, in the step whose forward computes the last prompt token
        # (chunked prefill spreads a prompt over several steps).
        n = len(c.prompt_token_ids)
        if num_computed + scheduler_output.num_scheduled_tokens.get(req_id, 0) < n:
            return
        pages = math.ceil(n / BLOCK_SIZE)
        if len(c.block_ids) < pages:
            logger.error("TileRTConnector: request %s (rid %s) has %d blocks for %d prompt tokens; not shipped",
                         req_id, c.rid, len(c.block_ids), n)
        else:
            meta.sends.append(SendSpec(req_id=req_id, rid=c.rid, host=c.host, ctrl_port=c.ctrl_port, seq_len=n,
                                       last_prompt_token=int(c.prompt_token_ids[-1]), block_ids=c.block_ids[:pages]))
        del self._claims[req_id]

    def request_finished(self, request, block_ids) -> tuple[bool, dict[str, Any] | None]:
        # The state was staged inside the forward window: vLLM may free the
        # blocks now. A request that finished before its prefill completed
        # (aborted) drops its claim.
        self._claims.pop(request.request_id, None)
        return False, None

    # ------------------------------------------------------------------
    # Worker side
    # ------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        layers = []
        for name, t in kv_caches.items():
            layer, kind = parse_layer_name(name)
            layers.append((layer, kind, name, t))
        layers.sort(key=lambda x: (x[0], x[1] != "mla"))
        self._layers = layers

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
        if not sends or _tp_rank() != 0:
            return
        for spec in sends:
            try:
                self._stage(spec)
            except Exception as e:  # never break the forward of everyone else
                logger.error("TileRTConnector: request %s (rid %s) not shipped: %s", spec.req_id, spec.rid, e)

    def _sidecar_client(self) -> SidecarClient:
        if self._sidecar is None:
            self._sidecar = SidecarClient(self.socket_path)
        return self._sidecar

    def _stage(self, spec: SendSpec) -> None:
        if not self._layers:
            raise SidecarError("no KV caches registered")
        client = self._sidecar_client()
        staging = client.staging_dir()
        with self._lock:
            self._seq += 1
            seq = self._seq
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", spec.rid)[:100].lstrip(".") or "rid"
        path = os.path.join(staging, f"{safe}-{os.getpid()}-{seq}.kv")

        # Per layer: gather the request's blocks, one row per block.
        idx_cache: dict[torch.device, torch.Tensor] = {}
        regions, sizes = [], []
        offset = 0
        for layer, kind, name, t in self._layers:
            row = t[0].numel() * t.element_size()
            n = row * len(spec.block_ids)
            regions.append({"layer": layer, "kind": kind, "offset": offset, "bytes": n})
            sizes.append((t, n))
            offset += n
        total = offset
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, total)
            with mmap.mmap(fd, total) as mm:
                dst = torch.frombuffer(mm, dtype=torch.uint8)
                try:
                    for (t, n), r in zip(sizes, regions):
                        idx = idx_cache.get(t.device)
                        if idx is None:
                            idx = torch.tensor(spec.block_ids, dtype=torch.long, device=t.device)
                            idx_cache[t.device] = idx
                        rows = t.index_select(0, idx).contiguous()
                        dst[r["offset"]:r["offset"] + n].copy_(rows.view(-1).view(torch.uint8) if rows.dtype != torch.uint8 else rows.view(-1))
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

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return None, None

    def shutdown(self):
        if self._sidecar is not None:
            self._sidecar.close()
            self._sidecar = None


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
