"""Zamba2 beyond the family suite: the dt clamp at time_step_min (with transformers' own dt
init, under which it is active), variants without attention adapters, RoPE or a second
shared block, and each shared weight held once under model.shared."""

from __future__ import annotations

from pathlib import Path

import exports
import pytest
import torch
from family_checkpoints import make_zamba2

from hybridrt.models.decoder import HybridForCausalLM
from hybridrt.models.loading.checkpoint import load_model
from hybridrt.models.mixers.mamba2 import Mamba2Mixer

TOL = 1e-4


def _logits(model: HybridForCausalLM, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids)[0]


def _transformers(ckpt: Path, ids: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(ckpt).eval()
    with torch.no_grad():
        return hf(input_ids=ids, attention_mask=torch.ones_like(ids)).logits


def test_dt_clamp_at_time_step_min(tmp_path: Path) -> None:
    """With transformers' dt init many dt fall under time_step_min: the reference clamps them
    as transformers' scan does, and without the clamp the logits would differ."""
    ckpt = exports.checkpoint(make_zamba2, dt_bias=None, initializer_range=0.2, time_step_min=0.01)
    model, _ = load_model(ckpt)
    ids = torch.randint(3, model.config.vocab_size, (2, 64), generator=torch.Generator().manual_seed(5))
    ours = _logits(model, ids)
    assert (ours - _transformers(ckpt, ids)).abs().max().item() <= TOL
    for m in model.modules():
        if isinstance(m, Mamba2Mixer):
            m.dt_min = 0.0
    assert (_logits(model, ids) - ours).abs().max().item() > TOL


@pytest.mark.parametrize(
    "overrides",
    [
        {"use_shared_attention_adapter": False, "use_mem_rope": False, "num_mem_blocks": 1, "num_key_value_heads": 2},
        {"num_mem_blocks": 4},
        {
            "num_mem_blocks": 3,
            "add_bias_linear": True,
            "hidden_act": "silu",
            "num_hidden_layers": 4,
            "layers_block_type": ["hybrid", "mamba", "hybrid", "hybrid"],
        },
    ],
    ids=["one-block-gqa-no-adapter-nope", "more-blocks-than-hybrid-layers", "three-blocks-bias-silu"],
)
def test_variants_match_transformers(tmp_path: Path, overrides: dict[str, object]) -> None:
    ckpt = exports.checkpoint(make_zamba2, seed=1, **overrides)
    model, _ = load_model(ckpt)
    ids = torch.randint(3, model.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(4))
    assert (_logits(model, ids) - _transformers(ckpt, ids)).abs().max().item() <= TOL


def test_shared_blocks_are_held_once(tmp_path: Path) -> None:
    """Three hybrid layers over two blocks: each shared weight has one name under
    model.shared, the first and third hybrid layers use the same block, adapters are per layer."""
    model, _ = load_model(exports.checkpoint(make_zamba2))
    names = list(model.state_dict())
    assert not any(".mixer._block" in n for n in names)
    assert {n.split(".")[3] for n in names if n.startswith("model.shared.blocks.")} == {"0", "1"}
    hybrid = [layer.mixer for layer in model.model.layers if layer.kind == "zamba2_hybrid"]  # type: ignore[union-attr]
    assert len(hybrid) == 3
    assert hybrid[0]._block[0] is hybrid[2]._block[0] is not hybrid[1]._block[0]
    assert all(f"model.layers.{i}.mixer.q_adapter.0.weight" in names for i in (1, 2, 4))
