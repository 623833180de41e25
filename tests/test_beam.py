"""Beam search (hybridrt.runtime.beam) against transformers' `generate(num_beams=...)` on every
family, its options on Jamba and Llama, and `Stepper.reorder` on each kind of stepper.

transformers returns the prompt and pads the sequences to one length; its `beam_indices` say
how many tokens each sequence generated (-1 past its end), which is what `_reference` keeps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from family_checkpoints import BUILDERS
from test_state_batch import stepper_of

import hybridrt
from hybridrt.runtime.bound import BoundStepper
from hybridrt.runtime.decode import prefill

BEAMS = {"num_beams": 3, "max_new_tokens": 6}


@pytest.fixture(scope="session", params=sorted(BUILDERS))
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def hf_models(jamba_dir: Path, llama_dir: Path) -> dict[str, torch.nn.Module]:
    from transformers import AutoModelForCausalLM

    return {
        name: AutoModelForCausalLM.from_pretrained(d).eval() for name, d in (("jamba", jamba_dir), ("llama", llama_dir))
    }


def _prompt(length: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed + length).integers(3, 300, length).tolist()


def _reference(hf: torch.nn.Module, prompts: list[list[int]], **kwargs: Any) -> list[list[int]]:
    """transformers' beam search on left-padded prompts: the new tokens of every returned
    sequence (prompt-major), without the padding."""
    n = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (n - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (n - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=mask, do_sample=False, return_dict_in_generate=True, **kwargs)
    return [s[n : n + int((b >= 0).sum())].tolist() for s, b in zip(out.sequences, out.beam_indices)]


@pytest.mark.parametrize("options", [{}, {"num_return_sequences": 2, "length_penalty": 0.5}])
def test_beam_search_matches_transformers(ckpt: Path, exported: Path, options: dict[str, Any]) -> None:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(ckpt).eval()
    ids = _prompt(9)
    ref = _reference(hf, [ids], **BEAMS, **options)
    out = hybridrt.load(exported).generate(ids, **BEAMS, **options)
    assert (out if options else [out]) == ref


@pytest.mark.parametrize(
    ("name", "prompt", "kwargs", "differs"),
    [
        # Found from a first run: the prompts' beams produce the EOS token chosen (the best beam's
        # token at `eos_at`), and these settings make the modes give different sequences.
        ("jamba", [5, 17, 42, 99, 7, 8, 9], {"num_beams": 3, "eos_at": 4, "length_penalty": 2.0}, (True, False)),
        ("llama", [30, 218, 90, 163, 277], {"num_beams": 2, "eos_at": 3, "length_penalty": 2.0}, (False, "never")),
    ],
)
def test_early_stopping_modes_match_transformers(
    name: str,
    prompt: list[int],
    kwargs: dict[str, Any],
    differs: tuple[Any, Any],
    hf_models: dict[str, torch.nn.Module],
    request: pytest.FixtureRequest,
) -> None:
    model = hybridrt.load(request.getfixturevalue(f"{name}_onnx"))
    k = kwargs["num_beams"]
    common = {
        "num_beams": k,
        "num_return_sequences": k,
        "max_new_tokens": 10,
        "length_penalty": kwargs["length_penalty"],
    }
    eos = _reference(hf_models[name], [prompt], **common)[0][kwargs["eos_at"]]
    ref = {}
    for mode in (False, True, "never"):
        ref[mode] = _reference(hf_models[name], [prompt], **common, eos_token_id=eos, early_stopping=mode)
        assert model.generate(prompt, **common, eos_token_id=eos, early_stopping=mode) == ref[mode], mode
    assert any(s[-1] == eos and len(s) < 10 for s in ref[False] + ref[True])  # the EOS ends some beams
    assert ref[differs[0]] != ref[differs[1]]


@pytest.mark.parametrize("name", ["jamba", "llama"])
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"min_new_tokens": 4, "eos_at": 1, "length_penalty": 0.0},
        {"repetition_penalty": 1.5},
        {"eos_at": 1, "early_stopping": True, "length_penalty": 0.0},
    ],
    ids=["plain", "min-new-tokens", "repetition-penalty", "eos"],
)
def test_batch_of_different_lengths_matches_transformers(
    name: str, options: dict[str, Any], hf_models: dict[str, torch.nn.Module], request: pytest.FixtureRequest
) -> None:
    """Two prompts of 7 and 3 tokens in one call; transformers pads the shorter on the left.
    The EOS id is a token the first prompt's best beam produces (from a first run); with
    length_penalty 0 a beam it ends early is among the returned sequences.
    (repetition_penalty: transformers also penalizes the padding token 0, which no beam of
    these prompts produces.)"""
    model = hybridrt.load(request.getfixturevalue(f"{name}_onnx"))
    prompts = [[5, 17, 42, 99, 7, 8, 9], [11, 12, 13]]
    kwargs = {"num_beams": 3, "num_return_sequences": 3, "max_new_tokens": 8} | options
    if "eos_at" in kwargs:
        kwargs["eos_token_id"] = _reference(hf_models[name], prompts[:1], num_beams=3, max_new_tokens=8)[0][
            kwargs.pop("eos_at")
        ]
    ref = _reference(hf_models[name], prompts, **kwargs)
    out = model.generate(prompts, **kwargs)
    assert [s for per_prompt in out for s in per_prompt] == ref
    if "eos_token_id" in kwargs and "min_new_tokens" not in kwargs:  # the EOS ends a beam early
        assert any(s[-1] == kwargs["eos_token_id"] and len(s) < 8 for s in ref)
    if "min_new_tokens" in kwargs:  # the EOS ends a beam before 4 tokens unless suppressed
        assert all(len(s) >= 4 for s in ref)
        kwargs.pop("min_new_tokens")
        assert any(len(s) < 4 for s in _reference(hf_models[name], prompts, **kwargs))


def test_steppers_give_the_same_beams(onnx_dir: Path) -> None:
    """IO-bound states (reordered in place) and plain session.run feeds (new arrays)."""
    kwargs = {"num_beams": 4, "num_return_sequences": 4, "max_new_tokens": 8}
    bound = hybridrt.load(onnx_dir).generate([_prompt(5), _prompt(2)], **kwargs)
    assert hybridrt.load(onnx_dir, io_binding=False).generate([_prompt(5), _prompt(2)], **kwargs) == bound


def _no_host_copy() -> None:
    raise AssertionError("reorder copied the states to the host")


@pytest.mark.parametrize("kind", ["plain", "host", "device"])
def test_reorder_continues_the_source_rows(onnx_dir: Path, kind: str) -> None:
    """After reorder(index), row r decodes as row index[r] would have: logits equal through
    several steps, across a KV regrowth (capacity 6) and a second reorder."""
    model = hybridrt.load(onnx_dir)
    prompts = [_prompt(n) for n in (3, 6, 4)]
    moved, kept = stepper_of(model, kind, 3, 6), stepper_of(model, kind, 3, 6)
    first = prefill(moved, prompts)
    assert np.array_equal(prefill(kept, prompts), first)
    index = np.array([2, 0, 0], dtype=np.int64)
    if kind == "device":  # off the host, reordering copies no state to the host
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(moved, "_host", _no_host_copy)
            moved.reorder(index)
    else:
        moved.reorder(index)
    assert moved.lengths.tolist() == [4, 3, 3]
    tokens = np.array([7, 8, 9], dtype=np.int64)
    for _ in range(4):
        expected = kept.forward(tokens[:, None])[index]
        np.testing.assert_allclose(moved.forward(tokens[index][:, None]), expected, rtol=0, atol=1e-5)
        tokens = tokens + 1
    assert moved.capacity > 6
    again = np.array([1, 1, 0], dtype=np.int64)  # rows 0 and 2 of `kept` (index[again])
    moved.reorder(again)
    both = index[again]
    for _ in range(2):
        expected = kept.forward(tokens[:, None])[both]
        np.testing.assert_allclose(moved.forward(tokens[both][:, None]), expected, rtol=0, atol=1e-5)
        tokens = tokens + 1


def test_beam_search_off_the_host_equals_in_place(llama_onnx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """generate() with states reordered by the device path (forced on the CPU) gives the beams
    of the in-place path."""
    model = hybridrt.load(llama_onnx)
    kwargs = {"num_beams": 3, "num_return_sequences": 3, "max_new_tokens": 8}
    in_place = model.generate(_prompt(6), **kwargs)
    init = BoundStepper.__init__

    def off_host(self: BoundStepper, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.on_host = False

    monkeypatch.setattr(BoundStepper, "__init__", off_host)
    assert model.generate(_prompt(6), **kwargs) == in_place


def test_outputs_per_prompt(llama_onnx: Path) -> None:
    """num_return_sequences > 1: a list per prompt, text or ids; 1: the shapes of greedy."""
    model = hybridrt.load(llama_onnx)
    beams = {"num_beams": 3, "max_new_tokens": 4}
    texts = model.generate(["def f", "class"], num_return_sequences=2, **beams)
    assert len(texts) == 2 and all(len(t) == 2 and all(isinstance(s, str) for s in t) for t in texts)
    ids = model.generate(_prompt(4), num_return_sequences=3, **beams)
    assert len(ids) == 3 and all(isinstance(s, list) and len(s) == 4 for s in ids)
    assert ids[0] == model.generate(_prompt(4), **beams)
    out, stats = model.generate_with_stats([_prompt(4), _prompt(2)], num_return_sequences=2, **beams)
    assert stats.tokens == [s for per_prompt in out for s in per_prompt]
    assert isinstance(model.generate("def f", **beams), str)


def test_stream_and_chat_session_refuse_beam_search(llama_onnx: Path) -> None:
    model = hybridrt.load(llama_onnx)
    with pytest.raises(hybridrt.GenerationError, match="use generate"):
        model.stream("def f", num_beams=2)
    chat = model.session()
    with pytest.raises(hybridrt.GenerationError, match="beam search"):
        chat.generate("def f", num_beams=2)
    with pytest.raises(hybridrt.GenerationError, match="beam search"):
        chat.stream("def f", num_beams=2)


def test_cli_generate_with_beams(jamba_onnx: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hybridrt.cli import main

    model = hybridrt.load(jamba_onnx)
    args = ["generate", str(jamba_onnx), "def fib", "--max-new-tokens", "6", "--num-beams", "3"]
    assert main([*args, "--num-return-sequences", "2", "--length-penalty", "0.5", "--early-stopping", "true"]) == 0
    out = capsys.readouterr().out
    want = model.generate(
        "def fib", max_new_tokens=6, num_beams=3, num_return_sequences=2, length_penalty=0.5, early_stopping=True
    )
    assert out == f"# 1\n{want[0]}\n# 2\n{want[1]}\n"
    assert main(args) == 0
    assert capsys.readouterr().out == model.generate("def fib", max_new_tokens=6, num_beams=3) + "\n"
    assert main([*args, "--num-return-sequences", "4"]) == 2
    assert "--num-return-sequences (4) must not exceed --num-beams (3)" in capsys.readouterr().err
