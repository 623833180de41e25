"""Traced templates shared between exports (hybridrt.export.trace_cache, HYBRIDRT_TRACE_CACHE):
the same graph as a fresh trace, a key that every input of a trace changes, and a damaged entry
traced again."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import exports
import pytest
from checkpoints import make_llama

import hybridrt
from hybridrt.export.trace_cache import ENV, template_key
from hybridrt.graphs.contract import GraphContract
from hybridrt.models.loading.checkpoint import load_config


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "traces"
    monkeypatch.setenv(ENV, str(directory))
    return directory


def test_a_cached_trace_writes_the_graph_a_fresh_trace_writes(cache: Path, tmp_path: Path) -> None:
    src = exports.checkpoint(make_llama)
    first = hybridrt.export_model(src, tmp_path / "a")
    second = hybridrt.export_model(src, tmp_path / "b", quantize="int8-dynamic")
    third = hybridrt.export_model(src, tmp_path / "c")
    # two templates: layer 1's and the outer graph's (layer 0's is made from layer 1's)
    assert first.provenance["trace_cache"] | {"directory": None} == {"directory": None, "hits": 0, "traced": 2}
    assert second.provenance["trace_cache"]["hits"] == third.provenance["trace_cache"]["hits"] == 2
    assert (tmp_path / "a" / "model.onnx").read_bytes() == (tmp_path / "c" / "model.onnx").read_bytes()
    assert third.parity["passed"] and third.parity["max_abs_logits"] == first.parity["max_abs_logits"]


def test_without_the_variable_nothing_is_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    manifest = hybridrt.export_model(exports.checkpoint(make_llama), tmp_path / "a", validate=False)
    assert "trace_cache" not in manifest.provenance


def test_every_input_of_a_trace_changes_its_key() -> None:
    cfg = load_config(exports.checkpoint(make_llama))[0]
    contract = GraphContract.of(cfg)
    key = template_key(cfg, 1, True, contract)
    assert template_key(cfg, 1, True, contract) == key
    wider = dataclasses.replace(cfg, intermediate_size=cfg.intermediate_size * 2)
    longer = dataclasses.replace(cfg, max_position_embeddings=cfg.max_position_embeddings * 2)
    others = {
        template_key(cfg, 0, True, contract),
        template_key(cfg, -1, True, contract),
        template_key(cfg, 1, False, contract),
        template_key(wider, 1, True, GraphContract.of(wider)),
        template_key(longer, 1, True, GraphContract.of(longer)),
        template_key(cfg, 1, True, dataclasses.replace(contract, outputs=contract.outputs[:1])),
    }
    assert key not in others and len(others) == 6


def test_a_damaged_entry_is_traced_again(cache: Path, tmp_path: Path) -> None:
    src = exports.checkpoint(make_llama)
    hybridrt.export_model(src, tmp_path / "a", validate=False)
    graphs = sorted(cache.glob("*.onnx"))
    assert len(graphs) == 2
    graphs[0].write_bytes(graphs[0].read_bytes()[:-10])
    manifest = hybridrt.export_model(src, tmp_path / "b")
    record = manifest.provenance["trace_cache"]
    assert (record["hits"], record["traced"]) == (1, 1)
    assert record["damaged"] == [f"{graphs[0].name}: its graph does not match its checksum"]
    assert manifest.parity["passed"]
    assert (tmp_path / "a" / "model.onnx").read_bytes() == (tmp_path / "b" / "model.onnx").read_bytes()
