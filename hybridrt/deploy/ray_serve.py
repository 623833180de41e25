"""`hybridrt serve MODEL ... --ray`: the server as a Ray Serve application (`pip install
'hybridrt[ray]'`), on a local cluster started for the command or on a running one
(`--ray-address`).

Two deployments. `engine` replicas each hold the app that `hybridrt serve` builds from the same
flags (its engines, continuous batching and prefix state cache): a request reaches it as the
HTTP request it is, handed to that app in-process (serve/exchange.py), so routes, parsing,
errors, the API key and the per-request log line (`door`: "ray") are the server's own. The
`front` ingress reads each request's body, computes the chain of digests of its prompt's
prefix (ray_router.affinity_keys), and calls an engine replica through a deployment handle whose
router (ray_router.AffinityRouter) sends it to the replica that served the longest of those prefixes, the one
holding that conversation's states, unless that replica has `bound` requests or more in hand;
then, and for a prefix seen nowhere, Ray's own choice (the less loaded of two). A replica
that dies mid-stream ends the stream with an error event; one that dies before answering is
a 503; Ray starts a new one. A turn sent away from the replica holding its states fetches them
from there where that beats prefilling them again (ray_peers.py).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import GraphError
from ..serve.api_error import ApiError
from ..serve.exchange import Exchange
from ..serve.openai import error_event
from ..serve.request_log import HEADER, configure
from .ray_peers import FETCHED, KEYS, PeerStates, StateDirectory, handle, header, snapshot_for
from .ray_router import affinity_keys

LOOPBACK = "127.0.0.1"
APP = "hybridrt"  # the Ray Serve application's name
NOT_LOADED = "a replica could not load its model"
# Headers that belong to the front's connection, not to the request the replica answers.
HOP = {b"host", b"content-length", b"content-type", b"connection", b"transfer-encoding", b"keep-alive"}


# --- the deployments -------------------------------------------------------------------------


class EngineReplica:
    """One replica: the server's app, built by `make_app` (commands/serve.app_from_args over
    the command's flags), answering requests handed to it whole."""

    def __init__(self, make_app: Callable[[], Any], directory: Any = None, log: tuple[str, int] | None = None) -> None:
        import ray
        from ray import serve

        self.name = str(serve.get_replica_context().replica_id.unique_id)
        if log is None:
            configure()  # stderr: the replica's Ray log
        else:
            configure(replica_log(log[0], self.name), log[1])
        self.app = make_app()
        self.node = ray.get_runtime_context().get_node_id()
        # With a state directory (the affinity router's), states move here from other replicas.
        self.peers = None if directory is None else PeerStates(self.name, directory, lambda: handle("engine", APP))
        self.app.state.server.state_source = self.peers
        # Ready only once its models are loaded: Ray sends no request to a replica still starting.
        for engine in self.app.state.engines.values():
            while not engine.ready.wait(0.05) and engine.error is None:
                pass
            if engine.error is not None:
                raise RuntimeError(f"{NOT_LOADED}: {engine.error}") from engine.error

    async def call(
        self, keys: list[str], method: str, path: str, query: bytes, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> AsyncIterator[Any]:
        """The response's head ({status, headers, replica, pid}), then its body in chunks."""
        exchange = Exchange(self.app, method, path, body, headers, door="ray", query=query, extra={KEYS: keys})
        try:
            status = await exchange.start()
            if self.peers is not None and status == 200:
                self.peers.record(keys)
            yield {
                "status": status,
                "headers": exchange.headers,
                "replica": self.name,
                "pid": os.getpid(),
                "node": self.node,
                "state_from": header(exchange.scope.get(FETCHED)),
            }
            async for chunk in exchange.chunks():
                yield chunk
        finally:
            await exchange.close()  # the front's client left (or the stream ended): the job is done

    async def state(self, keys: list[str], replica: str, model: str, tokens: list[int], at_least: int) -> Any:
        """This replica's deepest state of `tokens` for another replica (ray_peers), if it is
        the replica asked for and it holds `at_least` tokens of them; else None."""
        engine = self.app.state.engines.get(model) if replica == self.name else None
        return None if engine is None else snapshot_for(engine.cache, tokens, at_least)

    async def check_health(self) -> None:
        """Ray's health check: a replica whose engine failed is replaced."""
        status, body = self.app.state.status()
        if body.get("status") == "failed":
            raise RuntimeError(f"the engine failed: {body['error']}")


class Front:
    """The ingress: every route of the server, forwarded to an engine replica."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    async def __call__(self, request: Any) -> Any:
        from starlette.responses import StreamingResponse

        from ..serve.app import error_response

        body = await request.body()
        keys = affinity_keys(request.url.path, body) if request.method == "POST" else []
        headers = [(k, v) for k, v in request.headers.raw if k.lower() not in HOP]
        stream = self.engine.options(stream=True).call.remote(
            keys, request.method, request.url.path, request.url.query.encode(), headers, body
        )
        try:
            head = await stream.__anext__()
        except Exception as e:  # the replica died before it answered
            return error_response(_gone(f"the replica serving this request stopped before it answered ({e})"))
        # Ray's proxy answers with the request's x-request-id (the one the replica logged) itself.
        out = {k: v for k, v in head["headers"].items() if k not in {"content-length", "transfer-encoding", HEADER}}
        out["x-hybridrt-replica"], out["x-hybridrt-replica-pid"] = head["replica"], str(head["pid"])
        out["x-hybridrt-replica-node"] = head["node"]
        if head.get("state_from"):
            out["x-hybridrt-state-from"] = head["state_from"]
        sse = out.get("content-type", "").startswith("text/event-stream")

        async def rest() -> AsyncIterator[bytes]:
            try:
                async for chunk in stream:
                    yield chunk
            except Exception as e:  # the replica died mid-stream: the client hears so, never waits
                if not sse:
                    raise  # a JSON body cut short: the connection ends unfinished, as the client must see
                yield error_event(_gone(f"the replica serving this stream stopped ({type(e).__name__})"))

        return StreamingResponse(rest(), status_code=head["status"], headers=out)


def _gone(message: str) -> ApiError:
    """The server's own 503 (its OpenAI error body), for a replica that died under a request."""
    return ApiError(503, message, code="replica_gone")


# --- the command -----------------------------------------------------------------------------


@dataclass(frozen=True)
class RayOptions:
    """--ray's settings: replicas (a fixed count, or autoscaling from `replicas` to
    `max_replicas` at `target_ongoing` requests per replica), CPUs per replica, the cluster."""

    replicas: int = 1
    max_replicas: int | None = None
    target_ongoing: float = 2.0
    cpus_per_replica: float = 1.0
    address: str | None = None  # None: start a local cluster; "auto" or host:port: join one
    local_cpus: int | None = None  # the local cluster's CPUs (default: every core)
    router: str = "affinity"  # or "default": Ray's power of two choices
    state_moves: bool = True  # with affinity: states move between replicas (ray_peers.py)
    bound: int = 8  # requests in hand past which affinity gives way
    max_ongoing: int = 72  # requests a replica takes before Ray queues them (slots + queue)
    shutdown_s: float = 600.0  # a draining replica's time to finish its streams
    # Each replica's request log lines (serve.request_log) in a file of its own on its host,
    # `<log_file>` with the replica's id before the suffix, rotated at log_bytes; None: its Ray log.
    log_file: str | None = None
    log_bytes: int = 100 << 20


def application(make_app: Callable[[], Any], options: RayOptions) -> Any:
    """The bound Ray Serve application (serve.run takes it)."""
    from ray import serve

    scaling: dict[str, Any] = {"num_replicas": options.replicas}
    if options.max_replicas is not None:
        scaling = {
            "autoscaling_config": {
                "min_replicas": options.replicas,
                "max_replicas": options.max_replicas,
                "target_ongoing_requests": options.target_ongoing,
                "upscale_delay_s": 2.0,
                "downscale_delay_s": 10.0,
            }
        }
    if options.router == "affinity":
        from ray.serve.config import RequestRouterConfig

        scaling["request_router_config"] = RequestRouterConfig(
            request_router_class="hybridrt.deploy.ray_router:AffinityRouter",  # type: ignore[arg-type]
            request_router_kwargs={"bound": options.bound},
        )
    engine = serve.deployment(
        name="engine",
        ray_actor_options={"num_cpus": options.cpus_per_replica},
        max_ongoing_requests=options.max_ongoing,
        graceful_shutdown_timeout_s=options.shutdown_s,
        health_check_period_s=2.0,
        max_constructor_retry_count=3,  # a model that does not load fails the start, not forever
        **scaling,
    )(EngineReplica)
    front = serve.deployment(name="front", ray_actor_options={"num_cpus": 0}, max_ongoing_requests=4096)(Front)
    log = None if options.log_file is None else (options.log_file, options.log_bytes)
    if options.router != "affinity" or not options.state_moves:  # calls name their replica only with affinity
        return front.bind(engine.bind(make_app, None, log))
    directory = serve.deployment(name="states", ray_actor_options={"num_cpus": 0})(StateDirectory)
    return front.bind(engine.bind(make_app, directory.bind(), log))


def replica_log(path: str, replica: str) -> str:
    """A replica's own request log file: `path` with the replica's id before its suffix."""
    p = Path(path)
    return str(p.with_name(f"{p.stem}.{replica}{p.suffix}"))


def _deployment_message() -> str:
    """What Ray Serve says of the engine deployment (a replica's constructor error)."""
    from ray import serve

    try:
        return str(serve.status().applications[APP].deployments["engine"].message)
    except Exception:
        return ""


def run(make_app: Callable[[], Any], options: RayOptions, host: str, port: int) -> None:
    """Start (or join) the cluster, run the application on host:port, and keep it up until
    SIGINT or SIGTERM; then shut the application down (replicas finish their streams first)."""
    import ray
    from ray import serve

    if options.address is None:  # the local cluster listens on the loopback interface only
        ray.init(num_cpus=options.local_cpus, include_dashboard=False, log_to_driver=False, _node_ip_address=LOOPBACK)
    else:
        ray.init(address=options.address, log_to_driver=False)
    serve.start(http_options={"host": host, "port": port})
    try:
        serve.run(application(make_app, options), name=APP, route_prefix="/", blocking=False)
    except Exception as e:  # a replica that cannot start (its model, its port): one line, not Ray's trace
        text = (_deployment_message() or str(e)).splitlines() or [repr(e)]
        _leave(options)
        why = [line for line in text if NOT_LOADED in line] or [line for line in text if "Error" in line] or text
        raise GraphError(
            f"the Ray Serve application did not start: {why[-1].strip().removeprefix('RuntimeError: ')}"
        ) from None
    print(f"hybridrt on Ray Serve: http://{host}:{port}", flush=True)
    stop, received = threading.Event(), []

    def on_signal(number: int, frame: Any) -> None:
        received.append(number)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    stop.wait()
    # Ctrl-C at a terminal reaches the whole process group, the local cluster's own processes
    # too: they are already stopping, so there is nothing left to drain through.
    _leave(options, drain=not (options.address is None and received[0] == signal.SIGINT))


def _leave(options: RayOptions, drain: bool = True) -> None:
    """Take the application down, open streams finished first (`drain`): with the local cluster,
    Serve and the cluster too; on a running cluster only this application (other applications
    and Serve itself stay)."""
    import ray
    from ray import serve

    if drain and options.address is None:
        serve.shutdown()
    elif drain:
        serve.delete(APP)
    ray.shutdown()
