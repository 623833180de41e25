"""The OpenAI-compatible HTTP layer (Starlette): checks requests, queues them on the engine and
streams its tokens back. It never runs the model itself.

Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health (no key;
503 until the model is loaded), GET /metrics (Prometheus text). Errors are OpenAI's
{"error": {"message", "type", "param", "code"}} with a 4xx status for anything the client
can fix; no stack trace reaches a client.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import GenerationError
from ..runtime.model import Model
from .chat import ChatTemplate, check_messages
from .config import ServeConfig
from .engine import Engine, EngineBusy, EngineClosed
from .jobs import Job
from .metrics import CONTENT_TYPE
from .protocol import (
    CHAT_FIELDS,
    COMPLETION_FIELDS,
    FAILURES,
    ApiError,
    Params,
    check_fields,
    failure,
    params,
    parse_json,
)
from .sse import EventStream, full_body

ROUTES = ("/health", "/metrics", "/v1/models", "/v1/completions", "/v1/chat/completions")
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


class Server:
    def __init__(self, engine: Engine, config: ServeConfig) -> None:
        self.engine = engine
        self.config = config
        self.template: ChatTemplate | None = None
        self.created = int(time.time())

    def model(self) -> Model:
        if self.engine.error is not None:
            raise ApiError(503, f"the model failed to load: {self.engine.error}")
        if not self.engine.ready.is_set() or self.engine.model is None:
            raise ApiError(503, "the model is loading; retry shortly", headers={"Retry-After": "1"})
        return self.engine.model

    async def health(self, request: Request) -> Response:
        if self.engine.error is not None:
            return JSONResponse({"status": "failed", "error": str(self.engine.error)}, 503)
        if not self.engine.ready.is_set():
            return JSONResponse({"status": "loading"}, 503)
        if self.engine.closing:
            return JSONResponse({"status": "shutting down"}, 503)
        return JSONResponse({"status": "ok"})

    async def metrics(self, request: Request) -> Response:
        return Response(self.engine.metrics.render(), media_type=CONTENT_TYPE)

    async def models(self, request: Request) -> Response:
        model = self.model()
        card = {
            "id": self.config.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "hybridrt",
            "max_model_len": model.max_length,
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def completions(self, request: Request) -> Response:
        body = await self._body(request, COMPLETION_FIELDS)
        model = self.model()
        try:
            rows = model.prompt_rows(body.get("prompt")).rows  # text gets <s> where the model asks for it
        except GenerationError as e:
            raise ApiError(400, str(e), "prompt") from None
        p = params(body, rows, model.max_length, COMPLETION_DEFAULT_MAX_TOKENS, model.manifest.generation)
        return await self._run(request, p, chat=False)

    async def chat(self, request: Request) -> Response:
        body = await self._body(request, CHAT_FIELDS)
        model = self.model()
        messages = check_messages(body.get("messages"))
        if self.template is None:
            self.template = ChatTemplate.for_model(model.path)
        try:
            # Tokenized as generate() would tokenize the rendered text: <s> first where the model asks for it.
            rows = model.prompt_rows(self.template.render(messages)).rows
        except GenerationError as e:
            raise ApiError(400, str(e), "messages") from None
        p = params(body, rows, model.max_length, None, model.manifest.generation)
        return await self._run(request, p, chat=True)

    async def _body(self, request: Request, known: set[str]) -> dict[str, Any]:
        limit = self.config.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"the request body exceeds {limit} bytes")
        raw = bytearray()
        async for part in request.stream():
            raw += part
            if len(raw) > limit:
                raise ApiError(413, f"the request body exceeds {limit} bytes")
        body = parse_json(bytes(raw))
        check_fields(body, known, self.config.model_name)
        return body

    async def _run(self, request: Request, p: Params, chat: bool) -> Response:
        model = self.model()
        job = Job(self.engine, p, model.tokenizer, self.config.request_timeout)
        try:
            job.submit()
        except EngineBusy as e:
            raise ApiError(429, str(e), headers={"Retry-After": str(self.config.retry_after_s)}) from None
        except EngineClosed as e:
            raise ApiError(503, str(e)) from None
        except GenerationError as e:
            raise ApiError(400, str(e)) from None
        meta = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            "created": int(time.time()),
            "model": self.config.model_name,
        }
        if p.stream:
            return EventStream(job, meta, chat, p.include_usage)
        watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
        try:
            async for _ in job.pieces():
                pass
        finally:
            watcher.cancel()
        failed = next((c for c in job.choices if c.finish_reason in FAILURES), None)
        if failed is not None:
            raise failure(failed.finish_reason, failed.error)
        return JSONResponse(full_body(job, meta, chat))


async def _cancel_on_disconnect(request: Request, job: Job) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    job.cancel()


class Guard:
    """ASGI middleware: the API key on every route but /health, and requests counted by route and status."""

    def __init__(self, app: Any, server: Server) -> None:
        self.app, self.server = app, server
        key = server.config.api_key
        self.expected = None if key is None else f"Bearer {key}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        status = [500]

        async def counted(message: Any) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            if self.expected is not None and path != "/health" and not self._authorized(scope):
                error = ApiError(
                    401, "missing or wrong API key: send Authorization: Bearer KEY", code="invalid_api_key"
                )
                await error_response(error)(scope, receive, counted)
            else:
                await self.app(scope, receive, counted)
        finally:
            route = path if path in ROUTES else "other"
            self.server.engine.metrics.requests.labels(route, str(status[0])).inc()

    def _authorized(self, scope: Any) -> bool:
        got = dict(scope["headers"]).get(b"authorization", b"")
        assert self.expected is not None
        return hmac.compare_digest(got, self.expected)


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), e.status, headers=e.headers)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return error_response(ApiError(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}"))


async def _server_error(request: Request, exc: Exception) -> Response:
    return error_response(ApiError(500, "internal server error", code="internal_error"))


def create_app(engine: Engine, config: ServeConfig | None = None) -> Starlette:
    """The ASGI app over a started engine (which may still be loading its model)."""
    server = Server(engine, config or ServeConfig())
    routes = [
        Route("/health", server.health, methods=["GET"]),
        Route("/metrics", server.metrics, methods=["GET"]),
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/v1/completions", server.completions, methods=["POST"]),
        Route("/v1/chat/completions", server.chat, methods=["POST"]),
    ]
    handlers = {ApiError: _api_error, HTTPException: _http_error, Exception: _server_error}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        # After the server's graceful shutdown has let open requests finish.
        await anyio.to_thread.run_sync(engine.stop)

    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan)  # type: ignore[arg-type]
    app.add_middleware(Guard, server=server)  # type: ignore[arg-type]
    return app
