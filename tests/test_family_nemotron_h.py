"""Nemotron-H beyond the family suite: the released `hybrid_override_pattern` spelling, and
MoE ("E") layers refused by the field that names them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from family_checkpoints import make_nemotron_h

from hybridrt.errors import UnsupportedArchitectureError
from hybridrt.models.checkpoint import load_config


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_nemotron_h(tmp_path_factory.mktemp("nemotron_h"))


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
    old = load_config(_pattern_config(ckpt, tmp_path / "old", "M-*-M-"))[0]
    assert old.layer_types == new.layer_types == ("mamba2", "none", "attention", "none", "mamba2", "none")
    assert old.ffn_types == new.ffn_types == ("none", "relu2_mlp", "none", "relu2_mlp", "none", "relu2_mlp")
    assert new.rope_theta is None and not new.uses_positions


def test_moe_pattern_is_refused_by_field(ckpt: Path, tmp_path: Path) -> None:
    with pytest.raises(UnsupportedArchitectureError, match="hybrid_override_pattern"):
        load_config(_pattern_config(ckpt, tmp_path / "moe", "M-*E"))
