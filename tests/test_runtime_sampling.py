"""Sampling: seeds, the top-k/top-p/repetition transforms against transformers', validation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import hybridrt
from hybridrt.errors import GenerationError
from hybridrt.runtime.sampling import (
    GenerationConfig,
    Tally,
    apply_repetition_penalty,
    processed_logits,
    sample,
    top_k_filter,
    top_p_filter,
)

PROMPT = [5, 17, 42, 99, 7]


def test_same_seed_same_tokens(jamba_onnx: Path) -> None:
    model = hybridrt.load(jamba_onnx)
    kw = {"max_new_tokens": 32, "do_sample": True, "temperature": 0.9, "top_p": 0.95}
    a = model.generate(PROMPT, seed=7, **kw)
    assert a == model.generate(PROMPT, seed=7, **kw)
    assert a != model.generate(PROMPT, seed=8, **kw)


def test_top_k_1_equals_greedy(onnx_dir: Path) -> None:
    model = hybridrt.load(onnx_dir)
    greedy = model.generate(PROMPT, max_new_tokens=24)
    assert model.generate(PROMPT, max_new_tokens=24, do_sample=True, top_k=1, temperature=0.7, seed=3) == greedy


def test_sampled_frequencies_follow_the_distribution() -> None:
    p = np.array([0.5, 0.3, 0.2, 0.0])
    logits = np.log(np.maximum(p, 1e-30))[None].repeat(20000, axis=0).astype(np.float32)
    tokens = sample(logits, GenerationConfig(do_sample=True), np.random.default_rng(0))
    freq = np.bincount(tokens, minlength=4) / len(tokens)
    assert np.abs(freq - p).max() < 0.015


def test_filters_keep_what_transformers_keeps() -> None:
    from transformers.generation.logits_process import (
        RepetitionPenaltyLogitsProcessor,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, 50)).astype(np.float32) * 3
    ids = torch.from_numpy(rng.integers(0, 50, (4, 6)))
    for k in (1, 5, 49):
        ours = logits.copy()
        top_k_filter(ours, k)
        ref = TopKLogitsWarper(k)(ids, torch.from_numpy(logits.copy())).numpy()
        assert np.array_equal(np.isinf(ours), np.isinf(ref))
    for p in (0.05, 0.5, 0.9):
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        top_p_filter(probs, p)
        ref = TopPLogitsWarper(p)(ids, torch.from_numpy(logits.copy())).numpy()
        assert np.array_equal(probs == 0, np.isinf(ref))
    seen = np.zeros_like(logits, dtype=bool)
    seen[np.arange(4)[:, None], ids.numpy()] = True
    ours = logits.copy()
    apply_repetition_penalty(ours, seen, 1.3)
    ref = RepetitionPenaltyLogitsProcessor(1.3)(ids, torch.from_numpy(logits.copy())).numpy()
    np.testing.assert_allclose(ours, ref, rtol=1e-6)


class _SessionSpy:
    """Records which session attributes the model reaches for (it runs nothing itself)."""

    def __init__(self, session: object) -> None:
        self.session, self.used = session, []

    def __getattr__(self, name: str) -> object:
        self.used.append(name)
        return getattr(self.session, name)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"do_sample": True, "temperature": 0.0},
        {"temperature": -1.0},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"top_k": -1},
        {"repetition_penalty": 0.0},
        {"max_new_tokens": 0},
        {"min_new_tokens": -1},
        {"eos_token_id": "x"},
        {"stop_strings": [""]},
        {"temprature": 0.5},
        {"num_beams": 0},
        {"num_beams": 2, "num_return_sequences": 3},
        {"num_return_sequences": 2},
        {"num_beams": 2, "do_sample": True},
        {"early_stopping": "always"},
    ],
)
def test_invalid_generation_parameters_are_rejected_before_any_work(jamba_onnx: Path, kwargs: dict) -> None:
    model = hybridrt.load(jamba_onnx)
    spy = _SessionSpy(model.inference_session)
    model.inference_session = spy
    with pytest.raises(hybridrt.GenerationError):
        model.generate(PROMPT, **kwargs)
    assert spy.used == []


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_beams": 0}, r"num_beams must be an integer >= 1"),
        ({"num_beams": 2.0}, r"num_beams must be an integer >= 1"),
        ({"num_beams": True}, r"num_beams must be an integer >= 1"),
        ({"length_penalty": float("nan")}, r"length_penalty must be a finite number"),
        ({"length_penalty": 2**63}, r"length_penalty must be a finite number in \[-10, 10\]"),
        ({"early_stopping": "always"}, r'early_stopping must be True, False or "never"'),
        ({"early_stopping": 1}, r'early_stopping must be True, False or "never"'),
        ({"num_return_sequences": 0}, r"num_return_sequences must be an integer >= 1"),
        ({"num_beams": 2, "num_return_sequences": 3}, r"must not exceed num_beams \(2\); raise num_beams"),
        ({"num_return_sequences": 2}, r"needs beam search: set num_beams >= 2"),
        ({"num_beams": 2, "do_sample": True}, r"does not sample: .*do_sample=False.*num_beams=1"),
        ({"num_beams": 2, "top_p": 0.9}, r"does not sample"),
        ({"num_beams": 2, "stop_strings": "\n"}, r"stop_strings cannot end beam search"),
    ],
)
def test_beam_search_parameters_name_the_problem_and_the_fix(kwargs: dict, match: str) -> None:
    with pytest.raises(hybridrt.GenerationError, match=match):
        GenerationConfig.from_kwargs(**kwargs)


def test_beam_search_parameters_that_work() -> None:
    for kwargs in (
        {"num_beams": 4, "num_return_sequences": 4, "early_stopping": "never", "length_penalty": -0.5},
        {"num_beams": np.int64(2), "early_stopping": np.bool_(True), "do_sample": False, "temperature": 0.7},
        {"num_beams": 2, "temperature": 0},
    ):
        assert GenerationConfig.from_kwargs(**kwargs).num_beams == kwargs["num_beams"]


def test_temperature_zero_without_do_sample_is_greedy(jamba_onnx: Path) -> None:
    model = hybridrt.load(jamba_onnx)
    assert model.generate(PROMPT, max_new_tokens=8, temperature=0) == model.generate(PROMPT, max_new_tokens=8)


def test_penalties_that_overflow_float32_still_give_a_distribution() -> None:
    """A tiny repetition penalty divides a seen token's positive logit past float32's range
    (+inf): sampling then picks among the +inf tokens, never from a NaN distribution."""
    logits = np.asarray([[2.0, 1.0, -1.0, 3.0]], dtype=np.float32)
    seen = np.asarray([[True, True, False, False]])
    cfg = GenerationConfig(do_sample=True, temperature=0.5, repetition_penalty=5e-324, seed=0)
    with np.errstate(invalid="raise"):  # no NaN on the way
        tokens = [int(sample(logits, cfg, np.random.default_rng(i), Tally(seen))[0]) for i in range(40)]
    assert set(tokens) == {0, 1}  # both seen positive logits overflow to +inf; the others get nothing


def test_a_tiny_penalty_leaves_masked_seen_tokens_at_minus_inf() -> None:
    """A seen token that a grammar or top-k already masked (-inf) stays -inf under a penalty
    that float32 rounds to 0 (-inf * 0 would be NaN)."""
    logits = np.asarray([[-np.inf, -1.0, 2.0]], dtype=np.float32)
    with np.errstate(invalid="raise"):
        apply_repetition_penalty(logits, np.asarray([[True, True, True]]), 1e-300)
    assert logits[0, 0] == -np.inf and logits[0, 1] <= 0 and logits[0, 2] == np.inf


def test_presence_and_frequency_penalties_count_generated_tokens_only() -> None:
    """OpenAI's rule: logit - presence * (count > 0) - frequency * count, counted over the
    tokens generated (the history does not count); a Tally follows each row apart."""
    cfg = GenerationConfig(presence_penalty=0.5, frequency_penalty=0.25)
    tally = Tally.start(cfg, [[0, 1], [2]], 4)
    assert tally.seen is None and tally.counts is not None and not tally.counts.any()  # history not counted
    tally.add(np.asarray([3, 3]))
    tally.add(np.asarray([3]), rows=np.asarray([0]))
    logits = np.zeros((2, 4), dtype=np.float32)
    out = processed_logits(logits, cfg, tally)
    np.testing.assert_allclose(out[0], [0, 0, 0, -0.5 - 0.25 * 2])
    np.testing.assert_allclose(out[1], [0, 0, 0, -0.5 - 0.25])
    assert not logits.any()  # never in place


@pytest.mark.parametrize("name", ["presence_penalty", "frequency_penalty"])
def test_presence_and_frequency_penalties_are_checked(name: str) -> None:
    for bad in (2.5, -3, float("nan"), "1"):
        with pytest.raises(GenerationError, match=name):
            GenerationConfig.from_kwargs(**{name: bad})
