"""Architecture registry: `model_type` -> config translator and weight-name mapping.

A family is an addition here (a module under `families/` that calls `register`), never an
edit of shared code. Torch-free: translating a config needs no model code.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..config import HybridConfig
from ..errors import UnsupportedArchitectureError


@dataclass(frozen=True)
class Family:
    """How one Hugging Face `model_type` becomes a HybridConfig and our parameter names.

    `renames` are (regex, replacement) pairs applied in order to each checkpoint tensor name;
    `ignore` are regexes of checkpoint tensors that carry nothing we need (rotary caches).
    """

    model_type: str
    translate: Callable[[dict[str, Any]], HybridConfig]
    renames: tuple[tuple[str, str], ...] = ()
    ignore: tuple[str, ...] = ()

    def rename(self, name: str) -> str:
        for pattern, repl in self.renames:
            name = re.sub(pattern, repl, name)
        return name

    def ignored(self, name: str) -> bool:
        return any(re.search(p, name) for p in self.ignore)


FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    FAMILIES[family.model_type] = family
    return family


def get_family(model_type: str | None) -> Family:
    """The registered family; `hybridrt.models.families` registers the built-in ones on import."""
    if model_type not in FAMILIES:
        raise UnsupportedArchitectureError(
            f"unsupported model_type {model_type!r}; supported: {', '.join(sorted(FAMILIES))}"
        )
    return FAMILIES[model_type]


# Helpers shared by translators -------------------------------------------------------


def unsupported(model_type: str, field: str, value: Any, supported: str) -> UnsupportedArchitectureError:
    return UnsupportedArchitectureError(
        f"{model_type}: config field {field!r} = {value!r} is not supported by hybridrt (supported: {supported})"
    )


def eos_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list | tuple) else (int(value),)


def rope_settings(
    model_type: str, hf: dict[str, Any], default_theta: float = 10000.0, handled: tuple[str, ...] = ()
) -> dict[str, Any]:
    """rope_theta, rope_type and scaling from `rope_parameters` (transformers 5) or
    `rope_theta` + `rope_scaling` (transformers 4)."""
    params = hf.get("rope_parameters")
    field = "rope_parameters"
    if params is None:
        params = dict(hf.get("rope_scaling") or {})
        field = "rope_scaling"
        params.setdefault("rope_theta", hf.get("rope_theta", default_theta))
    params = dict(params)
    rope_type = params.pop("rope_type", params.pop("type", "default")) or "default"
    theta = float(params.pop("rope_theta", hf.get("rope_theta", default_theta)))
    needed = {
        "default": (),
        "linear": ("factor",),
        "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    }
    if rope_type not in needed:
        raise unsupported(model_type, f"{field}.rope_type", rope_type, ", ".join(needed))
    scaling = tuple((k, float(params[k])) for k in needed[rope_type] if k in params)
    # Keys the family reads itself (`handled`) or that change nothing are fine; any other key
    # would change the positions, so it is refused rather than ignored.
    extra = [
        k
        for k in params
        if k not in needed[rope_type]
        and k not in handled
        and not (k == "partial_rotary_factor" and float(params[k]) == 1.0)
    ]
    if extra:
        raise unsupported(model_type, f"{field}.{extra[0]}", params[extra[0]], "none for this family")
    missing = [k for k in needed[rope_type] if k not in params]
    if missing:
        raise UnsupportedArchitectureError(f"{model_type}: {field} of type {rope_type!r} lacks {missing}")
    return {"rope_theta": theta, "rope_type": rope_type, "rope_scaling": scaling}
