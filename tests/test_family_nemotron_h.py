"""Nemotron-H beyond the family suite: the released `hybrid_override_pattern` spelling, an
unknown pattern letter refused by the field, and MoE variants (latent projection, no
groups, no renormalization) against transformers."""

from __future__ import annotations

import json
from pathlib import Path

import exports
import pytest
import torch
from family_checkpoints import make_nemotron_h

from hybridrt.errors import UnsupportedArchitectureError
from hybridrt.models.loading.checkpoint import load_config, load_model


@pytest.fixture(scope="module")
def ckpt() -> Path:
    return exports.checkpoint(make_nemotron_h)


def _pattern_config(src: Path, dst: Path, pattern: str) -> Path:
    dst.mkdir()
    data = json.loads((src / "config.json").read_text())
    data.pop("layers_block_type")
    data["hybrid_override_pattern"] = pattern
    (dst / "config.json").write_text(json.dumps(data))
    return dst


def test_released_pattern_spelling(ckpt: Path, tmp_path: Path) -> None:
    """Released files give the layers as a pattern string: M Mamba2, * attention, - MLP."""
    new = load_config(ckpt)[0]
    old = load_config(_pattern_config(ckpt, tmp_path / "old", "ME*-ME"))[0]
    assert old.layer_types == new.layer_types == ("mamba2", "none", "attention", "none", "mamba2", "none")
    moe, mlp = "nemotron_moe", "relu2_mlp"
    assert old.ffn_types == new.ffn_types == ("none", moe, "none", mlp, "none", moe)
    assert new.rope_theta is None and not new.uses_positions


def test_unknown_pattern_letter_is_refused_by_field(ckpt: Path, tmp_path: Path) -> None:
    with pytest.raises(UnsupportedArchitectureError, match="hybrid_override_pattern"):
        load_config(_pattern_config(ckpt, tmp_path / "bad", "M-*X"))


@pytest.mark.parametrize(
    "overrides",
    [
        {"moe_latent_size": 16, "mlp_bias": True},
        {"n_group": 1, "topk_group": 1, "norm_topk_prob": False, "num_experts_per_tok": 3},
        {
            "head_dim": 16,
            "num_key_value_heads": 4,
            "use_bias": True,
            "use_conv_bias": False,
            "time_step_limit": (0.05, float("inf")),
        },
    ],
    ids=["latent-bias", "no-groups-no-renorm", "wide-heads-mamba-bias-dt-clamp"],
)
def test_variants_match_transformers(tmp_path: Path, overrides: dict[str, object]) -> None:
    from transformers import AutoModelForCausalLM

    ckpt = exports.checkpoint(make_nemotron_h, seed=1, **overrides)
    model, _ = load_model(ckpt)
    hf = AutoModelForCausalLM.from_pretrained(ckpt).eval()
    ids = torch.randint(3, model.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ours = model(ids)[0]
        ref = hf(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    assert (ours - ref).abs().max().item() <= 1e-4
