"""The engine's prompt side: requests admitted and not yet decoding, prefilled a chunk a turn.

Each turn of the engine prefills one chunk (at most `chunk` tokens; ALONE_CHUNKS chunks while no
request decodes, as nobody waits for a call then and its fixed cost is paid less often) of the
oldest request still prefilling, so a long prompt costs the others one chunk per turn. A
request's first turn looks up the prefix state cache (hybridrt.runtime.prefix_cache; not for a
request that scores its prompt: it needs the logits of every position) and plans where its
prefill stores states: its chunks end there, so storing one is a copy, not a call. Requests are
prefilled oldest first and look up the cache only when their turn comes, so requests that share
a prefix wait for one prefill of it: the first stores a state where they part, the others
resume from it. A prompt stored whole, with its last logits, is not prefilled at all.

A request's states are a state batch of its own (`Model.stepper`), made when its prefill
starts, not when it is admitted (64 requests admitted at once would otherwise hold 64 models'
worth of states); the engine joins them to its decode batch once the prompt is in. Before any
request, `warm_up` runs the sessions' first prefill and step.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from ..runtime.model import Model
from ..runtime.prefix_cache import StateCache
from ..runtime.prefix_plan import DENSITY, MIN_BRANCH, chunk_end
from ..runtime.radix import common_prefix
from ..runtime.state import Snapshot, Stepper
from .logprobs import prompt_scores
from .metrics import Metrics
from .request import Request
from .settings import EngineConfig

log = logging.getLogger("hybridrt.serve")
TIDY_AFTER_S = 0.05  # idle this long before idle work (Prompts.wait_idle)
# After a prompt's first token and before its states are copied into the cache, the engine
# thread waits (at most this long) until the server's event loop has taken the token
# (Request.taken), else the loop, woken to send it, waits for a core behind the copies and the
# next decode step: first token to client 6-15 ms later on 2 cores (granite-h-350m's agent
# steps). A fixed 1 ms sleep instead left 3 of 12 turns 7.5-13 ms late (0.2-0.3 ms: the rest).
HAND_OFF_S = 0.02
ALONE_CHUNKS = 2  # a prefill call takes this many chunks while no request decodes


def warm_up(model: Model, assistant: Model | None) -> float:
    """One prefill and decode step on each model before the engine says it is ready, so that
    no client's request pays for a session's first run (its allocations, its kernels' first
    calls). Returns the seconds it took."""
    t0 = time.perf_counter()
    token = model.manifest.special_tokens.get("bos_token_id") or 0
    for m in (model, assistant):
        if m is not None:
            m.generate([int(token)] * 4, max_new_tokens=2, eos_token_id=[], repetition_penalty=1.0)
    seconds = time.perf_counter() - t0
    log.info("warmed up in %.0f ms", seconds * 1000)
    return seconds


def open_cache(model: Model, config: EngineConfig, metrics: Metrics) -> StateCache:
    """The prefix state cache of `model` as `config` sizes it, said in the log and in /metrics."""
    c = config
    cache = StateCache.for_model(
        model,
        memory_bytes=c.cache_bytes,
        directory=c.cache_dir,
        disk_bytes=c.cache_disk_bytes,
        spacing=c.cache_spacing,
        stored=c.cache_stored,
    )
    files = cache.files
    disk = "" if files is None else f", disk tier {files.where} up to {files.cap / 2**20:.0f} MiB"
    log.info(
        "prefix state cache: %.0f MiB of memory%s%s; %s",
        cache.memory_bytes / 2**20,
        disk,
        "" if cache.stored == "float32" else f", states kept as {cache.stored}",
        "no checkpoints inside prompts (no recurrent state)"
        if not cache.recurrent
        else f"a checkpoint every {cache.spacing} prompt tokens"
        if cache.spacing is not None
        else f"about {DENSITY} checkpoints a long prompt, {cache.state_bytes / 2**20:.1f} MiB of states each",
    )
    metrics.cache = cache
    return cache


class Prompts:
    """The requests still prefilling (`requests`, oldest first) and what their prefill reads and
    writes: the model, the prefix state cache, the chunk size. `ring`: the state sets each
    request's states keep (2 with a draft model, whose rounds take back their verifying call)."""

    def __init__(
        self, model: Model, config: EngineConfig, metrics: Metrics, requests: list[Request], ring: int = 1
    ) -> None:
        self.model, self.chunk, self.metrics, self.ring = model, config.chunk, metrics, ring
        self.cache = open_cache(model, config, metrics)
        self.requests = requests
        # The decode batch once its last request left (`park`): the next request prefills in its
        # buffers instead of allocating and zeroing new ones, and joins as the batch with its
        # slots' room already reserved. `idle_seen`: the tokens its row 0 has seen, when they are
        # not stored in the cache yet (a reply's end): a prompt that continues them continues
        # in that row, with nothing copied; any other prefills in the spare (below) or stores
        # them first.
        self.idle: Stepper | None = None
        self.idle_seen: list[int] | None = None
        self.idle_stored = False  # idle_seen's states are in the cache already (tidy)
        # A second kept batch whose row holds nothing to store: a request that comes straight
        # after a reply (an agent's next step, a conversation resent as text) prefills in it,
        # and the kept row is stored after that request's first token, not before its prefill.
        self.spare: Stepper | None = None
        self.held: list[np.ndarray] | None = None  # a prompt's fixed states before its last call

    def park(self, batch: Stepper, seen: list[int] | None = None) -> None:
        """Keep the emptied decode batch for the next request; `seen`: what its one row holds.
        The batch kept before (its row stored first, if it was not) becomes the spare."""
        if self.idle is not None:
            self._store_idle()
            self.spare = self.idle
        self.idle, self.idle_seen, self.idle_stored = batch, seen, False

    def release_idle(self) -> None:
        """Give the kept batches' buffers back (the server has been idle a while); what the
        kept row has seen goes to the cache first."""
        self._store_idle()
        self.idle = self.spare = None

    def store_kept(self) -> None:
        """A request's first token is out: the kept row it did not prefill in goes to the cache
        (the row stays kept, as after tidy)."""
        self._store_idle(keep=True)

    def wait_idle(self, cond: threading.Condition, release_s: float) -> None:
        """One wait of the engine without work (`cond` held; notified when a request comes):
        TIDY_AFTER_S without one, a piece of idle work (tidy: not between requests that follow
        each other closely, which it would delay); when none is left, the kept batch's memory
        is given back after release_s more."""
        if cond.wait(TIDY_AFTER_S) or self.tidy():
            return
        if not cond.wait(release_s):
            self.release_idle()

    def tidy(self) -> bool:
        """The server's idle time, a piece a call (False: nothing left to do): the kept row's
        states into the cache (the row stays kept: a chat's next turn still continues in it,
        and a request that does not need not wait for the copy), then blocks made ready for
        the next checkpoints (runtime.host_blocks)."""
        if self.cache.enabled and self.idle is not None and self.idle_seen is not None and not self.idle_stored:
            self._store_idle(keep=True)
            return True
        return self.cache.prepare()

    def _store_idle(self, keep: bool = False) -> None:
        if self.idle is not None and self.idle_seen is not None and not self.idle_stored:
            self.cache.put(self.idle_seen, self.idle.row(0, self.cache.blocks), None, reply=True)
        self.idle_stored = keep and self.idle_seen is not None
        self.idle_seen = self.idle_seen if keep else None

    def cached_whole(self, req: Request) -> np.ndarray | None:
        """A newly admitted request: the last logits of its prompt where the cache holds it whole
        (req then resumes from those states), else None; in that case the prompts already
        prefilling store a state where req parts from them (req looks the cache up when its
        turn comes: the state it resumes from may be stored by then)."""
        if self.cache.enabled and req.prompt_logprobs is None:
            hit = self.cache.lookup(req.prompt, whole=True)
            if hit is not None and hit.logits is not None:
                self._resumed(req, hit.snapshot.length, hit.snapshot)
                req.marks = []
                return hit.logits
        for other in self.requests:
            if other.marks is not None and other is not req:
                at = common_prefix(req.prompt, other.prompt)
                # Not passed yet, and worth a state (see prefix_cache.MIN_BRANCH).
                if (
                    other.fed < at < len(other.prompt)
                    and at >= other.cached_tokens + MIN_BRANCH
                    and at not in other.marks
                ):
                    other.marks = sorted([*other.marks, at])
        return None

    def prefill(
        self, req: Request, others: Callable[[], Sequence[Sequence[int]]], alone: bool = False
    ) -> tuple[np.ndarray, Callable[[], None]] | None:
        """One turn of req's prefill (`others`: the prompts waiting or prefilling beside it, which
        its first turn's plan of checkpoints considers; `alone`: no request decodes). None while
        the prompt is not all in; then its last logits [1, V] and a call that stores the
        prompt's states in the cache where planned, made after the first token is sent (the
        states stay in req's rows until the next step)."""
        if req.marks is None:
            logits = self._resume(req, others)
            if logits is not None:
                return logits, lambda: None
        assert req.marks is not None
        rows = self.states(req)
        chunk = self.chunk * ALONE_CHUNKS if alone else self.chunk
        end = chunk_end(req.fed, chunk, len(req.prompt), req.marks)
        ids = np.asarray([req.prompt[req.fed : end]], dtype=np.int64)
        t0 = time.perf_counter()
        if req.prompt_logprobs is None:
            logits = rows.forward(ids)
        else:
            every = rows.forward(ids, all_logits=True)[0]  # [s, V]
            req.scored += prompt_scores(every, req.prompt, req.fed, req.prompt_logprobs)
            logits = every[-1:]
        self.cache.observe(end - req.fed, time.perf_counter() - t0)
        req.fed = end
        if end < len(req.prompt):
            if end in req.marks and chunk_end(end, chunk, len(req.prompt), req.marks) == len(req.prompt):
                # Before the prompt's last call only the fixed states need keeping (into buffers
                # reused from request to request): the checkpoint is stored after the first token.
                self.held, req.held = rows.fixed_of(0, self.held), end
            elif end in req.marks:
                self.cache.put(req.prompt[:end], rows.row(0, self.cache.blocks))
            return None
        held, req.held = req.held, None
        at_end = end in req.marks

        def store() -> None:
            if req.taken is not None:  # (None: no event loop, a caller of the engine's own)
                req.taken.wait(HAND_OFF_S)
            if held is not None and self.held is not None:
                self.cache.put(req.prompt[:held], rows.row_at(0, held, self.held, self.cache.blocks))
            if at_end:
                self.cache.put(req.prompt, rows.row(0, self.cache.blocks), logits)
            self.store_kept()

        return logits, store

    def states(self, req: Request) -> Stepper:
        """req's own states, made on first use (from the cached state it resumes from, if any)."""
        if req.rows is None:
            capacity = len(req.prompt) + req.cfg.max_new_tokens
            kept = self._buffers()
            if kept is not None:
                req.rows = kept
                req.rows.restart(req.resume, capacity)
            else:
                req.rows = self.model.stepper(1, capacity, ring=self.ring)
                if req.resume is not None:
                    req.rows.set_row(0, req.resume.states, req.resume.length)
            req.resume = None
        return req.rows

    def _buffers(self) -> Stepper | None:
        """Kept buffers for a new request's states, if any: the kept batch when its row holds
        nothing to store, else the spare (store_kept stores the row after the request's first
        token); None when the kept row needs storing and there is no spare: the request makes
        new buffers, and from its end on two batches are kept in turn."""
        if self.idle is not None and (self.idle_seen is None or self.idle_stored or not self.cache.enabled):
            idle, self.idle, self.idle_seen, self.idle_stored = self.idle, None, None, False
            return idle
        spare, self.spare = self.spare, None
        return spare

    def _resume(self, req: Request, others: Callable[[], Sequence[Sequence[int]]]) -> np.ndarray | None:
        """req's first prefill turn: resume from the cache and plan its checkpoints; the last
        logits of the prompt where the cache held it whole (nothing to prefill)."""
        cache = self.cache if self.cache.enabled else None
        # A scored prompt needs the logits of every position, which the cache does not keep.
        usable = cache is not None and req.prompt_logprobs is None
        continued = usable and self._continued(req)  # (no tail checkpoint then: prefix_plan)
        if cache is not None and usable and not continued:
            hit = cache.lookup(req.prompt)
            if hit is None:
                self.metrics.cache_misses.inc()
            else:
                self._resumed(req, hit.snapshot.length, hit.snapshot)
                continued = hit.reply  # at a reply's end: a chat template's next turn
                if hit.logits is not None:
                    req.marks = []
                    return hit.logits
        req.marks = [] if cache is None else cache.plan(req.prompt, req.fed, others(), tail=not continued)
        return None

    def _continued(self, req: Request) -> bool:
        """Whether req's prompt continues what the idle batch's row holds (a chat's next turn
        after its reply): then req prefills the rest in that row, from where it is."""
        seen = self.idle_seen
        if self.idle is None or seen is None or len(req.prompt) <= len(seen) or req.prompt[: len(seen)] != seen:
            return False
        req.rows, self.idle, self.idle_seen, self.idle_stored = self.idle, None, None, False
        capacity = len(req.prompt) + req.cfg.max_new_tokens
        if req.rows.has_kv and capacity > req.rows.capacity:
            req.rows.grow(capacity)
        self._resumed(req, len(seen))
        return True

    def _resumed(self, req: Request, length: int, snapshot: Snapshot | None = None) -> None:
        req.resume, req.fed, req.cached_tokens = snapshot, length, length
        self.metrics.cache_hits.inc()
        self.metrics.cache_hit_tokens.inc(length)
