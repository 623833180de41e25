"""Helpers shared by subcommands."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from .. import default_model


def stage(t0: float, message: str) -> None:
    print(f"[{time.perf_counter() - t0:6.1f}s] {message}", file=sys.stderr, flush=True)


def model_dir(name: str) -> Path:
    """An exported directory; "default" exports the shipped model on first use (needs torch)."""
    t0 = time.perf_counter()
    return default_model.model_dir(name, export=True, progress=lambda msg: stage(t0, f"default model: {msg}"))
