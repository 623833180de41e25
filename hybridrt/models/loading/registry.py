"""Architecture registry: `model_type` -> config translator and weight-name mapping.

A family is one module under `families/` that calls `register`: `discover()` imports every
module there (no list to edit) and any distribution's `hybridrt.families` entry point, so a
family outside this package registers the same way. No family imports another; what they
share is in `models.loading.translate` and `models.loading.layouts`. Torch-free: translating a
config needs no model code (a merge's combine imports torch when the loader calls it).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...config import HybridConfig, register_family_params
from ...errors import UnsupportedArchitectureError


@dataclass(frozen=True)
class Merge:
    """Several checkpoint tensors that make one of our parameters together (per-expert
    tensors stacked into one, separate q, k and v projections concatenated).

    `pattern` is a regex over our names, after the renames and rename_layer; `target` and
    `part` are its replacement templates for the parameter's name and for the part's key (as
    re.Match.expand writes them). `combine(parts, cfg)` makes the parameter from {part key:
    tensor}, each part read (and converted) as any tensor is.
    """

    pattern: str
    target: str
    part: str
    combine: Callable[[dict[str, Any], HybridConfig], Any]

    def match(self, name: str) -> tuple[str, str] | None:
        """(the parameter's name, the part's key) when `name` is a part of this merge."""
        m = re.match(self.pattern, name)
        return None if m is None else (m.expand(self.target), m.expand(self.part))


def _stack_gate_up(parts: dict[str, Any], cfg: HybridConfig) -> Any:
    """{"<e>.gate_proj": [f, d], "<e>.up_proj": [f, d]} -> [E, 2f, d], experts in order."""
    import torch

    experts = sorted({int(k.split(".")[0]) for k in parts})
    return torch.stack([torch.cat([parts[f"{e}.gate_proj"], parts[f"{e}.up_proj"]]) for e in experts])


def _stack_down(parts: dict[str, Any], cfg: HybridConfig) -> Any:
    """{"<e>": [d, f]} -> [E, d, f], experts in order."""
    import torch

    return torch.stack([parts[k] for k in sorted(parts, key=int)])


def concat(order: tuple[str, ...]) -> Callable[[dict[str, Any], HybridConfig], Any]:
    """A combine that concatenates the parts along the first axis, in `order` of their keys."""

    def combine(parts: dict[str, Any], cfg: HybridConfig) -> Any:
        import torch

        return torch.cat([parts[k] for k in order])

    return combine


# Per-expert gate/up/down tensors (released Jamba, LFM2-MoE and Qwen3-Next files) stacked into the
# MoE's experts.gate_up_proj [E, 2f, d] and experts.down_proj [E, d, f]. Every family has it
# unless it declares its own merges.
LEGACY_EXPERTS = (
    Merge(r"^(.*\.ffn\.experts)\.(\d+)\.(gate_proj|up_proj)\.weight$", r"\1.gate_up_proj", r"\2.\3", _stack_gate_up),
    Merge(r"^(.*\.ffn\.experts)\.(\d+)\.down_proj\.weight$", r"\1.down_proj", r"\2", _stack_down),
)


@dataclass(frozen=True)
class Family:
    """How one Hugging Face `model_type` becomes a HybridConfig and our parameter names.

    `renames` are (regex, replacement) pairs applied in order to each checkpoint tensor name;
    `ignore` are regexes of checkpoint tensors that carry nothing we need (rotary caches).
    `rename_layer(name, cfg)` runs after the renames, for names that depend on the layer's
    kind; `convert(name, tensor, cfg)` rewrites a tensor once named (e.g. a norm stored as
    weight - 1); `merges` make one parameter of several tensors. `params` is the frozen
    dataclass of the parameters this family alone reads (HybridConfig.family_params).
    """

    model_type: str
    translate: Callable[[dict[str, Any]], HybridConfig]
    renames: tuple[tuple[str, str], ...] = ()
    ignore: tuple[str, ...] = ()
    rename_layer: Callable[[str, HybridConfig], str] | None = None
    convert: Callable[[str, Any, HybridConfig], Any] | None = None
    merges: tuple[Merge, ...] = LEGACY_EXPERTS
    params: type | None = None

    def rename(self, name: str, cfg: HybridConfig | None = None) -> str:
        for pattern, repl in self.renames:
            name = re.sub(pattern, repl, name)
        if self.rename_layer is not None and cfg is not None:
            name = self.rename_layer(name, cfg)
        return name

    def ignored(self, name: str) -> bool:
        return any(re.search(p, name) for p in self.ignore)

    def merge_of(self, name: str) -> tuple[Merge, str, str] | None:
        """(the merge, its parameter's name, the part's key) when `name` is a merge's part."""
        for merge in self.merges:
            found = merge.match(name)
            if found is not None:
                return merge, *found
        return None


FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    if family.params is not None:
        register_family_params(family.model_type, family.params)
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

    from .. import families

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
