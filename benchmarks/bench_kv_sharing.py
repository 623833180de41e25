"""What a prefix state cache holds of long multi-turn conversations, and what a store and a
lookup cost per entry (runtime.kv_pieces: KV shared between the entries of one path).

    python benchmarks/bench_kv_sharing.py MODEL_DIR [--conversations 4] [--turns 30]
        [--user 100] [--reply 30] [--budget-mb 2]

Each conversation is --turns turns of --user random prompt tokens and --reply greedy tokens, in
one state batch as the server keeps a chat's row: the cache stores states where it plans them in
each prompt (runtime.prefix_plan) and at each reply's end. First one conversation in an
unbounded cache: its entries, the bytes they hold, the seconds per store (the row's copy, then
put) and per lookup of each entry. Then every conversation, one after another, in a cache of
--budget-mb: the entries left in memory, the conversations whose last state is still there, and
the conversation tokens the entries in memory resume. Run it against two trees (PYTHONPATH) to
compare them; the figures are the cache's, whatever the model's speed.

Figures (2-core x86 host, shared): the tests' tiny Llama and LFM2 exported with max length
4,096 (tests/exports.py: export(checkpoint(make_llama, max_position_embeddings=4096))), defaults.
One 3,900-token conversation: Llama's 60 entries held 29.3 MiB with a copy of the KV each, 0.99
MiB shared; LFM2's 90 entries 43.9 MiB, 1.03 MiB. In 2 MiB, four conversations: 4 entries kept
(Llama; LFM2: 2), the last state of one conversation, against 120 (LFM2: 141) and two. Median
put 0.14 ms either way (LFM2: 0.17, 0.20 ms: the copy of the positions past the ancestor); a
lookup 0.04 ms, 0.19 ms shared (LFM2: 0.05, 0.27 ms: the pieces joined into one array).
At the serving bench's granite-h-350m int4 shape (--conversations 4 --turns 16 --budget-mb 512,
27 MB of fixed states a checkpoint): the kept entries resume 8,218 of the conversations' tokens
(each keeps a state within 34 tokens of its end), against 5,652 when a conversation's
checkpoints that its later turns had passed were valued as any other (runtime.cache_entry).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np

import hybridrt
from hybridrt.runtime.prefix_plan import chunk_end

CHUNK = 256


def conversation(model: Any, cache: Any, seed: int, turns: int, user: int, reply: int) -> tuple[list[int], dict]:
    """One conversation stored in `cache`; its tokens and the seconds of each store."""
    rng = np.random.default_rng(seed)
    vocab = int(model.manifest.vocab_size)
    stepper = model.stepper(1, turns * (user + reply) + 8)
    history: list[int] = []
    times: dict[str, list[float]] = {"row": [], "put": []}

    def store(end: int, logits: np.ndarray | None) -> None:
        t0 = time.perf_counter()
        row = stepper.row(0, cache.blocks)
        t1 = time.perf_counter()
        cache.put(history[:end], row, logits)
        times["row"].append(t1 - t0)
        times["put"].append(time.perf_counter() - t1)

    for _ in range(turns):
        seen = len(history)
        history += rng.integers(3, vocab, user).tolist()
        marks = cache.plan(history, seen)
        while seen < len(history):
            end = chunk_end(seen, CHUNK, len(history), marks)
            logits = np.array(stepper.forward(np.asarray([history[seen:end]], dtype=np.int64)))
            seen = end
            if end in marks:
                store(end, logits if end == len(history) else None)
        for _ in range(reply):
            history.append(int(logits[0].argmax()))
            logits = np.array(stepper.forward(np.asarray([[history[-1]]], dtype=np.int64)))
        store(len(history), None)
    return history, times


def lookups(cache: Any, history: list[int]) -> list[float]:
    """Seconds of a lookup resuming from each stored state on history's path."""
    out = []
    for node, _ in cache.tree.match(history).path:
        t0 = time.perf_counter()
        hit = cache.lookup(history[: node.depth] + [1], counted=False)
        out.append(time.perf_counter() - t0)
        assert hit is not None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    for name, default in (("conversations", 4), ("turns", 30), ("user", 100), ("reply", 30)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--budget-mb", type=float, default=2.0)
    args = parser.parse_args()
    model = hybridrt.load(args.model)
    shape = (args.turns, args.user, args.reply)

    one = model.state_cache(memory_bytes=2**34, spacing=None)
    history, times = conversation(model, one, 0, *shape)
    found = lookups(one, history)
    ms = {k: 1e3 * statistics.median(v) for k, v in times.items()} | {"lookup": 1e3 * statistics.median(found)}
    unbounded = {"tokens": len(history), "entries": len(one), "bytes": one.memory, "ms_median": ms}

    budget = int(args.budget_mb * 2**20)
    cache = model.state_cache(memory_bytes=budget, spacing=None)
    stored = [conversation(model, cache, seed, *shape)[0] for seed in range(args.conversations)]
    last_kept = sum(cache.depth(h + [1]) == len(h) for h in stored)
    resumed = sum(max((n.depth for n, _ in cache.tree.match(h).path), default=0) for h in stored)
    bounded = {"budget": budget, "entries": len(cache), "bytes": cache.memory, "last_states_kept": last_kept}
    bounded |= {"conversations": args.conversations, "tokens_resumed": resumed, "evictions": cache.stats.evictions}

    print(
        f"one conversation, {len(history)} tokens: {len(one)} entries hold {one.memory / 2**20:.2f} MiB; "
        f"median ms per store: row {ms['row']:.3f} + put {ms['put']:.3f}; per lookup {ms['lookup']:.3f}"
    )
    print(
        f"{args.conversations} conversations in {budget / 2**20:.2f} MiB: {len(cache)} entries kept "
        f"({cache.memory / 2**20:.2f} MiB), {last_kept} last states kept, {resumed} tokens resumed, "
        f"{cache.stats.evictions} evictions"
    )
    print(json.dumps({"unbounded": unbounded, "bounded": bounded}))


if __name__ == "__main__":
    main()
