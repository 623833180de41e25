"""A corpus of bad requests against a real server: each gets a 4xx with an OpenAI-style
{"error": {...}} body, never a 5xx or a stack trace, and the server keeps serving."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
from serving import AUTH, server_fixture

from hybridrt.serve.server import Running

COMPLETION = {"model": "default", "prompt": "def f", "max_tokens": 4}
CHAT = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
ROUTES = {"/v1/completions": COMPLETION, "/v1/chat/completions": CHAT}

MALFORMED = [
    b"", b"{", b"}", b"[", b"null", b"1", b'"text"', b"[]", b"true", b'{"model": }', b"{'model': 'default'}",
    b'{"model": "default",}', b"NaN", b'{"max_tokens": NaN}', b'{"temperature": Infinity}', b'{"top_p": -Infinity}',
    b"[" * 50000 + b"]" * 50000, b'{"a":' * 20000 + b"1" + b"}" * 20000, b'{"model": "default"} trailing',
    b'{"model": "default" "prompt": "x"}', b"\x00", b'{"model": "\\ud800"', b"{}" * 3, b"  ", b"\n\n",
]  # fmt: skip
NOT_UTF8 = [
    b"\xff", b"\xfe\xff", b'{"model": "\xff"}', '{"model": "default", "prompt": "café"}'.encode("latin-1"),
    '{"model": "default"}'.encode("utf-16"), b"\xed\xa0\x80", b"\xc3\x28", b"\xf0\x28\x8c\x28", b"\x80abc",
]  # fmt: skip
BAD_COMMON: dict[str, list[Any]] = {
    "model": [1, None, "nope", "", ["default"], {"a": 1}, True, "default ", "DEFAULT"],
    "max_tokens": [0, -1, -100, 10**12, 2**70, 1.5, "16", True, [16], {"n": 1}, 600, 1e400],
    "temperature": [-0.1, 2.5, "1", True, [1], 100, -1e400, {"t": 1}],
    "top_p": [0, -0.5, 1.5, "0.9", True, [], 1e400],
    "top_k": [-2, 1.5, "5", True, [5]],
    "n": [0, -1, 17, 1.5, "2", True, 10**9],
    "stream": ["yes", 1, 0, [], {}, "true"],
    "stream_options": ["x", [], {"include_usage": "yes"}, {"foo": True}, 5, True],
    "stop": [5, [1], [""], "", ["a"] * 5, [None], {"a": 1}, True, [["a"]]],
    "seed": [-1, 1.5, "1", 2**64, True, [1]],
    "presence_penalty": [-3, 2.5, "0", True, [0], 1e400],
    "frequency_penalty": [-3, 2.5, "0", True, "x"],
    "repetition_penalty": [0, -1, 101, "1", True, 1e400],
    "min_tokens": [-1, 1.5, "1", 17, True],
    "logit_bias": [{"1": 5}, [], "x"],
    "user": [5, ["x"], True],
    "foo": [1, None, "x"],
    "max_new_tokens": [5],
    "temprature": [1],
}
BAD_COMPLETION: dict[str, list[Any]] = {
    "prompt": [None, "", [], [[]], [1, "a"], [-1], [10**6], [1.5], {"a": 1}, True, 5, [["x"]], [[1], "x"],
               [True, False], [[1, 2], [3, -4]], [5] * 600, "x " * 600, [None]],
    "echo": ["yes", 1, []],
    "logprobs": [6, -1, True, "1", 1.5, [1]],
    "best_of": [2, True, 1.5, "1"],
    "suffix": ["x", 1],
    "response_format": [{"type": "xml"},
                        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/x"}}}],
}  # fmt: skip
BAD_CHAT: dict[str, list[Any]] = {
    "messages": [None, [], "hi", [{}], [{"role": "user"}], [{"role": "robot", "content": "x"}],
                 [{"role": 1, "content": "x"}], [{"role": "user", "content": 5}], ["hi"],
                 [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
                 [{"role": "user", "content": None}], {"role": "user", "content": "x"},
                 [{"role": "user", "content": [{"type": "text"}]}], [{"role": "user", "content": "x " * 600}]],
    "tools": ["f", [{"type": "function"}], [{"function": {"name": "f"}}], [{"type": "function", "function": {}}],
              [{"type": "function", "function": {"name": "a b"}}],
              [{"type": "function", "function": {"name": "f"}}] * 2,
              [{"type": "function", "function": {"name": "f", "parameters": "x"}}]],
    "tool_choice": ["required", "any", 5, {"type": "function", "function": {"name": "f"}}, {"type": "function"}],
    "parallel_tool_calls": ["yes", 1],
    "logprobs": [5, "yes", 1],
    "top_logprobs": [2, -1, 21, 1.5, True],  # also: top_logprobs without logprobs: true
    "response_format": [{"type": "xml"}, "json", {"type": "json_schema"}, {"type": "json_schema", "json_schema": {}},
                        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}},
                        {"type": "json_schema", "json_schema": {"name": "x", "schema": []}},
                        {"type": "json_object", "schema": {}}],
    "max_completion_tokens": [0, -5, "8", 10**6],
}  # fmt: skip


def _cases() -> Iterator[tuple[str, str, bytes, dict[str, str]]]:
    """(method, path, body, headers) of every bad request."""
    for path, good in ROUTES.items():
        for raw in MALFORMED + NOT_UTF8:
            yield "POST", path, raw, AUTH
        extra = BAD_COMPLETION if path == "/v1/completions" else BAD_CHAT
        for field, values in (BAD_COMMON | extra).items():
            for value in values:
                body = good | {field: value}
                if value is None and field in good:
                    del body[field]  # a required field left out
                yield "POST", path, json.dumps(body).encode(), AUTH
        big = good | {"prompt": "x" * (2 << 20)}
        yield "POST", path, json.dumps(big).encode(), AUTH
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic dGVzdA=="}):
            yield "POST", path, json.dumps(good).encode(), headers
        for method in ("GET", "PUT", "DELETE", "PATCH"):
            yield method, path, b"", AUTH
    for path in ("/v1/embeddings", "/v2/completions", "/index.html", "/v1/completions/x", "/%ff", "/v1/models/x"):
        yield "GET", path, b"", AUTH
        yield "POST", path, json.dumps(COMPLETION).encode(), AUTH
    for path in ("/v1/models", "/metrics", "/health"):
        yield "POST", path, b"{}", AUTH


server = server_fixture("jamba_onnx", max_body_bytes=1 << 20)


def test_every_bad_request_gets_a_4xx_with_an_openai_error(server: Running) -> None:
    cases = list(_cases())
    assert len(cases) >= 300
    failures = []
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for method, path, body, headers in cases:
            r = client.request(method, path, content=body, headers=headers)
            error = r.json().get("error") if r.headers.get("content-type", "").startswith("application/json") else None
            ok = 400 <= r.status_code < 500 and isinstance(error, dict) and isinstance(error.get("message"), str)
            if not ok or "Traceback" in r.text:
                failures.append((method, path, body[:80], r.status_code, r.text[:200]))
        # Still serving, and no request ended in a 5xx.
        assert client.post("/v1/completions", json=COMPLETION, headers=AUTH).status_code == 200
        assert 'status="5' not in client.get("/metrics", headers=AUTH).text
    assert not failures, f"{len(failures)} of {len(cases)} bad requests were mishandled: {failures[:5]}"
