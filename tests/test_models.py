"""Reference PyTorch model vs transformers, and the state contract of the reference."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hybridrt.graphs.feeds import position_ids
from hybridrt.models.checkpoint import load_model
from hybridrt.models.state import zero_states

TOL = 1e-4


def _forward(model, ids, mask, states):  # type: ignore[no-untyped-def]
    pos = torch.from_numpy(position_ids(mask.numpy(), ids.shape[1])) if model.config.uses_positions else None
    with torch.no_grad():
        return model(ids, mask, pos, states)


@pytest.mark.parametrize("length", [1, 7, 64, 300])
def test_reference_matches_transformers(ckpt_dir: Path, length: int) -> None:
    from transformers import AutoModelForCausalLM

    model, _ = load_model(ckpt_dir)
    hf = AutoModelForCausalLM.from_pretrained(ckpt_dir).eval()
    ids = torch.randint(0, model.config.vocab_size, (2, length), generator=torch.Generator().manual_seed(length))
    mask = torch.ones_like(ids)
    logits, _ = _forward(model, ids, mask, zero_states(model.config, 2))
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask).logits
    assert (logits - ref).abs().max().item() <= TOL


def test_step_by_step_decode_equals_full_forward(ckpt_dir: Path) -> None:
    model, _ = load_model(ckpt_dir)
    ids = torch.randint(0, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    full, _ = _forward(model, ids, torch.ones_like(ids), zero_states(model.config, 2))
    logits, states = _forward(model, ids[:, :8], torch.ones(2, 8, dtype=torch.long), zero_states(model.config, 2))
    steps = [logits]
    for t in range(8, 24):
        mask = torch.ones(2, t + 1, dtype=torch.long)
        logits, states = _forward(model, ids[:, t : t + 1], mask, states)
        steps.append(logits)
    assert (torch.cat(steps, dim=1) - full).abs().max().item() <= TOL


@pytest.mark.parametrize("split", [1, 17, 40])
def test_chunked_prefill_equals_one_shot(ckpt_dir: Path, split: int) -> None:
    """The second chunk starts from the first chunk's states (non-zero initial SSM state)."""
    model, _ = load_model(ckpt_dir)
    ids = torch.randint(0, model.config.vocab_size, (2, 70), generator=torch.Generator().manual_seed(2))
    full, full_states = _forward(model, ids, torch.ones_like(ids), zero_states(model.config, 2))
    a, states = _forward(model, ids[:, :split], torch.ones(2, split, dtype=torch.long), zero_states(model.config, 2))
    b, states = _forward(model, ids[:, split:], torch.ones(2, 70, dtype=torch.long), states)
    assert (torch.cat([a, b], dim=1) - full).abs().max().item() <= TOL
    for x, y in zip(states, full_states):
        assert (x - y).abs().max().item() <= TOL


def test_left_padding_leaves_rows_unchanged(ckpt_dir: Path) -> None:
    """A left-padded row gives the logits it gets alone, at its real positions."""
    model, _ = load_model(ckpt_dir)
    ids = torch.randint(3, model.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(3))
    alone, _ = _forward(model, ids, torch.ones_like(ids), zero_states(model.config, 1))
    padded = torch.cat([torch.zeros(1, 4, dtype=torch.long), ids], dim=1)
    mask = torch.cat([torch.zeros(1, 4, dtype=torch.long), torch.ones_like(ids)], dim=1)
    out, _ = _forward(model, padded, mask, zero_states(model.config, 1))
    assert (out[:, 4:] - alone).abs().max().item() <= TOL
