"""End-to-end driver for roles/prefillshim's TestPythonPluginEndToEnd (not a
pytest module): plays vLLM around the real TileRTConnector against the real
Go sidecar.

Usage: e2e_driver.py SPEC.json. The spec (written by the Go test) names the
sidecar socket, the decode node's ctrl address, the prompt and a state file
holding a CPU engine's exported pages per layer region (vLLM's layouts). The
driver builds vLLM-shaped paged caches full of stale bytes, lets a "forward"
write the exported pages into a random block table across two chunked
prefill steps, and runs the V1 connector call sequence so the plugin stages
the request for the sidecar. It prints one JSON line with what was staged.
"""

import importlib.util
import json
import logging
import math
import os
import random
import sys
import time
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
# As conftest.py: the stand-in base module when vLLM is absent, and the
# plugin from this checkout.
if importlib.util.find_spec("vllm") is None:
    sys.path.insert(0, os.path.join(HERE, "fake_vllm"))
sys.path.insert(0, os.path.join(HERE, ".."))

import torch  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402

from tilert.pd_vllm import prefill_connector  # noqa: E402
from tilert.pd_vllm.prefill_connector import BLOCK_SIZE, TileRTConnector  # noqa: E402

MLA_TOKEN = {"fp8_ds_mla": 656}
INDEXER_PAGE = 8448


def cache_name(layer, kind):
    # vLLM's attention layer names; the MTP draft layer is layer num_hidden_layers.
    if kind == "mla":
        return f"model.layers.{layer}.self_attn.attn"
    return f"model.layers.{layer}.self_attn.indexer.k_cache"


def record_frames(sent):
    """Keep a copy of every frame the plugin sends (behaviour unchanged), so
    the Go test can check the stage frame and find the regions in the file."""
    request = prefill_connector.SidecarClient.request

    def recording(self, msg, *a, **k):
        sent.append(dict(msg))
        return request(self, msg, *a, **k)

    prefill_connector.SidecarClient.request = recording


def main(spec_path):
    sent = []
    record_frames(sent)
    with open(spec_path) as f:
        spec = json.load(f)
    with open(spec["state_file"], "rb") as f:
        state = f.read()
    prompt = spec["prompt_ids"]
    seq_len = len(prompt)
    pages = math.ceil(seq_len / BLOCK_SIZE)
    num_blocks = spec["num_blocks"]
    rng = random.Random(spec["seed"])
    gen = torch.Generator().manual_seed(spec["seed"])
    tail = seq_len - (pages - 1) * BLOCK_SIZE  # tokens used in the last page

    # vLLM 0.33's caches: one shared buffer (on the spec's device), per layer
    # a [blocks, 1, 64, C] view, block-outermost (BLNHC) or layer-outermost
    # (LBNHC), full of stale bytes (earlier requests' leftovers).
    device = torch.device(spec.get("device", "cpu"))
    layout = spec.get("layout", "BLNHC")
    pages_of = []
    for r in spec["regions"]:
        width = MLA_TOKEN[spec["kv_cache_dtype"]] if r["kind"] == "mla" else INDEXER_PAGE // BLOCK_SIZE
        page = BLOCK_SIZE * width
        if r["bytes"] != pages * page:
            raise SystemExit(f"region L{r['layer']}.{r['kind']}: {r['bytes']} bytes, want {pages} pages of {page}")
        pages_of.append((r, width, page))
    per_block = sum(p for _, _, p in pages_of)
    buf = torch.randint(0, 256, (per_block * num_blocks + 4096,), generator=gen, dtype=torch.uint8).to(device)
    caches, exported, off = {}, {}, 1024
    for r, width, page in pages_of:
        name = cache_name(r["layer"], r["kind"])
        stride = per_block if layout == "BLNHC" else page
        caches[name] = torch.as_strided(buf, (num_blocks, 1, BLOCK_SIZE, width), (stride, page, width, 1), off)
        off += page if layout == "BLNHC" else page * num_blocks
        src = torch.frombuffer(bytearray(state[r["offset"]:r["offset"] + r["bytes"]]), dtype=torch.uint8)
        exported[name] = src.view(pages, page).to(device)

    def write_pages(first, last):
        """The forward writing positions of pages first..last-1 into the
        request's blocks. In the last page only the used positions are
        written: its tail keeps stale bytes, as in vLLM."""
        for name, t in caches.items():
            rows = t.flatten(1)  # a view: one block's bytes per row
            src = exported[name]
            for p in range(first, last):
                b = block_ids[p]
                if p < pages - 1:
                    rows[b] = src[p]
                elif ".indexer." not in name:  # MLA: token-major rows
                    w = rows.shape[1] // BLOCK_SIZE
                    rows[b, :tail * w] = src[p, :tail * w]
                else:  # indexer: 64 x 128 fp8 values, then 64 float32 scales
                    d = (INDEXER_PAGE // BLOCK_SIZE) - 4
                    rows[b, :tail * d] = src[p, :tail * d]
                    s = BLOCK_SIZE * d
                    rows[b, s:s + 4 * tail] = src[p, s:s + 4 * tail]

    block_ids = rng.sample(range(num_blocks), pages)
    native_blocks = rng.sample([b for b in range(num_blocks) if b not in block_ids], 2)

    ktc = SimpleNamespace(kv_connector="TileRTConnector", kv_connector_module_path="tilert.pd_vllm.prefill_connector",
                          kv_role="kv_producer", is_kv_producer=True,
                          kv_connector_extra_config={"tilert_model": spec["model"],
                                                     "tilert_max_seq_len": 4096,
                                                     "tilert_transfer": spec.get("transfer", "auto"),
                                                     "tilert_sidecar_socket": spec["socket"]})
    cfg = SimpleNamespace(kv_transfer_config=ktc,
                          cache_config=SimpleNamespace(cache_dtype=spec["kv_cache_dtype"], block_size=BLOCK_SIZE))
    sched = TileRTConnector(cfg, KVConnectorRole.SCHEDULER, None)
    worker = TileRTConnector(cfg, KVConnectorRole.WORKER, None)
    # vLLM registers its caches as a dict in no particular order.
    items = list(caches.items())
    rng.shuffle(items)
    worker.register_kv_caches(dict(items))

    req_id = "cmpl-e2e-0"
    claimed = SimpleNamespace(request_id=req_id, prompt_token_ids=list(prompt),
                              kv_transfer_params={"tilert_host": spec["host"], "tilert_ctrl_port": spec["ctrl_port"],
                                                  "tilert_rid": spec["rid"], "tilert_router": "e2e"})
    native = SimpleNamespace(request_id="native-0", prompt_token_ids=[1, 2, 3], kv_transfer_params=None)

    for r in (claimed, native):
        assert sched.get_num_new_matched_tokens(r, 0) == (0, False)

    # Chunked prefill: the first step computes all but the last page's tokens
    # (at least one page), the second the rest in a newly allocated block.
    chunk = max(1, pages - 1) * BLOCK_SIZE if pages > 1 else seq_len
    first_blocks = block_ids[:chunk // BLOCK_SIZE] if pages > 1 else block_ids
    sched.update_state_after_alloc(claimed, SimpleNamespace(get_block_ids=lambda: (list(first_blocks),)), 0)
    sched.update_state_after_alloc(native, SimpleNamespace(get_block_ids=lambda: (list(native_blocks[:1]),)), 0)

    def step(new=(), cached=()):
        return SimpleNamespace(
            scheduled_new_reqs=[SimpleNamespace(req_id=r.request_id, prompt_token_ids=r.prompt_token_ids,
                                                block_ids=(list(b),), num_computed_tokens=nc) for r, b, nc, _ in new],
            scheduled_cached_reqs=SimpleNamespace(req_ids=[c[0] for c in cached], resumed_req_ids=set(),
                                                  new_block_ids=[(list(c[1]),) if c[1] is not None else None for c in cached],
                                                  num_computed_tokens=[c[2] for c in cached],
                                                  num_output_tokens=[0 for _ in cached]),
            num_scheduled_tokens={**{r.request_id: ns for r, _, _, ns in new}, **{c[0]: c[3] for c in cached}},
            finished_req_ids=set(),
        )

    def worker_step(meta, forward, finished=()):
        # vLLM 0.33's V2 model runner order around one forward.
        worker.handle_preemptions(meta)
        worker.bind_connector_metadata(meta)
        forward()
        for name, t in caches.items():
            worker.wait_for_layer_load(name)
            worker.save_kv_layer(name, t, None)
        worker.finish_forward()
        worker.start_load_kv(SimpleNamespace())
        out = worker.get_finished(set(finished))
        worker.wait_for_save()
        worker.clear_connector_metadata()
        return out

    def native_forward():
        for t in caches.values():
            t[native_blocks[0]] = (torch.arange(t[0].numel(), device=device) % 199).to(torch.uint8).view(t[0].shape)

    meta = sched.build_connector_meta(step(new=[(claimed, first_blocks, 0, chunk), (native, native_blocks[:1], 0, 3)]))
    shipped_in = 1 if meta.sends else 2

    def forward1():
        write_pages(0, len(first_blocks) if pages > 1 else pages)
        native_forward()

    worker_step(meta, forward1)
    if pages > 1:
        meta = sched.build_connector_meta(step(cached=[(req_id, block_ids[len(first_blocks):], chunk, seq_len - chunk),
                                                       ("native-0", None, 3, 1)]))
        worker_step(meta, lambda: write_pages(len(first_blocks), pages))
    # The request finishes (max_tokens 1 on the prefill side). vLLM holds its
    # blocks until the worker reports it (the sidecar may still be reading
    # them straight from GPU memory), then frees them and may reuse them at
    # once: scribble over them.
    assert sched.request_finished(claimed, block_ids) == (True, None)
    released = None
    for _ in range(12000):  # a minute at most
        done, _ = worker.get_finished({req_id})
        if done:
            released = sorted(done)
            break
        time.sleep(0.005)
    assert released == [req_id], released
    for t in caches.values():
        t[block_ids] = 0xFF
    worker.shutdown()
    print(json.dumps({"staged": worker.staged, "block_ids": block_ids, "shipped_in_step": shipped_in, "frames": sent,
                      "mode": worker.mode_used}))


if __name__ == "__main__":
    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
    main(sys.argv[1])
