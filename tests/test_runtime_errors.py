"""Bad inputs give typed errors that name the problem, never an ONNX Runtime stack trace.
Each test corrupts a copy of the exported directory, never the shared fixture."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import hybridrt
from hybridrt.graphs.manifest import MANIFEST


@pytest.fixture
def copy(jamba_onnx: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(jamba_onnx, tmp_path / "model"))


def _edit_manifest(directory: Path, edit) -> None:  # type: ignore[no-untyped-def]
    path = directory / MANIFEST
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def test_corrupt_graph_fails_its_checksum(copy: Path) -> None:
    with open(copy / "model.onnx", "r+b") as f:
        f.seek(1000)
        f.write(b"\xff" * 64)
    with pytest.raises(hybridrt.GraphError, match="checksum"):
        hybridrt.load(copy)


def test_unreadable_graph_is_a_graph_error_without_verification(copy: Path) -> None:
    """Guards against ONNX Runtime's own exception escaping when checksums are skipped."""
    (copy / "model.onnx").write_bytes(b"not a protobuf" * 100)
    with pytest.raises(hybridrt.GraphError, match="cannot load"):
        hybridrt.load(copy, verify=False)


def test_missing_or_corrupt_manifest(copy: Path) -> None:
    (copy / MANIFEST).write_text("{not json")
    with pytest.raises(hybridrt.GraphError, match="corrupt"):
        hybridrt.load(copy)
    (copy / MANIFEST).unlink()
    with pytest.raises(hybridrt.GraphError, match="no hybridrt.json"):
        hybridrt.load(copy)


def test_manifest_input_name_not_in_graph(copy: Path) -> None:
    _edit_manifest(copy, lambda d: d["inputs"][2].update(name="past.0.convolution"))
    with pytest.raises(hybridrt.GraphError, match="past.0.convolution"):
        hybridrt.load(copy)


def test_directory_of_the_growing_kv_contract_asks_for_a_re_export(copy: Path) -> None:
    """Schema 1 graphs (KV grown per token, attention mask in) are refused with the fix."""

    def old(d: dict) -> None:  # type: ignore[type-arg]
        d["schema_version"] = 1
        d["inputs"][1] = {
            "name": "attention_mask",
            "dims": ["batch", "total_len"],
            "dtype": "int64",
            "kind": "attention_mask",
        }

    _edit_manifest(copy, old)
    with pytest.raises(hybridrt.GraphError, match=r"schema version 1.*attention mask.*Re-export the model"):
        hybridrt.load(copy)


def test_directory_of_the_previous_mamba_state_layout_asks_for_a_re_export(copy: Path) -> None:
    """Schema 2 graphs with Mamba layers (SSM state [batch, d_inner, d_state]) are refused with
    the fix: their states would bind with the wrong layout. Without Mamba layers they load."""
    _edit_manifest(copy, lambda d: d.update(schema_version=2))
    with pytest.raises(hybridrt.GraphError, match=r"schema version 2.*d_inner, d_state.*Re-export the model"):
        hybridrt.load(copy)


def test_directory_of_schema_2_without_mamba_layers_still_loads(llama_onnx: Path, tmp_path: Path) -> None:
    model = Path(shutil.copytree(llama_onnx, tmp_path / "model"))
    expected = hybridrt.load(model).generate([5, 6, 7], max_new_tokens=4)
    _edit_manifest(model, lambda d: d.update(schema_version=2))
    assert hybridrt.load(model).generate([5, 6, 7], max_new_tokens=4) == expected


def test_manifest_vocabulary_not_matching_the_graph(copy: Path) -> None:
    """The decode loop sizes its logits buffer from the manifest: a wrong vocab_size is caught at load."""
    _edit_manifest(copy, lambda d: d.update(vocab_size=10))
    with pytest.raises(hybridrt.GraphError, match="vocab_size 10 but model.onnx gives logits over 320 tokens"):
        hybridrt.load(copy)


def test_manifest_rank_not_matching_graph(copy: Path) -> None:
    _edit_manifest(copy, lambda d: d["outputs"][1].update(dims=["batch", 64]))
    with pytest.raises(hybridrt.GraphError, match="present.0.conv has rank 3"):
        hybridrt.load(copy)


def test_text_prompt_without_tokenizer(copy: Path) -> None:
    (copy / "tokenizer.json").unlink()
    _edit_manifest(copy, lambda d: d["files"].pop("tokenizer.json"))
    model = hybridrt.load(copy)
    assert len(model.generate([5, 6, 7], max_new_tokens=3)) == 3  # token ids still work
    with pytest.raises(hybridrt.GenerationError, match="tokenizer.json"):
        model.generate("hello", max_new_tokens=3)


def test_prompt_longer_than_max_length(jamba_onnx: Path) -> None:
    model = hybridrt.load(jamba_onnx)
    assert len(model.generate([5] * (model.max_length - 4), max_new_tokens=4)) == 4  # fits exactly
    with pytest.raises(hybridrt.GenerationError, match="max length"):
        model.generate([5] * (model.max_length - 3), max_new_tokens=4)


def test_session_past_max_length(jamba_onnx: Path) -> None:
    chat = hybridrt.load(jamba_onnx).session()
    chat.generate([5] * 300, max_new_tokens=2)
    with pytest.raises(hybridrt.GenerationError, match="max length"):
        chat.generate([5] * 200, max_new_tokens=20)


@pytest.mark.parametrize("prompt", ["", [], [[]], [[1, 2], []], [1, 2, 320], [-1], ["a", [1]], [1.5]])
def test_bad_prompts(jamba_onnx: Path, prompt: object) -> None:
    with pytest.raises(hybridrt.GenerationError):
        hybridrt.load(jamba_onnx).generate(prompt, max_new_tokens=2)


def test_default_model_not_exported_says_how(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtime alone cannot export; loading "default" before any export names the fix."""
    monkeypatch.setenv("HYBRIDRT_CACHE", str(tmp_path))
    with pytest.raises(hybridrt.GraphError, match="hybridrt demo"):
        hybridrt.load("default")
