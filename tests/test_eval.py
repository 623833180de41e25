"""`hybridrt eval`: sliding-window NLL, perplexity and bits per byte from the ONNX model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from checkpoints import TEXT
from reference_eval import reference_eval

import hybridrt
from hybridrt.cli import main
from hybridrt.errors import GenerationError
from hybridrt.runtime.evaluate import evaluate, window_starts


@pytest.fixture()
def text_file(tmp_path: Path) -> Path:
    path = tmp_path / "text.txt"
    path.write_text(TEXT * 3, encoding="utf-8")
    return path


def test_onnx_eval_matches_reference(onnx_dir: Path, text_file: Path) -> None:
    from hybridrt.graphs.manifest import read_manifest

    source = read_manifest(onnx_dir).provenance["source"]
    got = evaluate(hybridrt.load(onnx_dir), text_file.read_text(), window=64, stride=32)
    ref = reference_eval(source, text_file.read_text(), window=64, stride=32)
    assert got["tokens"] == ref["tokens"] and got["bytes"] == ref["bytes"]
    assert abs(got["nll_per_token"] - ref["nll_per_token"]) <= 1e-4 * ref["nll_per_token"]


def test_figures_are_consistent(jamba_onnx: Path, text_file: Path) -> None:
    r = evaluate(hybridrt.load(jamba_onnx), text_file.read_text(), window=64, stride=48)
    assert r["perplexity"] == pytest.approx(math.exp(r["nll_per_token"]))
    assert r["bits_per_byte"] == pytest.approx(r["nll_per_token"] * r["tokens"] / math.log(2) / r["bytes"])
    # A random model over a 320-token vocabulary is near-uniform: close to ln(320) nats.
    assert 0.5 * math.log(320) < r["nll_per_token"] < 2 * math.log(320)


def test_every_token_scored_once() -> None:
    for n, w, s in [(10, 4, 2), (100, 32, 32), (100, 32, 7), (5, 64, 32)]:
        starts = window_starts(n, w, s)
        assert starts[0] == 0 and starts[-1] + w >= n


def test_stride_equal_to_window_scores_every_token(jamba_onnx: Path, text_file: Path) -> None:
    """Regression: with stride == window the first token of each later window had no logits
    predicting it, was left NaN, and made the whole figure NaN."""
    r = evaluate(hybridrt.load(jamba_onnx), text_file.read_text(), window=32, stride=32)
    assert math.isfinite(r["nll_per_token"]) and math.isfinite(r["bits_per_byte"])
    assert window_starts(100, 32, 32)[:3] == [0, 31, 62]


def test_one_window_equals_many_when_context_fits(jamba_onnx: Path, text_file: Path) -> None:
    """With a window longer than the text, the stride does not matter."""
    model = hybridrt.load(jamba_onnx)
    text = text_file.read_text()[:300]
    a = evaluate(model, text, window=256, stride=256)
    b = evaluate(model, text, window=256, stride=16)
    assert a["nll_per_token"] == pytest.approx(b["nll_per_token"], rel=1e-9)


def test_cli_json(jamba_onnx: Path, text_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", str(jamba_onnx), "--text", str(text_file), "--json", "--window", "64"]) == 0
    data = json.loads(capsys.readouterr().out)
    for key in ("nll_per_token", "perplexity", "bits_per_byte", "tokens", "bytes"):
        assert key in data


def test_empty_file_is_an_error(jamba_onnx: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty.txt").write_text("  \n")
    assert main(["eval", str(jamba_onnx), "--text", str(tmp_path / "empty.txt")]) == 2
    assert "empty" in capsys.readouterr().err


def test_undecodable_file_is_an_error(jamba_onnx: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bin.txt").write_bytes(b"abc\xff\xfe\x00")
    assert main(["eval", str(jamba_onnx), "--text", str(tmp_path / "bin.txt")]) == 2
    assert "not UTF-8" in capsys.readouterr().err


def test_window_beyond_max_length(jamba_onnx: Path, text_file: Path) -> None:
    with pytest.raises(GenerationError, match="max length"):
        evaluate(hybridrt.load(jamba_onnx), text_file.read_text(), window=10_000)
