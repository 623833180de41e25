"""The OpenAI-compatible HTTP layer (Starlette): checks requests, queues them on the engine and
streams its tokens back. It never runs the model itself.

Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health (no key;
503 until the model is loaded), GET /metrics (Prometheus text), GET /openapi.json (no key; their
description, openapi.py), GET / (no key: the chat page and its assets, page.py). Errors are OpenAI's
{"error": {"message", "type", "param", "code"}} with a 4xx status for anything the client
can fix; no stack trace reaches a client. Every request gets an id (the client's X-Request-ID, or
a new one) returned in that header, and one JSON log line when it ends (request_log.py). With
ServeConfig.grpc_address, a gRPC door (grpc_api.py) hands its calls to this same app.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import GenerationError
from ..runtime.model import Model
from . import openai, page
from .chat import ChatTemplate, chat_params
from .engine import Engine, EngineBusy, EngineClosed
from .jobs import Job
from .metrics import CONTENT_TYPE, ServerMetrics, render
from .openapi import spec
from .protocol import CHAT_FIELDS, COMPLETION_FIELDS, ApiError, Params, check_fields, completion_params, parse_json
from .request_log import HEADER, RequestRecord, request_id, write
from .routes import ROUTE_HEADER, USER_HEADER, LengthRoute, ServedRoute, check_routes
from .settings import ServeConfig
from .sse import EventStream, full_body

ROUTES = ("/health", "/metrics", "/openapi.json", "/v1/models", "/v1/completions", "/v1/chat/completions")
PUBLIC = ("/health", "/openapi.json", *page.FILES)  # no API key

log = logging.getLogger("hybridrt.serve")


class Server:
    """The HTTP side of one or several served models (each its own engine, first = the default
    one) and the routes between them (routes.py)."""

    def __init__(self, engines: dict[str, Engine], config: ServeConfig, routes: Sequence[ServedRoute] = ()) -> None:
        check_routes(routes, list(engines))
        self.engines = engines
        self.engine = next(iter(engines.values()))
        self.routes = {r.name: r for r in routes}
        self.config = config
        self.metrics = ServerMetrics()
        self.templates: dict[str, ChatTemplate] = {}
        self.created = int(time.time())
        self.draining = False  # SIGTERM: work routes answer 503 while open requests finish
        self.open = 0  # requests on work routes (/v1/...) not yet answered in full
        # Where a request may find states deeper than its engine's cache holds (another
        # replica's: deploy/ray_peers.py): `await fill(model, cache, tokens, scope)`.
        self.state_source: Any = None

    @property
    def names(self) -> list[str]:
        """Every name a request's `model` may take: the models, then the routes."""
        return [*self.engines, *self.routes]

    async def drain(self, timeout: float, give_up: Callable[[], bool] = lambda: False) -> None:
        """Refuse new work (503) and wait, up to timeout seconds or until give_up(), for open
        requests to finish."""
        self.draining = True
        deadline = time.monotonic() + timeout
        while self.open and time.monotonic() < deadline and not give_up():
            await asyncio.sleep(0.05)

    def model(self, name: str | None = None) -> Model:
        engine = self.engines[name] if name is not None else self.engine
        label = "the model" if len(self.engines) == 1 else f"the model {name or next(iter(self.engines))!r}"
        if engine.error is not None:
            raise ApiError(503, f"{label} failed to load: {engine.error}")
        if not engine.ready.is_set() or engine.model is None:
            raise ApiError(503, f"{label} is loading; retry shortly", headers={"Retry-After": "1"})
        return engine.model

    def status(self) -> tuple[int, dict[str, Any]]:
        """(HTTP status, body) of /health: 200 once every model is loaded, else 503 and why."""
        failed = {n: str(e.error) for n, e in self.engines.items() if e.error is not None}
        if failed:
            error = next(iter(failed.values())) if len(self.engines) == 1 else failed
            return 503, {"status": "failed", "error": error}
        if not all(e.ready.is_set() for e in self.engines.values()):
            return 503, {"status": "loading"}
        if any(e.closing for e in self.engines.values()) or self.draining:
            return 503, {"status": "shutting down"}
        return 200, {"status": "ok"}

    async def health(self, request: Request) -> Response:
        code, body = self.status()
        return JSONResponse(body, code)

    async def metrics_text(self, request: Request) -> Response:
        return Response(render(self.metrics, {n: e.metrics for n, e in self.engines.items()}), media_type=CONTENT_TYPE)

    async def openapi(self, request: Request) -> Response:
        model = self.engine.model if self.engine.ready.is_set() else None
        max_length, vocab = (None, None) if model is None else (model.max_length, int(model.manifest.vocab_size))
        return JSONResponse(spec(self.config.model_name, max_length, vocab, self.config.api_key is not None))

    async def models(self, request: Request) -> Response:
        lengths = {name: self.model(name).max_length for name in self.engines}
        for route in self.routes.values():  # a route takes what every model it may choose takes
            lengths[route.name] = min(lengths[m] for m in route.models)
        return JSONResponse(openai.model_list(list(lengths.items()), self.created))

    async def completions(self, request: Request) -> Response:
        body = await self._body(request, COMPLETION_FIELDS)
        name, p = self._choose(request, body, lambda m: completion_params(self.model(m), body))
        return await self._run(request, name, p, chat=False)

    async def chat(self, request: Request) -> Response:
        body = await self._body(request, CHAT_FIELDS)

        def params(name: str) -> Params:
            model = self.model(name)
            if name not in self.templates:
                self.templates[name] = ChatTemplate.for_model(model.path, self.config.chat_template)
            return chat_params(model, self.templates[name], body)

        name, p = self._choose(request, body, params)
        return await self._run(request, name, p, chat=True)

    def _choose(self, request: Request, body: dict[str, Any], params: Callable[[str], Params]) -> tuple[str, Params]:
        """The served model of the body's `model` (itself, or a route's choice, recorded) and
        the request's parameters on it; a prompt is tokenized once unless a length route
        counted it with another model's tokenizer."""
        wanted = str(body["model"])
        route = self.routes.get(wanted)
        if route is None:
            return wanted, params(wanted)  # check_fields refused a name that is served by neither
        record: RequestRecord = request.state.record
        if isinstance(route, LengthRoute):
            counted = params(route.short)
            chosen = route.choose(max(len(r) for r in counted.rows))
            record.route, record.variant = route.name, chosen
            return chosen, counted if chosen == route.short else params(chosen)
        chosen = route.choose(body.get("user") or request.headers.get(USER_HEADER))
        record.route, record.variant = route.name, chosen
        return chosen, params(chosen)

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
        check_fields(body, known, self.names)
        return body

    async def _run(self, request: Request, name: str, p: Params, chat: bool) -> Response:
        model, engine = self.model(name), self.engines[name]
        job = Job(engine, p, model.tokenizer, self.config.request_timeout, self.config.stream_backlog)
        record: RequestRecord = request.state.record
        record.model, record.job = name, job
        if self.config.log_prompts and model.tokenizer is not None:
            record.prompt = model.tokenizer.decode(p.rows[0], skip_special_tokens=False)
        if self.state_source is not None and len(p.rows) == 1 and engine.cache is not None:
            try:
                await self.state_source.fill(name, engine.cache, p.rows[0], request.scope)
            except Exception as e:  # no state: the request prefills as usual
                log.warning("fetching a state from another replica failed: %s", e)
        try:
            job.submit()
        except EngineBusy as e:
            raise ApiError(429, str(e), headers={"Retry-After": str(self.config.retry_after_s)}) from None
        except EngineClosed as e:
            raise ApiError(503, str(e)) from None
        except GenerationError as e:
            raise ApiError(400, str(e)) from None
        meta = openai.meta(chat, name)
        if p.stream:
            return EventStream(job, meta, chat, p.include_usage, p.continuous_usage)
        watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
        try:
            async for _ in job.pieces():
                pass
        finally:
            watcher.cancel()
        failed = next((c for c in job.choices if c.finish_reason in openai.FAILURES), None)
        if failed is not None:
            raise openai.failure(failed.finish_reason, failed.error)
        return JSONResponse(full_body(job, meta, chat))


async def _cancel_on_disconnect(request: Request, job: Job) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    job.cancel()


class Guard:
    """ASGI middleware: the API key on every route but PUBLIC ones, and requests counted by route and status."""

    def __init__(self, app: Any, server: Server) -> None:
        self.app, self.server = app, server
        key = server.config.api_key
        self.expected = None if key is None else f"Bearer {key}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        status = [500]
        given = dict(scope["headers"]).get(b"x-request-id")
        record = RequestRecord(request_id(given), scope["method"], path, scope.get("hybridrt.door", "http"))
        scope.setdefault("state", {})["record"] = record  # the routes' request.state.record
        tag = (HEADER.encode(), record.request_id.encode())

        async def counted(message: Any) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                tags = [tag]
                if record.route is not None:  # a routed name: which model it chose
                    tags.append((ROUTE_HEADER.encode(), f"{record.route}={record.variant}".encode()))
                message = message | {"headers": [*message.get("headers", []), *tags]}
            await send(message)

        work = path.startswith("/v1/")
        try:
            if self.expected is not None and path not in PUBLIC and not self._authorized(scope):
                error = ApiError(
                    401, "missing or wrong API key: send Authorization: Bearer KEY", code="invalid_api_key"
                )
                record.error = error.message
                await error_response(error)(scope, receive, counted)
            elif work and self.server.draining:
                error = ApiError(503, "the server is shutting down", code="shutting_down")
                record.error = error.message
                await error_response(error)(scope, receive, counted)
            elif work:
                self.server.open += 1
                try:
                    await self.app(scope, receive, counted)
                finally:
                    self.server.open -= 1
            else:
                await self.app(scope, receive, counted)
        finally:
            route = path if path in ROUTES or path in page.FILES else "other"
            metrics = self.server.metrics
            metrics.requests.labels(route, str(status[0])).inc()
            record.status = status[0]
            fields = write(record, self.server.config.log_prompts)
            if record.model is not None:
                metrics.request_seconds.labels(record.model).observe(fields["total_s"])
                if fields["queue_wait_s"] is not None:
                    metrics.queue_wait.labels(record.model).observe(fields["queue_wait_s"])
            if record.route is not None:
                chosen = (record.route, str(record.variant))
                metrics.routed.labels(*chosen).inc()
                metrics.routed_tokens.labels(*chosen).inc(fields["completion_tokens"])
                metrics.routed_seconds.labels(*chosen).observe(fields["total_s"])

    def _authorized(self, scope: Any) -> bool:
        got = dict(scope["headers"]).get(b"authorization", b"")
        assert self.expected is not None
        return hmac.compare_digest(got, self.expected)


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), e.status, headers=e.headers)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    _record_error(request, exc.message)
    return error_response(exc)


def _record_error(request: Request, message: str) -> None:
    record = getattr(request.state, "record", None)
    if record is not None:
        record.error = message


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    error = ApiError(
        exc.status_code, f"{exc.detail}: {request.method} {request.url.path}", headers=dict(exc.headers or {})
    )
    _record_error(request, error.message)
    return error_response(error)


async def _server_error(request: Request, exc: Exception) -> Response:
    _record_error(request, f"internal server error: {type(exc).__name__}: {exc}")  # the log's, not the client's
    return error_response(ApiError(500, "internal server error", code="internal_error"))


def create_app(
    engine: Engine | dict[str, Engine], config: ServeConfig | None = None, routes: Sequence[ServedRoute] = ()
) -> Starlette:
    """The ASGI app over a started engine (which may still be loading its model), or over
    several ({served name: engine}, the first the default) with `routes` between them."""
    config = config or ServeConfig()
    engines = engine if isinstance(engine, dict) else {config.model_name: engine}
    server = Server(engines, config, routes)
    paths = [
        Route("/health", server.health, methods=["GET"]),
        Route("/metrics", server.metrics_text, methods=["GET"]),
        Route("/openapi.json", server.openapi, methods=["GET"]),
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/v1/completions", server.completions, methods=["POST"]),
        Route("/v1/chat/completions", server.chat, methods=["POST"]),
        *page.routes(key_required=server.config.api_key is not None),
    ]
    handlers = {ApiError: _api_error, HTTPException: _http_error, Exception: _server_error}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        door = None
        if config.grpc_address is not None:  # the gRPC door, on this loop, into this app
            from .grpc_api import start

            door, app.state.grpc_port = await start(app, config.grpc_address)
        yield
        # After the server's graceful shutdown has let open requests (gRPC calls too) finish.
        if door is not None:
            await door.stop(1)
        for each in engines.values():
            await anyio.to_thread.run_sync(each.stop)

    app = Starlette(routes=paths, exception_handlers=handlers, lifespan=lifespan)  # type: ignore[arg-type]
    app.add_middleware(Guard, server=server)  # type: ignore[arg-type]
    app.state.engines = engines  # {served name: engine}
    app.state.drain = server.drain  # awaited by the uvicorn runner (server.py) on SIGTERM/SIGINT
    app.state.status = server.status  # /health's answer, for the gRPC door's health service
    app.state.server = server  # a host of the app sets its state_source (deploy/ray_peers.py)
    return app
