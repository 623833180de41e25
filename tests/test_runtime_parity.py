"""The runtime's tokens against transformers, and against itself across batching, sessions
and the two ways of running a step."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import hybridrt

GREEDY = {"max_new_tokens": 32, "min_new_tokens": 32}  # min_new_tokens: both sides run all 32


def _prompt(length: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed + length).integers(3, 320, length).tolist()


@pytest.fixture(scope="module")
def hf_models(jamba_dir: Path, llama_dir: Path) -> dict[str, torch.nn.Module]:
    from transformers import AutoModelForCausalLM

    return {
        name: AutoModelForCausalLM.from_pretrained(d).eval() for name, d in (("jamba", jamba_dir), ("llama", llama_dir))
    }


@pytest.mark.parametrize("name", ["jamba", "llama"])
@pytest.mark.parametrize("length", [1, 5, 40, 300])  # 300: prefilled in calls of PREFILL_CHUNK
def test_greedy_matches_transformers(
    name: str, length: int, hf_models: dict[str, torch.nn.Module], request: pytest.FixtureRequest
) -> None:
    model = hybridrt.load(request.getfixturevalue(f"{name}_onnx"))
    ids = _prompt(length)
    t = torch.tensor([ids])
    with torch.no_grad():
        ref = hf_models[name].generate(t, attention_mask=torch.ones_like(t), do_sample=False, **GREEDY)
    assert model.generate(ids, **GREEDY) == ref[0, length:].tolist()


def test_repetition_penalty_matches_transformers(jamba_onnx: Path, hf_models: dict[str, torch.nn.Module]) -> None:
    model = hybridrt.load(jamba_onnx)
    ids = _prompt(9)
    t = torch.tensor([ids])
    with torch.no_grad():
        ref = hf_models["jamba"].generate(
            t, attention_mask=torch.ones_like(t), do_sample=False, repetition_penalty=1.5, **GREEDY
        )
    assert model.generate(ids, repetition_penalty=1.5, **GREEDY) == ref[0, 9:].tolist()


def test_batch_of_different_lengths_equals_each_prompt_alone(onnx_dir: Path) -> None:
    model = hybridrt.load(onnx_dir)
    prompts = [_prompt(n) for n in (1, 7, 20, 33, 150)]
    batch = model.generate(prompts, **GREEDY)
    assert batch == [model.generate(p, **GREEDY) for p in prompts]


def test_rows_stop_at_their_own_eos(onnx_dir: Path) -> None:
    model = hybridrt.load(onnx_dir)
    prompts = [_prompt(4), _prompt(11)]
    free = model.generate(prompts, max_new_tokens=12, eos_token_id=[])
    eos = free[0][2]  # row 0 stops at its third token; row 1 goes on unless it meets the same token
    out = model.generate(prompts, max_new_tokens=12, eos_token_id=eos)
    assert out[0] == free[0][: free[0].index(eos) + 1]
    assert out[1] == model.generate(prompts[1], max_new_tokens=12, eos_token_id=eos)


def test_io_binding_and_plain_run_give_the_same_tokens(onnx_dir: Path) -> None:
    bound = hybridrt.load(onnx_dir, io_binding=True)
    plain = hybridrt.load(onnx_dir, io_binding=False)
    prompts = [_prompt(3), _prompt(17)]
    assert bound.generate(prompts, **GREEDY) == plain.generate(prompts, **GREEDY)


def test_session_over_two_calls_equals_one_call_on_the_concatenation(onnx_dir: Path) -> None:
    model = hybridrt.load(onnx_dir)
    first, second = _prompt(6), _prompt(9, seed=1)
    chat = model.session()
    reply1 = chat.generate(first, max_new_tokens=7, min_new_tokens=7)
    reply2 = chat.generate(second, max_new_tokens=10, min_new_tokens=10)
    assert reply2 == model.generate(first + reply1 + second, max_new_tokens=10, min_new_tokens=10)


def test_session_reset_starts_fresh(onnx_dir: Path) -> None:
    model = hybridrt.load(onnx_dir)
    chat = model.session()
    chat.generate(_prompt(6), max_new_tokens=5)
    chat.reset()
    assert chat.generate(_prompt(8), **GREEDY) == model.generate(_prompt(8), **GREEDY)
