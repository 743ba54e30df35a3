import importlib.util
import os
import sys

# Real vLLM on a machine without a GPU runs on its CPU platform.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

# The fast path: vLLM's connector base module from tests/fake_vllm (a
# stand-in checked for drift against the real one by test_fake_drift.py)
# when vLLM is not installed, or when TILERT_FAKE_VLLM=1 asks for it.
if importlib.util.find_spec("vllm") is None or os.environ.get("TILERT_FAKE_VLLM") == "1":
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "fake_vllm"))
# Import the plugin from this checkout (pip install ./python is not needed for tests).
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
