"""States that move between Ray Serve replicas instead of being prefilled again.

A conversation's states live in the prefix state cache of the replica that served it. When
its next turn lands elsewhere (the holder is busy past the affinity bound, or a new replica
takes load), that replica can fetch the holder's deepest state of the prompt through Ray's
object store and prefill only the rest. Measured on a 2-core host (granite-h-350m int4, one
thread, docs/bench/ray.md): prefill ~5.4 ms a token, a 25.7 MiB float32 state moved between
two replicas' processes in 19-28 ms, so a move wins from a few tokens of prefix on.

- `StateDirectory` (a deployment, one replica, no CPU) remembers which replica answered each
  prompt-prefix digest (ray_serve.affinity_keys), as the router does in the front.
- `PeerStates` (each engine replica's, installed as the server's `state_source`): before a
  request is queued, if its engine's cache holds less of the prompt than it could gain, it
  asks the directory for the holder and that replica (`EngineReplica.state`, routed to it by
  the AffinityRouter) for a state deeper than its own, and stores it in its cache; the engine
  then resumes from it as from any cached state.
- `TransferCost` decides: a fetch is tried only where the prefill seconds it would save (the
  cache's measured seconds per token) exceed the move's expected time (a fixed latency plus
  the state's bytes at the measured seconds per byte, refined by every move).
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..graphs.contract import state_bytes_per_sequence
from ..runtime.prefix_cache import StateCache
from ..runtime.state import Snapshot, widened

REPLICA_KEY = "replica:"  # a call's routing key naming the one replica it must reach
KEYS = "hybridrt.prefix_keys"  # scope entries: the request's prefix digests (set by the replica),
FETCHED = "hybridrt.state_from"  # ... and what a fetch brought (set by PeerStates.fill)
MAX_KEYS = 200_000


class StateDirectory:
    """prefix digest -> the replica that last answered a request with that prefix."""

    def __init__(self) -> None:
        self.holders: OrderedDict[str, str] = OrderedDict()

    def record(self, keys: list[str], replica: str) -> None:
        for key in keys:
            self.holders[key] = replica
            self.holders.move_to_end(key)
        while len(self.holders) > MAX_KEYS:
            self.holders.popitem(last=False)

    def holder(self, keys: list[str]) -> str | None:
        """The replica of the longest known prefix among `keys` (shortest first)."""
        return next((self.holders[k] for k in reversed(keys) if k in self.holders), None)


@dataclass
class TransferCost:
    """The expected time of moving a state between replicas: `latency_s` plus bytes at
    `seconds_per_byte` (starting guesses; each move refines them)."""

    latency_s: float = 0.010
    seconds_per_byte: float = 1e-9  # 1 GB/s

    def seconds(self, nbytes: int) -> float:
        return self.latency_s + nbytes * self.seconds_per_byte

    def worth(self, tokens: int, nbytes: int, seconds_per_token: float) -> bool:
        """Whether prefilling `tokens` takes longer than moving `nbytes` of states."""
        return tokens > 0 and tokens * seconds_per_token > self.seconds(nbytes)

    def observe(self, nbytes: int, seconds: float) -> None:
        per_byte = max(seconds - self.latency_s, 0.0) / max(nbytes, 1)
        self.seconds_per_byte = 0.7 * self.seconds_per_byte + 0.3 * per_byte


def state_bytes(cache: StateCache, length: int) -> int:
    """Bytes of a state after `length` tokens as it moves: the fixed-size states plus `length`
    positions of KV, in the form the cache keeps them (float32 as bfloat16: half)."""
    halved = cache.stored == "bfloat16"
    return sum(
        state_bytes_per_sequence(s) // (2 if halved and s.dtype == "float32" else 1) * (length if s.is_kv else 1)
        for s in cache.pasts
    )


class PeerStates:
    """The server's `state_source` in an engine replica (see the module docstring)."""

    def __init__(self, name: str, directory: Any, engines: Callable[[], Any], cost: TransferCost | None = None) -> None:
        self.name = name
        self.directory = directory  # the StateDirectory deployment's handle
        self.engines = engines  # the engine deployment's handle (made on first use)
        self.cost = cost or TransferCost()
        self.sent: deque[Any] = deque(maxlen=64)

    def record(self, keys: list[str]) -> None:
        """This replica answered a request with these prefixes (sent, not awaited: the last
        few responses are kept so that none is dropped before it is sent)."""
        if keys:
            self.sent.append(self.directory.record.remote(keys, self.name))

    async def fill(self, model: str, cache: StateCache, tokens: Sequence[int], scope: dict[str, Any]) -> None:
        keys = scope.get(KEYS)
        if not keys or not cache.enabled:
            return
        have = cache.depth(tokens)
        gain = len(tokens) - 1 - have  # a fetched state leaves at least the last token to feed
        if not self.cost.worth(gain, state_bytes(cache, len(tokens)), cache.seconds_per_token):
            return
        holder = await self.directory.holder.remote(keys)
        if holder is None or holder == self.name:
            return
        t0 = time.perf_counter()
        call = self.engines().options(method_name="state")
        got = await call.remote([REPLICA_KEY + holder], holder, model, list(tokens), have + 1)
        if got is None:
            return
        seconds = time.perf_counter() - t0
        nbytes = sum(np.asarray(x).nbytes for x in got["states"])  # as moved
        snapshot, logits = received(cache, got)
        cache.put(list(tokens[: snapshot.length]), snapshot, logits)
        self.cost.observe(nbytes, seconds)
        scope[FETCHED] = {"replica": holder, "tokens": snapshot.length, "bytes": nbytes, "ms": round(seconds * 1000, 1)}


def received(cache: StateCache, got: dict[str, Any]) -> tuple[Snapshot, np.ndarray | None]:
    """A holder's answer (snapshot_for) as this cache takes it: arrays of its own (the object
    store's are read-only), widened to float32 unless this cache keeps bfloat16 too."""
    states = [np.array(x) for x in got["states"]]
    if cache.stored != "bfloat16":
        states = widened(states)
    return Snapshot(states, int(got["length"])), None if got["logits"] is None else np.array(got["logits"])


def snapshot_for(cache: StateCache | None, tokens: list[int], at_least: int) -> dict[str, Any] | None:
    """The holder's side: its deepest state of `tokens` if it covers `at_least` tokens."""
    if cache is None or not cache.enabled:
        return None
    # The receiver counts the hit it resumes from; the state moves as kept (bfloat16: half the bytes).
    hit = cache.lookup(tokens, counted=False, widen=False)
    if hit is None or hit.snapshot.length < at_least:
        return None
    return {"length": hit.snapshot.length, "states": [np.asarray(x) for x in hit.snapshot.states], "logits": hit.logits}


def handle(deployment: str, app: str) -> Any:
    """A handle to a deployment of the running application (made inside a replica)."""
    from ray import serve

    return serve.get_deployment_handle(deployment, app_name=app)


def header(fetched: dict[str, Any] | None) -> str | None:
    """x-hybridrt-state-from's value: the replica, tokens, bytes and milliseconds of a move."""
    if not fetched:
        return None
    return f"{fetched['replica']}; tokens={fetched['tokens']}; bytes={fetched['bytes']}; ms={fetched['ms']}"
