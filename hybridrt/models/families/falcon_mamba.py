"""Falcon-Mamba (`FalconMambaForCausalLM`): Mamba1 with weightless RMSNorms on dt, B and C."""

from __future__ import annotations

from typing import Any

from ...config import HybridConfig
from ..loading.layouts import MAMBA_RENAMES
from ..loading.registry import Family, register
from ..loading.translate import mamba_model


def translate(hf: dict[str, Any]) -> HybridConfig:
    return mamba_model(
        "falcon_mamba",
        hf,
        mamba_inner_norms=True,
        mamba_inner_norm_weights=False,
        mamba_inner_norm_eps=hf.get("mixer_rms_eps", 1e-6),
    )


FAMILY = register(Family(model_type="falcon_mamba", translate=translate, renames=MAMBA_RENAMES))
