"""Qwen3-Next and Qwen3.5 variants beyond the family suite's tiny checkpoints: the MoE/dense
layer choice (`decoder_sparse_step`, `mlp_only_layers`, no experts), unnormalized top-k,
one value head per key head, tied embeddings, full rotary."""

from __future__ import annotations

from pathlib import Path

import exports
import pytest
import torch

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
    ("overrides", "ffn"),
    [
        ({"decoder_sparse_step": 2, "mlp_only_layers": []}, ("mlp", "gated_shared_moe", "mlp", "gated_shared_moe")),
        ({"num_experts": 0}, ("mlp",) * 4),
        ({"norm_topk_prob": False, "linear_num_value_heads": 2, "tie_word_embeddings": True}, None),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 5000.0, "partial_rotary_factor": 1.0}}, None),
    ],
    ids=["sparse-step-2", "dense", "unnormalized-rep1-tied", "full-rotary"],
)
def test_qwen3_next_variants_match_transformers(
    tmp_path: Path, overrides: dict[str, object], ffn: tuple[str, ...] | None
) -> None:
    from family_checkpoints import make_qwen3_next

    ckpt = exports.checkpoint(make_qwen3_next, seed=1, **overrides)
    if ffn is not None:
        assert load_config(ckpt)[0].ffn_types == ffn
    _matches_transformers(ckpt)


def test_qwen3_5_default_layer_pattern_matches_transformers(tmp_path: Path) -> None:
    """No layer_types: every fourth layer is full attention (`full_attention_interval`)."""
    from family_checkpoints import make_qwen3_5

    ckpt = exports.checkpoint(make_qwen3_5, seed=2, layer_types=None, num_hidden_layers=4)
    assert load_config(ckpt)[0].layer_types == ("gated_delta",) * 3 + ("attention",)
    _matches_transformers(ckpt)


def test_qwen3_next_per_expert_tensors_load(tmp_path: Path) -> None:
    """Released Qwen3-Next files store each expert's gate/up/down projections apart."""
    import shutil

    from family_checkpoints import make_qwen3_next
    from safetensors.torch import load_file, save_file

    src = exports.checkpoint(make_qwen3_next, seed=3)
    dst = tmp_path / "split"
    shutil.copytree(src, dst)
    tensors = load_file(str(src / "model.safetensors"))
    split: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            gate, up = t.chunk(2, dim=1)
            for e in range(t.shape[0]):
                split[f"{name[: -len('gate_up_proj')]}{e}.gate_proj.weight"] = gate[e].contiguous()
                split[f"{name[: -len('gate_up_proj')]}{e}.up_proj.weight"] = up[e].contiguous()
        elif name.endswith("mlp.experts.down_proj"):
            for e in range(t.shape[0]):
                split[f"{name[: -len('down_proj')]}{e}.down_proj.weight"] = t[e].contiguous()
        else:
            split[name] = t
    save_file(split, str(dst / "model.safetensors"), metadata={"format": "pt"})
    a, _ = load_model(src)
    b, _ = load_model(dst)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name
