"""Architecture registry: `model_type` -> config translator and weight-name mapping.

A family is one module under `families/` that calls `register`: `discover()` imports every
module there (no list to edit) and any distribution's `hybridrt.families` entry point, so a
family outside this package registers the same way. No family imports another; what they
share is in `models.translate`. Torch-free: translating a config needs no model code.
"""

from __future__ import annotations

import importlib
import pkgutil
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
    `rename_layer(name, cfg)` runs after the renames, for names that depend on the layer's
    kind; `convert(name, tensor, cfg)` rewrites a tensor once named (e.g. a norm stored as
    weight - 1). Both are optional.
    """

    model_type: str
    translate: Callable[[dict[str, Any]], HybridConfig]
    renames: tuple[tuple[str, str], ...] = ()
    ignore: tuple[str, ...] = ()
    rename_layer: Callable[[str, HybridConfig], str] | None = None
    convert: Callable[[str, Any, HybridConfig], Any] | None = None

    def rename(self, name: str, cfg: HybridConfig | None = None) -> str:
        for pattern, repl in self.renames:
            name = re.sub(pattern, repl, name)
        if self.rename_layer is not None and cfg is not None:
            name = self.rename_layer(name, cfg)
        return name

    def ignored(self, name: str) -> bool:
        return any(re.search(p, name) for p in self.ignore)


FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    FAMILIES[family.model_type] = family
    return family


_DISCOVERED = False


def discover() -> None:
    """Import every module of `hybridrt.models.families` and every `hybridrt.families` entry
    point once; each registers its family."""
    global _DISCOVERED
    if _DISCOVERED:
        return
    from importlib.metadata import entry_points

    from . import families

    for info in pkgutil.iter_modules(families.__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{families.__name__}.{info.name}")
    for ep in entry_points(group="hybridrt.families"):
        ep.load()
    _DISCOVERED = True


def get_family(model_type: str | None) -> Family:
    """The registered family for a config.json's `model_type`."""
    discover()
    if model_type not in FAMILIES:
        raise UnsupportedArchitectureError(
            f"unsupported model_type {model_type!r}; supported: {', '.join(sorted(FAMILIES))}"
        )
    return FAMILIES[model_type]
