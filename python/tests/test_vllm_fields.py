"""openai/testdata/vllm-fields.json lists the request fields of vLLM's
OpenAI chat and completions endpoints; the router classifies every one
(openai/fields.go: modelled, prompt-only, no effect, or refused), and
openai's TestVLLMFieldsClassified holds the classification to this file.
Here the file is held to the installed vLLM: a vLLM with other fields fails
until the file, and so the classification, follow. Runs whenever vLLM's
OpenAI server is importable (make test-vllm); skipped otherwise."""

import json
import os

import pytest

pytest.importorskip("torch")
chat_protocol = pytest.importorskip("vllm.entrypoints.openai.chat_completion.protocol")
completion_protocol = pytest.importorskip("vllm.entrypoints.openai.completion.protocol")

FIELDS = os.path.join(os.path.dirname(__file__), "..", "..", "openai", "testdata", "vllm-fields.json")


def test_request_fields_match_vllm():
    import vllm

    with open(FIELDS) as f:
        want = json.load(f)
    got = {
        "chat": sorted(chat_protocol.ChatCompletionRequest.model_fields),
        "completion": sorted(completion_protocol.CompletionRequest.model_fields),
    }
    for ep in ("chat", "completion"):
        added = sorted(set(got[ep]) - set(want[ep]))
        gone = sorted(set(want[ep]) - set(got[ep]))
        assert not added and not gone, (
            f"vLLM {vllm.__version__}'s {ep} request fields differ from {FIELDS} (written for vLLM {want['vllm']}): "
            f"new {added}, gone {gone}; update the file and classify the new fields in openai/fields.go"
        )
