"""The router's prefill requests and vLLM's answers, checked with vLLM 0.33's
own OpenAI classes (make test-vllm; skipped without vLLM).

- roles/router/testdata/vllm/prefill_requests.json (written by the Go test
  TestVLLMGoldenPrefillRequests -update): every body validates as vLLM's
  ChatCompletionRequest / CompletionRequest, turns into SamplingParams the
  way vLLM's serving code does, and reaches the connector as a Request whose
  kv_transfer_params name the router's node and rid.
- roles/router/testdata/vllm/responses.json (written here with
  TILERT_UPDATE_GOLDEN=1, read by the Go test TestVLLMGoldenResponses):
  prefill answers built with vLLM's ChatCompletionResponse /
  CompletionResponse, as vLLM serves them with --return-tokens-as-token-ids.
"""

import json
import os

import pytest

pytest.importorskip("torch")
vllm = pytest.importorskip("vllm")
if not getattr(vllm, "__version__", "").startswith("0.33"):
    pytest.skip("needs vLLM 0.33 (make test-vllm)", allow_module_level=True)

from vllm.entrypoints.openai.chat_completion.protocol import (  # noqa: E402
    ChatCompletionLogProb,
    ChatCompletionLogProbs,
    ChatCompletionLogProbsContent,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatMessage,
)
from vllm.entrypoints.openai.completion.protocol import (  # noqa: E402
    CompletionLogProbs,
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
)

from vllm.logprobs import Logprob  # noqa: E402

from tilert.pd_vllm.prefill_connector import claim_params  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "roles", "router", "testdata", "vllm")


def load(name):
    with open(os.path.join(ROOT, name)) as f:
        return json.load(f)


@pytest.mark.parametrize("case", load("prefill_requests.json"), ids=lambda c: c["name"])
def test_router_prefill_request_is_valid_for_vllm(case):
    from vllm.v1.request import Request

    body = case["prefill_body"]
    cls = ChatCompletionRequest if case["chat"] else CompletionRequest
    assert case["endpoint"] == ("/v1/chat/completions" if case["chat"] else "/v1/completions")
    req = cls.model_validate(body)  # raises on anything vLLM's server would refuse with 400
    assert req.stream is False and req.max_tokens == 1
    # vLLM's serving code: max_tokens resolved, then to_sampling_params.
    sp = req.to_sampling_params(1, {})
    assert sp.max_tokens == 1
    # The first token's id comes back as logprobs ("token_id:N").
    assert sp.logprobs is not None
    if case["chat"]:
        assert req.logprobs is True
    # The connector sees the router's routing through vLLM's own path:
    # request extra_args -> Request.kv_transfer_params.
    assert sp.extra_args["kv_transfer_params"] == body["kv_transfer_params"]
    r = Request(request_id="cmpl-x-1f3a9c0d", prompt_token_ids=[1, 2, 3], sampling_params=sp, pooling_params=None)
    p = claim_params(r.kv_transfer_params)
    assert p is not None and p["tilert_rid"].startswith("tilert-golden-")
    assert p["tilert_host"] == "10.0.0.7" and p["tilert_ctrl_port"] == 5556
    if case["router_wants_prompt_ids"]:
        assert req.return_token_ids is True


PROMPT_LOGPROBS = [None, {17: Logprob(logprob=-1.5, rank=1, decoded_token="x")},
                   {9: Logprob(logprob=-0.25, rank=1, decoded_token="y"), 4: Logprob(logprob=-2.0, rank=2, decoded_token="z")}]


def chat_response(first, lp, top, prompt_ids=None, finish="length", prompt_logprobs=None, prompt_text=None):
    content = ChatCompletionLogProbsContent(token=f"token_id:{first}", logprob=lp,
                                            top_logprobs=[ChatCompletionLogProb(token=f"token_id:{i}", logprob=p)
                                                          for i, p in top])
    return ChatCompletionResponse(
        id="chatcmpl-golden", created=1764547200, model="glm-5-tiny",
        choices=[ChatCompletionResponseChoice(index=0, message=ChatMessage(role="assistant", content="token_id:%d" % first),
                                              logprobs=ChatCompletionLogProbs(content=[content]), finish_reason=finish,
                                              token_ids=None)],
        usage={"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}, prompt_token_ids=prompt_ids,
        prompt_logprobs=prompt_logprobs, prompt_text=prompt_text)


def completion_response(first, lp, top, prompt_ids=None, finish="length", with_logprobs=True, prompt_logprobs=None):
    logprobs = None
    if with_logprobs:
        logprobs = CompletionLogProbs(text_offset=[0], token_logprobs=[lp], tokens=[f"token_id:{first}"],
                                      top_logprobs=[{f"token_id:{i}": p for i, p in top}] if top else [None])
    return CompletionResponse(
        id="cmpl-golden", created=1764547200, model="glm-5-tiny",
        choices=[CompletionResponseChoice(index=0, text="x", logprobs=logprobs, finish_reason=finish,
                                          prompt_token_ids=prompt_ids, prompt_logprobs=prompt_logprobs)],
        usage={"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5})


def response_cases():
    chat = json.dumps({"model": "glm-5-tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8})
    chat_lp = json.dumps({"model": "glm-5-tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
                          "logprobs": True, "top_logprobs": 2})
    comp = json.dumps({"prompt": "The decode engine", "max_tokens": 8})
    comp_lp = json.dumps({"prompt": "The decode engine", "max_tokens": 8, "logprobs": 2})
    comp_pen = json.dumps({"prompt": "Say it again", "max_tokens": 8, "repetition_penalty": 1.1})
    out = []

    def add(name, is_chat, client, resp, want):
        out.append({"name": name, "chat": is_chat, "client_body": json.loads(client),
                    "vllm_body": json.loads(resp.model_dump_json()), "want": want})

    add("chat_first_token", True, chat, chat_response(515, -0.25, []),
        {"first_token_id": 515, "logprob": -0.25, "top": [], "prompt_token_ids": None, "prompt_tokens": 5,
         "finish_reason": "length"})
    add("chat_top_logprobs", True, chat_lp, chat_response(77, -0.5, [(77, -0.5), (12, -1.25)]),
        {"first_token_id": 77, "logprob": -0.5, "top": [[77, -0.5], [12, -1.25]], "prompt_token_ids": None,
         "prompt_tokens": 5, "finish_reason": "length"})
    add("chat_eos_first", True, chat, chat_response(2, -0.1, [], finish="stop"),
        {"first_token_id": 2, "logprob": -0.1, "top": [], "prompt_token_ids": None, "prompt_tokens": 5,
         "finish_reason": "stop"})
    add("completion_first_token", False, comp, completion_response(431, -1.0, []),
        {"first_token_id": 431, "logprob": -1.0, "top": [], "prompt_token_ids": None, "prompt_tokens": 4,
         "finish_reason": "length"})
    add("completion_top_logprobs", False, comp_lp, completion_response(9, -0.75, [(9, -0.75), (300, -2.0)]),
        {"first_token_id": 9, "logprob": -0.75, "top": [[9, -0.75], [300, -2.0]], "prompt_token_ids": None,
         "prompt_tokens": 4, "finish_reason": "length"})
    add("completion_prompt_ids", False, comp_pen, completion_response(5, -0.5, [], prompt_ids=[11, 12, 13, 14]),
        {"first_token_id": 5, "logprob": -0.5, "top": [], "prompt_token_ids": [11, 12, 13, 14], "prompt_tokens": 4,
         "finish_reason": "length"})
    comp_plp = json.dumps({"prompt": "The decode engine", "max_tokens": 8, "prompt_logprobs": 2})
    chat_plp = json.dumps({"model": "glm-5-tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
                           "prompt_logprobs": 2, "return_prompt_text": True})
    add("completion_prompt_logprobs", False, comp_plp, completion_response(431, -1.0, [], prompt_logprobs=PROMPT_LOGPROBS),
        {"first_token_id": 431, "logprob": -1.0, "top": [], "prompt_token_ids": None, "prompt_tokens": 4,
         "finish_reason": "length", "prompt_logprobs_len": 3})
    add("chat_prompt_logprobs_text", True, chat_plp,
        chat_response(515, -0.25, [], prompt_logprobs=PROMPT_LOGPROBS, prompt_text="<|user|>Hi<|assistant|>"),
        {"first_token_id": 515, "logprob": -0.25, "top": [], "prompt_token_ids": None, "prompt_tokens": 5,
         "finish_reason": "length", "prompt_logprobs_len": 3, "prompt_text": "<|user|>Hi<|assistant|>"})
    add("completion_without_token_ids", False, comp, completion_response(5, -0.5, [], with_logprobs=False),
        {"first_token_id": 0, "logprob": None, "top": [], "prompt_token_ids": None, "prompt_tokens": 0,
         "finish_reason": "", "error_code": "prefill_no_token_id"})
    return out


def test_response_goldens_are_vllms_own():
    """responses.json is what vLLM 0.33's response classes serialise; rewrite
    it with TILERT_UPDATE_GOLDEN=1 (then the Go test reads the new bodies)."""
    got = response_cases()
    path = os.path.join(ROOT, "responses.json")
    if os.environ.get("TILERT_UPDATE_GOLDEN") == "1":
        with open(path, "w") as f:
            json.dump(got, f, indent=2, sort_keys=True)
            f.write("\n")
    with open(path) as f:
        want = json.load(f)
    assert want == json.loads(json.dumps(got)), "vLLM's response classes serialise differently now: " \
        "rerun with TILERT_UPDATE_GOLDEN=1 and go test ./roles/router -run VLLMGolden"
