"""Mamba (`MambaForCausalLM`): a stack of Mamba1 mixers, no attention, no feed-forward."""

from __future__ import annotations

from typing import Any

from ...config import HybridConfig
from ..loading.layouts import MAMBA_RENAMES
from ..loading.registry import Family, register
from ..loading.translate import mamba_model


def translate(hf: dict[str, Any]) -> HybridConfig:
    return mamba_model("mamba", hf)


FAMILY = register(Family(model_type="mamba", translate=translate, renames=MAMBA_RENAMES))
