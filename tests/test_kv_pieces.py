"""KV shared between the prefix cache's entries on one path (hybridrt.runtime.kv_pieces): an
entry copies only the positions past its nearest ancestor in memory, a request resumed from any
entry gets a cold request's tokens and logits, and the cache's memory counts each piece once, at
every moment, through ancestors that leave while their descendants still hold their KV."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from resuming import cached_prefill, cold_prefill, parted, random_prompt

import hybridrt
from hybridrt.runtime.cache_entry import Entry
from hybridrt.runtime.kv_pieces import Spans
from hybridrt.runtime.prefix_cache import StateCache
from hybridrt.runtime.state import Snapshot

TOL = 1e-5


@pytest.fixture(scope="module", params=["jamba", "llama"])
def model(request: pytest.FixtureRequest) -> hybridrt.runtime.Model:
    """Mamba1 + attention, and attention only (all of its states are KV)."""
    return hybridrt.load(request.getfixturevalue(f"{request.param}_onnx"))


def _row(model: hybridrt.runtime.Model, tokens: list[int]) -> Snapshot:
    stepper = model.stepper(1, len(tokens) + 4)
    stepper.forward(np.asarray([tokens], dtype=np.int64))
    return stepper.row(0)


def _held(cache: StateCache) -> int:
    """Bytes the entries in memory hold, counted from the arrays themselves: the memory each
    array is a view of (its base's), once however many entries refer to it; and the KV pieces
    of an entry being stored (its own states count once it is in)."""
    roots: dict[int, int] = {}
    for _, entry in cache.tree.values():
        if entry.states is None:
            continue
        own = [*entry.states, *([] if entry.logits is None else [entry.logits])] if entry in cache.entries else []
        for x in own + [a for piece in entry.kv for a in piece.arrays]:
            while isinstance(x.base, np.ndarray):
                x = x.base
            roots[id(x)] = x.nbytes
    return sum(roots.values())


def _entry(cache: StateCache, tokens: list[int]) -> Entry:
    node, entry = cache.tree.match(tokens).path[0]
    assert node.depth == len(tokens)
    return entry


@pytest.mark.parametrize("stored", ["float32", "bfloat16"])
def test_entries_on_a_path_hold_each_position_s_kv_once(model: hybridrt.runtime.Model, stored: str) -> None:
    p = random_prompt(120)
    branch = p[:60] + random_prompt(30, seed=1)
    rows = {d: _row(model, p[:d]) for d in (30, 60, 90, 120)}
    cache = model.state_cache(memory_bytes=2**28, stored=stored)
    for d, row in rows.items():
        cache.put(p[:d], row)
        assert cache.memory == _held(cache)
    cache.put(branch, _row(model, branch))
    assert cache.memory == _held(cache)
    # Each entry holds its ancestor's pieces (the same arrays) and a piece of its own positions.
    entries = [_entry(cache, p[:d]) for d in (30, 60, 90, 120)]
    for above, below in zip(entries, entries[1:]):
        assert below.kv[:-1] == above.kv and below.kv[-1].start == above.length
    assert _entry(cache, branch).kv[:-1] == entries[1].kv
    # Five entries' fixed states, 150 distinct positions of KV (120 on the path, 30 on the branch).
    narrow = 2 if stored == "bfloat16" else 1
    per_token = (rows[60].nbytes - rows[30].nbytes) // 30 // narrow
    fixed = (rows[30].nbytes - 30 * per_token * narrow) // narrow
    assert cache.memory == 5 * fixed + 150 * per_token
    assert cache.memory < 0.6 * (sum(r.nbytes for r in rows.values()) + rows[90].nbytes) // narrow


def test_requests_resumed_from_shared_pieces_match_cold_ones(model: hybridrt.runtime.Model) -> None:
    """Entries along a conversation (checkpoints inside each turn's prompt, its tail and end)
    resume with a cold prefill's logits and greedy tokens, their KV joined from several pieces."""
    vocab = int(model.manifest.vocab_size)
    cache = model.state_cache(memory_bytes=2**28, spacing=32)
    history = random_prompt(100, vocab=vocab)
    for turn in range(3):
        reply = model.generate(history, cache=cache, max_new_tokens=6)
        history = history + reply + random_prompt(40, seed=turn + 1, vocab=vocab)
    out, stats = model.generate_with_stats(history, cache=cache, max_new_tokens=8)
    assert out == model.generate(history, max_new_tokens=8) and stats.cached_tokens > 0
    depths = [n.depth for n, _ in cache.tree.match(history).path]
    assert max(len(_entry(cache, history[:d]).kv) for d in depths) >= 4
    for d in depths:
        tokens = parted(history, d) if d < len(history) else history
        logits, resumed = cached_prefill(model, tokens, cache)
        assert resumed == d and np.abs(logits - cold_prefill(model, tokens)).max() <= TOL
    out, stats = model.generate_with_stats(history[: depths[0]] + [5, 9], cache=cache, max_new_tokens=8)
    assert stats.cached_tokens == depths[0] and out == model.generate(history[: depths[0]] + [5, 9], max_new_tokens=8)
    if not model.manifest.recurrent:  # KV alone: cut to where a request parts, across pieces
        tokens = history[: depths[1] + 7] + [5]
        logits, resumed = cached_prefill(model, tokens, cache)
        assert resumed == depths[1] + 7 and np.abs(logits - cold_prefill(model, tokens)).max() <= TOL


def test_an_evicted_entry_frees_only_what_no_other_entry_holds(model: hybridrt.runtime.Model) -> None:
    """An ancestor leaves while its descendants hold its KV: the pieces stay (counted), it frees
    its fixed states only; the last holder leaving frees them. A descendant's bytes for valuing
    are its own; an ancestor whose pieces all descendants share frees only its fixed states."""
    p = random_prompt(80)
    cache = model.state_cache(memory_bytes=2**28)
    for d in (40, 60, 80):
        cache.put(p[:d], _row(model, p[:d]))
    a, b, c = (_entry(cache, p[:d]) for d in (40, 60, 80))
    assert a.unshared() == b.unshared() == a.own() and c.unshared() > c.own()
    for _ in range(5):  # b and c save prefills: a is the least valued (on a model with fixed states)
        for d in (60, 80):
            assert cache.lookup(p[:d] + [7]) is not None
    fresh = random_prompt(8, seed=3)
    row = _row(model, fresh)
    before, shared, fixed = cache.memory, a.kv[0], a.own()
    cache.memory_bytes = before + row.nbytes - 1  # one eviction's room
    cache.put(fresh, row)
    assert cache.stats.evictions == 1 and cache.memory == _held(cache) <= cache.memory_bytes
    if model.manifest.recurrent:
        assert a not in cache.entries and shared.holders == {b, c} and b.kv[0] is shared
        assert cache.memory == before + row.nbytes - fixed
    else:  # a and b free nothing (no fixed states): c, the leaf, leaves first, its own piece freed
        assert c not in cache.entries and cache.memory == before + row.nbytes - c.nbytes + b.nbytes
        assert b.unshared() == b.kv[-1].nbytes and a.unshared() == 0
    for d in (60, 80) if model.manifest.recurrent else (40, 60):
        logits, resumed = cached_prefill(model, p[:d] + [7], cache)
        assert resumed == d and np.abs(logits - cold_prefill(model, p[:d] + [7])).max() <= TOL
    last = random_prompt(8, seed=4)
    cache.memory_bytes = row.nbytes  # room for one fresh prompt alone: the path leaves whole
    cache.put(last, _row(model, last))
    assert cache.memory == _held(cache) == row.nbytes and not shared.holders


def test_a_shared_entry_goes_to_disk_whole_and_comes_back_alone(model: hybridrt.runtime.Model, tmp_path: Path) -> None:
    p = random_prompt(80)
    cache = model.state_cache(memory_bytes=2**28, directory=tmp_path)
    for d in (40, 80):
        cache.put(p[:d], _row(model, p[:d]))
    deep = _entry(cache, p)
    assert len(deep.kv) == 2
    fresh = random_prompt(8, seed=3)
    row = _row(model, fresh)
    cache.memory_bytes = cache.memory + row.nbytes - 1  # the deep entry (its own KV) moves to disk
    cache.put(fresh, row)
    assert deep.states is None and not deep.kv and cache.memory == _held(cache) <= cache.memory_bytes
    assert deep.file is not None and cache.disk == deep.nbytes == _row(model, p).nbytes
    assert (cache.files.where / f"{deep.file}.bin").stat().st_size == deep.nbytes  # type: ignore[union-attr]
    cache.memory_bytes = 2**28
    hit = cache.lookup(p + [7])
    assert hit is not None and hit.snapshot.length == len(p) and cache.stats.disk_reads == 1
    assert len(deep.kv) == 1 and deep.kv[0].holders == {deep} and cache.memory == _held(cache)
    logits, resumed = cached_prefill(model, p + [7], cache)
    assert resumed == len(p) and np.abs(logits - cold_prefill(model, p + [7])).max() <= TOL
    # A restarted cache reads it as it was written: whole, exact.
    again = model.state_cache(memory_bytes=2**28, directory=tmp_path)
    logits, resumed = cached_prefill(model, p + [7], again)
    assert resumed == len(p) and np.abs(logits - cold_prefill(model, p + [7])).max() <= TOL


def test_memory_counts_each_piece_once_at_every_moment(model: hybridrt.runtime.Model, tmp_path: Path) -> None:
    """A conversation with side questions in a small budget with a disk tier: after every
    store, eviction, file written and read back, the memory counted is the memory held, within
    the budget (which holds the longest entry alone, not the conversation)."""
    vocab = int(model.manifest.vocab_size)
    largest = _row(model, random_prompt(300, vocab=vocab)).nbytes
    cache = model.state_cache(memory_bytes=int(1.2 * largest), directory=tmp_path, spacing=32)
    assert cache.files is not None
    seen: list[tuple[int, int]] = []
    write = cache.files.write

    def watched(*args: object, **kwargs: object) -> str:
        seen.append((cache.memory, _held(cache)))
        return write(*args, **kwargs)  # type: ignore[arg-type]

    cache.files.write = watched  # type: ignore[method-assign]
    history, asked = random_prompt(60, vocab=vocab), []
    for turn in range(6):
        side = history[: len(history) // 2] + random_prompt(20, seed=50 + turn, vocab=vocab)
        for prompt in (history, side):
            out, stats = model.generate_with_stats(prompt, cache=cache, max_new_tokens=5)
            assert out == model.generate(prompt, max_new_tokens=5)
            assert turn == 0 or prompt is side or stats.cached_tokens > 0
            assert cache.memory == _held(cache) <= cache.memory_bytes
            asked.append(prompt)
        history = history + out + random_prompt(30, seed=turn + 1, vocab=vocab)
    for prompt in asked:  # some from disk
        assert cache.lookup(prompt + [1]) is not None
        assert cache.memory == _held(cache) <= cache.memory_bytes
    assert cache.stats.evictions > 0 and cache.stats.disk_writes > 0 and cache.stats.disk_reads > 0
    assert seen and all(counted == held <= cache.memory_bytes for counted, held in seen), seen


def test_a_row_stored_from_a_batch_s_buffers_keeps_copies_of_only_its_own_positions(
    model: hybridrt.runtime.Model,
) -> None:
    """A row made for the cache (`row(r, cache.blocks)`) has its KV as views of the batch's
    buffers, so that storing it copies only what the cache keeps: the positions past its nearest
    stored ancestor. What the cache keeps must not be those views: the batch, started again on
    other tokens, overwrites its buffers, and the stored entries still resume as cold ones."""
    vocab = int(model.manifest.vocab_size)
    cache = model.state_cache(memory_bytes=2**28)
    p = random_prompt(60, vocab=vocab)
    batch = model.stepper(1, 128)
    batch.forward(np.asarray([p[:40]], dtype=np.int64))
    cache.put(p[:40], batch.row(0, cache.blocks))  # no ancestor: its whole KV, copied
    batch.forward(np.asarray([p[40:]], dtype=np.int64))
    cache.put(p, batch.row(0, cache.blocks))  # positions 40..60 only
    first, second = _entry(cache, p[:40]), _entry(cache, p)
    assert [(piece.start, piece.end) for piece in second.kv] == [(0, 40), (40, 60)]
    assert second.kv[0] is first.kv[0]
    buffers = batch._arrays()
    for piece in second.kv:
        assert not any(np.shares_memory(a, x) for a in piece.arrays for x in buffers)
    batch.restart(None, 128)
    batch.forward(np.asarray([random_prompt(100, seed=5, vocab=vocab)], dtype=np.int64))  # other tokens now
    for tokens in (parted(p, 40), [*p, 3]):
        logits, resumed = cached_prefill(model, tokens, cache)
        assert resumed == len(tokens) - 1
        assert np.abs(logits - cold_prefill(model, tokens)).max() <= TOL


def test_a_lookup_s_kv_of_several_pieces_goes_into_a_batch_unjoined(model: hybridrt.runtime.Model) -> None:
    """A lookup gives an entry's KV of several pieces as the pieces' views (kv_pieces.Spans): a
    state batch's row takes them span by span, with no joined copy made first (on a long
    conversation's turn that copy was milliseconds before its first token). Read any other way,
    it is the joined array. Rows resumed from it, bound or plain, match a cold prefill."""
    vocab = int(model.manifest.vocab_size)
    cache = model.state_cache(memory_bytes=2**28)
    p = random_prompt(90, vocab=vocab)
    for d in (30, 60, 90):
        cache.put(p[:d], _row(model, p[:d]))
    tokens = [*p, 3]
    hit = cache.lookup(tokens)
    assert hit is not None and hit.snapshot.length == 90
    kv = [x for s, x in zip(model.manifest.pasts, hit.snapshot.states) if s.is_kv]
    pieces = _entry(cache, p).kv
    assert kv and all(isinstance(x, Spans) and len(x.parts) == len(pieces) == 3 for x in kv)
    assert all(
        np.shares_memory(part, piece.arrays[i]) for i, x in enumerate(kv) for part, piece in zip(x.parts, pieces)
    )
    cold = cold_prefill(model, tokens)
    stepper = model.stepper(1, 128)
    stepper.set_row(0, hit.snapshot.states, hit.snapshot.length)
    assert all(x._joined is None for x in kv)  # copied in span by span
    assert np.abs(stepper.forward(np.asarray([[3]], dtype=np.int64)) - cold).max() <= TOL
    plain = hybridrt.load(model.path, io_binding=False).stepper(1, 128)
    plain.set_row(0, hit.snapshot.states, hit.snapshot.length)
    assert np.abs(plain.forward(np.asarray([[3]], dtype=np.int64)) - cold).max() <= TOL
    for x in kv:
        joined = np.asarray(x)
        assert joined.shape == x.shape and x.shape[x.axis] == 90
        assert np.array_equal(joined, np.concatenate(x.parts, axis=x.axis)) and x[0].shape == joined[0].shape
        np.array(x)[...] = 0  # a copy asked for is the caller's own
        assert np.array_equal(np.asarray(x), joined) and np.abs(joined).max() > 0
