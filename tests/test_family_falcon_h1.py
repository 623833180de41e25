"""Falcon-H1 variants beyond the family suite's checkpoint: the Mamba2 output without the gated
RMSNorm (y * silu(z), the transformers default), the norm gating first, no projection biases,
a head_dim other than hidden_size / heads, and unit multipliers."""

from __future__ import annotations

from pathlib import Path

import exports
import pytest
import torch
from family_checkpoints import make_falcon_h1

from hybridrt.models.loading.checkpoint import load_model

TOL = 1e-4
UNIT = dict(
    embedding_multiplier=1.0,
    lm_head_multiplier=1.0,
    attention_in_multiplier=1.0,
    attention_out_multiplier=1.0,
    key_multiplier=1.0,
    ssm_in_multiplier=1.0,
    ssm_out_multiplier=1.0,
    ssm_multipliers=None,
    mlp_multipliers=None,
)


@pytest.mark.parametrize(
    "overrides",
    [
        {"mamba_rms_norm": False},
        {"mamba_norm_before_gate": False},
        {"mamba_proj_bias": False, "projectors_bias": False, "attention_bias": True, "mlp_bias": True},
        {"head_dim": 16, "num_key_value_heads": 4},
        UNIT,
    ],
    ids=["no-gated-norm", "gate-before-norm", "other-biases", "head-dim-16-mha", "unit-multipliers"],
)
def test_falcon_h1_variants_match_transformers(tmp_path: Path, overrides: dict[str, object]) -> None:
    from transformers import AutoModelForCausalLM

    ckpt = exports.checkpoint(make_falcon_h1, seed=1, **overrides)
    model, _ = load_model(ckpt)
    hf = AutoModelForCausalLM.from_pretrained(ckpt).eval()
    ids = torch.randint(3, model.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        logits, _ = model(ids)
        ref = hf(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    assert (logits - ref).abs().max().item() <= TOL
