"""The same text scoring as `hybridrt eval`, with the PyTorch reference model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..runtime.evaluate import score_text
from .checkpoint import load_model


def reference_eval(checkpoint: str | Path, text: str, window: int, stride: int) -> dict[str, Any]:
    from tokenizers import Tokenizer

    model, _ = load_model(checkpoint)
    tokenizer = Tokenizer.from_file(str(Path(checkpoint) / "tokenizer.json"))

    def logits_fn(chunk: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            logits, _ = model(torch.from_numpy(chunk))  # fresh states, every position
        return logits[0].numpy()

    return score_text(logits_fn, tokenizer, text, window, stride)
