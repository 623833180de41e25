"""Bad input at export: clear typed errors, and nothing left behind."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import hybridrt
from hybridrt.errors import CheckpointError, ExportError, UnsupportedArchitectureError


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir())


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_unknown_model_type_lists_supported(jamba_dir: Path, tmp_path: Path) -> None:
    src = _copy(jamba_dir, tmp_path / "src")
    cfg = json.loads((src / "config.json").read_text())
    cfg["model_type"] = "gpt_neox"
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedArchitectureError, match=r"'gpt_neox'.*supported: .*jamba.*llama"):
        hybridrt.export_model(src, tmp_path / "out")
    assert _leftovers(tmp_path) == ["src"]


def test_unsupported_config_field_is_named(llama_dir: Path, tmp_path: Path) -> None:
    src = _copy(llama_dir, tmp_path / "src")
    cfg = json.loads((src / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedArchitectureError, match="rope_parameters.rope_type"):
        hybridrt.export_model(src, tmp_path / "out")


def test_directory_without_weights(jamba_dir: Path, tmp_path: Path) -> None:
    src = _copy(jamba_dir, tmp_path / "src")
    (src / "model.safetensors").unlink()
    (src / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(CheckpointError, match="no weights.*only safetensors"):
        hybridrt.export_model(src, tmp_path / "out")
    assert _leftovers(tmp_path) == ["src"]


def test_truncated_safetensors(jamba_dir: Path, tmp_path: Path) -> None:
    src = _copy(jamba_dir, tmp_path / "src")
    data = (src / "model.safetensors").read_bytes()
    (src / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or not safetensors"):
        hybridrt.export_model(src, tmp_path / "out")
    assert _leftovers(tmp_path) == ["src"]


def test_config_weights_shape_mismatch(jamba_dir: Path, tmp_path: Path) -> None:
    src = _copy(jamba_dir, tmp_path / "src")
    cfg = json.loads((src / "config.json").read_text())
    cfg["mamba_d_state"] = 16
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="shape .* config.json implies"):
        hybridrt.export_model(src, tmp_path / "out")
    assert _leftovers(tmp_path) == ["src"]


def test_missing_checkpoint_directory(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not found"):
        hybridrt.export_model(tmp_path / "nope", tmp_path / "out")


def test_existing_output_directory_is_refused(jamba_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match="already exists.*--force"):
        hybridrt.export_model(jamba_dir, out)
    assert (out / "keep.txt").read_text() == "mine"
    assert _leftovers(tmp_path) == ["out"]


def test_failed_export_leaves_nothing(jamba_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="unknown format"):
        hybridrt.export_model(jamba_dir, tmp_path / "out", format="tflite")
    assert _leftovers(tmp_path) == []


def test_cli_reports_error_without_traceback(
    jamba_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hybridrt.cli import main

    (tmp_path / "out").mkdir()
    assert main(["export", str(jamba_dir), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and "Traceback" not in err


def test_unknown_rope_parameter_is_refused(llama_dir: Path, tmp_path: Path) -> None:
    """Regression: an unknown rope_parameters key (partial rotary on a Llama) was ignored."""
    src = _copy(llama_dir, tmp_path / "src")
    cfg = json.loads((src / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedArchitectureError, match="partial_rotary_factor"):
        hybridrt.export_model(src, tmp_path / "out")
