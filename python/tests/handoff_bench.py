"""Hand-off benchmark driver for roles/prefillshim's TestGPUHandoff (not a
pytest module): the real TileRTConnector over vLLM-shaped CUDA caches
(DeepSeek-V3.2's 61 + 1 layers, fp8_ds_mla + indexer, vLLM 0.33's BLNHC
views of one buffer), through the real sidecar, into a decode node.

Per context length and hand-off mode (zero-copy ``ipc`` vs ``shm``) it
times, for one request: how long ``wait_for_save`` holds vLLM's step, and
how long until the decode node has the state (its ``/pd/decode`` done line:
``wait_state``, measured by the node from that call, which is sent just
before ``wait_for_save``). Prints one JSON line per request.

Usage: handoff_bench.py SPEC.json (written by the Go test).
"""

import importlib.util
import json
import math
import os
import sys
import threading
import time
import urllib.request
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
if importlib.util.find_spec("vllm") is None or os.environ.get("TILERT_FAKE_VLLM") == "1":
    sys.path.insert(0, os.path.join(HERE, "fake_vllm"))
sys.path.insert(0, os.path.join(HERE, ".."))

import torch  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402

from tilert.pd_vllm.prefill_connector import TileRTConnector  # noqa: E402

PAGE = 64
MLA, IDX = 656, 132


def caches_for(layers, blocks, device):
    """vLLM 0.33's BLNHC views: one buffer, a block holds every layer's
    MLA page then indexer page; per layer a [blocks, 1, 64, C] view."""
    per_block = layers * PAGE * (MLA + IDX)
    buf = torch.randint(0, 256, (per_block * blocks + 4096,), dtype=torch.uint8, device=device)
    caches, off = {}, 2048
    for layer in range(layers):
        for kind, width in (("attn", MLA), ("indexer.k_cache", IDX)):
            caches[f"model.layers.{layer}.self_attn.{kind}"] = torch.as_strided(
                buf, (blocks, 1, PAGE, width), (per_block, PAGE * width, width, 1), off)
            off += PAGE * width
    return caches


def connector(spec, transfer, role):
    ktc = SimpleNamespace(kv_connector="TileRTConnector", kv_connector_module_path="tilert.pd_vllm.prefill_connector",
                          kv_role="kv_producer", is_kv_producer=True,
                          kv_connector_extra_config={"tilert_model": spec["model"], "tilert_transfer": transfer,
                                                     "tilert_sidecar_socket": spec["socket"]})
    cfg = SimpleNamespace(kv_transfer_config=ktc, cache_config=SimpleNamespace(cache_dtype="fp8_ds_mla", block_size=PAGE))
    return TileRTConnector(cfg, role, None)


def decode_call(http, rid, out):
    body = json.dumps({"rid": rid, "first_token_id": 1, "max_tokens": 1, "timeout_s": 120, "stream": False,
                       "sampling": {"temperature": 0}}).encode()
    req = urllib.request.Request(f"http://{http}/pd/decode", data=body, headers={"Content-Type": "application/json"})
    out["t_call"] = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=180) as r:
            out["reply"] = json.loads(r.read())
    except Exception as e:  # reported, the benchmark goes on
        out["error"] = str(e)
    out["t_done"] = time.perf_counter()


def main(spec_path):
    with open(spec_path) as f:
        spec = json.load(f)
    device = torch.device(spec.get("device", "cuda"))
    layers = spec["layers"]
    max_ctx = max(spec["ctx"])
    blocks = math.ceil(max_ctx / PAGE) + 8
    caches = caches_for(layers, blocks, device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    sched = connector(spec, "auto", KVConnectorRole.SCHEDULER)
    workers = {}
    for mode in spec["modes"]:
        w = connector(spec, mode, KVConnectorRole.WORKER)
        w.register_kv_caches(caches)
        workers[mode] = w
    gen = torch.Generator().manual_seed(5)
    n = 0
    for ctx in spec["ctx"]:
        for rep in range(spec["reps"]):
            for mode in spec["modes"]:
                w = workers[mode]
                n += 1
                rid = f"bench-{ctx}-{mode}-{rep}"
                req_id = f"cmpl-{n}-abcdefgh"
                pages = math.ceil(ctx / PAGE)
                ids = torch.randperm(blocks, generator=gen)[:pages].tolist()
                req = SimpleNamespace(request_id=req_id, prompt_token_ids=[(i * 7) % 1000 for i in range(ctx)],
                                      kv_transfer_params={"tilert_host": spec["host"], "tilert_ctrl_port": spec["ctrl_port"],
                                                          "tilert_rid": rid})
                sched.update_state_after_alloc(req, SimpleNamespace(get_block_ids=lambda: (ids,)), 0)
                so = SimpleNamespace(
                    scheduled_new_reqs=[SimpleNamespace(req_id=req_id, block_ids=(ids,), num_computed_tokens=0)],
                    scheduled_cached_reqs=SimpleNamespace(req_ids=[], resumed_req_ids=set(), new_block_ids=[],
                                                          num_computed_tokens=[]),
                    num_scheduled_tokens={req_id: ctx})
                meta = sched.build_connector_meta(so)
                assert [s.rid for s in meta.sends] == [rid]
                # The node waits for the state from this call on.
                res = {}
                th = threading.Thread(target=decode_call, args=(spec["http"], rid, res))
                th.start()
                time.sleep(0.05)
                w.bind_connector_metadata(meta)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                w.wait_for_save()
                t1 = time.perf_counter()
                w.clear_connector_metadata()
                th.join()
                assert sched.request_finished(req, ids) == (True, None)
                t_free = None
                for _ in range(20000):
                    done, _ = w.get_finished({req_id})
                    if done:
                        t_free = time.perf_counter()
                        break
                    time.sleep(0.001)
                reply = res.get("reply") or {}
                tm = reply.get("timing_ms") or {}
                print(json.dumps({"ctx": ctx, "mode": w.mode_used, "asked": mode, "rep": rep,
                                  "state_bytes": pages * PAGE * layers * (MLA + IDX),
                                  "step_blocked_ms": (t1 - t0) * 1e3,
                                  # the node's wait, less the time its call waited before wait_for_save began
                                  "handoff_ms": (tm["wait_state"] - (t0 - res["t_call"]) * 1e3) if "wait_state" in tm else None,
                                  "node_wait_state_ms": tm.get("wait_state"),
                                  "node_import_ms": tm.get("import"),
                                  "wall_to_decode_done_ms": (res["t_done"] - t0) * 1e3 if "t_done" in res else None,
                                  "blocks_released_ms": (t_free - t0) * 1e3 if t_free else None,
                                  "finish": reply.get("finish_reason"), "error": res.get("error")}), flush=True)
    for w in workers.values():
        w.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
