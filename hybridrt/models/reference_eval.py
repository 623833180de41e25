"""The same text scoring as `hybridrt eval`, with the PyTorch reference model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..runtime.evaluate import score_text
from .checkpoint import load_model
from .state import zero_states


def reference_eval(checkpoint: str | Path, text: str, window: int, stride: int) -> dict[str, Any]:
    from tokenizers import Tokenizer

    model, _ = load_model(checkpoint)
    tokenizer = Tokenizer.from_file(str(Path(checkpoint) / "tokenizer.json"))

    def logits_fn(chunk: np.ndarray) -> np.ndarray:
        ids = torch.from_numpy(chunk)
        mask = torch.ones_like(ids)
        pos = torch.arange(ids.shape[1])[None] if model.config.rope_theta is not None else None
        with torch.no_grad():
            logits, _ = model(ids, mask, pos, zero_states(model.config, 1))
        return logits[0].numpy()

    return score_text(logits_fn, tokenizer, text, window, stride)
