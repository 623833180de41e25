"""Parity of an exported graph against the PyTorch reference, measured right after export.

Prompt lengths other than the traced one (1, 7, 64, 300; 300 spans several scan chunks) at
batch 2 from fresh states; a 17-token chunk over random states whose rows have seen
different numbers of tokens; then 16 decode steps from such states, in which each side
carries its own states. Figures land in hybridrt.json; above tolerance the export fails.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..graphs.contract import input_specs, past_specs
from ..models.model import HybridForCausalLM
from ..models.state import zero_states
from .trace import GraphModule, feeds

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
    return torch_runner(GraphModule(model))


def _errors(
    a: Sequence[np.ndarray], b: Sequence[np.ndarray], kv: Sequence[bool], lengths: np.ndarray
) -> tuple[float, float]:
    """Worst logits and state differences; a KV buffer counts up to each row's length (past
    that the graph may leave what the buffer held: nothing reads it)."""
    logits = float(np.abs(a[0] - b[0]).max())
    states = 0.0
    for x, y, is_kv in zip(a[1:], b[1:], kv):
        d = np.abs(x - y)
        if is_kv:
            d = d * (np.arange(d.shape[2])[None, :] < lengths[:, None])[:, None, :, None]
        if d.size:
            states = max(states, float(d.max()))
    return logits, states


def _random_states(cfg: Any, pasts: Sequence[int], capacity: int, g: torch.Generator) -> list[torch.Tensor]:
    return [s.normal_(generator=g) for s in zero_states(cfg, len(pasts), capacity)]


def measure_parity(
    model: HybridForCausalLM,
    runner: Runner,
    lengths: Sequence[int] = PROMPT_LENGTHS,
    seed: int = 0,
    decode_steps: int = DECODE_STEPS,
) -> dict[str, Any]:
    cfg = model.config
    ref = _reference(model)
    g = torch.Generator().manual_seed(seed)
    kv = [s.is_kv for s in past_specs(cfg)]
    lengths = [l for l in lengths if l <= cfg.max_position_embeddings]
    decode_steps = min(decode_steps, cfg.max_position_embeddings - 9 - 17)
    report: dict[str, Any] = {"tolerance": TOLERANCE, "prompt": [], "decode": {}}
    for l in lengths:
        ids = torch.randint(0, cfg.vocab_size, (2, l), generator=g)
        args = feeds(model, ids, 0, zero_states(cfg, 2, l + 5))
        e_logits, e_states = _errors(runner(args), ref(args), kv, np.array([l, l]))
        report["prompt"].append({"batch": 2, "seq": l, "max_abs_logits": e_logits, "max_abs_state": e_states})
    # Rows that have seen 3 and 9 tokens (random states): a chunk, then decode steps in which
    # each side carries its own states, with logits of the last position only.
    pasts = torch.tensor([3, 9])
    capacity = 9 + 17 + decode_steps + 3
    states = _random_states(cfg, pasts.tolist(), capacity, g)
    ids = torch.randint(0, cfg.vocab_size, (2, 17), generator=g)
    args = feeds(model, ids, pasts, states)
    e_logits, e_states = _errors(runner(args), ref(args), kv, pasts.numpy() + 17)
    report["prompt"].append(
        {"batch": 2, "seq": 17, "pasts": [3, 9], "max_abs_logits": e_logits, "max_abs_state": e_states}
    )
    states_r = states_g = states
    worst = [0.0, 0.0]
    for _ in range(decode_steps + 1):
        args_r, args_g = feeds(model, ids, pasts, states_r, False), feeds(model, ids, pasts, states_g, False)
        out_r, out_g = ref(args_r), runner(args_g)
        e = _errors(out_g, out_r, kv, pasts.numpy() + ids.shape[1])
        worst = [max(worst[0], e[0]), max(worst[1], e[1])]
        states_r = [torch.from_numpy(x) for x in out_r[1:]]
        states_g = [torch.from_numpy(np.ascontiguousarray(x)) for x in out_g[1:]]
        pasts = pasts + ids.shape[1]
        ids = torch.from_numpy(out_r[0][:, -1].argmax(-1)).unsqueeze(1)
    report["decode"] = {"batch": 2, "steps": decode_steps, "max_abs_logits": worst[0], "max_abs_state": worst[1]}
    cases = report["prompt"] + [report["decode"]]
    report["max_abs_logits"] = max(c["max_abs_logits"] for c in cases)
    report["max_abs_state"] = max(c["max_abs_state"] for c in cases)
    report["passed"] = report["max_abs_logits"] <= TOLERANCE and report["max_abs_state"] <= TOLERANCE
    return report
