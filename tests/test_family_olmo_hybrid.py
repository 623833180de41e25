"""OLMo Hybrid variants beyond the family suite's tiny checkpoint: no positions (as released),
beta in [0, 1] (`linear_allow_neg_eigval` false), transformers' default layer pattern, and
the merged q/k/v tensors of both checkpoint layouts."""

from __future__ import annotations

import json
from pathlib import Path

import exports
import pytest
import torch
from safetensors.torch import load_file, save_file

from hybridrt.kinds import GatedDeltaParams
from hybridrt.models.loading.checkpoint import load_config, load_model

TOL = 1e-4


def _matches_transformers(ckpt: Path) -> None:
    from transformers import AutoModelForCausalLM

    model, _ = load_model(ckpt)
    hf = AutoModelForCausalLM.from_pretrained(ckpt).eval()
    ids = torch.randint(3, model.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        logits, _ = model(ids)
        ref = hf(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    assert (logits - ref).abs().max().item() <= TOL


@pytest.mark.parametrize(
    "overrides",
    [
        {"rope_parameters": {"rope_type": "default", "rope_theta": None}},
        {"linear_allow_neg_eigval": False, "tie_word_embeddings": True},
        {"layer_types": None, "num_hidden_layers": 4},
    ],
    ids=["no-positions", "beta-0-1-tied", "default-layer-pattern"],
)
def test_olmo_hybrid_variants_match_transformers(tmp_path: Path, overrides: dict[str, object]) -> None:
    from family_checkpoints import make_olmo_hybrid

    ckpt = exports.checkpoint(make_olmo_hybrid, seed=1, **overrides)
    cfg = load_config(ckpt)[0]
    if "rope_parameters" in overrides:
        assert cfg.rope_theta is None and not cfg.uses_positions
    if "linear_allow_neg_eigval" in overrides:
        assert cfg.params(GatedDeltaParams).gdn_beta_scale == 1.0
    if "layer_types" in overrides:
        assert cfg.layer_types == ("gated_delta",) * 3 + ("post_norm_attention",)
    _matches_transformers(ckpt)


def test_olmo_hybrid_unconverted_layout_loads_the_same_model(tmp_path: Path) -> None:
    """transformers writes OLMo-core's layout (one conv per q, k and v, `attention_layer_norm`);
    its in-memory names (one conv1d, `input_layernorm`) load to the same parameters: q, k and
    v are merged by the family's merges in either case."""
    from family_checkpoints import make_olmo_hybrid

    src = exports.checkpoint(make_olmo_hybrid)
    tensors = load_file(str(src / "model.safetensors"))
    assert "model.layers.0.linear_attn.q_conv1d.weight" in tensors
    other: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if ".linear_attn.q_conv1d." in name:
            parts = [tensors[name.replace("q_conv1d", p)] for p in ("q_conv1d", "k_conv1d", "v_conv1d")]
            other[name.replace("q_conv1d", "conv1d")] = torch.cat(parts)
        elif ".linear_attn.k_conv1d." in name or ".linear_attn.v_conv1d." in name:
            continue
        else:
            name = name.replace("attention_layer_norm", "input_layernorm")
            other[name.replace("feedforward_layer_norm", "post_attention_layernorm")] = t
    dst = tmp_path / "unconverted"
    dst.mkdir()
    save_file(other, str(dst / "model.safetensors"))
    (dst / "config.json").write_text(json.dumps(json.loads((src / "config.json").read_text())))
    a, _ = load_model(src)
    b, _ = load_model(dst)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name
