"""Length-based routing over two exported models of one tokenizer (runtime.router)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import hybridrt
from hybridrt.graphs.manifest import MANIFEST
from hybridrt.runtime import LengthRouter

GREEDY = {"max_new_tokens": 6, "min_new_tokens": 6, "do_sample": False}


@pytest.fixture  # one per test: its stats count that test's requests only, whatever ran before
def router(jamba_onnx: Path, llama_onnx: Path) -> LengthRouter:
    return LengthRouter(hybridrt.load(llama_onnx), hybridrt.load(jamba_onnx), threshold=8)


def test_prompts_go_to_their_route_and_give_that_models_tokens(router: LengthRouter) -> None:
    short, long = [5, 6, 7], list(range(5, 25))
    assert router.route(short) == "short" and router.route(long) == "long"
    assert router.route([short, long]) == "long"  # a batch follows its longest prompt
    for prompt, name in ((short, "short"), (long, "long"), (short, "short")):
        out, stats = router.generate_with_stats(prompt, **GREEDY)
        assert stats.route == name
        assert out == router.models[name].generate(prompt, **GREEDY)
    stats = router.stats()
    assert stats["threshold"] == 8
    assert stats["short"]["requests"] == 2 and stats["long"]["requests"] == 1
    assert stats["short"]["prompt_tokens"] == 6 and stats["long"]["prompt_tokens"] == 20
    assert stats["short"]["new_tokens"] == 12 and stats["long"]["new_tokens"] == 6
    latency = stats["long"]["latency_ms"]
    assert 0 < latency["p50"] <= latency["p95"] <= latency["max"]


def test_text_streams_are_routed_and_recorded(router: LengthRouter) -> None:
    before = router.stats()["long"]["requests"]
    text = "def add(a, b):\n    return a + b\n" * 3
    assert router.route(text) == "long"
    stream = router.stream(text, **GREEDY)
    pieces = "".join(stream)
    assert stream.stats.route == "long" and pieces == router.models["long"].generate(text, **GREEDY)
    assert router.stats()["long"]["requests"] == before + 1


def test_models_of_different_tokenizers_are_refused(jamba_onnx: Path, llama_onnx: Path, tmp_path: Path) -> None:
    other = Path(shutil.copytree(llama_onnx, tmp_path / "other"))
    data = json.loads((other / MANIFEST).read_text())
    data["files"]["tokenizer.json"]["sha256"] = "0" * 64
    (other / MANIFEST).write_text(json.dumps(data))
    with pytest.raises(hybridrt.GenerationError, match="different tokenizer.json"):
        LengthRouter(hybridrt.load(jamba_onnx), hybridrt.load(other, verify=False), threshold=8)
    for bad in (0, -3, 2.5, True, "8"):
        with pytest.raises(hybridrt.GenerationError, match="threshold"):
            LengthRouter(hybridrt.load(jamba_onnx), hybridrt.load(llama_onnx), threshold=bad)  # type: ignore[arg-type]
