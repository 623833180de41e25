"""`hybridrt demo` on the shipped default model: export, parity, a deterministic completion."""

from __future__ import annotations

from pathlib import Path

import pytest

import hybridrt
from hybridrt.cli import main
from hybridrt.default_model import CHECKPOINT_DIR, cached_export_dir
from hybridrt.graphs.manifest import read_manifest


def test_shipped_model_is_small_and_complete() -> None:
    files = {p.name: p.stat().st_size for p in CHECKPOINT_DIR.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= set(files)
    assert sum(files.values()) < 40 * 2**20


def test_demo_stages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HYBRIDRT_CACHE", str(tmp_path))
    assert main(["demo", "--max-new-tokens", "24"]) == 0
    first = capsys.readouterr()
    directory = cached_export_dir()
    assert directory.parent == tmp_path and (directory / "model.onnx").is_file()
    assert "[1/4] export" in first.err and "exported to" in first.err
    parity = read_manifest(directory).parity
    assert parity["passed"] and parity["max_abs_logits"] <= 1e-4
    assert f"{parity['max_abs_logits']:.2e}" in first.err
    assert "tokens/s" in first.err

    # Second run: the cached export is reused and greedy decoding gives the same text.
    assert main(["demo", "--max-new-tokens", "24"]) == 0
    second = capsys.readouterr()
    assert "cached at" in second.err
    assert second.out == first.out and len(first.out) > len("def fibonacci(n):\n")

    # The name "default" now resolves for the runtime too.
    model = hybridrt.load("default")
    assert model.path == directory
    prompt = "import os\n"
    assert model.generate(prompt, max_new_tokens=8, do_sample=False) == model.generate(
        prompt, max_new_tokens=8, do_sample=False
    )
