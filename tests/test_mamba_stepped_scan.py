"""MambaMixer.stepped_scan, the path scripts/train_default_model.py trains the default model
through, computes what the chunked reference scan computes, gradients included."""

from __future__ import annotations

import torch

from hybridrt.default_model import CHECKPOINT_DIR  # noqa: E402
from hybridrt.models.decoder import HybridForCausalLM
from hybridrt.models.loading.checkpoint import load_model
from hybridrt.models.mixers.mamba import MambaMixer
from hybridrt.models.state import zero_tensors  # noqa: E402


def _stepped(model: HybridForCausalLM, on: bool) -> None:
    mixers = [m for m in model.modules() if isinstance(m, MambaMixer)]
    assert mixers
    for m in mixers:
        m.stepped_scan = on


def test_stepped_scan_gives_the_reference_logits_and_gradients() -> None:
    model, _ = load_model(CHECKPOINT_DIR)
    ids = torch.randint(3, model.config.vocab_size, (2, 41), generator=torch.Generator().manual_seed(0))

    def run() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        states = zero_tensors(model.config, 2, 41)
        logits, states = model(ids[:, :30], torch.zeros(2, dtype=torch.long), None, states)
        more, _ = model(ids[:, 30:], torch.full((2,), 30, dtype=torch.long), None, states)
        (logits.logsumexp(-1).mean() + more.logsumexp(-1).mean()).backward()
        grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        return logits.detach(), more.detach(), grad

    ref = run()
    _stepped(model, True)
    try:
        stepped = run()
    finally:
        _stepped(model, False)
    for a, b in zip(ref, stepped, strict=True):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)
