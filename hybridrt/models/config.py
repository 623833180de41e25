"""Kept so that `hybridrt.models.config` still imports (scripts/train_default_model.py uses
it); the configuration lives in `hybridrt.config`, below graphs/, torch-free."""

from ..config import FFN_KINDS, MIXER_KINDS, ROPE_TYPES, HybridConfig

__all__ = ["FFN_KINDS", "MIXER_KINDS", "ROPE_TYPES", "HybridConfig"]
