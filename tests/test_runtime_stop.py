"""A library call can be stopped: generate(timeout=) and chat sessions stop after the step that
passes the deadline with a typed error, a closed stream computes nothing more, and the model and
the session stay usable. The clock is replaced by one that advances a second per reading, so
"the step that passes the deadline" is exact, not timed."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import hybridrt
from hybridrt import GenerationTimeout
from hybridrt.runtime import decode
from hybridrt.runtime.model import Model

PROMPT = [5, 6, 7, 8]


@pytest.fixture(scope="module")
def model(jamba_onnx: Path) -> Model:
    return hybridrt.load(jamba_onnx)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The time limits' clock (runtime/decode.py, until): each reading one second after the last."""
    now = [0.0]

    def monotonic() -> float:
        now[0] += 1.0
        return now[0]

    monkeypatch.setattr(decode, "time", SimpleNamespace(monotonic=monotonic, perf_counter=time.perf_counter))
    return now


def test_generate_stops_after_the_step_that_passes_its_timeout(model: Model, clock: list[float]) -> None:
    # The deadline is read at 1 s + 4.5 s; the steps are checked at 2, 3, 4, 5, 6 s: the fifth passes it.
    with pytest.raises(GenerationTimeout, match="after 5 new tokens") as caught:
        model.generate(PROMPT, max_new_tokens=100, eos_token_id=[], timeout=4.5)
    stats = caught.value.stats
    full = model.generate(PROMPT, max_new_tokens=100, eos_token_id=[])
    assert stats.tokens == [full[:5]]  # the tokens so far, as without a timeout
    assert model.generate(PROMPT, max_new_tokens=8, eos_token_id=[]) == full[:8]  # the model is usable


def test_a_session_that_times_out_keeps_consistent_states(model: Model, clock: list[float]) -> None:
    session = model.session()
    with pytest.raises(GenerationTimeout):
        session.generate(PROMPT, max_new_tokens=100, eos_token_id=[], timeout=3.5)
    history = list(session.history)
    assert history[: len(PROMPT)] == PROMPT and len(history) == len(PROMPT) + 4  # deadline 4.5 s: four steps
    # The next turn continues from the history as if it had been one prompt.
    turn = session.generate([9, 10], max_new_tokens=6, eos_token_id=[])
    assert turn == model.generate(history + [9, 10], max_new_tokens=6, eos_token_id=[])


def test_a_closed_stream_computes_nothing_more(model: Model) -> None:
    stream = model.stream(PROMPT, max_new_tokens=200, eos_token_id=[])
    pieces = iter(stream)
    for _ in range(3):
        next(pieces)
    stream.close()
    made = stream.stats.new_tokens
    assert made <= 6  # the pieces read, and at most the step under way
    with pytest.raises(StopIteration):
        next(pieces)
    assert stream.stats.new_tokens == made
    assert model.generate(PROMPT, max_new_tokens=4, eos_token_id=[]) == model.generate(
        PROMPT, max_new_tokens=4, eos_token_id=[]
    )


def test_stream_timeout_and_bad_values(model: Model, clock: list[float]) -> None:
    stream = model.stream(PROMPT, max_new_tokens=100, eos_token_id=[], timeout=2.5)
    with pytest.raises(GenerationTimeout):
        for _ in stream:
            pass
    for bad in (0, -1, "5", True):
        with pytest.raises(hybridrt.GenerationError, match="timeout"):
            model.generate(PROMPT, max_new_tokens=2, timeout=bad)
    with pytest.raises(hybridrt.GenerationError, match="beam search"):
        model.generate(PROMPT, max_new_tokens=2, num_beams=2, timeout=5)
