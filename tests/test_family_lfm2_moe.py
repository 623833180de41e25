"""LFM2-MoE variants beyond the family suite's checkpoint: no expert bias, top-k weights kept
as they are, and expert weights stored stacked (gate_up_proj / down_proj) rather than per expert."""

from __future__ import annotations

from pathlib import Path

import exports
import pytest
import torch
from family_checkpoints import make_lfm2_moe
from safetensors.torch import load_file, save_file

from hybridrt.models.loading.checkpoint import load_model

TOL = 1e-4


def _logits(model, ids):  # type: ignore[no-untyped-def]
    with torch.no_grad():
        return model(ids)[0]


@pytest.mark.parametrize(
    "overrides",
    [
        {"use_expert_bias": False},
        {"norm_topk_prob": False, "routed_scaling_factor": 1.0},
        {"num_dense_layers": 0, "num_experts_per_tok": 3},
    ],
    ids=["no-expert-bias", "raw-topk-weights", "all-moe-top3"],
)
def test_lfm2_moe_variants_match_transformers(tmp_path: Path, overrides: dict[str, object]) -> None:
    from transformers import AutoModelForCausalLM

    ckpt = exports.checkpoint(make_lfm2_moe, seed=1, **overrides)
    model, _ = load_model(ckpt)
    hf = AutoModelForCausalLM.from_pretrained(ckpt).eval()
    ids = torch.randint(3, model.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    assert (_logits(model, ids) - ref).abs().max().item() <= TOL


def test_stacked_expert_weights_load_like_per_expert(tmp_path: Path) -> None:
    """transformers' in-memory layout (experts.gate_up_proj [E, 2f, d], experts.down_proj
    [E, d, f]) loads to the same model as the per-expert w1/w3/w2 files it saves."""
    ckpt = exports.checkpoint(make_lfm2_moe)
    tensors = load_file(str(ckpt / "model.safetensors"))
    stacked: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    for name, t in tensors.items():
        parts = name.split(".")
        if ".experts." in name:
            prefix = ".".join(parts[: parts.index("experts") + 1])
            experts.setdefault(prefix, {}).setdefault(int(parts[parts.index("experts") + 1]), {})[parts[-2]] = t
        else:
            stacked[name] = t
    for prefix, per in experts.items():
        order = [per[e] for e in sorted(per)]
        stacked[f"{prefix}.gate_up_proj"] = torch.stack([torch.cat([x["w1"], x["w3"]]) for x in order])
        stacked[f"{prefix}.down_proj"] = torch.stack([x["w2"] for x in order])
    other = tmp_path / "stacked"
    other.mkdir()
    (other / "config.json").write_text((ckpt / "config.json").read_text())
    save_file(stacked, str(other / "model.safetensors"), metadata={"format": "pt"})
    ids = torch.randint(3, 320, (1, 12), generator=torch.Generator().manual_seed(5))
    a, _ = load_model(ckpt)
    b, _ = load_model(other)
    assert torch.equal(_logits(a, ids), _logits(b, ids))
