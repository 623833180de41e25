"""The tests' reference for `hybridrt eval`: the same text scoring, with the PyTorch model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from hybridrt.models.loading.checkpoint import load_model
from hybridrt.runtime.evaluate import score_text


def reference_eval(checkpoint: str | Path, text: str, window: int, stride: int) -> dict[str, Any]:
    from tokenizers import Tokenizer

    model, _ = load_model(checkpoint)
    tokenizer = Tokenizer.from_file(str(Path(checkpoint) / "tokenizer.json"))

    def logits_fn(chunk: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            logits, _ = model(torch.from_numpy(chunk))  # fresh states, every position
        return logits[0].numpy()

    return score_text(logits_fn, tokenizer, text, window, stride)
