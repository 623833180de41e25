"""OpenAI-compatible serving: an engine thread with continuous batching over state slots, and
the HTTP layer over it. Needs the `serve` extra (starlette, uvicorn, prometheus_client, jinja2);
never imports torch."""

from .app import ServeConfig, create_app
from .engine import Engine, EngineConfig

__all__ = ["Engine", "EngineConfig", "ServeConfig", "create_app"]
