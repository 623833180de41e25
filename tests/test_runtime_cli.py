"""`hybridrt generate`: streams the text to stdout and the speed to stderr."""

from __future__ import annotations

import shutil
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


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--temperature", "0", "--top-k", "5"], "--temperature 0 means greedy decoding, which ignores --top-k"),
        (["--do-sample", "--temperature", "0"], "--temperature must be > 0 when sampling (--do-sample)"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be an integer >= 1, got 0"),
        (["--seed", "-1"], "--seed must be an integer >= 0, got -1"),
    ],
)
def test_generate_errors_speak_flags(
    jamba_onnx: Path, capsys: pytest.CaptureFixture[str], flags: list[str], says: str
) -> None:
    """Regression: CLI errors named Python parameters (max_new_tokens, do_sample=False), and
    --temperature 0 silently ignored --top-k/--top-p/--seed."""
    assert main(["generate", str(jamba_onnx), "def", *flags]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1


def test_do_sample_flag(jamba_onnx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["generate", str(jamba_onnx), "def", "--max-new-tokens", "8", "--no-stream"]
    assert main([*args, "--do-sample", "--seed", "3"]) == 0
    sampled = capsys.readouterr().out
    assert sampled == hybridrt.load(jamba_onnx).generate("def", max_new_tokens=8, do_sample=True, seed=3) + "\n"
    assert main([*args, "--no-do-sample"]) == 0
    assert capsys.readouterr().out == hybridrt.load(jamba_onnx).generate("def", max_new_tokens=8) + "\n"


def test_serve_refuses_a_model_without_a_tokenizer(
    jamba_onnx: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The server answers in text: without tokenizer.json it says so at start, rather than
    failing each streamed request inside the application."""
    bare = tmp_path / "bare"
    shutil.copytree(jamba_onnx, bare, ignore=shutil.ignore_patterns("tokenizer*"))
    assert main(["serve", str(bare), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "has no tokenizer.json, and the server answers in text" in err and err.count("\n") == 1
