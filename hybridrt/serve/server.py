"""Run the app on uvicorn: from the CLI (blocking, SIGINT/SIGTERM shut it down gracefully) or,
for tests and scripts, in a background thread on a free port of 127.0.0.1."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..runtime.model import Model
from .app import create_app
from .config import EngineConfig, ServeConfig
from .engine import Engine

GRACEFUL_SHUTDOWN_S = 30


def build(
    model: Model | Callable[[], Model],
    engine: EngineConfig,
    config: ServeConfig,
    assistant: Model | Callable[[], Model] | None = None,
) -> tuple[Engine, Any]:
    """A started engine (loading its model, and the assistant model if any, on its own
    thread) and the app over it."""
    eng = Engine(model, engine, assistant=assistant).start()
    return eng, create_app(eng, config)


def _uvicorn(app: Any, host: str, port: int, log_level: str) -> Any:
    import uvicorn

    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S, lifespan="on"
    )
    return uvicorn.Server(config)


def serve(app: Any, host: str, port: int, log_level: str = "info") -> None:
    """Serve until SIGINT/SIGTERM: stop accepting, let open requests finish, stop the engine."""
    _uvicorn(app, host, port, log_level).run()


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
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
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
