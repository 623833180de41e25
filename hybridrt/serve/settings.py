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
    chunk: int = PREFILL_CHUNK  # the prompt tokens one prefill call takes (twice while none decodes)
    max_queue: int = 64
    # The prefix state cache (hybridrt.runtime.prefix_cache): its memory budget (None: a share of
    # the memory available at start; 0: off), its disk tier (None: none) and that tier's cap (None:
    # a share of the free space there), and the tokens between checkpoints inside a prompt (None:
    # from the model's state sizes).
    cache_bytes: int | None = None
    cache_dir: str | None = None
    cache_disk_bytes: int | None = None
    cache_spacing: int | None = None
    cache_stored: str = "float32"  # "bfloat16": float32 states kept at half the bytes (opt-in, not exact)
    idle_release_s: float = 30.0  # an emptied decode batch's buffers are kept this long for the next request

    def __post_init__(self) -> None:
        for name in ("slots", "chunk", "max_queue"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise GenerationError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if not isinstance(self.idle_release_s, (int, float)) or not self.idle_release_s > 0:
            raise GenerationError(f"idle_release_s must be a number of seconds > 0, got {self.idle_release_s!r}")
        if self.cache_stored not in ("float32", "bfloat16"):
            raise GenerationError(f"cache_stored must be float32 or bfloat16, got {self.cache_stored!r}")
        for name in ("cache_bytes", "cache_disk_bytes", "cache_spacing"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise GenerationError(f"{name} must be an integer >= 0 or unset, got {value!r}")


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
    chat_template: str | None = None  # a Jinja chat template's source, over the model's own
    # Per-request log lines (request_log.py): the prompt's first N characters in each (0: none).
    log_prompts: int = 0
    # host:port of the gRPC door (grpc_api.py; port 0: a free one, in app.state.grpc_port), or none.
    grpc_address: str | None = None
