"""Layer kinds are data: a kind is one table entry and one module, and everything else (the
graph contract, the model's forward, the runtime's buffers, export and its parity check)
follows. Proven with a toy kind and family that live in the tests, not in the package."""

from __future__ import annotations

import exports
import numpy as np
import pytest
import toy_kind

import hybridrt
from hybridrt.config import HybridConfig
from hybridrt.ffn_kinds import FFN_KINDS
from hybridrt.graphs.contract import input_specs, output_specs, past_specs
from hybridrt.graphs.manifest import read_manifest
from hybridrt.kinds import CAPACITY, KEY, LAYER_KINDS, layer_kind


def test_every_kind_declares_a_module_or_none_and_its_states() -> None:
    for name, kind in LAYER_KINDS.items():
        assert kind.name == name and kind.summary
        assert kind.module is None or ":" in kind.module
        assert len({s.name for s in kind.states}) == len(kind.states)
    assert layer_kind("attention").states[0] is KEY and CAPACITY in KEY.dims(_cfg(("attention",)))
    assert FFN_KINDS["none"].module is None
    assert all(k.name == name and (k.module is None or ":" in k.module) for name, k in FFN_KINDS.items())
    with pytest.raises(ValueError, match="unknown mixer kind 'nope'"):
        layer_kind("nope")


def _cfg(layer_types: tuple[str, ...]) -> HybridConfig:
    return HybridConfig(
        "t", 64, 16, layer_types, ("none",) * len(layer_types), num_attention_heads=2, num_key_value_heads=2
    )


def test_contract_follows_the_table(toy_registered: None) -> None:
    cfg = _cfg(("ema", "attention", "mamba2", "none"))
    pasts = [(s.name, s.dims) for s in past_specs(cfg)]
    assert pasts[0] == ("past.0.ema", ("batch", 16))
    assert pasts[1] == ("past.1.key", ("batch", 2, "capacity", 8))
    assert [n for n, _ in pasts[3:]] == ["past.2.conv", "past.2.ssm"]  # the "none" layer has no state
    assert [s.name for s in output_specs(cfg)][1] == "present.0.ema"
    assert "past.0.ema" in [s.name for s in input_specs(cfg)]


def test_toy_kind_exports_and_runs_end_to_end(toy_registered: None) -> None:
    """Registered from outside: the model builds, exports with passing parity (1 to 300
    tokens), and the runtime allocates its state from the manifest and decodes."""
    out = exports.export(toy_kind.make_toy, validate=True)
    manifest = read_manifest(out)
    assert manifest.parity["passed"] is True and manifest.parity["max_abs_logits"] <= 1e-4
    assert "past.0.ema" in [s.name for s in manifest.inputs]
    model = hybridrt.load(out)
    prompts = [np.arange(3, 3 + n).tolist() for n in (2, 9)]
    batch = model.generate(prompts, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert batch == [model.generate(p, max_new_tokens=8, min_new_tokens=8, do_sample=False) for p in prompts]
