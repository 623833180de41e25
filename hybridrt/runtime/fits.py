"""Whether a call can run as asked: its rows within the model's length, vocabulary and batch
memory (check_rows_fit), and a prefix state cache it may resume from (check_cache_use)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import GenerationError
from ..graphs.manifest import Manifest
from .input_checks import check_eos_ids, check_memory
from .prefix_cache import StateCache
from .sampling import GenerationConfig
from .text import Prompts


def check_rows_fit(
    manifest: Manifest, rows: Sequence[Sequence[int]], cfg: GenerationConfig, past: int = 0, memory: bool = True
) -> None:
    """GenerationError unless rows (after `past` tokens) and cfg.max_new_tokens fit the model:
    its max length, its vocabulary (EOS ids) and (with `memory`) the batch memory limit."""
    longest = past + max(len(r) for r in rows)
    if longest + cfg.max_new_tokens > manifest.max_length:
        raise GenerationError(
            f"prompt of {longest} tokens + max_new_tokens {cfg.max_new_tokens} exceeds the model's max length "
            f"{manifest.max_length}; shorten the prompt or lower max_new_tokens"
        )
    check_eos_ids(cfg.eos_ids(()), manifest.vocab_size)
    if memory:
        check_memory(manifest, len(rows) * cfg.num_beams, longest + cfg.max_new_tokens)


def check_cache_use(
    cache: Any, owner: Any, prompts: Prompts | None, cfg: GenerationConfig | None, assistant: bool
) -> None:
    """GenerationError unless `cache` is a StateCache made for the model `owner` names and the
    call can resume from it: one prompt, no beams, no draft."""
    if not isinstance(cache, StateCache) or cache.owner != owner:
        raise GenerationError("cache= takes a StateCache made for this model: model.state_cache()")
    if prompts is not None and not prompts.single:
        raise GenerationError("cache= takes one prompt; generate a batch without it, or one prompt at a time")
    if cfg is not None and cfg.num_beams > 1:
        raise GenerationError("beam search does not resume from a prefix state cache: drop cache= or num_beams")
    if assistant:
        raise GenerationError(
            "speculative decoding does not resume from a prefix state cache: drop cache= or assistant_model"
        )
