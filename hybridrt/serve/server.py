"""Run the app on uvicorn: from the CLI (blocking, SIGINT/SIGTERM shut it down gracefully) or,
for tests and scripts, in a background thread on a free port of 127.0.0.1.

A graceful shutdown drains: the listening socket stays open and work routes answer 503 while
open requests (streams included) finish; then uvicorn closes the connections and the app's
lifespan stops the engine, all within GRACEFUL_SHUTDOWN_S. After SIGTERM the process exits 0.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import GenerationError
from ..runtime.model import Model
from .app import create_app
from .engine import Engine
from .routes import ServedRoute, check_routes
from .settings import EngineConfig, ServeConfig

GRACEFUL_SHUTDOWN_S = 30


def build(
    model: Model | Callable[[], Model] | dict[str, Model | Callable[[], Model]],
    engine: EngineConfig,
    config: ServeConfig,
    assistant: Model | Callable[[], Model] | None = None,
    routes: Sequence[ServedRoute] = (),
) -> tuple[Engine, Any]:
    """A started engine (loading its model, and the assistant model if any, on its own
    thread) and the app over it; or, for {served name: model}, an engine per model (the first
    returned) and `routes` between them. The process's numpy arrays get plain pages from here
    on (plain_pages)."""
    plain_pages()
    if not isinstance(model, dict):
        eng = Engine(model, engine, assistant=assistant).start()
        return eng, create_app(eng, config, routes)
    if assistant is not None and len(model) > 1:
        raise GenerationError("an assistant (draft) model serves one model; serve several without --assistant")
    check_routes(routes, list(model))
    engines = {name: Engine(m, engine, assistant=assistant).start() for name, m in model.items()}
    return next(iter(engines.values())), create_app(engines, config, routes)


def plain_pages() -> bool:
    """Ask numpy not to madvise its large arrays (4 MB and more) for transparent huge pages,
    as NUMPY_MADVISE_HUGEPAGE=0 does at its import; False where this numpy has no such switch.
    Where the kernel compacts memory to find a huge page at the first write (THP defrag
    "madvise", a common default), a state buffer written for the first time stalls: a server
    does that between a request's arrival and its first token (a kept batch grown for a longer
    conversation, a cached state read into it). Measured on granite-h-350m's agent steps
    (2-core x86): 4.5-49.5 ms to restore a state, 5.6-13.3 ms with plain pages; prefill and
    decode speed the same within noise, five alternations each."""
    import importlib

    for name in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            toggle = getattr(importlib.import_module(name), "_set_madvise_hugepage", None)
        except ImportError:
            continue
        if toggle is not None:
            toggle(False)
            return True
    return False


def _uvicorn(app: Any, host: str, port: int, log_level: str) -> Any:
    import uvicorn

    class Draining(uvicorn.Server):
        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            drain = getattr(app.state, "drain", None)
            if drain is not None and not self.force_exit:
                start = time.monotonic()
                await drain(GRACEFUL_SHUTDOWN_S, lambda: self.force_exit)  # a second Ctrl-C: stop waiting
                # uvicorn's own wait for open connections gets what the drain left of the budget.
                self.config.timeout_graceful_shutdown = max(1, round(GRACEFUL_SHUTDOWN_S - (time.monotonic() - start)))
            await super().shutdown(sockets)

    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S, lifespan="on"
    )
    return Draining(config)


def serve(app: Any, host: str, port: int, log_level: str = "info") -> None:
    """Serve until SIGINT/SIGTERM: refuse new work, let open requests finish, stop the engine."""
    # uvicorn raises the signal it caught again once it has shut down, under the handler it
    # found: a drained SIGTERM is a normal end (status 0), not a kill.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    # The engine's own lines (the model loading, the prefix cache's budget and tiers) beside
    # uvicorn's, at the same level.
    logging.basicConfig(format="%(levelname)s:     %(name)s: %(message)s")
    logging.getLogger("hybridrt").setLevel(getattr(logging, log_level.upper(), logging.DEBUG))
    try:
        _uvicorn(app, host, port, log_level).run()
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclass
class Running:
    """A server on a background thread; `url` is its base address."""

    server: Any
    thread: threading.Thread
    url: str
    engine: Engine

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(GRACEFUL_SHUTDOWN_S + 10)


def start_in_thread(engine: Engine, app: Any, log_level: str = "warning") -> Running:
    """Start uvicorn on 127.0.0.1 on a free port, in a daemon thread; returns once it accepts."""
    # IPPROTO_TCP named, not left 0: asyncio sets TCP_NODELAY only on sockets that say they are
    # TCP, and without it every response after a connection's first waits ~40 ms for the
    # client's delayed ACK (its headers and body are two writes).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = _uvicorn(app, "127.0.0.1", port, log_level)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    return Running(server, thread, f"http://127.0.0.1:{port}", engine)
