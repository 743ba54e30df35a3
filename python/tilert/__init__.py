"""TileRT's Python side: the vLLM prefill connector plugin (tilert.pd_vllm)."""
