"""Checks of generation inputs by type and range, before any work is done. Torch-free.

One rule per GenerationConfig field (a bool is not an int, NaN and inf are not numbers a
caller means, sequences are checked element by element) and the prompt-side checks that
need the model: text the tokenizer cannot take, a batch whose states and logits would not
fit in the memory limit, rows within the model's length and vocabulary (check_rows_fit), and
a prefix state cache a call may resume from (check_cache_use). Every failure is a
GenerationError that names the parameter, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import GenerationError, HybridrtError
from ..graphs.files import as_path, encodable, shown

# Default ceiling of one generation's estimated memory (states, KV at full length, logits);
# $HYBRIDRT_MAX_GENERATION_BYTES overrides it.
MAX_GENERATION_BYTES = 8 * 2**30
# Beam search divides scores by length ** length_penalty; beyond this the power overflows a
# float at long lengths (transformers' documented values lie well inside).
MAX_LENGTH_PENALTY = 10

SCHEDULES = ("adaptive", "heuristic", "constant")  # of num_assistant_tokens (speculative decoding)


def is_int(x: object) -> bool:
    return isinstance(x, int | np.integer) and not isinstance(x, bool)


def is_real(x: object) -> bool:
    """An int or float (numpy's too) that is finite; bools are not numbers here."""
    return (is_int(x) or isinstance(x, float | np.floating)) and math.isfinite(float(x))  # type: ignore[arg-type]


def early_stopping_never(value: object) -> bool:
    """early_stopping="never" (compared as a str only: arrays compare element by element)."""
    return isinstance(value, str) and value == "never"


def _int(name: str, value: object, low: int, what: str) -> str | None:
    if is_int(value) and value >= low:  # type: ignore[operator]
        return None
    return f"{name} must be an integer >= {low}{what}, got {shown(value)}"


def _real(name: str, value: Any, ok: Callable[[float], bool], allowed: str) -> str | None:
    if is_real(value) and ok(float(value)):
        return None
    return f"{name} must be a finite number {allowed}, got {shown(value)}"


def _token_ids(name: str, value: object) -> str | None:
    ids = [value] if is_int(value) else value
    if isinstance(ids, Sequence) and not isinstance(ids, str | bytes) and all(is_int(e) and e >= 0 for e in ids):
        return None
    return f"{name} must be a token id (integer >= 0) or a list of them, got {shown(value)}"


def _strings(name: str, value: object) -> str | None:
    items = [value] if isinstance(value, str) else value
    if isinstance(items, Sequence) and not isinstance(items, bytes) and all(isinstance(s, str) and s for s in items):
        if all(encodable(s) for s in items):
            return None
        return f"{name} must be valid Unicode text (no lone surrogates), got {shown(value)}"
    return f"{name} must be a non-empty string or a list of them, got {shown(value)}"


def config_errors(cfg: Any) -> list[str]:
    """Every problem with a GenerationConfig's values, one message each."""
    errors = [
        _int("max_new_tokens", cfg.max_new_tokens, 1, ""),
        _int("min_new_tokens", cfg.min_new_tokens, 0, ""),
        None
        if cfg.do_sample is None or isinstance(cfg.do_sample, bool | np.bool_)
        else f"do_sample must be True, False or None, got {shown(cfg.do_sample)}",
        None
        if cfg.add_bos_token is None or isinstance(cfg.add_bos_token, bool | np.bool_)
        else f"add_bos_token must be True, False or None, got {shown(cfg.add_bos_token)}",
        None if cfg.top_k is None else _int("top_k", cfg.top_k, 0, " (0 = off)"),
        None if cfg.top_p is None else _real("top_p", cfg.top_p, lambda p: 0 < p <= 1, "in (0, 1]"),
        _real(
            "repetition_penalty",
            cfg.repetition_penalty,
            lambda p: p > 0,
            "> 0 (1.0 = off)",
        ),
        _real("presence_penalty", cfg.presence_penalty, lambda p: -2 <= p <= 2, "in [-2, 2] (0 = off)"),
        _real("frequency_penalty", cfg.frequency_penalty, lambda p: -2 <= p <= 2, "in [-2, 2] (0 = off)"),
        None if cfg.seed is None else _int("seed", cfg.seed, 0, ""),
        None if cfg.eos_token_id is None else _token_ids("eos_token_id", cfg.eos_token_id),
        None if cfg.stop_strings is None else _strings("stop_strings", cfg.stop_strings),
        _int("num_assistant_tokens", cfg.num_assistant_tokens, 1, ""),
        None
        if cfg.num_assistant_tokens_schedule in SCHEDULES
        else f"num_assistant_tokens_schedule must be one of {', '.join(map(repr, SCHEDULES))}, "
        f"got {shown(cfg.num_assistant_tokens_schedule)}",
        _int("num_beams", cfg.num_beams, 1, " (1 = no beam search)"),
        _real(
            "length_penalty",
            cfg.length_penalty,
            lambda p: abs(p) <= MAX_LENGTH_PENALTY,
            f"in [-{MAX_LENGTH_PENALTY}, {MAX_LENGTH_PENALTY}] (1.0 = score per generated token)",
        ),
        None
        if isinstance(cfg.early_stopping, bool | np.bool_) or early_stopping_never(cfg.early_stopping)
        else f'early_stopping must be True, False or "never", got {shown(cfg.early_stopping)}',
        _int("num_return_sequences", cfg.num_return_sequences, 1, ""),
    ]
    if cfg.temperature is not None:
        errors.append(_real("temperature", cfg.temperature, lambda t: t >= 0, ">= 0"))
    found = [e for e in errors if e]
    if not found and is_int(cfg.min_new_tokens) and is_int(cfg.max_new_tokens):
        if cfg.min_new_tokens > cfg.max_new_tokens:
            found.append(f"min_new_tokens ({cfg.min_new_tokens}) must not exceed max_new_tokens ({cfg.max_new_tokens})")
    if not found and cfg.temperature == 0 and cfg.do_sample:
        found.append("temperature must be > 0 when sampling (do_sample=True); use do_sample=False for greedy")
    if not found and cfg.temperature == 0 and (cfg.top_k or cfg.top_p is not None or cfg.seed is not None):
        given = [n for n in ("top_k", "top_p", "seed") if getattr(cfg, n) not in (None, 0)]
        found.append(
            f"temperature 0 means greedy decoding, which ignores {', '.join(given)}; "
            "drop them, or give a temperature > 0 to sample"
        )
    if not found:
        found += _beam_errors(cfg)
    return found


def _beam_errors(cfg: Any) -> list[str]:
    """What beam search cannot be combined with (the fields' own types already checked)."""
    if cfg.num_return_sequences > cfg.num_beams:
        if cfg.num_beams == 1:
            return [
                f"num_return_sequences={cfg.num_return_sequences} needs beam search: set num_beams >= "
                f"{cfg.num_return_sequences} (to sample several continuations, pass the prompt several times)"
            ]
        return [
            f"num_return_sequences ({cfg.num_return_sequences}) must not exceed num_beams ({cfg.num_beams}); "
            "raise num_beams or lower num_return_sequences"
        ]
    if cfg.num_beams == 1:
        return []
    errors = []
    if cfg.sampling:
        errors.append(
            f"num_beams={cfg.num_beams} runs beam search, which does not sample: drop do_sample, temperature, "
            "top_k and top_p (or pass do_sample=False), or use num_beams=1 to sample"
        )
    if cfg.stop_strings is not None:
        errors.append(f"stop_strings cannot end beam search (num_beams={cfg.num_beams}): drop them, or use num_beams=1")
    return errors


def check_config(cfg: Any) -> None:
    errors = config_errors(cfg)
    if errors:
        raise GenerationError("; ".join(errors))


def refuse_unknown(cls: type, given: Iterable[str], error: Callable[[str], Exception], what: str) -> None:
    """Raises `error` naming those of `given` that are not fields of the dataclass `cls`, and the
    known ones (the option dataclasses' from_kwargs: GenerationConfig's, QuantConfig's)."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(given) - names)
    if unknown:
        raise error(f"unknown {what} {', '.join(unknown)}; known: {', '.join(sorted(names))}")


def check_text(texts: Sequence[str]) -> None:
    """Text a tokenizer can take: valid Unicode (a lone surrogate such as '\\udcff' is not)."""
    for i, text in enumerate(texts):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            where = f"prompt {i}" if len(texts) > 1 else "the prompt"
            raise GenerationError(
                f"{where} is not valid Unicode text: {text[e.start : e.end]!r} at character {e.start} "
                "(a lone surrogate, e.g. from decoding bytes with errors='surrogateescape'); "
                "decode the input with errors='replace', or pass token ids"
            ) from None


def check_eos_ids(eos: Sequence[int], vocab: int) -> None:
    bad = [e for e in eos if e >= vocab]
    if bad:
        raise GenerationError(f"eos_token_id {bad} outside the vocabulary of {vocab} tokens; ids are in [0, {vocab})")


def max_generation_bytes() -> int:
    raw = os.environ.get("HYBRIDRT_MAX_GENERATION_BYTES")
    if raw is None:
        return MAX_GENERATION_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise GenerationError(f"$HYBRIDRT_MAX_GENERATION_BYTES must be a positive integer, got {raw!r}")
    return value


def row_bytes(manifest: Any, length: int) -> int:
    """Bytes of one row's states (KV buffers of `length` positions) and last logits."""
    from ..graphs.contract import state_bytes_per_sequence

    per_row = 0
    for spec in manifest.pasts:
        n = state_bytes_per_sequence(spec)
        per_row += n * length if spec.is_kv else n
    return per_row + 4 * manifest.vocab_size  # float32 logits of the last position


def rows_that_fit(manifest: Any, length: int) -> int:
    """How many rows of up to `length` tokens the batch memory limit holds at once."""
    return max_generation_bytes() // row_bytes(manifest, length)


def check_memory(manifest: Any, batch: int, length: int) -> None:
    """Refuse a batch whose states (KV buffers of `length` positions) exceed the limit."""
    per_row = row_bytes(manifest, length)
    need, limit = batch * per_row, max_generation_bytes()
    if need > limit:
        raise GenerationError(
            f"a batch of {batch} rows up to {length} tokens needs about {need / 2**30:.2f} GiB of states, "
            f"above the limit of {limit / 2**30:.2f} GiB; split the batch, shorten the prompts or "
            "max_new_tokens, or raise $HYBRIDRT_MAX_GENERATION_BYTES"
        )


def check_rows_fit(manifest: Any, rows: Sequence[Sequence[int]], cfg: Any, past: int = 0, memory: bool = True) -> None:
    """GenerationError unless rows (after `past` tokens) and cfg.max_new_tokens (a
    GenerationConfig's) fit the model: its max length, its vocabulary (EOS ids) and (with
    `memory`) the batch memory limit."""
    longest = past + max(len(r) for r in rows)
    if longest + cfg.max_new_tokens > manifest.max_length:
        raise GenerationError(
            f"prompt of {longest} tokens + max_new_tokens {cfg.max_new_tokens} exceeds the model's max length "
            f"{manifest.max_length}; shorten the prompt or lower max_new_tokens"
        )
    check_eos_ids(cfg.eos_ids(()), manifest.vocab_size)
    if memory:
        check_memory(manifest, len(rows) * cfg.num_beams, longest + cfg.max_new_tokens)


def check_cache_use(made_for_model: bool, prompts: Any, cfg: Any, assistant: bool) -> None:
    """GenerationError unless the cache is a StateCache made for this model (`made_for_model`)
    and the call can resume from it: one prompt (text.Prompts, or None), no beams, no draft."""
    if not made_for_model:
        raise GenerationError("cache= takes a StateCache made for this model: model.state_cache()")
    if prompts is not None and not prompts.single:
        raise GenerationError("cache= takes one prompt; generate a batch without it, or one prompt at a time")
    if cfg is not None and cfg.num_beams > 1:
        raise GenerationError("beam search does not resume from a prefix state cache: drop cache= or num_beams")
    if assistant:
        raise GenerationError(
            "speculative decoding does not resume from a prefix state cache: drop cache= or assistant_model"
        )


def as_paths(value: object, what: str, error: type[HybridrtError] = GenerationError) -> list[Path]:
    """One path or a list of them."""
    if isinstance(value, str | os.PathLike):
        return [as_path(value, what, error)]
    if isinstance(value, list | tuple):
        return [as_path(v, what, error) for v in value]
    raise error(f"{what} must be a path or a list of paths, got {shown(value)}")


def read_utf8(path: Path, what: str, error: type[HybridrtError] = GenerationError, hint: str = "") -> str:
    """The text of the file at `path`; `error` naming `what` when there is no such file, or
    saying where it is not UTF-8 (then `hint`)."""
    if not path.is_file():
        raise error(f"{what} not found: {path}")
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path} is not UTF-8 text ({e.reason} at byte {e.start}){hint}") from None


def available_memory() -> int:
    """Bytes of memory available now (MemAvailable on Linux; physical pages elsewhere)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 4 << 30
