"""The gRPC door (`hybridrt serve --grpc-port`) on a real server on 127.0.0.1, called with a
grpcio client: the same greedy text and streamed pieces as the HTTP API, the same errors as gRPC
status codes, the standard health service, one request log line per call, and a cancelled stream
that frees its slot."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from serving import AUTH, KEY, metric, running, sse_data, wait_for

import hybridrt
from hybridrt.runtime.model import Model
from hybridrt.serve import grpc_schema as schema
from hybridrt.serve.grpc_api import SERVING, Client, request_body
from hybridrt.serve.request_log import LOGGER, configure
from hybridrt.serve.server import Running

METADATA = (("authorization", f"Bearer {KEY}"),)
GREEDY = {"model": "default", "max_tokens": 12, "temperature": 0.0}
PROMPT = "def fibonacci(n):\n"
CHAT = [{"role": "user", "content": "Write a loop."}]


@pytest.fixture(scope="module")
def model(default_onnx: Path) -> Model:
    return hybridrt.load(default_onnx)


@pytest.fixture(scope="module")
def door(model: Model) -> Iterator[tuple[Running, Client]]:
    with running(model, slots=2, grpc_address="127.0.0.1:0") as server:
        port = server.server.config.app.state.grpc_port
        client = Client(f"127.0.0.1:{port}", METADATA)
        yield server, client
        client.close()


def _http(server: Running, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url + path, headers=AUTH, json=body, timeout=60)


def _http_pieces(server: Running, path: str, body: dict[str, Any], chat: bool) -> list[str]:
    pieces = []
    with httpx.stream("POST", server.url + path, headers=AUTH, json=body | {"stream": True}, timeout=60) as r:
        for data in sse_data(r):
            if data != "[DONE]":
                choice = json.loads(data)["choices"]
                if choice:
                    pieces.append(choice[0]["delta"].get("content") or "" if chat else choice[0]["text"])
    return pieces


def test_completion_unary_and_stream_equal_http(door: tuple[Running, Client]) -> None:
    server, client = door
    want = _http(server, "/v1/completions", GREEDY | {"prompt": PROMPT}).json()
    got = client.complete(schema.CompletionRequest(prompt=[PROMPT], **GREEDY))
    assert got.choices[0].text == want["choices"][0]["text"] and got.choices[0].text
    assert got.choices[0].finish_reason == want["choices"][0]["finish_reason"]
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (
        want["usage"]["prompt_tokens"],
        want["usage"]["completion_tokens"],
    )
    assert got.object == "text_completion" and got.model == "default"
    streamed = list(client.complete_stream(schema.CompletionRequest(prompt=[PROMPT], **GREEDY)))
    assert [m.choices[0].text for m in streamed] == _http_pieces(
        server, "/v1/completions", GREEDY | {"prompt": PROMPT}, False
    )
    assert "".join(m.choices[0].text for m in streamed) == got.choices[0].text


def test_chat_unary_and_stream_equal_http(door: tuple[Running, Client]) -> None:
    server, client = door
    want = _http(server, "/v1/chat/completions", GREEDY | {"messages": CHAT}).json()
    messages = [schema.ChatMessage(**m) for m in CHAT]
    got = client.chat(schema.ChatRequest(messages=messages, **GREEDY))
    assert got.choices[0].message.content == want["choices"][0]["message"]["content"]
    assert got.choices[0].message.role == "assistant" and got.object == "chat.completion"
    streamed = list(client.chat_stream(schema.ChatRequest(messages=messages, **GREEDY)))
    assert streamed[0].choices[0].delta.role == "assistant"  # the role chunk, as over HTTP
    pieces = [m.choices[0].delta.content for m in streamed if m.choices]
    assert pieces == _http_pieces(server, "/v1/chat/completions", GREEDY | {"messages": CHAT}, True)
    assert "".join(pieces) == want["choices"][0]["message"]["content"]


def test_options_carry_the_other_fields_of_the_body(door: tuple[Running, Client]) -> None:
    _, client = door
    request = schema.CompletionRequest(prompt=[PROMPT], **GREEDY)
    request.options.update({"stream_options": {"include_usage": True}})
    last = list(client.complete_stream(request))[-1]
    assert not last.choices and last.usage.completion_tokens == GREEDY["max_tokens"]
    body = request_body(request, chat=False, stream=True)
    assert body == {"model": "default", "prompt": PROMPT, "max_tokens": 12, "temperature": 0.0} | {
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_errors_are_the_http_errors_as_grpc_status_codes(door: tuple[Running, Client]) -> None:
    server, client = door
    cases = [
        (GREEDY | {"top_p": 7.0}, grpc.StatusCode.INVALID_ARGUMENT),
        (GREEDY | {"model": "nope"}, grpc.StatusCode.NOT_FOUND),
        (GREEDY | {"max_tokens": 10**6}, grpc.StatusCode.INVALID_ARGUMENT),
    ]
    for fields, code in cases:
        http = _http(server, "/v1/completions", fields | {"prompt": PROMPT})
        with pytest.raises(grpc.RpcError) as e:
            client.complete(schema.CompletionRequest(prompt=[PROMPT], **fields))
        assert e.value.code() == code and e.value.details() == http.json()["error"]["message"]
        with pytest.raises(grpc.RpcError) as e:
            list(client.complete_stream(schema.CompletionRequest(prompt=[PROMPT], **fields)))
        assert e.value.code() == code
    keyless = Client(client.channel._channel.target().decode())  # type: ignore[attr-defined]
    with pytest.raises(grpc.RpcError) as e:
        keyless.complete(schema.CompletionRequest(prompt=[PROMPT], **GREEDY))
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    keyless.close()


def test_standard_health_service(door: tuple[Running, Client]) -> None:
    _, client = door
    assert client.health() == SERVING and client.health(schema.SERVICE) == SERVING
    with pytest.raises(grpc.RpcError) as e:
        client.health("another.Service")
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_each_call_logs_one_line_and_returns_its_request_id(door: tuple[Running, Client], tmp_path: Path) -> None:
    _, client = door
    path = tmp_path / "requests.log"
    handler = configure(str(path))
    try:
        call = client._complete.with_call(  # the unary call's initial metadata
            schema.CompletionRequest(prompt=[PROMPT], **GREEDY), metadata=METADATA + (("x-request-id", "grpc-1"),)
        )
        assert dict(call[1].initial_metadata())["x-request-id"] == "grpc-1"
        stream = client.complete_stream(schema.CompletionRequest(prompt=[PROMPT], **GREEDY))
        list(stream)
        with pytest.raises(grpc.RpcError):
            client.complete(schema.CompletionRequest(prompt=[PROMPT], **GREEDY | {"top_p": 7.0}))
        assert wait_for(lambda: len(path.read_text().splitlines()) == 3, 5)
    finally:
        LOGGER.removeHandler(handler)
        handler.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["door"] for line in lines] == ["grpc"] * 3
    assert lines[0]["request_id"] == "grpc-1" and lines[0]["completion_tokens"] == GREEDY["max_tokens"]
    assert [line["status"] for line in lines] == [200, 200, 400]


def test_a_cancelled_stream_frees_its_slot(model: Model) -> None:
    with running(model, slots=1, grpc_address="127.0.0.1:0") as server:
        client = Client(f"127.0.0.1:{server.server.config.app.state.grpc_port}", METADATA)
        long = schema.CompletionRequest(prompt=[PROMPT], model="default", max_tokens=1500, min_tokens=1500)
        stream = client.complete_stream(long)
        next(stream)
        assert metric(server.url, "hybridrt_busy_slots") == 1
        stream.cancel()
        assert wait_for(lambda: metric(server.url, "hybridrt_busy_slots") == 0, 5)
        got = client.complete(schema.CompletionRequest(prompt=[PROMPT], **GREEDY))  # the one slot is free again
        assert got.usage.completion_tokens == GREEDY["max_tokens"]
        client.close()


def test_the_shipped_proto_is_the_served_schema() -> None:
    shipped = Path(schema.__file__).with_name("hybridrt.proto").read_text()
    assert shipped == schema.proto_text()
    assert "rpc CompleteStream(CompletionRequest) returns (stream Completion);" in shipped
