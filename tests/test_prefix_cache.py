"""The prefix state cache (hybridrt.runtime.prefix_cache) on real sessions: a prompt resumes
from the deepest stored state at or before the first token where it differs from anything
seen, in memory or from disk, and gives the tokens and logits of a cold prefill."""

from __future__ import annotations

import logging
from pathlib import Path

import exports
import numpy as np
import pytest
from checkpoints import make_jamba
from family_checkpoints import make_granitemoehybrid
from resuming import cached_prefill, cold_prefill, parted, random_prompt

import hybridrt
from hybridrt.errors import GenerationError
from hybridrt.runtime.prefix_cache import StateCache
from hybridrt.runtime.prefix_plan import MIN_SPACING, READ_BYTES_PER_S, TAIL, chunk_end, spacing_for
from hybridrt.runtime.radix import RadixTree
from hybridrt.runtime.state import Snapshot

TOL = 1e-5


@pytest.fixture(scope="module", params=["jamba", "granitemoehybrid", "llama"])
def model(request: pytest.FixtureRequest) -> hybridrt.runtime.Model:
    """Mamba1 + attention, Mamba2 + attention (+ MoE), and attention only (KV cut to a prefix)."""
    if request.param == "granitemoehybrid":
        return hybridrt.load(exports.family(make_granitemoehybrid))
    return hybridrt.load(request.getfixturevalue(f"{request.param}_onnx"))


def test_radix_tree_finds_the_deepest_stored_prefix_and_where_tokens_part() -> None:
    tree: RadixTree[str] = RadixTree()
    tree.insert([1, 2, 3, 4, 5, 6], "long")
    tree.insert([1, 2, 3], "short")
    tree.insert([1, 2, 9], "other")  # splits the edge [1, 2, 3, ...] after [1, 2]
    match = tree.match([1, 2, 3, 4, 7, 8])
    assert match.agree == 4 and [v for _, v in match.path] == ["short"]
    assert [v for _, v in tree.match([1, 2, 3, 4, 5, 6, 7]).path] == ["long", "short"]
    assert tree.match([5]).agree == 0 and tree.match([5]).path == []
    node = tree.match([1, 2, 3]).path[0][0]
    tree.remove(node)  # [1, 2, 3] holds nothing now: merged into its one child's edge
    assert [v for _, v in tree.match([1, 2, 3, 4, 5, 6]).path] == ["long"]
    assert sorted(v for _, v in tree.values()) == ["long", "other"]
    assert tree.match([1, 2, 3, 4, 5, 6]).path[0][0].key() == [1, 2, 3, 4, 5, 6]


def test_a_prompt_resumes_from_the_deepest_checkpoint_before_it_differs(
    model: hybridrt.runtime.Model, tmp_path: Path
) -> None:
    vocab = int(model.manifest.vocab_size)
    p = random_prompt(300, vocab=vocab)
    q = p[:200] + random_prompt(60, seed=1, vocab=vocab)  # agrees with p for 200 tokens
    cold = model.generate(p, max_new_tokens=8)
    cache = model.state_cache(memory_bytes=2**28, spacing=128)
    model.generate(q, cache=cache, max_new_tokens=4)
    out, stats = model.generate_with_stats(p, cache=cache, max_new_tokens=8)
    # Recurrent states resume from the checkpoint at 128; KV alone is cut to 200.
    assert stats.cached_tokens == (128 if model.manifest.recurrent else 200)
    assert out == cold
    # p stored a state where it parts from q: a third prompt that agrees as far resumes there.
    r = p[:200] + random_prompt(20, seed=2, vocab=vocab)
    logits, resumed = cached_prefill(model, r, cache)
    assert resumed == 200
    assert np.abs(logits - cold_prefill(model, r)).max() <= TOL
    # Every state stored on p's path, and p itself (its last logits: nothing to prefill).
    depths = [n.depth for n, _ in cache.tree.match(p).path if n.depth <= len(p)]
    assert len(p) in depths and (len(p) - cache.tails.of(p) in depths) == model.manifest.recurrent
    for d in depths:
        tokens = parted(p, d) if d < len(p) else p
        logits, resumed = cached_prefill(model, tokens, cache)
        assert resumed == d
        assert np.abs(logits - cold_prefill(model, tokens)).max() <= TOL


def test_states_on_disk_resume_after_a_restart_and_never_for_another_model(jamba_onnx: Path, tmp_path: Path) -> None:
    model = hybridrt.load(jamba_onnx)
    p = random_prompt(60)
    cold, cold_logits = model.generate(p, max_new_tokens=8), cold_prefill(model, p + [7])
    # A budget of one byte: every state moves to disk as soon as it is stored.
    first = model.state_cache(memory_bytes=1, directory=tmp_path, spacing=16)
    model.generate(p, cache=first, max_new_tokens=8)
    assert first.memory <= 1 and first.disk > 0 and first.stats.disk_writes == len(first)
    # A new cache on the directory (a restarted server) finds them.
    again = model.state_cache(directory=tmp_path, spacing=16)
    assert len(again) == len(first) and again.memory == 0
    out, stats = model.generate_with_stats(p, cache=again, max_new_tokens=8)
    assert stats.cached_tokens == len(p) and out == cold and again.stats.disk_reads == 1
    logits, resumed = cached_prefill(model, p + [7], again)
    assert resumed == len(p) and np.abs(logits - cold_logits).max() <= TOL
    # Another export of the same architecture (other weights): same state shapes, another
    # identity, so it never reads these states.
    other = hybridrt.load(exports.export(exports.checkpoint(make_jamba, seed=1)))
    theirs = other.state_cache(directory=tmp_path, spacing=16)
    assert len(theirs) == 0 and theirs.lookup(p + [7]) is None
    assert other.generate_with_stats(p, cache=theirs, max_new_tokens=4)[1].cached_tokens == 0
    with pytest.raises(GenerationError, match="made for this model"):
        other.generate(p, cache=again)


def test_a_damaged_state_file_is_a_miss_not_an_error(jamba_onnx: Path, tmp_path: Path) -> None:
    model = hybridrt.load(jamba_onnx)
    p = random_prompt(40)
    model.generate(p, cache=model.state_cache(memory_bytes=1, directory=tmp_path, spacing=16), max_new_tokens=2)
    for f in tmp_path.rglob("*.bin"):
        f.write_bytes(b"\0" * f.stat().st_size)  # same size, other bytes
    cache = model.state_cache(directory=tmp_path, spacing=16)
    out, stats = model.generate_with_stats(p + [5], cache=cache, max_new_tokens=4)
    assert stats.cached_tokens == 0 and out == model.generate(p + [5], max_new_tokens=4)


def test_an_unwritable_directory_leaves_a_memory_cache_and_a_warning(
    jamba_onnx: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = hybridrt.load(jamba_onnx)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with caplog.at_level(logging.WARNING, "hybridrt.cache"):
        cache = model.state_cache(directory=blocker / "states")
    assert cache.files is None and "cannot be written" in caplog.text
    p = random_prompt(30)
    model.generate(p, cache=cache, max_new_tokens=3)
    assert model.generate_with_stats(p + [9], cache=cache, max_new_tokens=3)[1].cached_tokens == len(p)


def test_memory_stays_in_budget_and_valued_states_stay(jamba_onnx: Path) -> None:
    model = hybridrt.load(jamba_onnx)
    stepper = model.stepper(1, 64)
    stepper.forward(np.asarray([random_prompt(8)], dtype=np.int64))
    row = stepper.row(0)
    cache = model.state_cache(memory_bytes=3 * row.nbytes + 10)
    keys = [[k] * 8 for k in range(3, 9)]
    cache.put(keys[0], row)
    for _ in range(5):  # a state that keeps saving prefills is worth keeping
        assert cache.lookup(keys[0] + [1]) is not None
    for key in keys[1:]:
        cache.put(key, row)
        assert cache.memory <= cache.memory_bytes
    assert cache.lookup(keys[0] + [1]) is not None  # outlived five newer ones
    assert cache.lookup(keys[1] + [1]) is None  # the oldest never-used one left
    assert len(cache) == 3 and cache.stats.evictions == 3


def test_a_state_is_valued_by_what_it_saves_beyond_its_stored_ancestor(jamba_onnx: Path) -> None:
    """Request ends a few tokens past a long shared prefix save only those tokens (the prefix's
    own checkpoint serves the rest): they leave before fresh prompts' states when memory is
    short, though each holds more tokens."""
    model = hybridrt.load(jamba_onnx)

    def snapshot(tokens: list[int]) -> Snapshot:
        stepper = model.stepper(1, len(tokens) + 4)
        stepper.forward(np.asarray([tokens], dtype=np.int64))
        return stepper.row(0)

    shared = random_prompt(40, seed=1)
    ends = [shared + random_prompt(4, seed=10 + k) for k in range(3)]
    fresh = [random_prompt(24, seed=20 + k) for k in range(4)]
    rows = {tuple(t): snapshot(t) for t in [shared, *ends, *fresh]}
    probe = model.state_cache(memory_bytes=2**28)  # what all but the last hold (the ends share the prefix's KV)
    for tokens in [shared, *ends, *fresh[:3]]:
        probe.put(tokens, rows[tuple(tokens)])
    cache = model.state_cache(memory_bytes=probe.memory + rows[tuple(fresh[3])].nbytes // 2)
    for tokens in [shared, *ends, *fresh]:
        cache.put(tokens, rows[tuple(tokens)])
        assert cache.memory <= cache.memory_bytes
    assert cache.stats.evictions == 1
    # The one that left is a request end (the oldest); the shared prefix and every fresh prompt stay.
    assert [cache.lookup(t + [1]).snapshot.length for t in ends] == [40, 44, 44]  # type: ignore[union-attr]
    assert all(cache.lookup(t + [1]).snapshot.length == len(t) for t in [shared, *fresh])  # type: ignore[union-attr]


def test_memory_and_disk_stay_in_budget_at_every_moment_not_only_after_a_put(jamba_onnx: Path, tmp_path: Path) -> None:
    """Room is made before an entry counts: at each state file written (an eviction to disk, the
    slow moment a /metrics reader sees) memory and disk are already within their budgets."""
    model = hybridrt.load(jamba_onnx)
    stepper = model.stepper(1, 64)
    stepper.forward(np.asarray([random_prompt(8)], dtype=np.int64))
    row = stepper.row(0)
    n = row.nbytes
    cache = model.state_cache(memory_bytes=2 * n + 10, directory=tmp_path, disk_bytes=3 * n + 10)
    assert cache.files is not None
    seen: list[tuple[int, int]] = []
    write = cache.files.write

    def watched(*args: object, **kwargs: object) -> str:
        seen.append((cache.memory, cache.disk))
        return write(*args, **kwargs)  # type: ignore[arg-type]

    cache.files.write = watched  # type: ignore[method-assign]
    keys = [[k] * 8 for k in range(3, 12)]
    for key in keys:
        cache.put(key, row)
        assert cache.memory <= cache.memory_bytes and cache.disk <= cache.files.cap
    assert len(seen) == len(keys) - 2  # every entry past the first two went to disk
    assert all(memory <= cache.memory_bytes and disk + n <= cache.files.cap for memory, disk in seen), seen
    kept = [key for key in keys if cache.depth(key + [1]) == 8]  # (depth reads nothing back)
    assert len(kept) == len(cache) == 5  # two in memory, three on disk
    on_disk = [e for e in cache.entries if e.states is None]
    assert len(on_disk) == 3
    seen.clear()
    assert cache.lookup(list(on_disk[0].node.key()) + [1]) is not None  # read back: one moves out
    assert cache.memory <= cache.memory_bytes and cache.disk <= cache.files.cap
    assert all(memory <= cache.memory_bytes and disk + n <= cache.files.cap for memory, disk in seen), seen


def test_checkpoints_inside_a_prompt_follow_its_length(jamba_onnx: Path, llama_onnx: Path) -> None:
    jamba, llama = hybridrt.load(jamba_onnx), hybridrt.load(llama_onnx)
    assert spacing_for(8000, 0, 1e-3) == 512 and spacing_for(100, 0, 1e-3) == MIN_SPACING
    assert spacing_for(10**6, 0, 1e-3) == 8192
    # States that take longer to read back than 1,000 tokens take to prefill: no closer than that.
    assert spacing_for(8000, int(READ_BYTES_PER_S), 1e-3) == 1024
    assert llama.state_cache().plan(list(range(3, 900)), 0) == [897]  # KV alone: cut to any prefix
    cache = jamba.state_cache()
    cache.seconds_per_token = 1.0  # reading states back is never the limit here
    marks = cache.plan(list(range(3, 4099)), 0)  # 4096 new tokens: every 256
    assert marks == [*range(256, 4096, 256), 4096 - TAIL, 4096]
    assert cache.plan(list(range(3, 4099)), 3900) == [4096 - TAIL, 4096]  # 196 new tokens: tail and end
    assert cache.plan(list(range(3, 4099)), 3900, tail=False) == [4096]  # a row continued exactly
    assert jamba.state_cache(spacing=256).plan(list(range(3, 900)), 100) == [256, 512, 768, 897 - TAIL, 897]
    # Not within a quarter spacing after the start (512: 12 past 500) or before the tail (1024).
    assert cache.plan(list(range(3, 1103)), 500) == [768, 1024, 1100 - TAIL, 1100]
    assert cache.plan(list(range(3, 1073)), 500) == [768, 1070 - TAIL, 1070]
    # A conversation's turn (fewer new tokens than two spacings) is not split by one: its tail
    # and end only, where a checkpoint at 768 would have cost a call.
    assert cache.plan(list(range(3, 903)), 600) == [900 - TAIL, 900]
    assert cache.plan(list(range(3, 1115)), 600) == [768, 1024, 1112 - TAIL, 1112]  # 512 new tokens
    # A call takes a few tokens more rather than leave them to a call of their own.
    assert chunk_end(0, 128, 150, [146, 150]) == 146 and chunk_end(146, 128, 150, [146, 150]) == 150
    assert chunk_end(0, 128, 170, [166, 170]) == 128 and chunk_end(0, 128, 400, [256]) == 128


def test_a_chat_session_resumes_a_conversation_a_cache_has_seen(jamba_onnx: Path) -> None:
    model = hybridrt.load(jamba_onnx)
    cache = model.state_cache()
    turns = [random_prompt(20, seed=s) for s in range(3)]
    chat = model.session(cache=cache)
    replies = [chat.generate(t, max_new_tokens=5) for t in turns]
    # A new session (another process, a reloaded page) replays the same conversation: every
    # turn resumes where the last reply ended.
    again = model.session(cache=cache)
    for t, reply in zip(turns, replies):
        out, stats = again.generate_with_stats(t, max_new_tokens=5)
        assert out == reply and stats.cached_tokens > 0
    # The first session's later turns continued its row exactly: no checkpoint before their
    # ends (prefix_plan's tail); its first prompt, from nothing, has one.
    depths = {e.length for e in cache.entries}
    second = turns[0] + replies[0] + turns[1]
    assert 20 - cache.tails.of(turns[0]) in depths and len(second) in depths
    assert len(second) - cache.tails.of(second) not in depths


def test_cache_options_are_checked(jamba_onnx: Path) -> None:
    model = hybridrt.load(jamba_onnx)
    cache = model.state_cache()
    with pytest.raises(GenerationError, match="one prompt"):
        model.generate([random_prompt(5), random_prompt(6)], cache=cache)
    with pytest.raises(GenerationError, match="beam search"):
        model.generate(random_prompt(5), cache=cache, num_beams=2)
    with pytest.raises(GenerationError, match="memory_bytes must be"):
        model.state_cache(memory_bytes=-1)


def test_bfloat16_states_take_half_the_memory_and_resume_close(model: hybridrt.runtime.Model, tmp_path: Path) -> None:
    """The opt-in stored form: float32 states kept as bfloat16 take about half the bytes; a
    request resumed from them is close to a cold one (logits within 1% of their scale here: the
    measured worst is 0.34%, Granite-4.0-H's Mamba2 states) and greedy decoding gives the same
    tokens on these models; on disk they live apart, so an exact cache never reads them."""
    p = random_prompt(60)
    cold = cold_prefill(model, p + [7])
    exact = model.state_cache(spacing=16)
    half = model.state_cache(spacing=16, stored="bfloat16")
    on_disk = model.state_cache(memory_bytes=1, directory=tmp_path, spacing=16)  # every state goes to disk
    for cache in (exact, half, on_disk):
        model.generate(p, cache=cache, max_new_tokens=8)
    assert len(half) == len(exact) and half.memory < 0.55 * exact.memory
    logits, resumed = cached_prefill(model, p + [7], half)
    assert resumed == len(p) and 0 < np.abs(logits - cold).max() <= 0.01 * np.abs(cold).max()
    out, stats = model.generate_with_stats(p, cache=half, max_new_tokens=16)
    assert stats.cached_tokens > 0 and out == model.generate(p, max_new_tokens=16)
    half_on_disk = model.state_cache(memory_bytes=1, directory=tmp_path, spacing=16, stored="bfloat16")
    assert len(half_on_disk) == 0  # the exact cache's files are not its
    model.generate(p, cache=half_on_disk, max_new_tokens=8)
    assert len(half_on_disk) > 0 and half_on_disk.disk < 0.55 * on_disk.disk
    assert len(model.state_cache(directory=tmp_path, spacing=16)) == len(on_disk)  # nor its files the exact one's
    with pytest.raises(GenerationError, match="stored must be"):
        model.state_cache(stored="int8")


def test_a_state_read_for_a_peer_counts_no_hit_here_and_depth_reads_nothing(jamba_onnx: Path) -> None:
    """A replica that hands a state to another (deploy/ray_peers.py) reads it uncounted: the
    receiver counts the hit it resumes from. depth() says how far the cache reaches, no read."""
    model = hybridrt.load(jamba_onnx)
    p = random_prompt(150)
    cache = model.state_cache(memory_bytes=2**28, spacing=64)
    model.generate(p, cache=cache, max_new_tokens=2)
    longer = p + random_prompt(30, seed=3)
    before = (cache.stats.lookups, cache.stats.hits, cache.stats.hit_tokens, cache.stats.disk_reads)
    have = cache.depth(longer)
    peer = cache.lookup(longer, counted=False)
    assert peer is not None and have == peer.snapshot.length >= 64
    assert (cache.stats.lookups, cache.stats.hits, cache.stats.hit_tokens, cache.stats.disk_reads) == before
    assert cache.depth(random_prompt(40, seed=4)) == 0
    assert cache.lookup(longer) is not None and cache.stats.hits == before[1] + 1


def test_a_bfloat16_state_moves_to_a_peer_as_kept(jamba_onnx: Path) -> None:
    """Between replicas (deploy/ray_peers.py) a state moves in the form the holder keeps it: a
    bfloat16 cache sends half the bytes of an exact one, a bfloat16 receiver stores them as they
    came, and an exact receiver widens them; each then resumes from the same states."""
    from hybridrt.deploy.ray_peers import received, snapshot_for, state_bytes

    model = hybridrt.load(jamba_onnx)
    p = random_prompt(90)
    exact, half = model.state_cache(spacing=32), model.state_cache(spacing=32, stored="bfloat16")
    for cache in (exact, half):
        model.generate(p, cache=cache, max_new_tokens=4)
    sent_exact, sent_half = snapshot_for(exact, p + [7], 1), snapshot_for(half, p + [7], 1)
    assert sent_exact is not None and sent_half is not None and sent_half["length"] == sent_exact["length"]
    moved = [sum(x.nbytes for x in sent["states"]) for sent in (sent_exact, sent_half)]
    assert moved[1] < 0.55 * moved[0] and moved == [state_bytes(c, sent_half["length"]) for c in (exact, half)]
    want = half.lookup(p + [7], counted=False)
    assert want is not None
    for receiver in (model.state_cache(stored="bfloat16"), model.state_cache()):
        snapshot, logits = received(receiver, sent_half)
        receiver.put((p + [7])[: snapshot.length], snapshot, logits)
        got = receiver.lookup(p + [7])
        assert got is not None and got.snapshot.length == want.snapshot.length
        assert all(np.array_equal(a, b) for a, b in zip(got.snapshot.states, want.snapshot.states))


def test_a_row_s_fixed_states_are_copied_into_one_block_made_ready_while_idle(jamba_onnx: Path) -> None:
    """A stored row's fixed-size states are views of one block; idle time makes blocks ready
    within the budget (new while there is room, then the least valued entry's), the next
    copies take them, and a block something still reads is never reused (runtime.host_blocks)."""
    model = hybridrt.load(jamba_onnx)
    stepper = model.stepper(1, 64)
    stepper.forward(np.asarray([random_prompt(8)], dtype=np.int64))
    plain = stepper.row(0)
    block_bytes = StateCache.for_model(model, memory_bytes=1).block_bytes
    fits = -(-64 * block_bytes // plain.nbytes)  # ready blocks: at most 1/16 of the budget
    cache = model.state_cache(memory_bytes=fits * plain.nbytes)
    fixed = [not s.is_kv for s in model.manifest.pasts]
    snap = stepper.row(0, cache.blocks)
    assert snap.block is not None and snap.block.nbytes == cache.block_bytes
    assert all(x.base is snap.block for x, f in zip(snap.states, fixed) if f)
    assert all(np.array_equal(a, b) for a, b in zip(snap.states, plain.states))
    made = 0
    while cache.prepare():
        made += 1
        assert cache.memory + cache.blocks.held() <= cache.memory_bytes
    assert made == cache.keep_ready == 4
    ready = {id(b) for b in cache.blocks.ready}
    keys = [[k] * 8 for k in range(3, 3 + fits)]
    for key in keys[:2]:
        taken = stepper.row(0, cache.blocks)
        assert id(taken.block) in ready  # a ready block, not new memory
        cache.put(key, taken)
    for key in keys[2:]:  # to the budget: ready blocks go first, then entries
        cache.put(key, stepper.row(0, cache.blocks))
        assert cache.memory + cache.blocks.held() <= cache.memory_bytes
    assert not cache.blocks.ready and len(cache) == fits
    # Idle again, full: the least valued entry leaves and its memory is kept ready...
    victim = min(cache.entries, key=lambda e: (e.priority, e.used))
    victim_block = id(victim.block)
    del victim
    assert cache.prepare() and [id(b) for b in cache.blocks.ready] == [victim_block] and len(cache) == fits - 1
    # ... unless something still reads its states: that entry leaves, its block is not kept.
    victim = min(cache.entries, key=lambda e: (e.priority, e.used))
    read, copy = victim.states, [np.array(x) for x in victim.states or []]
    del victim
    assert not cache.prepare() and len(cache.blocks.ready) == 1 and len(cache) == fits - 2
    while cache.prepare():
        pass
    for k in range(3):  # the ready block is taken, new ones made: the one still read is not reused
        stepper.forward(np.asarray([[7 + k]], dtype=np.int64))  # (other states than the read ones)
        cache.put([500 + k] * int(stepper.lengths[0]), stepper.row(0, cache.blocks))
    assert read is not None and all(np.array_equal(a, b) for a, b in zip(read, copy))


def test_a_conversation_s_passed_checkpoints_leave_before_another_s_last(jamba_onnx: Path) -> None:
    """Each turn of a conversation resumes past its earlier turns' checkpoints (a pass each):
    when memory runs short, those leave first, and an older conversation keeps its last state,
    the one its next turn resumes from. Regression: every checkpoint was valued by the turn it
    saves beyond the one before it, the last state as any other, and four conversations in a
    512 MiB cache at the granite-h-350m shape kept nothing of the oldest one."""
    model = hybridrt.load(jamba_onnx)
    turns = {c: [random_prompt(32, seed=c)[: 8 * (t + 1)] for t in range(4)] for c in (1, 2)}
    rows = {}
    for c, prompts in turns.items():
        stepper = model.stepper(1, 40)
        for t, p in enumerate(prompts):
            stepper.forward(np.asarray([p[8 * t :]], dtype=np.int64))
            rows[c, t] = stepper.row(0)

    def converse(cache: StateCache, c: int) -> None:
        for t, p in enumerate(turns[c]):
            hit = cache.lookup(p)  # as a conversation resent as text: a hit on the last turn's end
            assert (hit.snapshot.length if hit else 0) == 8 * t
            cache.plan(p, 8 * t)
            cache.put(p, rows[c, t])
            assert cache.memory <= cache.memory_bytes

    probe = model.state_cache(memory_bytes=2**28)
    converse(probe, 1)
    cache = model.state_cache(memory_bytes=probe.memory + rows[2, 0].nbytes)
    converse(cache, 1)
    converse(cache, 2)
    assert cache.stats.evictions >= 2
    for c in (1, 2):  # each conversation's next turn resumes from its last state
        assert cache.lookup(turns[c][-1] + [1]).snapshot.length == 32  # type: ignore[union-attr]
