"""Speculative decoding: a draft proposes, the target verifies in one call, states rewind.

Greedy output must equal plain greedy whatever the draft (the same model keeps every draft,
its int4 quantization some, an unrelated model none); sampling follows the target's
distribution; rewinding a stepper returns exactly to its earlier states.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import hybridrt
from hybridrt.errors import GenerationError
from hybridrt.runtime.schedule import PROBE, DraftSchedule
from hybridrt.runtime.speculative import accept_or_replace

PROMPTS = [[5, 17, 99, 3, 250, 41, 7], [8], [100, 200, 300] * 5]


def _drafts(jamba_onnx: Path, jamba_int4: Path, llama_onnx: Path) -> dict[str, Path]:
    return {"same": jamba_onnx, "int4": jamba_int4, "unrelated": llama_onnx}


@pytest.mark.parametrize("io_binding", [True, False])
@pytest.mark.parametrize("draft", ["same", "int4", "unrelated"])
@pytest.mark.parametrize("schedule", ["adaptive", "heuristic", "constant"])
def test_greedy_with_a_draft_equals_plain_greedy(
    jamba_onnx: Path, jamba_int4: Path, llama_onnx: Path, draft: str, io_binding: bool, schedule: str
) -> None:
    target = hybridrt.load(jamba_onnx, io_binding=io_binding)
    assistant = hybridrt.load(_drafts(jamba_onnx, jamba_int4, llama_onnx)[draft], io_binding=io_binding)
    kw = dict(max_new_tokens=40, eos_token_id=[], num_assistant_tokens_schedule=schedule, num_assistant_tokens=4)
    plain = target.generate(PROMPTS, max_new_tokens=40, eos_token_id=[])
    out, stats = target.generate_with_stats(PROMPTS, assistant_model=assistant, **kw)
    assert out == plain
    assert stats.tokens == out and stats.new_tokens == 120
    assert stats.rounds > 0 and 0 <= stats.accepted_tokens <= stats.draft_tokens
    if draft == "same":
        assert stats.accepted_tokens == stats.draft_tokens
    elif draft == "unrelated":
        assert stats.accepted_tokens < stats.draft_tokens / 2
    elif schedule != "adaptive":  # int4: some kept, some not, so both rewinds ran
        # (adaptive may stop drafting early: on these tiny models plain steps measure faster)
        assert 0 < stats.accepted_tokens < stats.draft_tokens


@pytest.mark.parametrize("io_binding", [True, False])
def test_attention_only_target_with_a_hybrid_draft(jamba_onnx: Path, llama_onnx: Path, io_binding: bool) -> None:
    target = hybridrt.load(llama_onnx, io_binding=io_binding)
    assistant = hybridrt.load(jamba_onnx, io_binding=io_binding)
    plain = target.generate(PROMPTS, max_new_tokens=30, eos_token_id=[])
    out = target.generate(PROMPTS, assistant_model=assistant, max_new_tokens=30, eos_token_id=[])
    assert out == plain
    assert target.generate(PROMPTS[0], assistant_model=target, max_new_tokens=30, eos_token_id=[]) == plain[0]


def test_stops_penalties_and_min_tokens_match_plain_decoding(jamba_onnx: Path, jamba_int4: Path) -> None:
    target, assistant = hybridrt.load(jamba_onnx), hybridrt.load(jamba_int4)
    free = target.generate(PROMPTS[0], max_new_tokens=40, eos_token_id=[])
    eos = free[9]  # a token the greedy run produces: generation must stop right there
    cases = [
        dict(eos_token_id=eos),
        dict(eos_token_id=eos, min_new_tokens=15),
        dict(repetition_penalty=1.3, eos_token_id=[]),
        dict(presence_penalty=1.2, frequency_penalty=0.6, eos_token_id=[]),
        dict(stop_strings=target.tokenizer.decode(free[12:14]), eos_token_id=[]),
    ]
    for kw in cases:
        plain = target.generate(PROMPTS[0], max_new_tokens=40, **kw)
        assert target.generate(PROMPTS[0], assistant_model=assistant, max_new_tokens=40, **kw) == plain, kw
    assert target.generate(PROMPTS[0], max_new_tokens=40, eos_token_id=eos)[-1] == eos


def test_chat_session_and_stream_with_a_draft(jamba_onnx: Path, jamba_int4: Path) -> None:
    target, assistant = hybridrt.load(jamba_onnx), hybridrt.load(jamba_int4)
    turns = ["def add(a, b):", " return", "\nclass"]
    plain_chat, spec_chat = target.session(), target.session()
    for i, turn in enumerate(turns):
        expected = plain_chat.generate(turn, max_new_tokens=12, eos_token_id=[])
        # The draft on some turns only: its states catch up on the conversation when it returns.
        draft = assistant if i != 1 else None
        assert spec_chat.generate(turn, assistant_model=draft, max_new_tokens=12, eos_token_id=[]) == expected
        assert spec_chat.history == plain_chat.history
    one_shot = target.generate("def add(a, b):", max_new_tokens=20, eos_token_id=[])
    stream = target.stream("def add(a, b):", assistant_model=assistant, max_new_tokens=20, eos_token_id=[])
    assert "".join(stream) == one_shot
    assert stream.stats.rounds > 0 and stream.stats.new_tokens == 20


def test_sampling_with_the_target_as_its_own_draft_keeps_every_draft(jamba_onnx: Path, jamba_int4: Path) -> None:
    target, assistant = hybridrt.load(jamba_onnx), hybridrt.load(jamba_int4)
    kw = dict(max_new_tokens=30, eos_token_id=[], temperature=0.8, top_k=50, seed=3)
    out, stats = target.generate_with_stats(PROMPTS[0], assistant_model=target, **kw)
    assert stats.accepted_tokens == stats.draft_tokens > 0  # p == q: the rule keeps everything
    again = target.generate(PROMPTS[0], assistant_model=assistant, **kw)
    assert again == target.generate(PROMPTS[0], assistant_model=assistant, **kw)  # seeded
    assert len(out) == len(again) == 30


def test_acceptance_rule_follows_the_target_distribution() -> None:
    """Tokens drawn from q and passed through the rule are distributed as p."""
    rng = np.random.default_rng(0)
    p = np.array([0.5, 0.2, 0.15, 0.1, 0.05, 0.0])
    q = np.array([0.05, 0.4, 0.05, 0.2, 0.1, 0.2])
    n = 40_000
    counts = np.zeros(len(p))
    drafted = rng.choice(len(q), size=n, p=q)
    for d in drafted:
        replacement = accept_or_replace(p, q, int(d), rng)
        counts[d if replacement is None else replacement] += 1
    assert np.abs(counts / n - p).max() < 0.01
    assert counts[5] == 0  # a token the target never picks never comes out
    # The draft alone would be far off: the rule is doing the work.
    assert np.abs(np.bincount(drafted, minlength=len(q)) / n - p).max() > 0.3


@pytest.mark.parametrize("io_binding", [True, False])
def test_rewind_returns_to_the_states_of_a_checkpoint(jamba_onnx: Path, io_binding: bool) -> None:
    model = hybridrt.load(jamba_onnx, io_binding=io_binding)
    stepper = model.stepper(1, 8, ring=4)
    stepper.forward(np.asarray([[5, 17, 99]]))
    mark = stepper.checkpoint()
    first = [stepper.forward(np.asarray([[t]])).copy() for t in (4, 9)]
    stepper.rewind(mark)
    assert stepper.lengths.tolist() == [3]
    # Past the KV capacity of 8: the buffers grow, and the marks stay valid.
    again = [stepper.forward(np.asarray([[t]])).copy() for t in (4, 9)]
    np.testing.assert_array_equal(again[0], first[0])
    np.testing.assert_array_equal(again[1], first[1])
    longer = stepper.forward(np.asarray([[1, 2, 3, 4]]), last=2)
    assert longer.shape == (1, 2, model.manifest.vocab_size)
    stepper.rewind(mark)
    np.testing.assert_array_equal(stepper.forward(np.asarray([[4]])), first[0])
    if io_binding:  # four sets of states: three calls back at most
        for t in (1, 2, 3, 4):
            stepper.forward(np.asarray([[t]]))
        with pytest.raises(GenerationError, match="ring"):
            stepper.rewind(mark)


def test_bad_assistant_and_schedule_are_typed_errors(jamba_onnx: Path, default_onnx: Path) -> None:
    target = hybridrt.load(jamba_onnx)
    with pytest.raises(GenerationError, match="assistant_model must be a model loaded"):
        target.generate([5, 6], assistant_model=str(jamba_onnx), max_new_tokens=4)  # type: ignore[arg-type]
    with pytest.raises(GenerationError, match="does not share this model's tokenizer"):
        target.generate([5, 6], assistant_model=hybridrt.load(default_onnx), max_new_tokens=4)
    with pytest.raises(GenerationError, match="num_assistant_tokens_schedule must be one of"):
        target.generate([5, 6], assistant_model=target, num_assistant_tokens_schedule="fast")
    with pytest.raises(GenerationError, match="beam search and an assistant_model do not combine"):
        target.generate([5, 6], assistant_model=target, num_beams=2)
    with pytest.raises(GenerationError, match="num_assistant_tokens must be an integer >= 1"):
        target.generate([5, 6], assistant_model=target, num_assistant_tokens=0)


def test_adaptive_schedule_follows_acceptance_and_cost() -> None:
    good = DraftSchedule(k=5)
    for _ in range(30):
        good.update(good.k, good.k, draft_step_s=0.001, verify_s=0.02)  # cheap draft, all kept
    assert good.k == good.max_k
    bad = DraftSchedule(k=5)
    for _ in range(30):
        bad.update(max(bad.k, 1), 0, draft_step_s=0.005, verify_s=0.02)  # nothing kept
    assert bad.k == 0  # drafting off: plain steps ...
    assert [bad.next_k() for _ in range(PROBE + 1)][-1] == 1  # ... with a probe now and then
    mixed = DraftSchedule(k=5)
    for _ in range(30):
        mixed.update(4, 2, draft_step_s=0.004, verify_s=0.02)
    assert 1 <= mixed.k <= 6


def test_cli_generate_and_bench_with_an_assistant(
    jamba_onnx: Path, jamba_int4: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hybridrt.cli import main

    args = ["generate", str(jamba_onnx), "def fib", "--max-new-tokens", "16", "--no-stream"]
    assert main([*args, "--assistant", str(jamba_int4), "--num-assistant-tokens", "3"]) == 0
    out, err = capsys.readouterr()
    assert out == hybridrt.load(jamba_onnx).generate("def fib", max_new_tokens=16) + "\n"
    assert "drafted tokens kept" in err
    bench = ["bench", str(jamba_onnx), "--assistant", str(jamba_int4), "--prompt-tokens", "8", "--new-tokens", "12"]
    assert main([*bench, "--repeats", "1", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    spec = row["speculative"]
    assert spec["greedy_same_as_alone"] and 0 <= spec["acceptance_rate"] <= 1
    assert spec["decode_tokens_per_s"] > 0 and spec["tokens_per_round"] >= 1


def test_verify_calls_stay_short_when_drafts_are_rejected(jamba_onnx: Path, jamba_int4: Path) -> None:
    """A recurrent target runs the drafts it kept again after a rejection, once: its pending
    tokens never pile up from round to round (they did, each call longer than the last)."""
    from hybridrt.runtime.decode import GenerationStats
    from hybridrt.runtime.speculative import Draft, speculate

    target, draft = hybridrt.load(jamba_onnx), hybridrt.load(jamba_int4)
    cfg = target.generation_config(max_new_tokens=60, eos_token_id=[], num_assistant_tokens_schedule="constant")
    room = len(PROMPTS[0]) + cfg.max_new_tokens
    drafter = Draft.start(target, draft, cfg, room)
    stepper = target.stepper(1, room + drafter.schedule.max_k + 2, ring=2)
    lengths: list[int] = []
    forward = stepper.forward

    def counted(ids: np.ndarray, all_logits: bool = False, last: int = 1) -> np.ndarray:
        lengths.append(ids.shape[1])
        return forward(ids, all_logits, last)

    stepper.forward = counted  # type: ignore[method-assign]
    stats = GenerationStats()
    for _ in speculate(stepper, drafter, list(PROMPTS[0]), cfg, [], stats):
        pass
    assert stats.tokens[0] == target.generate(PROMPTS[0], max_new_tokens=60, eos_token_id=[])
    assert 0 < stats.accepted_tokens < stats.draft_tokens
    assert max(lengths[1:]) <= cfg.num_assistant_tokens + 1  # after the prompt: drafts + one token


def test_share_thread_pool_comes_first(jamba_onnx: Path, jamba_int4: Path, tmp_path: Path) -> None:
    """In a fresh process, target and draft share one pool and still decode exactly; once a
    session is open it is too late, and the call says so."""
    import subprocess
    import sys

    from hybridrt.errors import ProviderError
    from hybridrt.runtime import share_thread_pool

    code = (
        "import sys, json, hybridrt\n"
        "hybridrt.runtime.share_thread_pool(2)\n"
        "t, d = hybridrt.load(sys.argv[1]), hybridrt.load(sys.argv[2])\n"
        "kw = dict(max_new_tokens=20, eos_token_id=[])\n"
        "print(json.dumps([t.generate([5, 17, 99], **kw), t.generate([5, 17, 99], assistant_model=d, **kw)]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(jamba_onnx), str(jamba_int4)], capture_output=True, text=True, check=True
    )
    plain, spec = json.loads(done.stdout.strip().splitlines()[-1])
    assert plain == spec == hybridrt.load(jamba_onnx).generate([5, 17, 99], max_new_tokens=20, eos_token_id=[])
    with pytest.raises(ProviderError, match="before the first hybridrt.load"):
        share_thread_pool(2)


def test_adaptive_schedule_stops_drafting_when_plain_steps_are_faster() -> None:
    """Measured: rounds yielding fewer tokens per second than plain steps turn drafting off,
    after the warm-up steps that time a plain step; untimed (seeded sampling), it never looks."""
    from hybridrt.runtime.sampling import GenerationConfig

    schedule = DraftSchedule.of(GenerationConfig(num_assistant_tokens=4), cost=0.05)
    assert [schedule.next_k() for _ in range(3)] == [0, 0, 4]  # two timed plain steps first
    schedule.observe_step(0.010)
    schedule.update(4, 4, draft_step_s=0.001, verify_s=0.012, round_s=0.016)  # 5 tokens in 16 ms
    assert schedule.k > 0
    for _ in range(5):
        schedule.update(4, 1, draft_step_s=0.008, verify_s=0.012, round_s=0.044)  # 2 tokens in 44 ms
    assert schedule.k == 0
    seeded = DraftSchedule.of(GenerationConfig(num_assistant_tokens=4, temperature=0.7, seed=1), cost=0.05)
    assert seeded.warmup == 0 and not seeded.timed
    seeded.update(4, 1, draft_step_s=0.008, verify_s=0.012, round_s=0.044)
    assert seeded.round_rate == 0
