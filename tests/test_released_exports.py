"""Every released config.json of tests/data/released_configs, built small and exported.

For each file a reduced copy keeps every field and value of the release except depth (the first
layers of its layer pattern, at least one attention and one recurrent layer among them), widths
(hidden size 64, heads, groups, head and state sizes shrunk together), the vocabulary (the test
tokenizer's) and the number of experts. transformers builds a random checkpoint from it (the
class the file names), and hybridrt's PyTorch reference and its ONNX export must give
transformers' logits, the export over a prompt and the decode steps after it. The reductions
are a table keyed by model_type: a released file of a new family needs one.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import exports
import numpy as np
import pytest
import torch
from checkpoints import VOCAB
from family_checkpoints import QWEN3_5_VL_VISION, _save
from test_released_configs import DATA, REFUSED

import hybridrt
from hybridrt.models.loading.checkpoint import load_config, load_model

TOL = 1e-4
FILES = [p for p in sorted(DATA.glob("*.json")) if p.stem not in REFUSED]
PROMPT, STEPS = 33, 3  # a prompt, then decode steps one token at a time
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id")

Changes = dict[str, Any]


def _layers(pattern: list[str], attention: set[str]) -> int:
    """How many leading layers to keep: through the first attention layer (every released
    pattern opens with a recurrent layer, and each distinct layer costs an export trace)."""
    return next(i for i, kind in enumerate(pattern) if kind in attention) + 1


def _attention(data: dict[str, Any]) -> Changes:
    """4 query heads of 16 channels; grouped-query files keep sharing (2 KV heads)."""
    heads = data["num_attention_heads"]
    changes: Changes = {"num_attention_heads": 4}
    if "num_key_value_heads" in data:
        changes["num_key_value_heads"] = 4 if data["num_key_value_heads"] in (None, heads) else 2
    for name in ("head_dim", "attention_head_dim"):
        if name in data:
            changes[name] = 16
    return changes


def _gated_delta(data: dict[str, Any]) -> Changes:
    """Qwen3-Next and Qwen3.5 text: Gated DeltaNet and gated attention, MoE where the file has it."""
    ratio = data["linear_num_value_heads"] // data["linear_num_key_heads"]
    changes = _attention(data)
    changes |= {
        "hidden_size": 64,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 2 * ratio,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "intermediate_size": 96,
    }
    if "layer_types" in data:
        kept = _layers(data["layer_types"], {"full_attention"})
        changes |= {"layer_types": data["layer_types"][:kept], "num_hidden_layers": kept}
    else:
        changes["num_hidden_layers"] = data["full_attention_interval"]
    if "num_experts" in data:
        changes |= {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
        changes |= {"shared_expert_intermediate_size": 48}
    if "intermediate_size" not in data:
        del changes["intermediate_size"]
    rope = data.get("rope_parameters")
    if rope and "mrope_section" in rope:  # the sections split the (now 4) rotary dimensions
        changes["rope_parameters"] = rope | {"mrope_section": [1, 1, 0]}
    return changes


def _qwen3_5(data: dict[str, Any]) -> Changes:
    """The multimodal Qwen3.5 files: the text model reduced, a one-block vision tower."""
    text, vision = data["text_config"], data["vision_config"]
    return {
        "text_config": _changed(text, _gated_delta(text) | _vocab(text)),
        "vision_config": _changed(vision, QWEN3_5_VL_VISION | {"out_hidden_size": 64}),
    }


def _nemotron_h(data: dict[str, Any]) -> Changes:
    pattern = data["hybrid_override_pattern"]
    kept = pattern[: _layers(list(pattern), {"*"})]
    changes = _attention(data)
    changes |= {
        "hybrid_override_pattern": kept,
        "num_hidden_layers": len(kept),
        "hidden_size": 64,
        "intermediate_size": 96,
        "mamba_num_heads": 8,
        "mamba_head_dim": 16,
        "n_groups": 2,
        "ssm_state_size": 16,
    }
    if "n_routed_experts" in data:
        changes |= {"n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
        changes |= {"moe_shared_expert_intermediate_size": 48}
    return changes


def _lfm2(data: dict[str, Any]) -> Changes:
    layers = data["num_hidden_layers"]
    if "layer_types" in data:
        pattern = data["layer_types"]
    else:
        pattern = ["full_attention" if i in data["full_attn_idxs"] else "conv" for i in range(layers)]
    kept = _layers(pattern, {"full_attention"})
    changes = _attention(data)
    changes |= {"num_hidden_layers": kept, "hidden_size": 64}
    if "layer_types" in data:
        changes["layer_types"] = pattern[:kept]
    else:
        changes["full_attn_idxs"] = [i for i in data["full_attn_idxs"] if i < kept]
    same_as_hidden = ("block_dim", "conv_dim", "conv_dim_out")
    changes |= {name: 64 for name in same_as_hidden if data.get(name) == data["hidden_size"]}
    if "num_heads" in data:
        changes["num_heads"] = changes["num_attention_heads"]
    for name in ("block_ff_dim", "intermediate_size"):
        if name in data:
            changes[name] = 256
    return changes


def _granitemoehybrid(data: dict[str, Any]) -> Changes:
    """Granite 4.0 (and 4.0 H): Mamba2 and attention by layer_types, MoE where it has experts."""
    kept = _layers(data["layer_types"], {"attention", "full_attention"})
    changes = _attention(data)
    changes |= {"layer_types": data["layer_types"][:kept], "num_hidden_layers": kept, "hidden_size": 64}
    changes |= {"intermediate_size": 96, "shared_intermediate_size": 96}
    changes |= {"mamba_n_heads": 8, "mamba_d_head": 64 * data["mamba_expand"] // 8, "mamba_d_state": 16}
    if data.get("num_local_experts"):
        changes |= {"num_local_experts": 8, "num_experts_per_tok": 2}
    return changes


def _zamba2(data: dict[str, Any]) -> Changes:
    """Zamba2: Mamba2 layers and hybrid layers over shared transformer blocks (on the
    concatenation of the hidden state and the embeddings: twice the hidden size)."""
    kept = _layers(data["layers_block_type"], {"hybrid"})
    heads, mamba_heads = 4, 8
    changes = _attention(data)
    changes |= {"num_hidden_layers": kept, "layers_block_type": data["layers_block_type"][:kept]}
    changes |= {"hybrid_layer_ids": [i for i in data["hybrid_layer_ids"] if i < kept], "hidden_size": 64}
    changes |= {"attention_hidden_size": 128, "attention_head_dim": 128 // heads, "kv_channels": 64 // heads}
    changes |= {"num_query_groups": changes["num_key_value_heads"], "adapter_rank": 8, "mamba_d_state": 16}
    changes |= {"n_mamba_heads": mamba_heads, "mamba_headdim": 64 * data["mamba_expand"] // mamba_heads}
    changes |= {"intermediate_size": 96, "ffn_hidden_size": 96}
    return changes


def _falcon_h1(data: dict[str, Any]) -> Changes:
    """Falcon-H1: attention beside a Mamba2 mixer in every layer, every muP multiplier as released."""
    changes = _attention(data)
    changes |= {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 96}
    changes |= {"mamba_n_heads": 4, "mamba_d_head": 16, "mamba_d_ssm": 64, "mamba_d_state": 16}
    return changes


def _mamba(data: dict[str, Any]) -> Changes:
    changes: Changes = {"num_hidden_layers": 2, "hidden_size": 64, "time_step_rank": 4}
    changes |= {"intermediate_size": 64 * data["expand"]} if "intermediate_size" in data else {}
    changes |= {"n_layer": 2} if "n_layer" in data else {}
    return changes


# model_type -> the changes that make a released file small (depth, widths, experts); the
# vocabulary is `_vocab`'s for every family with a flat file.
REDUCE: dict[str, Callable[[dict[str, Any]], Changes]] = {
    "qwen3_next": _gated_delta,
    "qwen3_5": _qwen3_5,
    "qwen3_5_moe": _qwen3_5,
    "nemotron_h": _nemotron_h,
    "granitemoehybrid": _granitemoehybrid,
    "lfm2": _lfm2,
    "mamba": _mamba,
    "zamba2": _zamba2,
    "falcon_h1": _falcon_h1,
}
NESTED = {"qwen3_5", "qwen3_5_moe"}


def _vocab(data: dict[str, Any]) -> Changes:
    """The test tokenizer's vocabulary; special token ids beyond it moved to its own."""
    changes: Changes = {"vocab_size": VOCAB}
    for i, name in enumerate(TOKEN_IDS):
        if isinstance(data.get(name), int) and data[name] >= VOCAB:
            changes[name] = i
    return changes


def _changed(data: dict[str, Any], changes: Changes) -> dict[str, Any]:
    unknown = set(changes) - set(data)
    assert not unknown, f"a reduction adds fields the release does not have: {unknown}"
    return data | changes


def reduced(data: dict[str, Any]) -> dict[str, Any]:
    """The released config at test size: every field kept, only REDUCE's and `_vocab`'s changed."""
    if data["model_type"] not in REDUCE:
        pytest.fail(f"no reduction for model_type {data['model_type']!r}: add one to REDUCE")
    changes = REDUCE[data["model_type"]](data)
    if data["model_type"] not in NESTED:
        changes |= _vocab(data)
    return _changed(data, changes)


def _build(data: dict[str, Any], directory: Path) -> Path:
    """A random checkpoint of the class the file names, saved in Hugging Face layout."""
    import transformers

    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(data))
    config = transformers.AutoConfig.from_pretrained(directory)
    torch.manual_seed(0)
    model = getattr(transformers, data["architectures"][0])(config)
    with torch.no_grad():  # the spread the family builders get from a larger initializer_range
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.1)
    return _save(model, directory)


def _build_reduced(directory: Path, data: dict[str, Any]) -> Path:
    return _build(data, directory)


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_reduced_release_exports_and_matches_transformers(path: Path, tmp_path: Path) -> None:
    """The reduced copy has every layer and feed-forward kind of the release; the graph's
    logits equal transformers' over a prompt and the decode steps after it (the states it
    carries), and so do hybridrt's PyTorch reference's, which localizes a mismatch."""
    from transformers import AutoModelForCausalLM

    ckpt = exports.checkpoint(_build_reduced, data=reduced(json.loads(path.read_text())))
    (tmp_path / "released").mkdir()
    shutil.copyfile(path, tmp_path / "released" / "config.json")
    small, full = load_config(ckpt)[0], load_config(tmp_path / "released")[0]
    assert (set(small.layer_types), set(small.ffn_types)) == (set(full.layer_types), set(full.ffn_types))
    hf = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    ids = torch.randint(3, VOCAB, (2, PROMPT + STEPS), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        logits, _ = load_model(ckpt)[0](ids)
    assert (logits - ref).abs().max().item() <= TOL

    stepper = hybridrt.load(exports.export(ckpt, validate=False)).stepper(2, PROMPT + STEPS)
    steps = [np.array(stepper.forward(ids[:, :PROMPT].numpy(), all_logits=True))]
    for t in range(PROMPT, PROMPT + STEPS):  # copies: a bound stepper reuses its output buffer
        steps.append(np.array(stepper.forward(ids[:, t : t + 1].numpy(), all_logits=True)))
    assert np.abs(np.concatenate(steps, axis=1) - ref.numpy()).max() <= TOL
