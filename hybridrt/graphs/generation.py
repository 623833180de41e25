"""A model's recommended generation settings: read at export from the checkpoint's
`generation_config.json` (Hugging Face layout), recorded in the manifest's `generation`,
and applied by the runtime to every generate/stream/session call unless the caller
overrides them. Torch-free.

Keys taken from generation_config.json:
  repetition_penalty, max_new_tokens, min_new_tokens: as transformers;
  do_sample, temperature, top_k, top_p: only when do_sample is true (transformers ignores
    the others without it), and then as one group: a caller who sets any sampling
    parameter replaces the whole group;
  add_bos_token (hybridrt's key): prepend the tokenizer's BOS token to text prompts that do
    not start with it (a model trained on `<s>`-framed documents).
Other keys (bos/eos/pad ids, transformers_version, ...) are ignored here; the special token
ids come from config.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import GraphError

GENERATION_CONFIG = "generation_config.json"
SAMPLING = ("do_sample", "temperature", "top_k", "top_p")
SINGLE = ("repetition_penalty", "max_new_tokens", "min_new_tokens", "add_bos_token")


def read_generation_config(directory: Path) -> dict[str, Any] | None:
    """The recommended settings in `directory/generation_config.json`, or None without one."""
    from .schema import GENERATION, problem

    path = directory / GENERATION_CONFIG
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except ValueError as e:
        raise GraphError(f"{path} is not valid JSON ({e}); fix or remove it") from None
    if not isinstance(data, dict):
        raise GraphError(f"{path} must hold a JSON object, got {type(data).__name__}; fix or remove it")
    keys = SINGLE + (SAMPLING if data.get("do_sample") is True else ())
    found = {k: data[k] for k in keys if k in data and data[k] is not None}
    bad = problem(found, GENERATION, "")
    if bad:
        raise GraphError(f"{path}: {bad}; fix or remove it")
    return found or None


def merge(recommended: dict[str, Any] | None, given: dict[str, Any]) -> dict[str, Any]:
    """The caller's parameters over the model's recommendations (sampling as one group)."""
    if not recommended:
        return given
    base = dict(recommended)
    if any(given.get(k) is not None for k in SAMPLING):
        for k in SAMPLING:
            base.pop(k, None)
    return base | given
