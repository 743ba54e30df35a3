import importlib.util
import os
import sys

# vLLM cannot be installed in CI (it needs a GPU): fall back to the test-only
# stand-in of its connector base module when the real one is absent.
if importlib.util.find_spec("vllm") is None:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "fake_vllm"))
# Import the plugin from this checkout (pip install ./python is not needed for tests).
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
