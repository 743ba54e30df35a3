"""TileRTConnector driven through vLLM V1's connector call sequence, with fake
paged caches holding known bytes and a fake sidecar on a real unix socket."""

import json
import os
import socket
import struct
import tempfile
import threading
import time
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402

from tilert.pd_vllm.prefill_connector import (  # noqa: E402
    LayoutError,
    TileRTConnector,
    parse_layer_name,
)

NUM_BLOCKS = 16
MLA_TOKEN = 656  # fp8_ds_mla
IDX_TOKEN = 132  # 128 fp8 + one float32 scale, block-major per 64-token block
# GLM-5 style: layer 1 keeps no indexer cache; layer 2 is the MTP draft layer.
LAYERS = [(0, True), (1, False), (2, True)]


class FakeSidecar:
    """The sidecar's socket side: answers hello with a staging dir, takes
    stages (keeping the file bytes, deleting the file as the sidecar does)."""

    def __init__(self, refuse=None):
        self.root = tempfile.mkdtemp(prefix="tpc")
        self.path = os.path.join(self.root, "s.sock")
        self.staging = os.path.join(self.root, "staging")
        os.mkdir(self.staging)
        self.refuse = refuse
        self.stages = []
        self.files = {}
        self.connections = 0
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(self.path)
        self.srv.listen(4)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _recv(self, c, n):
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
            try:
                while True:
                    (n,) = struct.unpack(">I", self._recv(c, 4))
                    m = json.loads(self._recv(c, n))
                    if m["type"] == "hello":
                        r = {"type": "hello", "protocol_version": 1, "staging_dir": self.staging,
                             "staging_bytes": 1 << 30, "transport": "tcp"}
                    else:
                        self.stages.append(m)
                        with open(m["path"], "rb") as f:
                            self.files[m["rid"]] = f.read()
                        os.unlink(m["path"])
                        r = ({"type": "error", "rid": m["rid"], "error": self.refuse, "message": "test"}
                             if self.refuse else {"type": "queued", "rid": m["rid"], "queue_depth": 1})
                    b = json.dumps(r).encode()
                    c.sendall(struct.pack(">I", len(b)) + b)
            except EOFError:
                c.close()

    def close(self):
        self.srv.close()


@pytest.fixture
def sidecar():
    s = FakeSidecar()
    yield s
    s.close()


def vllm_config(sock, cache_dtype="fp8_ds_mla", block_size=64, **parallel):
    ktc = SimpleNamespace(kv_connector="TileRTConnector", kv_connector_module_path="tilert.pd_vllm.prefill_connector",
                          kv_role="kv_producer", is_kv_producer=True,
                          kv_connector_extra_config={"tilert_host": "10.0.0.9", "tilert_ctrl_port": 5556,
                                                     "tilert_model": "glm5", "tilert_max_seq_len": 202752,
                                                     "tilert_sidecar_socket": sock})
    pc = SimpleNamespace(pipeline_parallel_size=1, decode_context_parallel_size=1, prefill_context_parallel_size=1)
    for k, v in parallel.items():
        setattr(pc, k, v)
    return SimpleNamespace(kv_transfer_config=ktc, parallel_config=pc,
                           cache_config=SimpleNamespace(cache_dtype=cache_dtype, block_size=block_size))


def make_caches(seed=0, mla_dtype=torch.uint8, mla_width=MLA_TOKEN, layout="BLNHC", num_blocks=NUM_BLOCKS):
    """vLLM 0.33's shapes: one shared buffer, per layer a [B, 1, 64, C] view
    strided by the layout (BLNHC: a block holds every layer's page; LBNHC:
    each layer's blocks back to back), full of stale bytes."""
    g = torch.Generator().manual_seed(seed)
    es = torch.tensor([], dtype=mla_dtype).element_size()
    pages = []
    for layer, has_idx in LAYERS:
        pages.append((f"model.layers.{layer}.self_attn.attn", 64 * mla_width * es, mla_dtype, mla_width))
        if has_idx:
            pages.append((f"model.layers.{layer}.self_attn.indexer.k_cache", 64 * IDX_TOKEN, torch.uint8, IDX_TOKEN))
    per_block = sum(p[1] for p in pages)
    buf = torch.randint(0, 256, (per_block * num_blocks + 512,), generator=g, dtype=torch.uint8)
    caches, off = {}, 256
    for name, page, dt, width in pages:
        block_stride = per_block if layout == "BLNHC" else page
        # element_size, not dtype.itemsize: Debian's torch 1.13 (CI) lacks the latter.
        row = width * torch.tensor([], dtype=dt).element_size()
        v = torch.as_strided(buf, (num_blocks, 1, 64, row), (block_stride, page, row, 1), off)
        caches[name] = v.view(dt) if dt != torch.uint8 else v
        off += page if layout == "BLNHC" else page * num_blocks
    return caches


class Blocks:
    def __init__(self, ids):
        self.ids = ids

    def get_block_ids(self):
        return (list(self.ids),)


def request(rid, n, params):
    return SimpleNamespace(request_id=rid, prompt_token_ids=[(i * 7 + len(rid)) % 1000 for i in range(n)],
                           kv_transfer_params=params)


def sched_output(new=(), cached=(), finished=()):
    """new: (req, block_ids, num_computed, num_scheduled); cached: (req_id, new_block_ids|None, num_computed, num_scheduled)."""
    return SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id=r.request_id, prompt_token_ids=r.prompt_token_ids, block_ids=(list(b),),
                                            num_computed_tokens=nc) for r, b, nc, _ in new],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[c[0] for c in cached], resumed_req_ids=set(),
                                              new_block_ids=[(list(c[1]),) if c[1] is not None else None for c in cached],
                                              num_computed_tokens=[c[2] for c in cached],
                                              num_output_tokens=[0 for _ in cached]),
        num_scheduled_tokens={**{r.request_id: ns for r, _, _, ns in new}, **{c[0]: c[3] for c in cached}},
        finished_req_ids=set(finished),
    )


def worker_step(worker, meta, caches, forward=None, finished=()):
    """vLLM 0.33's V2 model runner order (with a drafter): handle_preemptions,
    bind; the forward (per-layer load/save); finish_forward; start_load_kv
    after the forward; get_finished; the drafter; wait_for_save; clear."""
    worker.handle_preemptions(meta)
    worker.bind_connector_metadata(meta)
    for name, t in caches.items():
        worker.wait_for_layer_load(name)
        if forward:
            forward(name, t)
        worker.save_kv_layer(name, t, None)
    worker.finish_forward()
    worker.start_load_kv(SimpleNamespace())
    out = worker.get_finished(set(finished))
    worker.wait_for_save()
    worker.clear_connector_metadata()
    return out


def block_bytes(t, b):
    """Kernel block b of a cache view, as bytes."""
    return t[b].contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def expected(caches, blocks):
    parts, regions, off = [], [], 0
    for layer, has_idx in LAYERS:
        names = [(f"model.layers.{layer}.self_attn.attn", "mla")]
        if has_idx:
            names.append((f"model.layers.{layer}.self_attn.indexer.k_cache", "indexer"))
        for name, kind in names:
            b = b"".join(block_bytes(caches[name], x) for x in blocks)
            regions.append({"layer": layer, "kind": kind, "offset": off, "bytes": len(b)})
            parts.append(b)
            off += len(b)
    return b"".join(parts), regions


def test_raw_ipc_handle():
    from tilert.pd_vllm.prefill_connector import SidecarError, raw_ipc_handle

    h = bytes(range(64))
    assert raw_ipc_handle(h) == h  # torch before handle versions
    for version in (2, 3):  # torch <= 2.12 and 2.13: version byte, 'c', the handle
        assert raw_ipc_handle(bytes([version]) + b"c" + h) == h
    with pytest.raises(SidecarError, match="expandable_segments"):
        raw_ipc_handle(bytes([2]) + b"e" + b"x" * 100)
    with pytest.raises(SidecarError, match="unrecognised"):
        raw_ipc_handle(b"x" * 10)


def test_parse_layer_name():
    assert parse_layer_name("model.layers.61.self_attn.attn") == (61, "mla")
    assert parse_layer_name("model.layers.3.self_attn.indexer.k_cache") == (3, "indexer")
    assert parse_layer_name("lm_head") is None


@pytest.mark.parametrize("layout", ["BLNHC", "LBNHC"])
def test_claimed_and_native_share_a_batch(sidecar, layout):
    cfg = vllm_config(sidecar.path)
    sched = TileRTConnector(cfg, KVConnectorRole.SCHEDULER, None)
    worker = TileRTConnector(cfg, KVConnectorRole.WORKER, None)
    caches = make_caches(layout=layout)
    # The caches are registered in vLLM's (unordered) dict order.
    worker.register_kv_caches(dict(reversed(list(caches.items()))))

    claimed = request("claimed", 150, {"tilert_host": "10.1.2.3", "tilert_ctrl_port": 6000, "tilert_rid": "rid-claimed"})
    native = request("native", 70, None)
    other = request("other", 40, {"do_remote_decode": True, "remote_host": "x"})  # another connector's params

    for r in (claimed, native, other):
        assert sched.get_num_new_matched_tokens(r, 0) == (0, False)
    alloc = {"claimed": [7, 3], "native": [1, 5], "other": [9]}
    for r in (claimed, native, other):
        sched.update_state_after_alloc(r, Blocks(alloc[r.request_id]), 0)

    # Step 1: chunked prefill, 100 of claimed's 150 tokens; native and other complete.
    meta = sched.build_connector_meta(sched_output(new=[(claimed, [7, 3], 0, 100), (native, [1, 5], 0, 70), (other, [9], 0, 40)]))
    assert meta.sends == []
    before = {k: v.clone() for k, v in caches.items()}
    assert worker_step(worker, meta, caches) == (None, None)
    assert sidecar.stages == []
    assert sidecar.connections == 0  # native traffic never touches the sidecar
    for r in (native, other):
        assert sched.request_finished(r, alloc[r.request_id]) == (False, None)

    # Step 2: the last 50 tokens land in a new block; the forward writes
    # new bytes into every layer's block 10 before wait_for_save.
    def forward(name, t):
        t[10] = (torch.arange(t[10].numel()) % 251).to(torch.uint8).view(t[10].shape)

    meta = sched.build_connector_meta(sched_output(cached=[("claimed", [10], 100, 50)]))
    assert [s.rid for s in meta.sends] == ["rid-claimed"]
    assert worker_step(worker, meta, caches, forward) == (None, None)
    # Shipped: vLLM keeps the blocks until the worker reports the request
    # (the zero-copy path reads them after wait_for_save returns).
    assert sched.request_finished(claimed, [7, 3, 10]) == (True, None)

    assert len(sidecar.stages) == 1
    st = sidecar.stages[0]
    want_bytes, want_regions = expected(caches, [7, 3, 10])
    assert sidecar.files["rid-claimed"] == want_bytes
    assert st["regions"] == want_regions
    assert {k: st[k] for k in ("rid", "tilert_host", "tilert_ctrl_port", "model", "kv_cache_dtype", "seq_len", "mtp_len",
                               "last_prompt_token", "file_bytes")} == {
        "rid": "rid-claimed", "tilert_host": "10.1.2.3", "tilert_ctrl_port": 6000, "model": "glm5",
        "kv_cache_dtype": "fp8_ds_mla", "seq_len": 150, "mtp_len": 150,
        "last_prompt_token": claimed.prompt_token_ids[-1], "file_bytes": len(want_bytes)}
    assert os.path.dirname(st["path"]) == sidecar.staging
    # 3 blocks: MLA 64*656 per block, indexer 8448 per block.
    assert [r["bytes"] for r in st["regions"]] == [3 * 64 * 656, 3 * 8448, 3 * 64 * 656, 3 * 64 * 656, 3 * 8448]

    # The connector never writes a cache: everything but the forward's
    # block 10 is as before, the native request's blocks included.
    for k, v in caches.items():
        mask = torch.ones(NUM_BLOCKS, dtype=torch.bool)
        mask[10] = False
        assert torch.equal(v[mask], before[k][mask]), k
        assert torch.equal(v[[1, 5, 9]], before[k][[1, 5, 9]]), k
    # A later step ships nothing more, and reports the request once vLLM
    # has told the worker it finished.
    meta = sched.build_connector_meta(sched_output(cached=[("native", None, 70, 1)]))
    assert meta.sends == []
    assert worker_step(worker, meta, caches, finished={"claimed", "native", "other"}) == ({"claimed"}, None)
    assert worker_step(worker, sched.build_connector_meta(sched_output()), caches) == (None, None)
    assert len(sidecar.stages) == 1


def test_whole_prompt_in_one_step_default_port_and_bf16(sidecar):
    # The config string says fp8, the tensors say bf16 (576 x 2 bytes): the
    # tensors win.
    cfg = vllm_config(sidecar.path, cache_dtype="fp8")
    sched = TileRTConnector(cfg, KVConnectorRole.SCHEDULER, None)
    worker = TileRTConnector(cfg, KVConnectorRole.WORKER, None)
    caches = make_caches(seed=1, mla_dtype=torch.bfloat16, mla_width=576, layout="LBNHC")
    worker.register_kv_caches(caches)
    r = request("req-7", 64, {"tilert_host": "h", "tilert_rid": "router-7"})  # no port: the default
    sched.update_state_after_alloc(r, Blocks([4]), 0)
    meta = sched.build_connector_meta(sched_output(new=[(r, [4], 0, 64)]))
    worker_step(worker, meta, caches)
    st = sidecar.stages[0]
    assert st["rid"] == "router-7" and st["tilert_ctrl_port"] == 5556 and st["kv_cache_dtype"] == "bfloat16"
    want, _ = expected(caches, [4])
    assert sidecar.files["router-7"] == want
    assert st["regions"][0]["bytes"] == 64 * 1152


def test_rid_is_required(sidecar, caplog):
    """vLLM appends 8 random characters to its request ids: a request that
    carries tilert_host but no tilert_rid cannot be named to the decode node,
    so it is not shipped (and said so), never shipped under vLLM's id."""
    cfg = vllm_config(sidecar.path)
    sched = TileRTConnector(cfg, KVConnectorRole.SCHEDULER, None)
    r = request("cmpl-abc-1f3a9c0d", 64, {"tilert_host": "h"})
    sched.update_state_after_alloc(r, Blocks([4]), 0)
    meta = sched.build_connector_meta(sched_output(new=[(r, [4], 0, 64)]))
    assert meta.sends == []
    assert "no tilert_rid" in caplog.text
    assert sched.request_finished(r, [4]) == (False, None)


def test_dtype_from_tensors_and_refusals(sidecar, caplog):
    cfg = vllm_config(sidecar.path, cache_dtype="fp8_ds_mla")
    worker = TileRTConnector(cfg, KVConnectorRole.WORKER, None)
    # FlashInfer sparse keeps plain fp8 (576 B/token) under an fp8 setting.
    with pytest.raises(LayoutError, match="plain fp8"):
        worker.register_kv_caches(make_caches(mla_width=576))
    with pytest.raises(LayoutError, match="nvfp4_ds_mla"):
        worker.register_kv_caches(make_caches(mla_width=352))
    # A cache that is not a numbered layer's is skipped with a warning.
    caches = make_caches()
    caches["model.mtp_embed.scratch"] = torch.zeros(4, 1, 64, 8, dtype=torch.uint8)
    worker.register_kv_caches(caches)
    assert worker.kv_cache_dtype == "fp8_ds_mla"
    assert "model.mtp_embed.scratch" in caplog.text and "not shipped" in caplog.text
    assert len(worker._layers) == len(caches) - 1


@pytest.mark.parametrize("flag, attr", [("--pipeline-parallel-size", "pipeline_parallel_size"),
                                        ("--decode-context-parallel-size", "decode_context_parallel_size"),
                                        ("--prefill-context-parallel-size", "prefill_context_parallel_size")])
def test_parallelism_that_splits_the_state_is_refused(flag, attr):
    cfg = vllm_config("/tmp/x.sock", **{attr: 2})
    for role in (KVConnectorRole.SCHEDULER, KVConnectorRole.WORKER):
        with pytest.raises(ValueError, match=flag):
            TileRTConnector(cfg, role, None)


def test_block_size_not_a_page_multiple_refused():
    with pytest.raises(ValueError, match="--block-size 64"):
        TileRTConnector(vllm_config("/tmp/x.sock", block_size=32), KVConnectorRole.SCHEDULER, None)


def test_block_size_128_maps_scheduler_to_kernel_blocks(sidecar):
    """--block-size 128: the registered views are in 64-token kernel blocks;
    scheduler block b is kernel blocks 2b and 2b+1."""
    cfg = vllm_config(sidecar.path, block_size=128)
    sched = TileRTConnector(cfg, KVConnectorRole.SCHEDULER, None)
    worker = TileRTConnector(cfg, KVConnectorRole.WORKER, None)
    caches = make_caches(seed=4, layout="LBNHC")
    worker.register_kv_caches(caches)
    for n, sched_blocks, kernel in ((40, [5], [10]), (200, [3, 6], [6, 7, 12, 13])):
        r = request(f"r{n}", n, {"tilert_host": "h", "tilert_rid": f"rid-{n}"})
        sched.update_state_after_alloc(r, Blocks(sched_blocks), 0)
        worker_step(worker, sched.build_connector_meta(sched_output(new=[(r, sched_blocks, 0, n)])), caches)
        want, _ = expected(caches, kernel)
        assert sidecar.files[f"rid-{n}"] == want, n


def test_prefix_cache_hit_blocks_come_first(sidecar):
    """Blocks from a local prefix-cache hit are part of the new request's block list."""
    cfg = vllm_config(sidecar.path)
    sched = TileRTConnector(cfg, KVConnectorRole.SCHEDULER, None)
    worker = TileRTConnector(cfg, KVConnectorRole.WORKER, None)
    caches = make_caches(seed=2)
    worker.register_kv_caches(caches)
    r = request("p", 130, {"tilert_host": "h", "tilert_ctrl_port": 1, "tilert_rid": "p"})
    assert sched.get_num_new_matched_tokens(r, 64) == (0, False)
    sched.update_state_after_alloc(r, Blocks([2, 8, 11]), 0)
    meta = sched.build_connector_meta(sched_output(new=[(r, [2, 8, 11], 64, 66)]))
    worker_step(worker, meta, caches)
    want, _ = expected(caches, [2, 8, 11])
    assert sidecar.files["p"] == want


def test_sidecar_refusal_and_absence_never_break_the_forward(caplog):
    s = FakeSidecar(refuse="staging_full")
    try:
        cfg = vllm_config(s.path)
        sched = TileRTConnector(cfg, KVConnectorRole.SCHEDULER, None)
        worker = TileRTConnector(cfg, KVConnectorRole.WORKER, None)
        caches = make_caches()
        worker.register_kv_caches(caches)
        r = request("x", 10, {"tilert_host": "h", "tilert_rid": "x"})
        sched.update_state_after_alloc(r, Blocks([0]), 0)
        worker_step(worker, sched.build_connector_meta(sched_output(new=[(r, [0], 0, 10)])), caches)
        assert worker.staged == [] and len(s.stages) == 1
        assert "staging_full" in caplog.text and "not shipped" in caplog.text
        assert os.listdir(s.staging) == []
    finally:
        s.close()

    caplog.clear()
    cfg = vllm_config("/nonexistent/tilert.sock")
    sched = TileRTConnector(cfg, KVConnectorRole.SCHEDULER, None)
    worker = TileRTConnector(cfg, KVConnectorRole.WORKER, None)
    worker.register_kv_caches(make_caches())
    r = request("y", 10, {"tilert_host": "h", "tilert_rid": "y"})
    sched.update_state_after_alloc(r, Blocks([0]), 0)
    worker_step(worker, sched.build_connector_meta(sched_output(new=[(r, [0], 0, 10)])), make_caches())
    assert "not shipped" in caplog.text
    # The blocks go back to vLLM all the same.
    assert sched.request_finished(r, [0]) == (True, None)
    assert worker_step(worker, sched.build_connector_meta(sched_output()), make_caches(), finished={"y"}) == ({"y"}, None)


def test_requires_model():
    cfg = vllm_config("/tmp/x.sock")
    del cfg.kv_transfer_config.kv_connector_extra_config["tilert_model"]
    with pytest.raises(ValueError, match="tilert_model"):
        TileRTConnector(cfg, KVConnectorRole.WORKER, None)


class ZeroCopySidecar(FakeSidecar):
    """Answers register_cache, takes stage_blocks, and releases a tag only
    once the test says so (as the real sidecar after its last read)."""

    def __init__(self):
        self.registered = []
        self.blocks = []
        self.release_now = []
        super().__init__()

    def _serve(self):
        while True:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            self.connections += 1
            try:
                while True:
                    (n,) = struct.unpack(">I", self._recv(c, 4))
                    m = json.loads(self._recv(c, n))
                    t = m["type"]
                    if t == "hello":
                        r = {"type": "hello", "protocol_version": 1, "staging_dir": self.staging,
                             "staging_bytes": 1 << 30, "transport": "tcp", "ipc": True}
                    elif t == "register_cache":
                        self.registered.append(m)
                        r = {"type": "registered"}
                    elif t == "stage_blocks":
                        self.blocks.append(m)
                        r = {"type": "queued", "rid": m["rid"], "queue_depth": 1}
                    elif t == "poll":
                        r = {"type": "released", "released": self.release_now}
                        self.release_now = []
                    else:
                        r = {"type": "error", "error": "bad_frame", "message": t}
                    b = json.dumps(r).encode()
                    c.sendall(struct.pack(">I", len(b)) + b)
            except EOFError:
                c.close()


class _Event:
    def __init__(self):
        self.synced = threading.Event()

    def synchronize(self):
        self.synced.set()


def test_zero_copy_bookkeeping():
    """The zero-copy path without a GPU: the forward's event is waited for
    before the blocks are named, kernel block ids per group (block size
    128), vLLM gets the blocks back only after the sidecar released them AND
    vLLM reported the request finished, and a reconnecting sidecar gets the
    cache registered again."""
    s = ZeroCopySidecar()
    try:
        cfg = vllm_config(s.path, block_size=128)
        sched = TileRTConnector(cfg, KVConnectorRole.SCHEDULER, None)
        worker = TileRTConnector(cfg, KVConnectorRole.WORKER, None)
        caches = make_caches(layout="LBNHC")
        worker.register_kv_caches(caches)
        reg = {"type": "register_cache", "allocs": [{"device": 0, "handle": "x", "bytes": 1}], "layers": []}
        # What _register_ipc leaves behind with CUDA tensors.
        worker._ipc_state, worker._ipc_msg = "on", reg
        events = []

        def new_event():
            events.append(_Event())
            return events[-1]

        worker._new_event = new_event
        r = request("cmpl-z-1f3a9c0d", 200, {"tilert_host": "h", "tilert_ctrl_port": 7, "tilert_rid": "rid-z"})
        sched.update_state_after_alloc(r, Blocks([3, 6]), 0)
        meta = sched.build_connector_meta(sched_output(new=[(r, [3, 6], 0, 200)]))
        assert worker_step(worker, meta, caches) == (None, None)
        for _ in range(2000):
            if s.blocks:
                break
            time.sleep(0.005)
        assert events and events[0].synced.is_set()
        assert len(s.registered) == 1  # on the first connection
        sb = s.blocks[0]
        assert sb["tag"] == "cmpl-z-1f3a9c0d" and sb["rid"] == "rid-z" and sb["seq_len"] == 200
        assert sb["blocks"] == [[6, 7, 12, 13]]  # 200 tokens: 4 kernel blocks of 64
        assert sb["kv_cache_dtype"] == "fp8_ds_mla"
        assert sched.request_finished(r, [3, 6]) == (True, None)
        # Finished in vLLM but not released by the sidecar: held.
        assert worker.get_finished({"cmpl-z-1f3a9c0d"}) == (None, None)
        s.release_now = ["cmpl-z-1f3a9c0d"]
        assert worker.get_finished(set()) == ({"cmpl-z-1f3a9c0d"}, None)
        assert worker.get_finished(set()) == (None, None)
        # The sidecar dropped the connection (idle timeout, restart): the
        # next frame reconnects and registers the cache again first.
        worker._sidecar._sock.close()
        worker._sidecar._sock = None
        r2 = request("cmpl-y-00000000", 64, {"tilert_host": "h", "tilert_rid": "rid-y"})
        sched.update_state_after_alloc(r2, Blocks([9]), 0)
        worker_step(worker, sched.build_connector_meta(sched_output(new=[(r2, [9], 0, 64)])), caches)
        for _ in range(2000):
            if len(s.blocks) == 2:
                break
            time.sleep(0.005)
        assert len(s.registered) == 2 and s.blocks[1]["blocks"] == [[18]]
        worker.shutdown()
    finally:
        s.close()
