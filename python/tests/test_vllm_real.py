"""The TileRT connector inside real vLLM 0.33 (CPU): vLLM's config,
KV-cache planning and allocation, Scheduler / AsyncScheduler, the connector
factory loading the plugin by module path, the V2 runner's worker-side
wrapper and hook order. Only the model forward is fake (known bytes).

Skipped without vLLM (``make test-vllm`` builds the venv that has it)."""

import logging
import math
import os
import random
import tempfile

import pytest

pytest.importorskip("torch")
vllm = pytest.importorskip("vllm")
if not hasattr(vllm, "__version__") or not vllm.__version__.startswith("0.33"):
    pytest.skip(f"these tests pin vLLM 0.33 (found {getattr(vllm, '__version__', '?')})", allow_module_level=True)

import vllm_harness as H  # noqa: E402

ROUTED = {"tilert_host": "10.1.2.3", "tilert_ctrl_port": 6000}


@pytest.fixture
def sidecar():
    s = H.FakeSidecar()
    yield s
    s.close()


@pytest.fixture
def root():
    return tempfile.mkdtemp(prefix="tvr")


@pytest.fixture
def engines():
    made = []
    yield made
    for e in made:
        e.close()


def new_engine(engines, setup, sidecar_path, root):
    e = H.Engine(setup, sidecar_path, root)
    engines.append(e)
    return e


def prompt(n, seed):
    r = random.Random(seed)
    return [r.randrange(2, 1000) for _ in range(n)]


def check_staged(e, sidecar, rid_router, vllm_rid, seq_len):
    """The staged file holds exactly the forward's bytes for every layer
    (the MTP layer included) at every used position."""
    st = [m for m in sidecar.stages if m["rid"] == rid_router]
    assert len(st) == 1, [m["rid"] for m in sidecar.stages]
    st = st[0]
    assert st["seq_len"] == seq_len and st["mtp_len"] == seq_len
    assert st["kv_cache_dtype"] == "fp8_ds_mla"
    data = sidecar.files[rid_router]
    want = e.expected(vllm_rid, seq_len)
    regions = {(r["layer"], r["kind"]): r for r in st["regions"]}
    assert set(regions) == set(want), sorted(set(regions) ^ set(want))
    pages = math.ceil(seq_len / 64)
    for key, spans in want.items():
        r = regions[key]
        assert r["bytes"] == pages * (64 * 656 if key[1] == "mla" else 8448), (key, r)
        blob = data[r["offset"]:r["offset"] + r["bytes"]]
        for start, b in spans:
            assert blob[start:start + len(b)] == b, f"L{key[0]}.{key[1]}: bytes at {start} differ"
    return st


@pytest.mark.parametrize("layout", ["LBNHC", "BLNHC"])
@pytest.mark.parametrize("async_sched", [False, True])
def test_deepseek_v32_both_layouts(layout, async_sched, sidecar, root, engines):
    """DeepSeek-V3.2 shaped (61 layers + MTP, MLA + indexer each): a chunked
    claimed prompt next to native traffic that hits its prefix cache."""
    e = new_engine(engines, H.Setup(layout=layout, async_scheduling=async_sched), sidecar.path, root)
    kinds = {tuple(t.shape[1:]) for t in e.caches.values()}
    assert kinds == {(1, 64, 656), (1, 64, 132)}, kinds
    # Real caches are 4-D strided views of one shared buffer.
    storages = {t.untyped_storage().data_ptr() for t in e.caches.values()}
    assert len(storages) == 1
    t0 = e.caches["model.layers.0.self_attn.attn"]
    assert t0.stride(0) == (41984 if layout == "LBNHC" else 62 * (41984 + 8448))

    p = prompt(300, 1)
    a = e.add("cmpl-a", p, {**ROUTED, "tilert_rid": "router-a"})
    n = e.add("cmpl-native", p[:100] + prompt(50, 2), None)
    free0 = e.free_blocks()
    e.drain(8)
    assert set(e.finished) == {a, n}
    st = check_staged(e, sidecar, "router-a", a, 300)
    assert st["tilert_host"] == "10.1.2.3" and st["tilert_ctrl_port"] == 6000 and st["model"] == "deepseek-v3.2"
    assert st["last_prompt_token"] == p[-1]
    assert len(sidecar.stages) == 1  # native traffic never reaches the sidecar
    # Every block came back (the shipped request's after get_finished).
    assert e.free_blocks() >= free0
    assert e.sched.kv_cache_manager.block_pool.get_num_free_blocks() == e.sched_kc.num_blocks - 1


def test_v2_hook_order(sidecar, root, engines):
    """The V2 runner calls start_load_kv after the forward and get_finished
    before wait_for_save (the drafter runs in between); the plugin ships in
    wait_for_save and reports the request in a later get_finished."""
    e = new_engine(engines, H.Setup(layers=3), sidecar.path, root)
    a = e.add("cmpl-h", prompt(70, 3), {**ROUTED, "tilert_rid": "router-h"})
    e.step()
    assert e.hooks[:7] == ["handle_preemptions", "bind_connector_metadata", "finish_forward", "start_load_kv",
                           "get_finished", "wait_for_save", "clear_connector_metadata"]
    assert [m["rid"] for m in sidecar.stages] == ["router-h"]
    e.drain(3)
    assert a in e.finished
    check_staged(e, sidecar, "router-h", a, 70)


def test_glm5_shaped_with_shared_indexer_layers(sidecar, root, engines):
    """GLM-5 shaped (78 layers + MTP), some backbone layers without an
    indexer cache (shared top-k); the MTP layer always has one."""
    skip = tuple(i for i in range(3, 78) if i % 2)
    e = new_engine(engines, H.Setup(model="glm_moe_dsa", layers=78, indexer_skip=skip, num_blocks=40), sidecar.path, root)
    a = e.add("chat-g", prompt(130, 4), {**ROUTED, "tilert_rid": "router-g"})
    e.drain(4)
    st = check_staged(e, sidecar, "router-g", a, 130)
    kinds = {(r["layer"], r["kind"]) for r in st["regions"]}
    assert (78, "indexer") in kinds and (3, "indexer") not in kinds and (4, "indexer") in kinds
    assert st["model"] == "glm5"


def test_block_size_128_ships_the_right_kernel_blocks(sidecar, root, engines):
    """--block-size 128: vLLM registers 64-token kernel-block views; scheduler
    block b is kernel blocks 2b, 2b+1. Short and long prompts both ship the
    forward's bytes."""
    e = new_engine(engines, H.Setup(layers=3, block_size=128, num_blocks=48), sidecar.path, root)
    assert {t.shape[2] for t in e.caches.values()} == {64}
    assert e.caches["model.layers.0.self_attn.attn"].shape[0] == 2 * e.sched_kc.num_blocks
    short = e.add("cmpl-s", prompt(40, 5), {**ROUTED, "tilert_rid": "router-s"})
    long = e.add("cmpl-l", prompt(700, 6), {**ROUTED, "tilert_rid": "router-l"})
    e.drain(8)
    check_staged(e, sidecar, "router-s", short, 40)
    check_staged(e, sidecar, "router-l", long, 700)


def test_block_size_128_block_outermost_refused(sidecar, root, engines):
    """With a block-outermost layout vLLM keeps 128-token kernel blocks; an
    indexer page of 128 tokens is laid out differently from TileRT's, so the
    worker refuses at start naming --block-size."""
    with pytest.raises(ValueError, match="--block-size 64"):
        new_engine(engines, H.Setup(layers=3, block_size=128, layout="BLNHC"), sidecar.path, root)


def test_abort_mid_prefill(sidecar, root, engines):
    """An aborted request (mid chunked prefill) ships nothing and frees its blocks."""
    from vllm.v1.request import RequestStatus

    e = new_engine(engines, H.Setup(layers=3, chunk=128, num_blocks=40), sidecar.path, root)
    gone = e.add("cmpl-abort", prompt(400, 7), {**ROUTED, "tilert_rid": "router-abort"})
    e.step()
    e.sched.finish_requests(gone, RequestStatus.FINISHED_ABORTED)
    e.drain(3)
    assert sidecar.stages == []
    assert e.free_blocks() == e.sched_kc.num_blocks - 1
    # The connector holds nothing for it: a later request ships normally.
    ok = e.add("cmpl-ok", prompt(100, 17), {**ROUTED, "tilert_rid": "router-ok"})
    e.drain(3)
    check_staged(e, sidecar, "router-ok", ok, 100)


@pytest.mark.parametrize("async_sched", [False, True])
def test_preempted_mid_prefill_ships_once_from_its_new_blocks(async_sched, sidecar, root, engines):
    """A native request decoding into a full cache makes vLLM preempt the
    claimed request mid chunked prefill; rescheduled (prefix-cache hits
    first, then fresh blocks), it is shipped once with the right bytes."""
    e = new_engine(engines, H.Setup(layers=3, chunk=32, num_blocks=10, max_len=512, async_scheduling=async_sched),
                   sidecar.path, root)
    native = e.add("cmpl-native", prompt(316, 18), None, max_tokens=40)
    claimed = e.add("cmpl-c", prompt(250, 19), {**ROUTED, "tilert_rid": "router-c"})
    e.drain(120)
    assert claimed in e.resumed, "vLLM never preempted the claimed request: the scenario did not happen"
    assert {native, claimed} <= set(e.finished)
    check_staged(e, sidecar, "router-c", claimed, 250)
    assert len(sidecar.stages) == 1
    assert e.free_blocks() == e.sched_kc.num_blocks - 1


def test_unmarked_and_rid_less_requests_untouched(sidecar, root, engines, caplog):
    """A request without tilert_host is not ours; one with tilert_host but no
    tilert_rid cannot be named to the decode node (vLLM's request id carries
    a random suffix) and is refused loudly, not shipped under vLLM's id."""
    e = new_engine(engines, H.Setup(layers=3), sidecar.path, root)
    plain = e.add("cmpl-plain", prompt(90, 9), None)
    other = e.add("cmpl-nixl", prompt(90, 10), {"do_remote_decode": True})
    norid = e.add("cmpl-norid", prompt(90, 11), dict(ROUTED))
    with caplog.at_level(logging.ERROR, logger="tilert.pd_vllm"):
        e.drain(4)
    assert {plain, other, norid} <= set(e.finished)
    assert sidecar.stages == [] and sidecar.connections == 0
    assert "no tilert_rid" in caplog.text and norid in caplog.text
    assert e.free_blocks() == e.sched_kc.num_blocks - 1


def test_sidecar_gone_vllm_keeps_serving(root, engines, caplog):
    """No sidecar: the request is not shipped (the router then reports
    kv_transfer_timeout from the decode node), vLLM finishes it, frees its
    blocks and keeps serving."""
    e = new_engine(engines, H.Setup(layers=3), os.path.join(root, "nobody.sock"), root)
    a = e.add("cmpl-x", prompt(100, 12), {**ROUTED, "tilert_rid": "router-x"})
    with caplog.at_level(logging.ERROR, logger="tilert.pd_vllm"):
        e.drain(3)
    assert a in e.finished and "not shipped" in caplog.text
    b = e.add("cmpl-y", prompt(50, 13), None)
    e.drain(3)
    assert b in e.finished
    assert e.free_blocks() == e.sched_kc.num_blocks - 1


def test_factory_hma_and_startup_refusals(sidecar, root):
    """The factory loads the plugin by module path; it declares hybrid KV
    cache manager support (vLLM keeps the manager on, and create_connector
    accepts it with HMA enabled); configurations it cannot serve are refused
    at start-up naming the setting."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole, supports_hma

    from tilert.pd_vllm.prefill_connector import TileRTConnector

    cfg = H.make_config(H.Setup(layers=3, hma=True), sidecar.path, root)
    assert KVConnectorFactory.get_connector_class(cfg.kv_transfer_config) is TileRTConnector
    assert supports_hma(TileRTConnector) and KVConnectorFactory.supports_hma_config(cfg.kv_transfer_config)
    assert cfg.scheduler_config.disable_hybrid_kv_cache_manager is False
    c = KVConnectorFactory.create_connector(cfg, KVConnectorRole.SCHEDULER, None)
    assert isinstance(c, TileRTConnector)

    for attr, flag in (("pipeline_parallel_size", "--pipeline-parallel-size"),
                       ("decode_context_parallel_size", "--decode-context-parallel-size"),
                       ("prefill_context_parallel_size", "--prefill-context-parallel-size")):
        cfg = H.make_config(H.Setup(layers=3), sidecar.path, root)
        object.__setattr__(cfg.parallel_config, attr, 2)
        with pytest.raises(ValueError, match=flag):
            KVConnectorFactory.create_connector(cfg, KVConnectorRole.WORKER, None)
