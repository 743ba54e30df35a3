"""TileRTConnector driven through vLLM V1's connector call sequence, with fake
paged caches holding known bytes and a fake sidecar on a real unix socket."""

import json
import os
import socket
import struct
import tempfile
import threading
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402

from tilert.pd_vllm.prefill_connector import (  # noqa: E402
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


def vllm_config(sock, cache_dtype="fp8_ds_mla"):
    ktc = SimpleNamespace(kv_connector="TileRTConnector", kv_connector_module_path="tilert.pd_vllm.prefill_connector",
                          kv_role="kv_producer", is_kv_producer=True,
                          kv_connector_extra_config={"tilert_host": "10.0.0.9", "tilert_ctrl_port": 5556,
                                                     "tilert_model": "glm5", "tilert_max_seq_len": 202752,
                                                     "tilert_sidecar_socket": sock})
    return SimpleNamespace(kv_transfer_config=ktc, cache_config=SimpleNamespace(cache_dtype=cache_dtype, block_size=64))


def make_caches(seed=0, mla_dtype=torch.uint8, mla_width=MLA_TOKEN):
    g = torch.Generator().manual_seed(seed)
    caches = {}
    for layer, has_idx in LAYERS:
        if mla_dtype == torch.uint8:
            mla = torch.randint(0, 256, (NUM_BLOCKS, 64, mla_width), generator=g, dtype=torch.uint8)
        else:
            mla = torch.randn((NUM_BLOCKS, 64, mla_width), generator=g).to(mla_dtype)
        caches[f"model.layers.{layer}.self_attn.attn"] = mla
        if has_idx:
            caches[f"model.layers.{layer}.self_attn.indexer.k_cache"] = torch.randint(
                0, 256, (NUM_BLOCKS, 64, IDX_TOKEN), generator=g, dtype=torch.uint8)
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


def worker_step(worker, meta, caches, forward=None):
    """The model runner's order: bind, start_load_kv, per-layer load/save
    during the forward, wait_for_save, get_finished, clear."""
    worker.bind_connector_metadata(meta)
    worker.start_load_kv(SimpleNamespace())
    for name, t in caches.items():
        worker.wait_for_layer_load(name)
        if forward:
            forward(name, t)
        worker.save_kv_layer(name, t, None)
    worker.wait_for_save()
    out = worker.get_finished(set())
    worker.clear_connector_metadata()
    return out


def expected(caches, blocks):
    idx = torch.tensor(blocks)
    parts, regions, off = [], [], 0
    for layer, has_idx in LAYERS:
        names = [(f"model.layers.{layer}.self_attn.attn", "mla")]
        if has_idx:
            names.append((f"model.layers.{layer}.self_attn.indexer.k_cache", "indexer"))
        for name, kind in names:
            b = caches[name].index_select(0, idx).contiguous().view(-1).view(torch.uint8).numpy().tobytes()
            regions.append({"layer": layer, "kind": kind, "offset": off, "bytes": len(b)})
            parts.append(b)
            off += len(b)
    return b"".join(parts), regions


def test_parse_layer_name():
    assert parse_layer_name("model.layers.61.self_attn.attn") == (61, "mla")
    assert parse_layer_name("model.layers.3.self_attn.indexer.k_cache") == (3, "indexer")
    with pytest.raises(ValueError):
        parse_layer_name("lm_head")


def test_claimed_and_native_share_a_batch(sidecar):
    cfg = vllm_config(sidecar.path)
    sched = TileRTConnector(cfg, KVConnectorRole.SCHEDULER, None)
    worker = TileRTConnector(cfg, KVConnectorRole.WORKER, None)
    caches = make_caches()
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
    worker_step(worker, meta, caches, forward)
    assert sched.request_finished(claimed, [7, 3, 10]) == (False, None)

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
    # A later step ships nothing more.
    meta = sched.build_connector_meta(sched_output(cached=[("native", None, 70, 1)]))
    assert meta.sends == []
    worker_step(worker, meta, caches)
    assert len(sidecar.stages) == 1


def test_whole_prompt_in_one_step_default_rid_and_bf16(sidecar):
    cfg = vllm_config(sidecar.path, cache_dtype="auto")
    sched = TileRTConnector(cfg, KVConnectorRole.SCHEDULER, None)
    worker = TileRTConnector(cfg, KVConnectorRole.WORKER, None)
    caches = make_caches(seed=1, mla_dtype=torch.bfloat16, mla_width=576)
    worker.register_kv_caches(caches)
    r = request("req-7", 64, {"tilert_host": "h"})  # no port, no rid: defaults
    sched.update_state_after_alloc(r, Blocks([4]), 0)
    meta = sched.build_connector_meta(sched_output(new=[(r, [4], 0, 64)]))
    worker_step(worker, meta, caches)
    st = sidecar.stages[0]
    assert st["rid"] == "req-7" and st["tilert_ctrl_port"] == 5556 and st["kv_cache_dtype"] == "bfloat16"
    want, _ = expected(caches, [4])
    assert sidecar.files["req-7"] == want
    assert st["regions"][0]["bytes"] == 64 * 1152


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
    r = request("y", 10, {"tilert_host": "h"})
    sched.update_state_after_alloc(r, Blocks([0]), 0)
    worker_step(worker, sched.build_connector_meta(sched_output(new=[(r, [0], 0, 10)])), make_caches())
    assert "not shipped" in caplog.text


def test_requires_model():
    cfg = vllm_config("/tmp/x.sock")
    del cfg.kv_transfer_config.kv_connector_extra_config["tilert_model"]
    with pytest.raises(ValueError, match="tilert_model"):
        TileRTConnector(cfg, KVConnectorRole.WORKER, None)
