"""The serving engine on real sessions: continuous batching, chunked prefill and the prefix
cache give each request the tokens Model.generate gives its prompt alone."""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import hybridrt
from hybridrt.runtime.sampling import GenerationConfig
from hybridrt.serve.engine import Engine, EngineBusy, EngineConfig, Request, Update


class Result:
    """Collects a request's updates, as the HTTP layer does."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.finish: str | None = None
        self.cached = 0
        self.done = threading.Event()

    def __call__(self, update: Update) -> None:
        self.tokens += update.tokens
        self.cached = update.cached_tokens
        if update.finish_reason is not None:
            self.finish = update.finish_reason
            self.done.set()


def _prompt(length: int, seed: int = 0, vocab: int = 320) -> list[int]:
    return np.random.default_rng(seed + length).integers(3, vocab, length).tolist()


def _submit(engine: Engine, prompt: list[int], **kwargs: object) -> tuple[Request, Result]:
    result = Result()
    req = Request(prompt, engine.model.generation_config(**kwargs), result)  # as Model.generate builds it
    engine.submit(req)
    return req, result


def _answered(engine: Engine, prompt: list[int], parked: bool = False) -> Result:
    """prompt's 6 tokens, once done (`parked`: once the engine has kept its emptied batch)."""
    result = _submit(engine, prompt, max_new_tokens=6)[1]
    assert result.done.wait(60)
    deadline = time.monotonic() + 10
    while parked and engine.prompts.idle is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return result


def _engine(model: hybridrt.runtime.Model, **kwargs: int) -> Engine:
    engine = Engine(model, EngineConfig(**kwargs)).start()
    assert engine.ready.wait(60)
    return engine


@pytest.fixture(scope="module", params=["default_onnx", "jamba_onnx", "llama_onnx", "llama_kv8"])
def model(request: pytest.FixtureRequest) -> hybridrt.runtime.Model:
    """The served models; llama_kv8 keeps its KV cache in int8 (rows join, leave and prefill in
    chunks in int8 buffers)."""
    return hybridrt.load(request.getfixturevalue(request.param))


def test_concurrent_greedy_requests_equal_generate_alone(model: hybridrt.runtime.Model) -> None:
    vocab = int(model.manifest.vocab_size)
    lengths = [1, 40, 5, 90, 17, 3, 64, 9]
    budgets = [12, 5, 20, 9, 1, 16, 7, 11]
    prompts = [_prompt(n, vocab=vocab) for n in lengths]
    # 3 slots for 8 requests, 16-token chunks: requests queue, prefill in pieces between
    # decode steps, and join and leave the batch at different steps.
    engine = _engine(model, slots=3, chunk=16, cache_bytes=0)
    try:
        results = [_submit(engine, p, max_new_tokens=k)[1] for p, k in zip(prompts, budgets)]
        assert all(r.done.wait(120) for r in results)
    finally:
        engine.stop()
    for p, k, r in zip(prompts, budgets, results):
        assert r.tokens == model.generate(p, max_new_tokens=k)
        assert r.finish in ("stop", "length") and r.cached == 0


def test_lone_requests_reuse_the_idle_batch_and_equal_generate_alone(model: hybridrt.runtime.Model) -> None:
    """One request at a time: each prefills in the buffers of a decode batch an earlier one
    left (two at most, kept in turn: Prompts.spare), with fresh states, resumed from the cache,
    or grown past the buffers' capacity, and each gives the tokens Model.generate gives its
    prompt alone."""
    vocab = int(model.manifest.vocab_size)
    engine = _engine(model, slots=4, chunk=32, cache_bytes=256 << 20)
    idle = []

    def ask(prompt: list[int], budget: int) -> Result:
        _, result = _submit(engine, prompt, max_new_tokens=budget)
        assert result.done.wait(120) and result.finish == "length"
        assert result.tokens == model.generate(prompt, max_new_tokens=budget)
        deadline = time.monotonic() + 10  # the engine moves the batch aside after the last token
        while engine.batch is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        idle.append(engine.prompts.idle)
        return result

    try:
        first = _prompt(70, vocab=vocab)
        reply = ask(first, 10).tokens
        assert ask(_prompt(9, seed=1, vocab=vocab), 6).cached == 0  # fresh states in used buffers
        # The first reply's end was stored while the engine was idle: resumed.
        second = first + reply + _prompt(20, seed=2, vocab=vocab)
        result = ask(second, 8)
        assert result.cached == len(first) + len(reply) - 1
        # The next turn continues in the row that holds it, nothing copied.
        third = second + result.tokens + _prompt(15, seed=4, vocab=vocab)
        assert ask(third, 7).cached == len(second) + len(result.tokens) - 1
        ask(_prompt(300, seed=3, vocab=vocab), 5)  # more positions than the buffers held: they grow
    finally:
        engine.stop()
    assert None not in idle and len({id(b) for b in idle}) <= 2


def test_an_idle_engine_gives_the_kept_batch_back_and_the_next_turn_still_resumes(jamba_onnx: Path) -> None:
    """After idle_release_s without work the emptied decode batch is dropped (its memory given
    back), its row's states stored first: the conversation's next turn resumes from the cache."""
    model = hybridrt.load(jamba_onnx)
    engine = Engine(model, EngineConfig(slots=4, chunk=32, cache_bytes=256 << 20, idle_release_s=0.2)).start()
    assert engine.ready.wait(60)
    try:
        first = _prompt(50)
        _, result = _submit(engine, first, max_new_tokens=6)
        assert result.done.wait(120) and result.finish == "length"
        deadline = time.monotonic() + 10
        while engine.prompts.idle is None and time.monotonic() < deadline:  # parked after the last token
            time.sleep(0.01)
        kept = engine.prompts.idle
        while engine.prompts.idle is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert kept is not None and engine.prompts.idle is None and engine.batch is None
        assert engine.prompts.spare is None
        turn = first + result.tokens + _prompt(12, seed=5)
        _, again = _submit(engine, turn, max_new_tokens=4)
        assert again.done.wait(120) and again.cached == len(first) + len(result.tokens) - 1
        assert again.tokens == model.generate(turn, max_new_tokens=4)
    finally:
        engine.stop()
    with pytest.raises(hybridrt.errors.GenerationError, match="idle_release_s"):
        EngineConfig(idle_release_s=0)


def test_admitted_requests_hold_no_states_until_their_prefill(jamba_onnx: Path) -> None:
    """Regression: every admitted request made its own state batch at admission, so 64
    requests arriving together held 64 sets of states before the first had prefilled
    (gigabytes on a 32-layer model). Only the request being prefilled holds states now, and
    the rows that leave the batch in any order still give each request its tokens alone.
    The engine's turns are run here on this thread, one at a time."""
    model = hybridrt.load(jamba_onnx)
    engine = Engine(model, EngineConfig(slots=4, chunk=4, cache_bytes=0))
    engine._loaded(model)  # what the engine thread's start does
    engine.ready.set()
    prompts = [_prompt(n, seed=n) for n in (9, 6, 11, 7, 5)]
    budgets = [7, 2, 5, 9, 3]
    results = [_submit(engine, p, max_new_tokens=k)[1] for p, k in zip(prompts, budgets)]
    held = []
    for _ in range(200):
        if all(r.done.is_set() for r in results):
            break
        engine._turn()
        held.append(sum(r.rows is not None for r in engine.prefilling))
    assert max(held) == 1 and len(engine.running) == 0
    for p, k, r in zip(prompts, budgets, results):
        assert r.tokens == model.generate(p, max_new_tokens=k)


def test_seeded_sampling_equals_generate_alone(jamba_onnx: Path) -> None:
    model = hybridrt.load(jamba_onnx)
    kwargs = [dict(temperature=0.8, top_p=0.9, seed=s, max_new_tokens=10 + s) for s in range(4)]
    kwargs.append(dict(repetition_penalty=1.5, max_new_tokens=12))
    prompts = [_prompt(3 + 7 * i) for i in range(len(kwargs))]
    engine = _engine(model, slots=4, chunk=8)
    try:
        results = [_submit(engine, p, **kw)[1] for p, kw in zip(prompts, kwargs)]
        assert all(r.done.wait(60) for r in results)
    finally:
        engine.stop()
    for p, kw, r in zip(prompts, kwargs, results):
        assert r.tokens == model.generate(p, **kw)


def test_prefix_cache_prefills_only_the_rest(default_onnx: Path) -> None:
    model = hybridrt.load(default_onnx)
    first, more = _prompt(30, vocab=4096), _prompt(12, seed=1, vocab=4096)
    engine = _engine(model, slots=2, chunk=8)
    try:
        a = _submit(engine, first, max_new_tokens=6, min_new_tokens=6)[1]
        assert a.done.wait(60) and a.cached == 0
        again = _submit(engine, first, max_new_tokens=6, min_new_tokens=6)[1]
        longer = _submit(engine, first + more, max_new_tokens=8)[1]
        assert again.done.wait(60) and longer.done.wait(60)
        # A chat turn: the previous prompt, its reply, then new tokens.
        turn = first + a.tokens + more
        b = _submit(engine, turn, max_new_tokens=8)[1]
        assert b.done.wait(60)
        stats = engine.stats()
    finally:
        engine.stop()
    assert again.cached == len(first) and again.tokens == a.tokens
    assert longer.cached == len(first) and longer.tokens == model.generate(first + more, max_new_tokens=8)
    assert b.cached == len(first) + len(a.tokens) - 1
    assert b.tokens == model.generate(turn, max_new_tokens=8)
    assert stats["cache_entries"] >= 3 and stats["cache_bytes"] > 0


def test_scored_prompts_skip_the_prefix_cache(default_onnx: Path) -> None:
    """A request that scores its prompt (echo + logprobs) prefills every position even when
    the cache holds its prompt: the cache keeps no logits but the last."""
    model = hybridrt.load(default_onnx)
    prompt = _prompt(21, vocab=4096)
    engine = _engine(model, slots=2, chunk=8)
    try:
        plain = _submit(engine, prompt, max_new_tokens=2)[1]
        assert plain.done.wait(60)
        scored: list[Update] = []
        done = threading.Event()

        def collect(update: Update) -> None:
            scored.append(update)
            if update.finish_reason is not None:
                done.set()

        cfg = model.generation_config(max_new_tokens=1)
        engine.submit(Request(prompt, cfg, collect, logprobs=0, prompt_logprobs=0, score_only=True))
        assert done.wait(60)
    finally:
        engine.stop()
    [update] = scored
    assert update.tokens == [] and update.finish_reason == "length" and update.cached_tokens == 0
    assert update.prompt_logprobs is not None and [e.token for e in update.prompt_logprobs] == prompt
    from hybridrt.runtime.evaluate import ort_logits_fn, token_nll

    want = -token_nll(ort_logits_fn(model), prompt, len(prompt), len(prompt), lambda n: None)
    got = [e.logprob for e in update.prompt_logprobs]
    assert got[0] is None
    np.testing.assert_allclose(np.asarray(got[1:], dtype=np.float64), want, atol=1e-4)


def test_cancel_frees_the_slot_at_once(jamba_onnx: Path) -> None:
    model = hybridrt.load(jamba_onnx)
    engine = _engine(model, slots=1, chunk=8)
    try:
        long_req, long_res = _submit(engine, _prompt(5), max_new_tokens=400, eos_token_id=[])
        while not long_res.tokens:
            time.sleep(0.01)
        engine.cancel(long_req)
        assert long_res.done.wait(10) and long_res.finish == "cancelled" and len(long_res.tokens) < 400
        short = _submit(engine, _prompt(6), max_new_tokens=4)[1]
        assert short.done.wait(30) and short.tokens == model.generate(_prompt(6), max_new_tokens=4)
        deadline = time.monotonic() + 5  # the slot is freed right after the last token is sent
        while engine.stats()["busy_slots"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.stats()["busy_slots"] == 0
    finally:
        engine.stop()


def test_full_queue_refuses_and_timeouts_end_requests(jamba_onnx: Path) -> None:
    model = hybridrt.load(jamba_onnx)
    engine = _engine(model, slots=1, max_queue=1)
    try:
        slow = Result()
        # 500 tokens take this model >= 0.2 s; the request may run for 0.05 s.
        engine.submit(Request(_prompt(4), GenerationConfig(max_new_tokens=500, eos_token_id=[]), slow, timeout=0.05))
        while not slow.tokens and not slow.done.is_set():
            time.sleep(0.01)
        queued = _submit(engine, _prompt(4), max_new_tokens=2)[1]
        with pytest.raises(EngineBusy):
            _submit(engine, _prompt(4), max_new_tokens=2)
        assert slow.done.wait(10) and slow.finish == "timeout" and len(slow.tokens) < 500
        assert queued.done.wait(10) and queued.finish in ("stop", "length")
    finally:
        engine.stop()


def test_stop_ends_waiting_and_running_requests(jamba_onnx: Path) -> None:
    engine = _engine(hybridrt.load(jamba_onnx), slots=1)
    updates: queue.Queue[Update] = queue.Queue()
    engine.submit(Request(_prompt(4), GenerationConfig(max_new_tokens=400, eos_token_id=[]), updates.put))
    while updates.empty():
        time.sleep(0.01)
    engine.stop()
    last = None
    while not updates.empty():
        last = updates.get()
    assert last is not None and last.finish_reason == "cancelled" and not engine.thread.is_alive()


def test_presence_and_frequency_penalties_follow_openai(default_onnx: Path) -> None:
    """logit - presence * (count > 0) - frequency * count over the tokens generated so far."""
    model = hybridrt.load(default_onnx)
    # Greedy repeats itself after this prompt ("\n#\n#\n#..."), so the penalties matter.
    prompt, presence, frequency = model.tokenizer.encode("import os\n").ids, 0.7, 0.4
    rows = model.stepper(1, len(prompt) + 16)
    logits = rows.forward(np.asarray([prompt], dtype=np.int64))[0].copy()
    counts, want = np.zeros_like(logits), []
    for _ in range(16):
        token = int(np.argmax(logits - presence * (counts > 0) - frequency * counts))
        want.append(token)
        counts[token] += 1
        logits = rows.forward(np.asarray([[token]], dtype=np.int64))[0].copy()
    engine = _engine(model)
    try:
        result = Result()
        cfg = GenerationConfig(
            max_new_tokens=16, eos_token_id=[], presence_penalty=presence, frequency_penalty=frequency
        )
        engine.submit(Request(prompt, cfg, result))
        assert result.done.wait(30)
    finally:
        engine.stop()
    assert result.tokens == want
    # The library samples through the same sampler: its penalized tokens are the engine's (the
    # model's recommended repetition penalty, which the library applies by default, turned off).
    plain = dict(max_new_tokens=16, eos_token_id=[], repetition_penalty=1.0)
    penalized = model.generate(prompt, presence_penalty=presence, frequency_penalty=frequency, **plain)
    assert penalized == want
    assert want != model.generate(prompt, max_new_tokens=16, eos_token_id=[])  # the penalties changed something


# The adaptive schedule may stop drafting on measured time (these tiny models step fast);
# the rounds counted below need drafts whatever the machine's load.
TIMING_FREE = "constant"


def test_assistant_decodes_lone_requests_speculatively(jamba_onnx: Path, jamba_int4: Path) -> None:
    """Greedy tokens equal Model.generate whether a request ran alone (speculative rounds),
    batched with others, or both in turn; seeded sampling stays on plain steps."""
    model, draft = hybridrt.load(jamba_onnx), hybridrt.load(jamba_int4)
    vocab = int(model.manifest.vocab_size)
    engine = Engine(model, EngineConfig(slots=3, chunk=16, cache_bytes=2**24), assistant=draft).start()
    assert engine.ready.wait(60)
    try:
        alone = [_prompt(n, vocab=vocab) for n in (7, 30)]
        for p in alone:  # one at a time: every round is speculative
            _, r = _submit(engine, p, max_new_tokens=24, eos_token_id=[], num_assistant_tokens_schedule=TIMING_FREE)
            assert r.done.wait(60) and r.tokens == model.generate(p, max_new_tokens=24, eos_token_id=[])
        drafted = engine.metrics.drafted_tokens._value.get()
        assert 0 < engine.metrics.accepted_tokens._value.get() < drafted
        # Several at once: they batch, and the last one left speculates again.
        lengths, budgets = [1, 40, 5, 90, 17], [30, 5, 20, 9, 40]
        prompts = [_prompt(n, seed=1, vocab=vocab) for n in lengths]
        results = [
            _submit(engine, p, max_new_tokens=k, eos_token_id=[], num_assistant_tokens_schedule=TIMING_FREE)[1]
            for p, k in zip(prompts, budgets)
        ]
        assert all(r.done.wait(120) for r in results)
        for p, k, r in zip(prompts, budgets, results):
            assert r.tokens == model.generate(p, max_new_tokens=k, eos_token_id=[])
        # One joins while another is in its speculative rounds: the lone row's lag is fed first.
        _, first = _submit(
            engine, prompts[3], max_new_tokens=60, eos_token_id=[], num_assistant_tokens_schedule=TIMING_FREE
        )
        deadline = time.monotonic() + 60
        while len(first.tokens) < 8 and time.monotonic() < deadline:
            time.sleep(0.001)
        _, second = _submit(
            engine, prompts[4], max_new_tokens=20, eos_token_id=[], num_assistant_tokens_schedule=TIMING_FREE
        )
        assert first.done.wait(60) and second.done.wait(60)
        assert first.tokens == model.generate(prompts[3], max_new_tokens=60, eos_token_id=[])
        assert second.tokens == model.generate(prompts[4], max_new_tokens=20, eos_token_id=[])
        # A follow-up turn starts from the cached states of the first request.
        follow = alone[0] + model.generate(alone[0], max_new_tokens=24, eos_token_id=[])[:-1]
        _, r = _submit(
            engine, follow + [9, 8], max_new_tokens=10, eos_token_id=[], num_assistant_tokens_schedule=TIMING_FREE
        )
        assert r.done.wait(60) and r.cached > 0
        assert r.tokens == model.generate(follow + [9, 8], max_new_tokens=10, eos_token_id=[])
        drafted = engine.metrics.drafted_tokens._value.get()
        kw = dict(
            temperature=0.8, seed=5, max_new_tokens=12, eos_token_id=[], num_assistant_tokens_schedule=TIMING_FREE
        )
        _, r = _submit(engine, alone[1], **kw)
        assert r.done.wait(60) and r.tokens == model.generate(alone[1], **kw)
        assert engine.metrics.drafted_tokens._value.get() == drafted
    finally:
        engine.stop()


def test_a_retokenized_turn_resumes_a_few_tokens_before_the_last_prompt_ended(jamba_onnx: Path) -> None:
    """Regression: a conversation resent as text over /v1/completions is tokenized again, and
    the reply's first characters can merge with the prompt's last token, so no stored prompt
    or reply end started the next turn and every turn prefilled its whole history. The state
    stored a tail before each prompt's end (as deep as the tokenizer says appended text reaches:
    runtime.retokenize) serves it."""
    model = hybridrt.load(jamba_onnx)
    engine = _engine(model, slots=2, chunk=8)
    try:
        first = _prompt(40)
        a = _answered(engine, first)
        merged = [(first[-1] + 1) % 300 + 3]  # the last token, tokenized with the reply's start
        turn = first[:-1] + merged + a.tokens + _prompt(12, seed=3)
        b = _answered(engine, turn)
    finally:
        engine.stop()
    assert engine.cache is not None
    assert b.cached == len(first) - engine.cache.tails.of(first) and b.tokens == model.generate(turn, max_new_tokens=6)


@pytest.mark.parametrize("alongside", [False, True], ids=["kept_row", "stored_reply_end"])
def test_a_chat_s_next_turn_stores_no_tail_checkpoint(jamba_onnx: Path, alongside: bool) -> None:
    """A prompt that continues exactly the tokens the kept row holds, or (with another request
    decoding when the reply ended, so its row was not kept) a reply end stored in the cache, is
    a chat template's next turn: it gets no tail checkpoint before its end, which only a
    conversation resent as text needs (prefix_plan), so its prefill is one call, not two. The
    first prompt, from nothing, has one; the turn's tokens equal generate's."""
    model = hybridrt.load(jamba_onnx)
    engine = _engine(model, slots=2, chunk=64)
    try:
        first = _prompt(40)
        if alongside:
            a = _submit(engine, first, max_new_tokens=6)[1]
            b = _submit(engine, _prompt(30, seed=7), max_new_tokens=30)[1]  # still decoding when a ends
            assert a.done.wait(60) and b.done.wait(60)
        else:
            a = _answered(engine, first, parked=True)
        turn = first + a.tokens + _prompt(12, seed=3)
        c = _answered(engine, turn)
        assert engine.cache is not None
        depths = {e.length for e in engine.cache.entries}
    finally:
        engine.stop()
    assert c.cached == len(first) + len(a.tokens) - 1  # resumed at the reply's end
    assert c.tokens == model.generate(turn, max_new_tokens=6)
    tails = engine.cache.tails
    assert len(first) - tails.of(first) in depths and len(turn) in depths and len(turn) - tails.of(turn) not in depths


def test_the_checkpoint_before_a_prompts_last_call_holds_that_positions_states(jamba_onnx: Path) -> None:
    """The state stored a tail before a prompt's end is taken before the prompt's last call
    and stored after the first token (its fixed states kept aside, its KV read back then): it
    equals the states of a cold prefill of those tokens."""
    from hybridrt.runtime.decode import prefill

    model = hybridrt.load(jamba_onnx)
    engine = _engine(model, slots=2, chunk=8)
    try:
        p = _prompt(40)
        assert _submit(engine, p, max_new_tokens=3)[1].done.wait(60)
        assert engine.cache is not None
        tail = engine.cache.tails.of(p)
        hit = engine.cache.lookup(p[:-tail] + [7])
    finally:
        engine.stop()
    assert hit is not None and hit.snapshot.length == len(p) - tail
    cold = model.stepper(1, 64)
    prefill(cold, [p[:-tail]])
    want = cold.row(0)
    assert all(np.allclose(a, b, atol=1e-5) for a, b in zip(hit.snapshot.states, want.states))


def test_requests_that_share_a_prefix_wait_for_one_prefill_of_it(jamba_onnx: Path) -> None:
    """Four requests with one 80-token system prompt arrive together: the first prefills it and
    stores a state where they part; the others resume there and prefill their own tokens."""
    model = hybridrt.load(jamba_onnx)
    shared = _prompt(80, seed=5)
    prompts = [shared + _prompt(9 + i, seed=i) for i in range(4)]
    engine = Engine(model, EngineConfig(slots=4, chunk=8))
    engine._loaded(model)  # the engine's turns run here, one at a time
    engine.ready.set()
    results = [_submit(engine, p, max_new_tokens=5)[1] for p in prompts]
    for _ in range(300):
        if all(r.done.is_set() for r in results):
            break
        engine._turn()
    assert [r.cached for r in results] == [0, 80, 80, 80]
    for p, r in zip(prompts, results):
        assert r.tokens == model.generate(p, max_new_tokens=5)
    assert engine.cache is not None and engine.cache.stats.hit_tokens == 3 * 80


def test_prompts_cached_whole_join_the_batch_in_one_turn(jamba_onnx: Path) -> None:
    """Regression: eight streams whose prompts were cached one round earlier waited for one
    engine turn each before their first token (a lookup and a state batch of their own per
    turn). Their cached states now join the decode batch at admission."""
    model = hybridrt.load(jamba_onnx)
    prompts = [_prompt(20 + i, seed=i) for i in range(4)]
    engine = Engine(model, EngineConfig(slots=4, chunk=8))
    engine._loaded(model)  # the engine's turns run here, one at a time
    engine.ready.set()

    def finish(results: list[Result]) -> None:
        for _ in range(300):
            if all(r.done.is_set() for r in results):
                return
            engine._turn()

    finish([_submit(engine, p, max_new_tokens=4)[1] for p in prompts])
    again = [_submit(engine, p, max_new_tokens=4)[1] for p in prompts]
    engine._turn()
    assert len(engine.running) == 4 and all(len(r.tokens) >= 1 for r in again)
    finish(again)
    assert [r.cached for r in again] == [len(p) for p in prompts]
    for p, r in zip(prompts, again):
        assert r.tokens == model.generate(p, max_new_tokens=4)


def test_a_request_straight_after_a_reply_prefills_in_a_second_kept_batch(jamba_onnx: Path) -> None:
    """A request that comes straight after a reply and does not continue it prefills in a
    second kept batch; the reply's end is stored after that request's first token, not before
    its prefill, and resumes exactly; two batches are then kept in turn."""
    model = hybridrt.load(jamba_onnx)
    engine = Engine(model, EngineConfig(slots=2, chunk=64, cache_bytes=256 << 20))
    engine._loaded(model)  # the engine's turns run here, one at a time (no idle time between)
    engine.ready.set()
    cache, prompts = engine.cache, engine.prompts
    assert cache is not None and prompts is not None
    seen: list[list[int]] = []
    kept = []
    for i in range(3):
        p = _prompt(30 + i, seed=10 + i)
        _, result = _submit(engine, p, max_new_tokens=4)
        if seen:
            assert cache.depth(seen[-1] + [1]) < len(seen[-1])  # the last reply's end: not stored yet
        while not result.tokens:  # p's prefill (to its tail checkpoint, then the rest) and first token
            engine._turn()
            if seen and not result.tokens:  # prefilling: the last reply's end not stored before it
                assert cache.depth(seen[-1] + [1]) < len(seen[-1])
        assert not seen or cache.depth(seen[-1] + [1]) == len(seen[-1])  # stored after its first token
        for _ in range(50):
            if result.done.is_set():
                break
            engine._turn()
        assert result.tokens == model.generate(p, max_new_tokens=4)
        seen.append(p + result.tokens[:-1])
        kept.append(prompts.idle)
    assert kept[0] is not kept[1] and kept[2] is kept[0] and prompts.spare is kept[1]
    turn = seen[0] + [5] + _prompt(9, seed=20)
    _, again = _submit(engine, turn, max_new_tokens=4)
    for _ in range(50):
        if again.done.is_set():
            break
        engine._turn()
    assert again.cached == len(seen[0]) and again.tokens == model.generate(turn, max_new_tokens=4)


def test_an_idle_engine_stores_the_kept_row_and_readies_blocks_for_checkpoints(jamba_onnx: Path) -> None:
    """Between requests the engine stores the kept row's states (a request that does not
    continue it then waits for no copy, and a chat's next turn still continues in the row) and
    makes blocks ready for the next checkpoints' fixed states, within the cache's budget; the
    next request's checkpoints take them (runtime.host_blocks)."""
    model = hybridrt.load(jamba_onnx)
    engine = _engine(model, slots=2, chunk=32, cache_bytes=64 << 20)
    cache = engine.cache
    assert cache is not None
    try:
        first = _prompt(50)
        _, result = _submit(engine, first, max_new_tokens=6)
        assert result.done.wait(120) and result.finish == "length"
        seen = first + result.tokens[:-1]
        deadline = time.monotonic() + 10
        while (cache.depth(seen + [1]) < len(seen) or len(cache.blocks.ready) < 4) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cache.depth(seen + [1]) == len(seen) and engine.prompts is not None and engine.prompts.idle is not None
        assert len(cache.blocks.ready) == cache.keep_ready == 4
        assert cache.memory + cache.blocks.held() <= cache.memory_bytes
        ready = {id(b) for b in cache.blocks.ready}
        turn = first + result.tokens + _prompt(12, seed=5)
        _, again = _submit(engine, turn, max_new_tokens=4)
        assert again.done.wait(120) and again.cached == len(seen)  # continued in the kept row
        assert again.tokens == model.generate(turn, max_new_tokens=4)
        assert any(id(e.block) in ready for e in list(cache.entries))  # its checkpoints took ready blocks
    finally:
        engine.stop()


def test_a_prompt_s_states_go_to_the_cache_after_the_server_took_its_first_token(jamba_onnx: Path) -> None:
    """Regression: right after a prompt's first token the engine copied the prompt's states into
    the cache, and the server's event loop, woken to send the token, waited for a core behind
    those copies (7.5-13 ms late in 3 of 12 turns on 2 cores). The copies now wait until the
    loop has taken the token (Request.taken, set by jobs.Job), or HAND_OFF_S at most: here it is
    never taken, so they start no sooner than that."""
    from hybridrt.serve.prefill import HAND_OFF_S

    model = hybridrt.load(jamba_onnx)
    engine = _engine(model, slots=2, chunk=64)
    assert engine.cache is not None
    seen: list[tuple[str, float]] = []
    put = engine.cache.put
    engine.cache.put = lambda *a, **k: (seen.append(("put", time.perf_counter())), put(*a, **k))[1]  # type: ignore[method-assign]
    result = Result()

    def emit(update: Update) -> None:
        seen.append(("token", time.perf_counter()))
        result(update)

    try:
        engine.submit(Request(_prompt(40), model.generation_config(max_new_tokens=4), emit, taken=threading.Event()))
        assert result.done.wait(60)
    finally:
        engine.stop()
    first = next(t for what, t in seen if what == "token")
    puts = [t for what, t in seen if what == "put"]
    assert puts and min(puts) >= first + HAND_OFF_S


def test_a_job_says_when_the_event_loop_has_taken_a_request_s_update(jamba_onnx: Path) -> None:
    """The other half of the hand-off above: the server's job marks each request taken once its
    event loop holds an update of it, which is what the engine's copies wait for."""
    import asyncio

    from hybridrt.serve.jobs import Job
    from hybridrt.serve.protocol import completion_params

    model = hybridrt.load(jamba_onnx)
    engine = _engine(model, slots=2, chunk=64)

    async def run() -> list[bool]:
        job = Job(engine, completion_params(model, {"prompt": _prompt(20), "max_tokens": 3}), model.tokenizer, 60)
        before = [c.request.taken is not None and c.request.taken.is_set() for c in job.choices]
        job.submit()
        async for _ in job.pieces():
            pass
        return before + [c.request.taken is not None and c.request.taken.is_set() for c in job.choices]

    try:
        assert asyncio.run(run()) == [False, True]
    finally:
        engine.stop()
