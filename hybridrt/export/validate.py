"""Parity of an exported graph against the PyTorch reference, measured right after export.

Prompt lengths other than the traced one (1, 7, 64, 300; 300 spans several scan chunks),
batch 2 with one row left-padded, then 16 decode steps in which each side carries its own
states. Figures land in hybridrt.json; above tolerance the export fails.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..graphs.contract import input_specs
from ..models.model import HybridForCausalLM
from ..models.state import zero_states
from .trace import feeds

PROMPT_LENGTHS = (1, 7, 64, 300)
DECODE_STEPS = 16
TOLERANCE = 1e-4

Runner = Callable[[tuple[torch.Tensor, ...]], list[np.ndarray]]


def ort_runner(path: Path, model: HybridForCausalLM) -> Runner:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    names = [s.name for s in input_specs(model.config)]

    def run(args: tuple[torch.Tensor, ...]) -> list[np.ndarray]:
        return list(sess.run(None, {n: a.numpy() for n, a in zip(names, args)}))

    return run


def torch_runner(fn: Callable[..., Any]) -> Runner:
    def run(args: tuple[torch.Tensor, ...]) -> list[np.ndarray]:
        with torch.no_grad():
            return [t.numpy() for t in fn(*args)]

    return run


def _reference(model: HybridForCausalLM) -> Runner:
    def run(args: tuple[torch.Tensor, ...]) -> list[np.ndarray]:
        with torch.no_grad():
            n_fixed = 3 if model.config.uses_positions else 2
            pos = args[2] if n_fixed == 3 else None
            logits, states = model(args[0], args[1], pos, list(args[n_fixed:]))
        return [logits.numpy()] + [s.numpy() for s in states]

    return run


def _errors(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> tuple[float, float]:
    logits = float(np.abs(a[0] - b[0]).max())
    states = max((float(np.abs(x - y).max()) for x, y in zip(a[1:], b[1:]) if x.size), default=0.0)
    return logits, states


def measure_parity(
    model: HybridForCausalLM, runner: Runner, lengths: Sequence[int] = PROMPT_LENGTHS, seed: int = 0
) -> dict[str, Any]:
    cfg = model.config
    ref = _reference(model)
    g = torch.Generator().manual_seed(seed)
    lengths = [l for l in lengths if l <= cfg.max_position_embeddings - DECODE_STEPS]
    report: dict[str, Any] = {"tolerance": TOLERANCE, "prompt": [], "decode": {}}
    for l in lengths:
        ids = torch.randint(0, cfg.vocab_size, (2, l), generator=g)
        mask = torch.ones(2, l, dtype=torch.long)
        mask[0, : l // 8] = 0  # left padding on one row
        args = feeds(model, ids, mask, zero_states(cfg, 2))
        e_logits, e_states = _errors(runner(args), ref(args))
        report["prompt"].append({"batch": 2, "seq": l, "max_abs_logits": e_logits, "max_abs_state": e_states})
    # Decode: each side carries its own states from a 7-token prompt.
    ids = torch.randint(0, cfg.vocab_size, (2, 7), generator=g)
    mask = torch.ones(2, 7, dtype=torch.long)
    states_r = states_g = zero_states(cfg, 2)
    worst = [0.0, 0.0]
    for _ in range(DECODE_STEPS + 1):
        args_r, args_g = feeds(model, ids, mask, states_r), feeds(model, ids, mask, states_g)
        out_r, out_g = ref(args_r), runner(args_g)
        e = _errors(out_g, out_r)
        worst = [max(worst[0], e[0]), max(worst[1], e[1])]
        states_r = [torch.from_numpy(x) for x in out_r[1:]]
        states_g = [torch.from_numpy(np.ascontiguousarray(x)) for x in out_g[1:]]
        ids = torch.from_numpy(out_r[0][:, -1].argmax(-1)).unsqueeze(1)
        mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], dim=1)
    report["decode"] = {"batch": 2, "steps": DECODE_STEPS, "max_abs_logits": worst[0], "max_abs_state": worst[1]}
    cases = report["prompt"] + [report["decode"]]
    report["max_abs_logits"] = max(c["max_abs_logits"] for c in cases)
    report["max_abs_state"] = max(c["max_abs_state"] for c in cases)
    report["passed"] = report["max_abs_logits"] <= TOLERANCE and report["max_abs_state"] <= TOLERANCE
    return report
