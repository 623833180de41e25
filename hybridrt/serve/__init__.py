"""OpenAI-compatible serving: an engine thread with continuous batching over state slots, and
the HTTP layer over it. Needs the `serve` extra (starlette, uvicorn, prometheus_client, jinja2);
never imports torch. The settings (`EngineConfig`, `ServeConfig`) import without the extra."""

from typing import Any

from .settings import EngineConfig, ServeConfig

__all__ = ["Engine", "EngineConfig", "ServeConfig", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from .engine import Engine

        return Engine
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(f"module 'hybridrt.serve' has no attribute {name!r}")
