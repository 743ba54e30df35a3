"""Test-only stand-in for vLLM (see tests/fake_vllm/README.md)."""
