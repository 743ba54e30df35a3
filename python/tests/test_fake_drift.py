"""The stand-in base module (tests/fake_vllm) must not drift from vLLM's:
every name it defines exists in the real module, every method it defines
has the real method's parameters, and every abstract method of the real
base is one the stand-in (and so the plugin) implements. Runs whenever vLLM
is importable (make test-vllm); skipped otherwise."""

import importlib.util
import inspect
import os

import pytest

pytest.importorskip("torch")
real = pytest.importorskip("vllm.distributed.kv_transfer.kv_connector.v1.base")
if "fake_vllm" in (real.__file__ or ""):
    pytest.skip("vLLM is not installed: only the stand-in is importable", allow_module_level=True)

FAKE_PATH = os.path.join(os.path.dirname(__file__), "fake_vllm", "vllm", "distributed", "kv_transfer", "kv_connector",
                         "v1", "base.py")


def load_fake():
    spec = importlib.util.spec_from_file_location("tilert_fake_vllm_base", FAKE_PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def params(fn):
    return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values()]


def public_names(mod):
    return [n for n, v in vars(mod).items() if not n.startswith("__") and getattr(v, "__module__", None) == mod.__name__]


def test_fake_names_exist_in_vllm():
    fake = load_fake()
    missing = [n for n in public_names(fake) if not hasattr(real, n)]
    assert not missing, f"the stand-in defines names vLLM does not: {missing}"


@pytest.mark.parametrize("cls", ["KVConnectorBase_V1", "SupportsHMA"])
def test_fake_methods_match_vllm_signatures(cls):
    fake_cls, real_cls = getattr(load_fake(), cls), getattr(real, cls)
    for name, fn in vars(fake_cls).items():
        if name.startswith("__") and name != "__init__":
            continue
        if isinstance(fn, property):
            assert isinstance(inspect.getattr_static(real_cls, name), property), f"{cls}.{name} is not a property in vLLM"
            continue
        if not callable(fn):
            continue
        assert hasattr(real_cls, name), f"{cls}.{name} is not in vLLM's {cls}"
        assert params(fn) == params(getattr(real_cls, name)), f"{cls}.{name}: stand-in {params(fn)} vs vLLM {params(getattr(real_cls, name))}"


def test_every_real_abstract_method_is_in_the_fake_and_the_plugin():
    from tilert.pd_vllm.prefill_connector import TileRTConnector

    fake = load_fake()
    for cls in ("KVConnectorBase_V1", "SupportsHMA"):
        abstract = getattr(real, cls).__abstractmethods__
        assert abstract <= set(vars(getattr(fake, cls))), f"{cls}: vLLM's abstract methods {sorted(abstract)}"
    assert not TileRTConnector.__abstractmethods__
    for name in ("request_finished", "request_finished_all_groups", "get_finished", "register_kv_caches",
                 "wait_for_save", "build_connector_meta", "update_state_after_alloc", "get_num_new_matched_tokens"):
        assert params(getattr(TileRTConnector, name)) == params(getattr(real.KVConnectorBase_V1, name, None)
                                                                  or getattr(real.SupportsHMA, name)), name
