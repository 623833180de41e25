"""logprobs, top_logprobs and echo over real HTTP, and GET /openapi.json as the description
that requests and responses follow."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from serving import AUTH, client_of, server_fixture

import hybridrt
from hybridrt.runtime.evaluate import ort_logits_fn, token_nll
from hybridrt.runtime.model import Model
from hybridrt.serve.server import Running

# Logits of one call and of several shorter ones (chunked prefill, decode steps) agree to
# float32 rounding; their log-softmax, summed in float64, to well below this.
CLOSE = 1e-4
PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n"


@pytest.fixture(scope="module")
def model(default_onnx: Path) -> Model:
    return hybridrt.load(default_onnx)


server = server_fixture("model", slots=3, chunk=4)  # 4-token chunks: a prompt is scored over many calls


@pytest.fixture
def client(server: Running) -> openai.OpenAI:
    return client_of(server)


@pytest.fixture(scope="module")
def spec(server: Running) -> dict[str, Any]:
    r = httpx.get(f"{server.url}/openapi.json")  # no key needed
    assert r.status_code == 200
    return r.json()


def _own(model: Model, ids: list[int]) -> np.ndarray:
    """hybridrt eval's log-probabilities of ids[1:] (token_nll, one window over all of them)."""
    return -token_nll(ort_logits_fn(model), ids, len(ids), len(ids), lambda n: None)


def _post(server: Running, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(server.url + path, headers=AUTH, json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _events(server: Running, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    r = httpx.post(server.url + path, headers=AUTH, json=body | {"stream": True}, timeout=60)
    assert r.status_code == 200, r.text
    lines = [line.removeprefix("data: ") for line in r.text.split("\n\n") if line]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_echo_scores_the_prompt_as_hybridrt_eval(server: Running, model: Model) -> None:
    """max_tokens 0 + echo + logprobs (lm-eval's scoring): the prompt's logprobs are
    token_nll's, the first null; a prompt the prefix cache holds is still scored in full."""
    ids = model.prompt_rows(PROMPT).rows[0]
    want = _own(model, ids)
    body = {"model": "default", "prompt": PROMPT, "max_tokens": 0, "echo": True, "logprobs": 2}
    for _ in range(2):  # the second time, the cache holds the prompt's states
        out = _post(server, "/v1/completions", body)
        [choice] = out["choices"]
        assert choice["text"] == PROMPT and choice["finish_reason"] == "length"
        lp = choice["logprobs"]
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert len(lp["tokens"]) == len(ids)
        np.testing.assert_allclose(lp["token_logprobs"][1:], want, atol=CLOSE)
        assert out["usage"]["completion_tokens"] == 0 and out["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    # Token ids, scored with the generated token (lm-eval's max_tokens 1): prompt then completion.
    out = _post(server, "/v1/completions", body | {"prompt": ids, "max_tokens": 1, "temperature": 0})
    lp = out["choices"][0]["logprobs"]
    assert len(lp["token_logprobs"]) == len(ids) + 1
    np.testing.assert_allclose(lp["token_logprobs"][1 : len(ids)], want, atol=CLOSE)
    assert lp["text_offset"][len(ids)] == len(model.tokenizer.decode(ids))


def test_generated_logprobs_are_the_raw_distributions(server: Running, model: Model) -> None:
    """Each logprob is the log-softmax of the raw logits (what scoring prompt + completion
    gives), before the repetition penalty the model recommends (1.3); without a penalty,
    greedy tokens are their position's most likely, with the top alternatives in order."""
    body = {"model": "default", "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "logprobs": 3}
    ids = model.prompt_rows(PROMPT).rows[0]
    for penalty in (None, 1.0):
        kwargs = {} if penalty is None else {"repetition_penalty": penalty}
        choice = _post(server, "/v1/completions", body | kwargs)["choices"][0]
        assert choice["text"] == model.generate(PROMPT, max_new_tokens=12, **kwargs)
        lp = choice["logprobs"]
        new = model.generate_with_stats(PROMPT, max_new_tokens=12, **kwargs)[1].tokens[0]
        np.testing.assert_allclose(lp["token_logprobs"], _own(model, ids + new)[len(ids) - 1 :], atol=CLOSE)
        assert lp["text_offset"] == list(np.cumsum([0] + [len(t) for t in lp["tokens"][:-1]]))
        for token, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
            ranked = list(top.values())
            assert 3 <= len(top) <= 4 and ranked[:3] == sorted(ranked[:3], reverse=True)
            assert top[token] == value
            if penalty == 1.0:
                assert value == max(ranked)


def test_streamed_logprobs_are_the_whole_ones(server: Running) -> None:
    body = {"model": "default", "prompt": PROMPT, "max_tokens": 9, "temperature": 0, "logprobs": 1, "echo": True}
    whole = _post(server, "/v1/completions", body)["choices"][0]
    chunks = [c["choices"][0] for c in _events(server, "/v1/completions", body) if c["choices"]]
    assert "".join(c["text"] for c in chunks) == whole["text"]
    joined: dict[str, list[Any]] = {k: [] for k in whole["logprobs"]}
    for c in chunks:
        for k in joined:
            joined[k] += c["logprobs"][k] if c["logprobs"] else []
    assert joined == whole["logprobs"]


def test_chat_logprobs_in_openais_shape(client: openai.OpenAI, server: Running) -> None:
    messages = [{"role": "user", "content": "def add(a, b):"}]
    out = client.chat.completions.create(
        model="default",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        extra_body={"repetition_penalty": 1.0},  # greedy on the raw logits: the top token is chosen
    )
    choice = out.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    content = choice.logprobs.content
    assert len(content) == out.usage.completion_tokens  # type: ignore[union-attr]
    text = b"".join(bytes(t.bytes or []) for t in content).decode("utf-8", "replace")
    assert text.startswith(choice.message.content or "")
    for t in content:
        assert len(t.top_logprobs) == 3 and t.top_logprobs[0].logprob == t.logprob  # greedy
    body = {"model": "default", "messages": messages, "max_tokens": 8, "temperature": 0, "logprobs": True}
    events = _events(server, "/v1/chat/completions", body | {"repetition_penalty": 1.0})
    streamed = [e for c in events for ch in c["choices"] if ch["logprobs"] for e in ch["logprobs"]["content"]]
    assert [e["token"] for e in streamed] == [t.token for t in content]
    assert all(e["top_logprobs"] == [] for e in streamed)  # top_logprobs left out: none


def test_logprobs_do_not_change_the_tokens_under_load(client: openai.OpenAI, model: Model) -> None:
    """Requests with and without logprobs batched together each get generate()'s text."""
    prompts = ["import os\n", "class Stack:\n", "for i in range(10):", PROMPT, "#"] * 2

    def one(i: int) -> str:
        extra = {"logprobs": 2} if i % 2 else {}
        out = client.completions.create(model="default", prompt=prompts[i], max_tokens=10, temperature=0, **extra)  # type: ignore[call-overload]
        return out.choices[0].text

    with ThreadPoolExecutor(len(prompts)) as pool:
        texts = list(pool.map(one, range(len(prompts))))
    assert texts == [model.generate(p, max_new_tokens=10) for p in prompts]


def _validator(spec: dict[str, Any], name: str) -> Any:
    from jsonschema import Draft202012Validator

    return Draft202012Validator({"$ref": f"#/components/schemas/{name}", "components": spec["components"]})


def test_openapi_describes_every_route(server: Running, spec: dict[str, Any]) -> None:
    from starlette.routing import Route

    app = server.server.config.app  # the Starlette app create_app made
    api = [r for r in app.routes if isinstance(r, Route) and r.include_in_schema]  # not the chat page
    served = {(r.path, m.lower()) for r in api for m in r.methods or () if m != "HEAD"}
    described = {(path, method) for path, ops in spec["paths"].items() for method in ops}
    assert served == described
    from openapi_spec_validator import validate

    validate(spec)


def test_requests_and_responses_follow_the_description(server: Running, spec: dict[str, Any]) -> None:
    """Valid requests (and the bodies they get) match the schemas; refused ones do not."""
    good = [
        ("/v1/completions", "CompletionRequest", "Completion", {"prompt": PROMPT, "max_tokens": 3, "logprobs": 2}),
        ("/v1/completions", "CompletionRequest", "Completion", {"prompt": [[5, 6.0]], "max_tokens": 0, "echo": True}),
        ("/v1/chat/completions", "ChatCompletionRequest", "ChatCompletion",
         {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "logprobs": True, "top_logprobs": 2}),
    ]  # fmt: skip
    for path, request, response, fields in good:
        body = {"model": "default"} | fields
        _validator(spec, request).validate(body)
        _validator(spec, response).validate(_post(server, path, body))
    bad = [
        ("/v1/completions", "CompletionRequest", {"prompt": "x", "max_tokens": 0}),  # 0 only with echo
        ("/v1/completions", "CompletionRequest", {"prompt": "x", "logprobs": 6}),
        ("/v1/chat/completions", "ChatCompletionRequest", {"messages": [{"role": "user", "content": "x"}],
                                                           "top_logprobs": 2}),  # without logprobs: true
    ]  # fmt: skip
    for path, request, fields in bad:
        body = {"model": "default"} | fields
        assert not _validator(spec, request).is_valid(body)
        r = httpx.post(server.url + path, headers=AUTH, json=body)
        assert r.status_code == 400
        _validator(spec, "Error").validate(r.json())


def test_max_tokens_is_checked_beside_max_completion_tokens(server: Running) -> None:
    """Regression (schemathesis): a chat request with max_completion_tokens had its max_tokens
    unchecked, so an out-of-range max_tokens was accepted."""
    body = {"model": "default", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 2}
    assert httpx.post(server.url + "/v1/chat/completions", headers=AUTH, json=body).status_code == 200
    r = httpx.post(server.url + "/v1/chat/completions", headers=AUTH, json=body | {"max_tokens": 10**6})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
