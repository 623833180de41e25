"""The engine: one thread owns the inference session and runs every request on it.

Continuous batching over a fixed pool of state slots. A request holds a slot from the start
of its prefill to its last token. Each turn of the loop:

1. admit waiting requests while slots are free (a prefix-cache hit starts from cached states);
2. prefill one chunk (at most `chunk` tokens) of the oldest request still prefilling, so a
   long prompt costs the others one chunk per turn, not its whole length;
3. run one decode step for every row of the decode batch and sample each row's next token
   with its own config and random generator.

A request whose prefill ends samples its first token and joins the decode batch; finished,
cancelled and timed-out requests leave it, between steps. Greedy tokens equal
`Model.generate` on the prompt alone: every row carries its own states, mask and positions.

With an assistant (draft) model, a request that is alone in the engine (none waiting or
prefilling) decodes speculatively (hybridrt.runtime.speculative): its draft proposes tokens,
its row verifies them in one call, and a rejection takes that call back (`Rows.undo`) and
leaves the kept drafts as the row's `lag`, run again before its next verify call (an
attention-only model keeps their keys and values and only sets its count back). Greedy tokens
are still those of Model.generate; seeded sampling and presence/frequency penalties stay on
plain steps, so that a seed gives the same text whatever the load. When another request is
about to join the batch, the lag is fed first, so batched rows take one token each.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from ..errors import HybridrtError
from ..runtime.decode import seen_tokens
from ..runtime.model import Model
from ..runtime.sampling import GenerationConfig, sample
from ..runtime.speculative import Chooser, DraftSchedule, draft_length, judge, propose
from ..runtime.state import Stepper
from ..runtime.text import decode
from .batch import Graph, Rows
from .cache import PrefixCache
from .config import EngineConfig
from .metrics import Metrics

log = logging.getLogger("hybridrt.serve")


class EngineBusy(HybridrtError):
    """The queue of waiting requests is full; retry later."""


class EngineClosed(HybridrtError):
    """The engine is not running (still loading, failed to load, or shut down)."""


@dataclass
class Update:
    """What the engine sends back: new tokens, and at the end why the request finished
    ("stop", "length", "timeout", "cancelled" or "error")."""

    tokens: list[int]
    finish_reason: str | None = None
    cached_tokens: int = 0
    error: str | None = None


@dataclass(eq=False)
class Request:
    prompt: list[int]
    cfg: GenerationConfig
    emit: Callable[[Update], None]  # called on the engine thread; must not block
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    timeout: float | None = None
    submitted: float = field(default_factory=time.perf_counter)
    cancelled: bool = False
    # Engine-side progress.
    tokens: list[int] = field(default_factory=list)
    cached_tokens: int = 0
    fed: int = 0
    rows: Rows | None = None
    last: float = 0.0
    rng: np.random.Generator | None = None
    eos: tuple[int, ...] = ()
    seen: np.ndarray | None = None  # [1, V], for the repetition penalty
    counts: np.ndarray | None = None
    # Speculative decoding: tokens before tokens[-1] that the request's row has not seen yet,
    # and the draft's own states and schedule.
    lag: list[int] = field(default_factory=list)
    draft: Stepper | None = None
    schedule: DraftSchedule | None = None
    chooser: Chooser | None = None

    def expired(self, now: float) -> bool:
        return self.timeout is not None and now - self.submitted > self.timeout


class Engine:
    def __init__(
        self,
        model: Model | Callable[[], Model],
        config: EngineConfig | None = None,
        metrics: Metrics | None = None,
        assistant: Model | Callable[[], Model] | None = None,
    ) -> None:
        self.config = config or EngineConfig()
        self.metrics = metrics or Metrics()
        self.metrics.slots.set(self.config.slots)
        self.cache = PrefixCache(self.config.cache_bytes)
        self._load = model if callable(model) else (lambda: model)
        self._load_assistant = assistant if callable(assistant) or assistant is None else (lambda: assistant)
        self.model: Model | None = None
        self.assistant: Model | None = None
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.cond = threading.Condition()
        self.waiting: deque[Request] = deque()
        self.prefilling: list[Request] = []
        self.running: list[Request] = []
        self.batch: Rows | None = None
        self.closing = False
        self.thread = threading.Thread(target=self._run, name="hybridrt-engine", daemon=True)

    def start(self) -> Engine:
        self.thread.start()
        return self

    def submit(self, req: Request) -> None:
        """Queue a request; raises EngineClosed, EngineBusy or GenerationError (too long) instead."""
        with self.cond:
            if self.closing or not self.ready.is_set():
                raise EngineClosed("the model is not loaded" if not self.closing else "the server is shutting down")
            assert self.model is not None
            self.model.check_length([req.prompt], req.cfg)
            if len(self.waiting) >= self.config.max_queue:
                raise EngineBusy(f"{len(self.waiting)} requests are already waiting; retry later")
            self.waiting.append(req)
            self.metrics.queue_depth.set(len(self.waiting))
            self.cond.notify()

    def cancel(self, req: Request) -> None:
        """Stop a request (its client went away): its slot is freed at the next step."""
        with self.cond:
            req.cancelled = True
            self.cond.notify()

    def stop(self, timeout: float = 30.0) -> None:
        """Finish: requests still queued or running end with finish_reason "cancelled"."""
        with self.cond:
            self.closing = True
            self.cond.notify()
        self.thread.join(timeout)

    # The engine thread.

    def _run(self) -> None:
        try:
            self.model = self._load()
            self.graph = Graph.of(self.model)
            self.graph_recurrent = any(not spec.is_kv for spec in self.graph.pasts)
            if self._load_assistant is not None:
                self.assistant = self.model.check_assistant(self._load_assistant())
        except BaseException as e:  # reported by /health and the CLI
            self.error = e
            log.error("loading the model failed: %s", e)
            return
        self.ready.set()
        try:
            while self._turn():
                pass
        finally:
            with self.cond:
                self.closing = True  # also after an unexpected error: refuse new work (503), do not queue it
            for req in [*self.waiting, *self.prefilling, *self.running]:
                self._send(req, Update([], "cancelled", req.cached_tokens))

    def _turn(self) -> bool:
        with self.cond:
            while not (self.waiting or self.prefilling or self.running or self.closing):
                self.cond.wait()
            if self.closing:
                return False
            admitted = self._admit()
        for req in admitted:
            self._guard([req], partial(self._start, req))
        self._drop_stopped()
        if self.prefilling:
            self._guard(self.prefilling[:1], lambda: self._prefill(self.prefilling[0]))
        if self.running:
            alone = len(self.running) == 1 and not self.prefilling and not self.waiting
            if alone and self._speculates(self.running[0]):
                self._guard(self.running, self._speculate)
            else:
                self._guard(self.running, self._decode)
        self.metrics.busy_slots.set(len(self.prefilling) + len(self.running))
        self.metrics.cache_bytes.set(self.cache.bytes)
        self.metrics.cache_entries.set(len(self.cache))
        return True

    def _admit(self) -> list[Request]:
        admitted = []
        while self.waiting and len(self.prefilling) + len(self.running) < self.config.slots:
            req = self.waiting.popleft()
            if not req.cancelled:
                self.prefilling.append(req)
                admitted.append(req)
        self.metrics.queue_depth.set(len(self.waiting))
        return admitted

    def _guard(self, reqs: list[Request], step: Callable[[], None]) -> None:
        """Run a step; if the graph fails, fail its requests and keep serving the others."""
        try:
            step()
        except Exception as e:
            log.exception("engine step failed")
            for req in list(reqs):
                self._remove(req)
                self._send(req, Update([], "error", req.cached_tokens, error=f"{type(e).__name__}: {e}"))

    def _start(self, req: Request) -> None:
        assert self.model is not None
        req.rng = np.random.default_rng(req.cfg.seed)
        req.eos = req.cfg.eos_ids(self.model.eos_token_ids)
        if req.cfg.repetition_penalty != 1.0:
            req.seen = seen_tokens([req.prompt], self.graph.vocab)
        if req.presence_penalty or req.frequency_penalty:
            req.counts = np.zeros(self.graph.vocab, dtype=np.float32)
        hit = self.cache.get(req.prompt)
        if hit is None:
            req.rows = Rows.fresh(self.graph, 1, len(req.prompt) + req.cfg.max_new_tokens)
            self.metrics.cache_misses.inc()
            return
        n, entry = hit
        req.rows, req.fed, req.cached_tokens = entry.rows.copy(), n, n
        self.metrics.cache_hits.inc()
        self.metrics.cache_hit_tokens.inc(n)
        if n == len(req.prompt):
            assert entry.logits is not None
            self._prefilled(req, entry.logits.copy())

    def _prefill(self, req: Request) -> None:
        assert req.rows is not None
        chunk = req.prompt[req.fed : req.fed + self.config.chunk]
        logits = req.rows.run(np.asarray([chunk], dtype=np.int64))
        req.fed += len(chunk)
        if req.fed == len(req.prompt):
            if self.cache.enabled:
                self.cache.put(req.prompt, req.rows.row(0), logits)
            self._prefilled(req, logits)

    def _prefilled(self, req: Request, logits: np.ndarray) -> None:
        """The prompt is in the states: sample the first token, then join the decode batch."""
        assert req.rows is not None
        self.prefilling.remove(req)
        self.metrics.prompt_tokens.inc(len(req.prompt))
        if self._advance(req, logits[:1]):
            if self.batch is None:
                self.batch = req.rows
            else:
                self._feed_lag()
                self.batch.extend(req.rows)
            self.running.append(req)
        req.rows = None

    def _decode(self) -> None:
        assert self.batch is not None
        self._feed_lag()  # after speculative rounds, when others now wait
        ids = np.asarray([[r.tokens[-1]] for r in self.running], dtype=np.int64)
        logits = self.batch.run(ids)
        keep = []
        for i, req in enumerate(self.running):
            if self._advance(req, logits[i : i + 1]):
                keep.append(i)
            elif self.cache.enabled:
                # The states have seen all but the reply's last token: a chat turn continues here.
                self.cache.put(req.prompt + req.tokens[:-1], self.batch.row(i), None)
        self._keep(keep)

    def _speculates(self, req: Request) -> bool:
        """Whether req's next tokens come from a speculative round (it must be alone)."""
        seeded = req.cfg.sampling and req.cfg.seed is not None
        return self.assistant is not None and not (seeded or req.presence_penalty or req.frequency_penalty)

    def _speculate(self) -> None:
        """One speculative round of the lone running request (see the module docstring)."""
        assert self.batch is not None and self.assistant is not None and self.model is not None
        req = self.running[0]
        if req.draft is None or req.schedule is None or req.chooser is None:
            assert req.rng is not None
            req.schedule = self.model.draft_schedule(self.assistant, req.cfg)
            room = len(req.prompt) + req.cfg.max_new_tokens + req.schedule.max_k + 2
            req.draft = self.assistant.draft_stepper(room, req.schedule)
            req.chooser = Chooser(req.cfg, req.eos, req.rng, None if req.seen is None else req.seen[0])
        k = draft_length(req.schedule, req.cfg.max_new_tokens - len(req.tokens), None, 0, req.draft)
        k = min(k, self.model.max_length - int(self.batch.count[0]) - len(req.lag) - 1)
        if k < 1:
            t_step = time.perf_counter()
            lagging = bool(req.lag)
            self._decode()
            if not lagging:
                req.schedule.observe_step(time.perf_counter() - t_step)
            return
        t_draft = time.perf_counter()
        proposal = propose(req.draft, _tokens_from(req, int(req.draft.lengths[0])), k, req.chooser, len(req.tokens))
        t_verify = time.perf_counter()
        self._feed_lag()  # kept drafts of the last round: an undo must not reach before them
        pending = req.tokens[-1:]
        verify = self.batch.run(np.asarray([pending + proposal.tokens], dtype=np.int64), last=k + 1)[0]
        accepted, last = judge(verify, proposal, req.chooser, len(req.tokens))
        t_end = time.perf_counter()
        req.schedule.update(k, accepted, (t_verify - t_draft) / k, t_end - t_verify, t_end - t_draft)
        self.metrics.drafted_tokens.inc(k)
        self.metrics.accepted_tokens.inc(accepted)
        for token in proposal.tokens[:accepted] + [last]:
            if not self._emit(req, token):
                # Finished inside the round: the row goes back to before the round's call.
                self.batch.undo()
                if self.cache.enabled:
                    seen = (req.prompt + req.tokens)[: int(self.batch.count[0])]
                    self.cache.put(seen, self.batch.row(0), None)
                self._keep([])
                return
        if accepted == k:
            return
        req.draft.rewind(proposal.marks[accepted])
        if self.graph_recurrent:
            self.batch.undo()
            req.lag = pending + proposal.tokens[:accepted]
        else:  # attention only: the kept drafts' keys and values are already in place
            self.batch.undo(keep=len(pending) + accepted)

    def _feed_lag(self) -> None:
        """Feed the lone running request's lag, so that its row has seen all but its last token."""
        if len(self.running) == 1 and self.running[0].lag and self.batch is not None:
            self.batch.run(np.asarray([self.running[0].lag], dtype=np.int64))
            self.running[0].lag = []

    def _advance(self, req: Request, logits: np.ndarray) -> bool:
        """Sample req's next token from logits [1, V] and send it; False once req is finished."""
        assert req.rng is not None
        cfg, eos = req.cfg, req.eos
        if req.counts is not None:
            logits = logits - req.presence_penalty * (req.counts > 0) - req.frequency_penalty * req.counts
        token = int(sample(logits, cfg, req.rng, req.seen, eos if len(req.tokens) < cfg.min_new_tokens else ())[0])
        return self._emit(req, token)

    def _emit(self, req: Request, token: int) -> bool:
        """Record and send req's next token; False once req is finished."""
        eos = req.eos
        req.tokens.append(token)
        if req.seen is not None:
            req.seen[0, token] = True
        if req.counts is not None:
            req.counts[token] += 1
        now = time.perf_counter()
        (self.metrics.inter_token if req.last else self.metrics.ttft).observe(now - (req.last or req.submitted))
        req.last = now
        self.metrics.generated_tokens.inc()
        reason = self._finish_reason(req, token, eos)
        self._send(req, Update([token], reason, req.cached_tokens))
        return reason is None

    def _finish_reason(self, req: Request, token: int, eos: tuple[int, ...]) -> str | None:
        if token in eos or self._stopped_by_string(req):
            return "stop"
        if len(req.tokens) >= req.cfg.max_new_tokens:
            return "length"
        return None

    def _stopped_by_string(self, req: Request) -> bool:
        stops = req.cfg.stops
        if not stops:
            return False
        assert self.model is not None
        longest = max(len(s) for s in stops)
        # A token holds at least one byte and a character at most four bytes.
        tail = decode(self.model.tokenizer, req.tokens[-4 * longest - 4 :])
        return any(s in tail for s in stops)

    def _drop_stopped(self) -> None:
        """Free the slots of cancelled and timed-out requests."""
        now = time.perf_counter()
        with self.cond:
            for queue in (self.waiting, self.prefilling, self.running):
                for req in [r for r in queue if r.cancelled or r.expired(now)]:
                    self._remove(req)
                    self._send(req, Update([], "cancelled" if req.cancelled else "timeout", req.cached_tokens))
            self.metrics.queue_depth.set(len(self.waiting))

    def _remove(self, req: Request) -> None:
        if req in self.waiting:
            self.waiting.remove(req)
        elif req in self.prefilling:
            self.prefilling.remove(req)
        elif req in self.running:
            i = self.running.index(req)
            self._keep([k for k in range(len(self.running)) if k != i])

    def _keep(self, keep: list[int]) -> None:
        """Keep only these rows of the decode batch (indices into self.running)."""
        self.running = [self.running[i] for i in keep]
        if not keep:
            self.batch = None
        elif self.batch is not None and len(keep) < self.batch.batch:
            self.batch.take(keep)

    def _send(self, req: Request, update: Update) -> None:
        try:
            req.emit(update)
        except Exception:  # the receiver is gone (its event loop closed); the request is over
            req.cancelled = True

    def stats(self) -> dict[str, int]:
        return {
            "waiting": len(self.waiting),
            "busy_slots": len(self.prefilling) + len(self.running),
            "cache_entries": len(self.cache),
            "cache_bytes": self.cache.bytes,
        }


def _tokens_from(req: Request, start: int) -> list[int]:
    """req's prompt and tokens from position `start` on, without joining the whole sequence."""
    n = len(req.prompt)
    return req.prompt[start:] + req.tokens if start < n else req.tokens[start - n :]
