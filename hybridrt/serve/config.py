"""Settings of the serving engine and the HTTP layer, importable without the `serve` extra:
the CLI builds its options (and their defaults) from them before anything is served."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import GenerationError
from ..runtime.decode import PREFILL_CHUNK


@dataclass(frozen=True)
class EngineConfig:
    """Sizes of the engine; the CLI's defaults come from here."""

    slots: int = 8
    chunk: int = PREFILL_CHUNK  # the prompt tokens one prefill call takes, as the runtime's
    max_queue: int = 64
    cache_bytes: int = 256 * 2**20

    def __post_init__(self) -> None:
        for name in ("slots", "chunk", "max_queue"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise GenerationError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if self.cache_bytes < 0:
            raise GenerationError(f"cache_bytes must be >= 0 (0: no prefix cache), got {self.cache_bytes!r}")


@dataclass(frozen=True)
class ServeConfig:
    """HTTP-side settings; the CLI's defaults come from here."""

    model_name: str = "default"
    api_key: str | None = None
    max_body_bytes: int = 1 << 20
    request_timeout: float = 600.0
    retry_after_s: int = 1
    # Updates a stream may hold unsent per choice (its client reads slower than tokens come)
    # before it ends with a `slow_client` error and frees its slot.
    stream_backlog: int = 256
