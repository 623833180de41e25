"""Falcon-Mamba (`FalconMambaForCausalLM`): Mamba1 with weightless RMSNorms on dt, B and C."""

from __future__ import annotations

import dataclasses
from typing import Any

from ...config import HybridConfig
from ..registry import Family, register
from .mamba import FAMILY as MAMBA
from .mamba import translate as translate_mamba


def translate(hf: dict[str, Any]) -> HybridConfig:
    cfg = translate_mamba(hf)
    return dataclasses.replace(
        cfg,
        model_type="falcon_mamba",
        mamba_inner_norms=True,
        mamba_inner_norm_weights=False,
        mamba_inner_norm_eps=hf.get("mixer_rms_eps", 1e-6),
    )


FAMILY = register(Family(model_type="falcon_mamba", translate=translate, renames=MAMBA.renames))
