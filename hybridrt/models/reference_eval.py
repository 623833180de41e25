"""The same text scoring as `hybridrt eval`, with the PyTorch reference model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..graphs.feeds import position_ids
from ..runtime.evaluate import score_text
from .checkpoint import load_model
from .state import zero_states


def reference_eval(checkpoint: str | Path, text: str, window: int, stride: int) -> dict[str, Any]:
    from tokenizers import Tokenizer

    model, _ = load_model(checkpoint)
    tokenizer = Tokenizer.from_file(str(Path(checkpoint) / "tokenizer.json"))

    def logits_fn(chunk: np.ndarray) -> np.ndarray:
        mask = np.ones_like(chunk)
        pos = torch.from_numpy(position_ids(mask, chunk.shape[1])) if model.config.uses_positions else None
        with torch.no_grad():
            logits, _ = model(torch.from_numpy(chunk), torch.from_numpy(mask), pos, zero_states(model.config, 1))
        return logits[0].numpy()

    return score_text(logits_fn, tokenizer, text, window, stride)
