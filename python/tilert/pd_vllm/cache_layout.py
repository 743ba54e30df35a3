"""What the TileRT connector reads from vLLM's registered KV cache tensors.

vLLM 0.33 hands ``register_kv_caches`` one view per attention layer into a
single shared int8 buffer: ``[B, H=1, N, C]`` (``B`` kernel blocks of ``N``
tokens, ``C`` bytes or elements per token), strided by the resolved layout
(layer-outermost ``LBNHC``: ``stride(0)`` is one block; block-outermost
``BLNHC``: ``stride(0)`` spans every layer's page of that block). With
``--block-size`` larger than the attention kernel's block, the views are in
kernel blocks: scheduler block ``b`` is kernel blocks ``b*r .. b*r+r-1``.

Everything here is derived from the tensors themselves (shape, strides,
element size), never from configuration strings: the bytes that cross are
whatever vLLM's kernels wrote.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

PAGE_TOKENS = 64  # the decode node's page: vLLM's FlashMLA-sparse kernel block
MLA_TOKEN_BYTES = {656: "fp8_ds_mla", 1152: "bfloat16"}
INDEXER_TOKEN_BYTES = 132  # 128 fp8 values + one float32 scale, block-major per page
INDEXER_PAGE_BYTES = PAGE_TOKENS * INDEXER_TOKEN_BYTES  # 8448
# Other MLA cache formats vLLM can run, named so a refusal says what it saw.
OTHER_MLA_FORMATS = {
    576: "plain fp8 (576 B/token, e.g. the FlashInfer sparse backend's fp8)",
    352: "nvfp4_ds_mla (352 B/token)",
}

_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")


class LayoutError(ValueError):
    """A cache vLLM registered that the decode node cannot take; the message
    names the vLLM setting to change."""


def parse_layer_name(name: str) -> tuple[int, str] | None:
    """(layer index, "mla" | "indexer") of a vLLM cache layer name, e.g.
    ``model.layers.3.self_attn.attn`` or ``model.layers.3.self_attn.indexer.k_cache``
    (the MTP draft layer is ``model.layers.<num_hidden_layers>....``), or None
    for a name that is neither (skipped with a warning by the connector)."""
    m = _LAYER_RE.search(name)
    if not m:
        return None
    kind = "indexer" if ".indexer." in name or name.endswith(".indexer") else "mla"
    return int(m.group(1)), kind


@dataclass
class LayerCache:
    """One registered cache, described in bytes."""

    layer: int
    kind: str  # "mla" | "indexer"
    name: str
    tensor: torch.Tensor
    group: int  # vLLM KV cache group (which block table indexes it)
    block_tokens: int  # tokens per kernel block (the view's N)
    token_bytes: int
    block_stride: int  # bytes from one kernel block to the next
    ratio: int  # kernel blocks per scheduler block

    @property
    def block_bytes(self) -> int:
        return self.block_tokens * self.token_bytes

    @property
    def page_bytes(self) -> int:
        return INDEXER_PAGE_BYTES if self.kind == "indexer" else PAGE_TOKENS * self.token_bytes

    def region_bytes(self, seq_len: int) -> int:
        """Bytes of this layer's region for seq_len tokens: whole 64-token pages."""
        return math.ceil(seq_len / PAGE_TOKENS) * self.page_bytes

    def kernel_blocks(self, sched_blocks: list[int], seq_len: int) -> list[int]:
        """The kernel blocks holding the first seq_len tokens."""
        kb = [b * self.ratio + j for b in sched_blocks for j in range(self.ratio)]
        need = math.ceil(seq_len / self.block_tokens)
        if len(kb) < need:
            raise LayoutError(f"{self.name}: {len(kb)} kernel blocks for {seq_len} tokens, need {need}")
        return kb[:need]

    def byte_rows(self) -> torch.Tensor:
        """The cache as uint8 rows, one kernel block per row (a view)."""
        t = self.tensor
        if t.dtype != torch.uint8:
            t = t.view(torch.uint8)
        return t.flatten(1) if t.dim() > 2 else t


def describe(name: str, layer: int, kind: str, t: torch.Tensor, group: int, sched_block_size: int) -> LayerCache:
    """Check one registered tensor and describe it, or raise LayoutError."""
    if t.dim() == 4:
        if t.shape[1] != 1:
            raise LayoutError(f"KV cache {name}: {t.shape[1]} heads in a [B, H, N, C] view; MLA caches have one")
        n, c = t.shape[2], t.shape[3]
    elif t.dim() == 3:
        n, c = t.shape[1], t.shape[2]
    else:
        raise LayoutError(f"KV cache {name}: shape {tuple(t.shape)} is not [B, H, N, C] or [B, N, C]")
    if t.stride(-1) != 1 or (n > 1 and t.stride(-2) != c):
        raise LayoutError(f"KV cache {name}: strides {t.stride()} do not keep a block's tokens packed")
    es = t.element_size()
    token_bytes = c * es
    block_stride = t.stride(0) * es
    if kind == "mla":
        if token_bytes not in MLA_TOKEN_BYTES:
            what = OTHER_MLA_FORMATS.get(token_bytes, f"{token_bytes} B/token ({t.dtype})")
            raise LayoutError(f"KV cache {name} holds {what}; the TileRT decode node reads fp8_ds_mla "
                              f"(656 B/token) or bfloat16 (1152 B/token): run vLLM with --kv-cache-dtype fp8_ds_mla")
        if n % PAGE_TOKENS:
            raise LayoutError(f"KV cache {name}: kernel blocks of {n} tokens; TileRT pages are {PAGE_TOKENS} tokens: "
                              f"run vLLM with --block-size {PAGE_TOKENS} (or a multiple of it)")
    else:
        if token_bytes != INDEXER_TOKEN_BYTES:
            raise LayoutError(f"indexer cache {name}: {token_bytes} B/token, the decode node reads {INDEXER_TOKEN_BYTES}")
        if n != PAGE_TOKENS:
            # The indexer page is block-major (all values, then all scales):
            # other block sizes change the byte layout, not just the count.
            raise LayoutError(f"indexer cache {name}: blocks of {n} tokens lay values and scales out differently "
                              f"from TileRT's {PAGE_TOKENS}-token pages: run vLLM with --block-size {PAGE_TOKENS}")
    if sched_block_size % n:
        raise LayoutError(f"KV cache {name}: scheduler blocks of {sched_block_size} tokens are not whole kernel "
                          f"blocks of {n}: run vLLM with --block-size {PAGE_TOKENS}")
    return LayerCache(layer=layer, kind=kind, name=name, tensor=t, group=group, block_tokens=n,
                      token_bytes=token_bytes, block_stride=block_stride, ratio=sched_block_size // n)


def dtype_label(layers: list[LayerCache]) -> str:
    """fp8_ds_mla or bfloat16, from the MLA tensors' bytes per token."""
    labels = {MLA_TOKEN_BYTES[lc.token_bytes] for lc in layers if lc.kind == "mla"}
    if len(labels) != 1:
        raise LayoutError(f"MLA caches disagree on their format: {sorted(labels)}" if labels else "no MLA cache registered")
    return labels.pop()
