"""Released checkpoints' config.json files, read as hybridrt reads them.

tests/data/released_configs/ holds verbatim copies of released config.json files (SOURCES.md
says where each was found). Each must load with `load_config` (or, listed in REFUSED, be
refused by a typed error that names the field) and translate to what the file says: its
depth, its mix of attention, recurrent (Mamba, Gated DeltaNet, conv) and feed-forward-only
layers, its widths and vocabulary, checked against a table here and against what transformers'
own AutoConfig derives from the same file. No weights: every test reads a config alone
(tests/test_released_exports.py builds and exports each file at reduced size).

The second half checks the spellings those files use that transformers 5 reads as something
else (Granite's "nope", Nemotron-H's pattern and `mamba_*` names, LFM2's `block_ff_dim`,
`tie_embedding` and `full_attn_idxs`, Zamba2's `layer_types`) on configs derived from a
released file or from transformers' own config class, never presented as released ones.
"""

from __future__ import annotations

import collections
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from hybridrt.config import HybridConfig
from hybridrt.errors import UnsupportedArchitectureError
from hybridrt.ffn_kinds import MoEParams
from hybridrt.kinds import Mamba2Params
from hybridrt.models.loading.checkpoint import load_config

DATA = Path(__file__).parent / "data" / "released_configs"
FILES = sorted(DATA.glob("*.json"))

# file stem -> (layers, attention, recurrent, feed-forward-only, hidden_size, vocab_size),
# counted from the file (layer_types, full_attention_interval, hybrid_override_pattern or
# full_attn_idxs; a plain Mamba file has a Mamba mixer in every layer).
EXPECTED: dict[str, tuple[int, int, int, int, int, int]] = {
    "LiquidAI--LFM2-350M": (16, 6, 10, 0, 1024, 65536),
    "ibm-granite--granite-4.0-1b": (40, 40, 0, 0, 2048, 100352),
    "ibm-granite--granite-4.0-h-tiny": (40, 4, 36, 0, 1536, 100352),
    "ibm-granite--granite-4.0-h-small": (40, 4, 36, 0, 4096, 100352),
    "Zyphra--Zamba2-2.7B": (54, 0, 54, 0, 2560, 32000),
    "tiiuae--Falcon-H1-0.5B-Base": (36, 0, 36, 0, 1024, 32784),
    "tiiuae--Falcon-H1-Tiny-90M-Base": (24, 0, 24, 0, 512, 32768),
    "Qwen--Qwen3-Next-80B-A3B-Thinking": (48, 12, 36, 0, 2048, 151936),
    "Qwen--Qwen3.5-27B": (64, 16, 48, 0, 5120, 248320),
    "Qwen--Qwen3.5-35B-A3B": (40, 10, 30, 0, 2048, 248320),
    "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": (52, 6, 23, 23, 2688, 131072),
    "nvidia--Nemotron-H-56B-Base-8K": (118, 10, 54, 54, 8192, 131072),
    "nvidia--Nemotron-H-8B-Base-8K": (52, 4, 24, 24, 4096, 131072),
    "state-spaces--mamba-2.8b-hf": (64, 0, 64, 0, 2560, 50280),
}
# file stem -> (error type, the config field its message must name): released files that use
# a feature hybridrt does not support. state-spaces' Mamba2 checkpoints are mamba_ssm's own
# format (d_model, n_layer, ssm_cfg; no model_type), which transformers does not read either.
REFUSED: dict[str, tuple[type[Exception], str]] = {
    "state-spaces--mamba2-2.7b": (UnsupportedArchitectureError, "model_type"),
}

MOE_FFNS = {"moe", "shared_moe", "gated_shared_moe", "sigmoid_moe", "nemotron_moe"}
# transformers' layer kind names, legacy spellings included -> the bucket counted here
TF_BUCKETS = {"full_attention": "attention", "attention": "attention", "mlp": "ffn_only", "moe": "ffn_only"}


def _checkpoint(tmp_path: Path, data: dict[str, Any] | Path) -> Path:
    """A checkpoint directory holding only a config.json: the released file byte for byte, or a
    derived config."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir(parents=True)
    if isinstance(data, Path):
        shutil.copyfile(data, ckpt / "config.json")
    else:
        (ckpt / "config.json").write_text(json.dumps(data))
    return ckpt


def _ours(cfg: HybridConfig) -> dict[str, Any]:
    kinds = collections.Counter(
        "attention" if k == "attention" else "ffn_only" if k == "none" else "recurrent" for k in cfg.layer_types
    )
    view = {
        "layers": cfg.num_layers,
        "attention": kinds["attention"],
        "recurrent": kinds["recurrent"],
        "ffn_only": kinds["ffn_only"],
        "hidden_size": cfg.hidden_size,
        "vocab_size": cfg.vocab_size,
        "tie_word_embeddings": cfg.tie_word_embeddings,
    }
    if kinds["attention"]:
        view |= {"heads": cfg.num_attention_heads, "kv_heads": cfg.num_key_value_heads, "head_dim": cfg.attn_head_dim}
    if MOE_FFNS & set(cfg.ffn_types):
        view["experts"] = cfg.params(MoEParams).num_experts
    return view


def _transformers(ckpt: Path, moe: bool) -> dict[str, Any]:
    """The same summary as transformers derives it from the directory (offline: a local path)."""
    import transformers

    top = transformers.AutoConfig.from_pretrained(ckpt)
    text = top.get_text_config()
    # a config without layer_types (plain Mamba) has one mixer, recurrent, in every layer
    layer_types = getattr(text, "layer_types", None) or ["mamba"] * text.num_hidden_layers
    kinds = collections.Counter(TF_BUCKETS.get(k, "recurrent") for k in layer_types)
    view = {
        "layers": len(layer_types),
        "attention": kinds["attention"],
        "recurrent": kinds["recurrent"],
        "ffn_only": kinds["ffn_only"],
        "hidden_size": text.hidden_size,
        "vocab_size": text.vocab_size,
        "tie_word_embeddings": top.tie_word_embeddings,
    }
    if kinds["attention"]:
        view |= {
            "heads": text.num_attention_heads,
            "kv_heads": text.num_key_value_heads,
            "head_dim": getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads,
        }
    if moe:
        view["experts"] = next(
            getattr(text, name)
            for name in ("num_experts", "n_routed_experts", "num_local_experts")
            if hasattr(text, name)
        )
    return view


def test_every_file_has_a_source_and_an_expectation() -> None:
    assert FILES, f"no released configs in {DATA}"
    sources = (DATA / "SOURCES.md").read_text()
    for path in FILES:
        assert f"`{path.name}`" in sources, f"{path.name} is not listed in SOURCES.md"
        assert (path.stem in EXPECTED) != (path.stem in REFUSED), f"{path.stem}: one of EXPECTED or REFUSED"


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_released_config_is_read(path: Path, tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path, path)
    if path.stem in REFUSED:
        error, field = REFUSED[path.stem]
        with pytest.raises(error, match=field):
            load_config(ckpt)
        return
    cfg, family, hf = load_config(ckpt)
    assert family.model_type == hf["model_type"] == cfg.model_type
    layers, attention, recurrent, ffn_only, hidden, vocab = EXPECTED[path.stem]
    ours = _ours(cfg)
    assert (ours["layers"], ours["attention"], ours["recurrent"], ours["ffn_only"]) == (
        layers,
        attention,
        recurrent,
        ffn_only,
    )
    assert (cfg.hidden_size, cfg.vocab_size) == (hidden, vocab)
    assert len(cfg.ffn_types) == layers
    assert ours == _transformers(ckpt, moe="experts" in ours)


# --- spellings -----------------------------------------------------------------------------


def _released(stem: str) -> dict[str, Any]:
    return json.loads((DATA / f"{stem}.json").read_text())


def _tiny_granite(position_embedding_type: str | None) -> dict[str, Any]:
    from transformers import GraniteMoeHybridConfig

    config = GraniteMoeHybridConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=24,
        shared_intermediate_size=40,
        num_hidden_layers=2,
        layer_types=["mamba", "attention"],  # the released spelling
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=0,
        mamba_n_heads=8,
        mamba_d_head=8,
        mamba_d_state=8,
        position_embedding_type=position_embedding_type,
    )
    return config.to_dict()


@pytest.mark.parametrize("positions", ["nope", None, "rope"])
def test_granite_position_embedding_type_as_transformers_reads_it(positions: str | None, tmp_path: Path) -> None:
    """The Granite 4.0 H files say "nope": no rotary embedding, as transformers builds none for
    anything but "rope"."""
    from transformers import AutoConfig, GraniteMoeHybridModel

    ckpt = _checkpoint(tmp_path, _tiny_granite(positions))
    cfg = load_config(ckpt)[0]
    built = GraniteMoeHybridModel(AutoConfig.from_pretrained(ckpt))
    assert cfg.uses_positions == (built.rotary_emb is not None) == (positions == "rope")
    assert cfg.layer_types == ("mamba2", "attention")


def test_granite_unknown_position_embedding_type_is_refused_by_field(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path, _tiny_granite(None) | {"position_embedding_type": "alibi"})
    with pytest.raises(UnsupportedArchitectureError, match="position_embedding_type.*'alibi'"):
        load_config(ckpt)


def _nemotron_layer_list(stem: str, field: str, legacy: bool) -> dict[str, Any]:
    """A released Nemotron-H file with its hybrid_override_pattern written out as a list."""
    data = _released(stem)
    names = {"M": "mamba", "*": "attention"} if legacy else {"M": "linear_attention", "*": "full_attention"}
    names |= {"-": "mlp", "E": "moe"}
    data[field] = [names[ch] for ch in data.pop("hybrid_override_pattern")]
    return data


@pytest.mark.parametrize(
    ("stem", "field", "legacy"),
    [
        ("nvidia--Nemotron-H-56B-Base-8K", "layer_types", True),
        ("nvidia--Nemotron-H-56B-Base-8K", "layers_block_type", False),
        ("nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "layer_types", False),
        ("nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "layers_block_type", True),
    ],
)
def test_nemotron_h_layer_list_spellings(stem: str, field: str, legacy: bool, tmp_path: Path) -> None:
    """transformers reads `layer_types` as `layers_block_type`, and "mamba"/"attention" as
    "linear_attention"/"full_attention": the list gives the layers the pattern gives."""
    ckpt = _checkpoint(tmp_path, _nemotron_layer_list(stem, field, legacy))
    from_list = load_config(ckpt)[0]
    from_pattern = load_config(_checkpoint(tmp_path / "pattern", DATA / f"{stem}.json"))[0]
    assert (from_list.layer_types, from_list.ffn_types) == (from_pattern.layer_types, from_pattern.ffn_types)
    ours = _ours(from_list)
    assert ours == _transformers(ckpt, moe="experts" in ours)


def test_nemotron_h_mamba_prefixed_names_win_as_in_transformers(tmp_path: Path) -> None:
    import transformers

    data = _released("nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")
    data |= {"mamba_n_groups": 4, "mamba_d_conv": 3, "mamba_conv_bias": False, "mamba_dt_limit": [0.002, float("inf")]}
    ckpt = _checkpoint(tmp_path, data)
    cfg = load_config(ckpt)[0]
    ref = transformers.AutoConfig.from_pretrained(ckpt)
    m2 = cfg.params(Mamba2Params)
    assert (m2.mamba2_groups, cfg.mamba_d_conv, m2.mamba2_conv_bias, m2.mamba2_dt_min) == (
        ref.n_groups,
        ref.conv_kernel,
        ref.use_conv_bias,
        float(ref.time_step_limit[0]),
    )
    assert (ref.n_groups, ref.conv_kernel, ref.use_conv_bias, float(ref.time_step_limit[0])) == (4, 3, False, 0.002)


@pytest.mark.parametrize(
    "changes",
    [
        {"block_ff_dim": 96},
        {"tie_embedding": False},
        {"layer_types": None, "full_attn_idxs": [1, 3]},
        {"layer_types": None, "full_attn_idxs": []},
        {"layer_types": None, "full_attn_idxs": None},
    ],
    ids=["block_ff_dim", "tie_embedding", "full_attn_idxs", "no-attention-listed", "no-list"],
)
def test_lfm2_released_spellings_as_transformers_reads_them(changes: dict[str, Any], tmp_path: Path) -> None:
    """The first LFM2 files spell intermediate_size `block_ff_dim`, tie_word_embeddings
    `tie_embedding` and the layer kinds `full_attn_idxs`; transformers takes the first two over
    the new names when a file has both."""
    from transformers import AutoConfig, Lfm2Config
    from transformers.models.lfm2.modeling_lfm2 import Lfm2MLP

    base = Lfm2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        layer_types=["conv", "full_attention", "conv", "full_attention"],
        block_multiple_of=16,
    ).to_dict()
    data = {k: v for k, v in (base | changes).items() if v is not None or k not in changes}
    ckpt = _checkpoint(tmp_path, data)
    cfg = load_config(ckpt)[0]
    ref = AutoConfig.from_pretrained(ckpt)
    assert cfg.intermediate_size == Lfm2MLP(ref).w1.out_features
    assert _ours(cfg) == _transformers(ckpt, moe=False)


def test_zamba2_layer_types_spelling(tmp_path: Path) -> None:
    """transformers reads `layer_types` as Zamba2's `layers_block_type`."""
    from transformers import Zamba2Config

    blocks = ["mamba", "hybrid", "mamba", "mamba", "hybrid"]
    base = Zamba2Config(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=5,
        num_attention_heads=4,
        n_mamba_heads=4,
        mamba_d_state=8,
        layers_block_type=blocks,
    ).to_dict()
    base.pop("layers_block_type", None)
    ckpt = _checkpoint(tmp_path, base | {"layer_types": blocks})
    cfg = load_config(ckpt)[0]
    assert cfg.layer_types == ("mamba2", "zamba2_hybrid", "mamba2", "mamba2", "zamba2_hybrid")
    assert _ours(cfg) == _transformers(ckpt, moe=False)
