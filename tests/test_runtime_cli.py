"""`hybridrt generate`: streams the text to stdout and the speed to stderr."""

from __future__ import annotations

from pathlib import Path

import pytest

import hybridrt
from hybridrt.cli import main


@pytest.mark.parametrize("stream", [True, False])
def test_generate_prints_the_text_and_its_speed(
    jamba_onnx: Path, capsys: pytest.CaptureFixture[str], stream: bool
) -> None:
    args = ["generate", str(jamba_onnx), "def fib", "--max-new-tokens", "12", "--seed", "1", "--temperature", "0.8"]
    assert main(args + ([] if stream else ["--no-stream"])) == 0
    out, err = capsys.readouterr()
    expected = hybridrt.load(jamba_onnx).generate("def fib", max_new_tokens=12, seed=1, temperature=0.8)
    assert out == expected + "\n"
    assert "prefill" in err and "tokens/s" in err


def test_generate_rejects_bad_values(jamba_onnx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", str(jamba_onnx), "def", "--top-p", "2"]) == 2
    assert "--top-p must be a finite number in (0, 1], got 2.0" in capsys.readouterr().err
