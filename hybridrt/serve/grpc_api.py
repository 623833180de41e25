"""The gRPC door (`hybridrt serve ... --grpc-port P`): completions and chat, unary and
server-streaming (grpc_schema.py, hybridrt/serve/hybridrt.proto), and the standard health service
(grpc.health.v1.Health: Check and Watch).

Not a second server: each call is handed to the HTTP app itself, in the same process and event
loop, as the POST its request stands for (the typed fields and `options` as the JSON body,
the call's metadata as headers: authorization, x-request-id, x-hybridrt-user). So a call goes
through the same API key check, body limits, parsing, model names and routes, engine queue,
per-request log line (its `door` field says "grpc") and /metrics as an HTTP request, and its
answer is that request's: a 4xx or 5xx becomes the gRPC status below with the error's message;
a streamed response's events become the stream's messages. The response's x-request-id and
x-hybridrt-route come back as initial metadata. A call the client cancels (or whose deadline
passes) is a client that went away: its job is cancelled and its state slot freed.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
from google.protobuf import json_format

from . import grpc_schema as schema
from .exchange import Exchange

CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    405: grpc.StatusCode.UNIMPLEMENTED,
    408: grpc.StatusCode.RESOURCE_EXHAUSTED,  # a stream read too slowly (slow_client)
    413: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
# An error inside a stream (its status line went out as 200) names itself by its code.
STREAM_CODES = {"timeout": 504, "cancelled": 503, "slow_client": 408}
BACK = ("x-request-id", "x-hybridrt-route")  # response headers returned as initial metadata
SERVING, NOT_SERVING = 1, 2  # grpc.health.v1.HealthCheckResponse.ServingStatus


def request_body(request: Any, chat: bool, stream: bool) -> dict[str, Any]:
    """The OpenAI JSON body a request message stands for: the fields it sets, `options`
    merged in as they are, `stream` from the call."""
    body: dict[str, Any] = {}
    for field, value in request.ListFields():
        if field.name == "options":
            body.update(json_format.MessageToDict(value))
        elif field.name == "messages":
            body["messages"] = [_message(m) for m in value]
        elif field.name == "prompt":
            body["prompt"] = value[0] if len(value) == 1 else list(value)
        elif _repeated(field):
            body[field.name] = list(value)
        else:
            body[field.name] = value
    body.setdefault("model", request.model)
    body["stream"] = stream
    if not stream:
        body.pop("stream_options", None)
    return body


def _repeated(field: Any) -> bool:
    if hasattr(field, "is_repeated"):  # protobuf >= 6.31 (label() is deprecated there)
        return bool(field.is_repeated)
    return bool(field.label == field.LABEL_REPEATED)


def _message(m: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.name:
        out["name"] = m.name
    if m.tool_call_id:
        out["tool_call_id"] = m.tool_call_id
    if m.tool_calls:
        out["tool_calls"] = [json_format.MessageToDict(c, preserving_proto_field_name=True) for c in m.tool_calls]
        if not m.content:
            out["content"] = None
    return out


def response_message(body: dict[str, Any]) -> Any:
    """An OpenAI response body (or one chunk of a stream) as a Completion message."""
    out = json_format.ParseDict(body, schema.Completion(), ignore_unknown_fields=True)
    details = (body.get("usage") or {}).get("prompt_tokens_details") or {}
    if details.get("cached_tokens"):
        out.usage.cached_tokens = details["cached_tokens"]
    return out


def _headers(context: Any) -> list[tuple[bytes, bytes]]:
    return [
        (k.lower().encode(), v.encode())
        for k, v in (context.invocation_metadata() or ())
        if isinstance(v, str) and not k.startswith(":")
    ]


async def _abort(context: Any, status: int, raw: bytes) -> None:
    try:
        message = json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = raw.decode("utf-8", "replace")[:500] or f"HTTP status {status}"
    await context.abort(CODES.get(status, grpc.StatusCode.INTERNAL), message)


class Door:
    """The gRPC handlers over `app` (the server's ASGI app, routes and middleware)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def _open(self, request: Any, context: Any, chat: bool, stream: bool) -> Exchange:
        path = "/v1/chat/completions" if chat else "/v1/completions"
        body = json.dumps(request_body(request, chat, stream), ensure_ascii=False).encode()
        exchange = Exchange(self.app, "POST", path, body, _headers(context))
        await exchange.start()
        back = tuple((k, exchange.headers[k]) for k in BACK if k in exchange.headers)
        if back:
            await context.send_initial_metadata(back)
        return exchange

    async def unary(self, request: Any, context: Any, chat: bool) -> Any:
        exchange = await self._open(request, context, chat, stream=False)
        try:
            raw = b"".join([part async for part in exchange.chunks()])
        finally:
            await exchange.close()
        if exchange.status != 200:
            await _abort(context, exchange.status, raw)
        return response_message(json.loads(raw))

    async def stream(self, request: Any, context: Any, chat: bool) -> AsyncIterator[Any]:
        exchange = await self._open(request, context, chat, stream=True)
        try:
            if exchange.status != 200:
                await _abort(context, exchange.status, b"".join([part async for part in exchange.chunks()]))
            buffer = b""
            async for part in exchange.chunks():
                buffer += part
                *events, buffer = buffer.split(b"\n\n")
                for event in events:
                    data = event.removeprefix(b"data: ")
                    if data == b"[DONE]":
                        return
                    body = json.loads(data)
                    if "error" in body:
                        status = STREAM_CODES.get(str(body["error"].get("code")), 500)
                        await _abort(context, status, data)
                    yield response_message(body)
        finally:
            await exchange.close()

    async def health(self, request: Any, context: Any) -> Any:
        if request.service not in ("", schema.SERVICE):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return schema.HealthCheckResponse(status=await self._status())

    async def watch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        if request.service not in ("", schema.SERVICE):
            yield schema.HealthCheckResponse(status=3)  # SERVICE_UNKNOWN, as the standard servicer answers
            return
        last = None
        while True:
            status = await self._status()
            if status != last:
                yield schema.HealthCheckResponse(status=status)
                last = status
            await asyncio.sleep(0.5)

    async def _status(self) -> int:
        """/health's answer, read from the app (no request: a Watch would log one a poll)."""
        code, _ = self.app.state.status()
        return SERVING if code == 200 else NOT_SERVING

    def handlers(self) -> list[Any]:
        # partials, not lambdas: grpc.aio tells coroutine and async-generator handlers by inspection
        unary, stream, serialize = functools.partial, functools.partial, _serialize
        methods = {
            "Complete": grpc.unary_unary_rpc_method_handler(
                unary(self.unary, chat=False), schema.CompletionRequest.FromString, serialize
            ),
            "CompleteStream": grpc.unary_stream_rpc_method_handler(
                stream(self.stream, chat=False), schema.CompletionRequest.FromString, serialize
            ),
            "Chat": grpc.unary_unary_rpc_method_handler(
                unary(self.unary, chat=True), schema.ChatRequest.FromString, serialize
            ),
            "ChatStream": grpc.unary_stream_rpc_method_handler(
                stream(self.stream, chat=True), schema.ChatRequest.FromString, serialize
            ),
        }
        health = {
            "Check": grpc.unary_unary_rpc_method_handler(self.health, schema.HealthCheckRequest.FromString, serialize),
            "Watch": grpc.unary_stream_rpc_method_handler(self.watch, schema.HealthCheckRequest.FromString, serialize),
        }
        return [
            grpc.method_handlers_generic_handler(schema.SERVICE, methods),
            grpc.method_handlers_generic_handler(schema.HEALTH_SERVICE, health),
        ]


def _serialize(message: Any) -> bytes:
    return bytes(message.SerializeToString())


async def start(app: Any, address: str) -> tuple[Any, int]:
    """A grpc.aio server for `app` on `address` (host:port; port 0 picks a free one), started
    on the running event loop; returns it and its port."""
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(Door(app).handlers())
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot listen for gRPC on {address}")
    await server.start()
    return server, port


class Client:
    """A blocking Python client of the door (grpcio), for scripts and tests: each method takes a
    request message (grpc_schema) and optional metadata such as [("authorization", "Bearer KEY")]."""

    def __init__(self, target: str, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        self.channel = grpc.insecure_channel(target)
        self.metadata = metadata

        def call(kind: str, service: str, rpc: str, request: Any, response: Any) -> Any:
            method = getattr(self.channel, kind)
            return method(f"/{service}/{rpc}", request_serializer=_serialize, response_deserializer=response.FromString)

        done = schema.Completion
        self._complete = call("unary_unary", schema.SERVICE, "Complete", schema.CompletionRequest, done)
        self._complete_stream = call("unary_stream", schema.SERVICE, "CompleteStream", schema.CompletionRequest, done)
        self._chat = call("unary_unary", schema.SERVICE, "Chat", schema.ChatRequest, done)
        self._chat_stream = call("unary_stream", schema.SERVICE, "ChatStream", schema.ChatRequest, done)
        health = schema.HealthCheckResponse
        self._check = call("unary_unary", schema.HEALTH_SERVICE, "Check", schema.HealthCheckRequest, health)

    def complete(self, request: Any, **kwargs: Any) -> Any:
        return self._complete(request, metadata=self.metadata, **kwargs)

    def complete_stream(self, request: Any, **kwargs: Any) -> Iterator[Any]:
        return self._complete_stream(request, metadata=self.metadata, **kwargs)  # type: ignore[no-any-return]

    def chat(self, request: Any, **kwargs: Any) -> Any:
        return self._chat(request, metadata=self.metadata, **kwargs)

    def chat_stream(self, request: Any, **kwargs: Any) -> Iterator[Any]:
        return self._chat_stream(request, metadata=self.metadata, **kwargs)  # type: ignore[no-any-return]

    def health(self, service: str = "") -> int:
        return int(self._check(schema.HealthCheckRequest(service=service)).status)

    def close(self) -> None:
        self.channel.close()
