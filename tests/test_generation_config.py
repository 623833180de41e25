"""A model's recommended generation settings: read from the checkpoint's
generation_config.json at export, recorded in the manifest, applied by generate, stream and
sessions unless the caller overrides them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import hybridrt
from hybridrt.graphs.manifest import MANIFEST, read_generation_config, read_manifest

RECOMMENDED = {"repetition_penalty": 1.3, "add_bos_token": True}


def test_reads_the_keys_it_applies(tmp_path: Path) -> None:
    assert read_generation_config(tmp_path) is None  # no file: no recommendations
    hf = {"bos_token_id": 1, "eos_token_id": 2, "transformers_version": "4.57", "temperature": 0.7}
    (tmp_path / "generation_config.json").write_text(json.dumps(hf | RECOMMENDED))
    # transformers ignores temperature without do_sample, and so does hybridrt.
    assert read_generation_config(tmp_path) == RECOMMENDED
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": True, "top_k": 5, "top_p": 0.9}))
    assert read_generation_config(tmp_path) == {"do_sample": True, "top_k": 5, "top_p": 0.9}


@pytest.mark.parametrize("text", ["{", "[]", '{"repetition_penalty": "high"}', '{"add_bos_token": 1}'])
def test_bad_generation_config_names_the_file(tmp_path: Path, text: str) -> None:
    (tmp_path / "generation_config.json").write_text(text)
    with pytest.raises(hybridrt.GraphError, match="generation_config.json"):
        read_generation_config(tmp_path)


def test_export_records_the_recommendations(jamba_dir: Path, tmp_path: Path) -> None:
    src = Path(shutil.copytree(jamba_dir, tmp_path / "src"))
    (src / "generation_config.json").write_text(json.dumps({"bos_token_id": 1} | RECOMMENDED))
    hybridrt.export_model(src, tmp_path / "out", validate=False)
    assert read_manifest(tmp_path / "out").generation == RECOMMENDED


@pytest.fixture
def recommending(jamba_onnx: Path, tmp_path: Path) -> Path:
    """The exported model with RECOMMENDED in its manifest."""
    directory = Path(shutil.copytree(jamba_onnx, tmp_path / "model"))
    data = json.loads((directory / MANIFEST).read_text())
    (directory / MANIFEST).write_text(json.dumps(data | {"generation": RECOMMENDED}))
    return directory


def test_recommendations_apply_everywhere_unless_overridden(jamba_onnx: Path, recommending: Path) -> None:
    """Regression: greedy output of the default model looped with generate/stream/session's
    defaults, because only `demo` added BOS and a repetition penalty."""
    plain, model = hybridrt.load(jamba_onnx), hybridrt.load(recommending)
    assert plain.tokenizer is not None
    ids = [1] + plain.tokenizer.encode("def", add_special_tokens=False).ids
    expected = plain.generate(ids, max_new_tokens=16, do_sample=False, repetition_penalty=1.3)
    assert isinstance(expected, list)
    text = plain.tokenizer.decode(expected, skip_special_tokens=True)
    assert model.generate("def", max_new_tokens=16, do_sample=False) == text
    assert "".join(model.stream("def", max_new_tokens=16, do_sample=False)) == text
    assert model.session().generate("def", max_new_tokens=16, do_sample=False) == text
    # The caller's values win: no penalty and no BOS give the plain model's output.
    overridden = model.generate("def", max_new_tokens=16, do_sample=False, repetition_penalty=1.0, add_bos_token=False)
    assert overridden == plain.generate("def", max_new_tokens=16, do_sample=False)
    assert overridden != text
