"""The engine: one thread owns the inference session and runs every request on it.

Continuous batching over a fixed pool of state slots. A request holds a slot from the start
of its prefill to its last token. Each turn of the loop:

1. admit waiting requests while slots are free;
2. prefill one chunk (at most `chunk` tokens) of the oldest request still prefilling, so a
   long prompt costs the others one chunk per turn, not its whole length. Its first turn looks
   up the prefix state cache (hybridrt.runtime.prefix_cache; not for a request that scores its
   prompt: it needs the logits of every position) and plans where its prefill stores states:
   its chunks end there, so storing one is a copy, not a call. Requests are prefilled oldest
   first and look up the cache only when their turn comes, so requests that share a prefix
   wait for one prefill of it: the first stores a state where they part, the others resume
   from it;
3. run one decode step for every row of the decode batch and sample each row's next token
   with its own config and random generator.

A request whose prefill ends samples its first token and joins the decode batch; finished,
cancelled and timed-out requests leave it, between steps. Greedy tokens equal
`Model.generate` on the prompt alone: every row carries its own states, mask and positions.

With an assistant (draft) model, a request that is alone in the engine (none waiting or
prefilling) decodes speculatively (hybridrt.runtime.speculative): its draft proposes tokens,
its row verifies them in one call: the round of `Model.generate` (runtime.speculative.Draft),
run on the decode batch's one row. A recurrent row that rejects a draft returns to its states
before the call and lags behind by the drafts it kept, which the next round runs again (an
attention-only row keeps their keys and values). Greedy tokens are still those of
Model.generate; seeded sampling, presence/frequency penalties, logprobs and grammar
constraints (hybridrt.serve.grammar: a mask on the row's logits) stay on plain steps, so
that a seed gives the same text whatever the load, each token's logprob comes from the
logits it was sampled from, and every token is sampled under its mask. When another
request is about to join the batch, the lag is fed first, so batched rows take one token
each.

The decode batch and each prefilling request's states are runtime state batches
(`Model.stepper`): bound on the model's device, so `--provider cuda` keeps every state on
the GPU between steps; rows join (`extend`) and leave (`reorder`) between steps.

Per-request state (sampling, penalties, logprobs) and the updates sent back are
hybridrt.serve.request's; logprobs are hybridrt.serve.logprobs's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from functools import partial

import numpy as np

from ..errors import HybridrtError
from ..runtime.decode import feed
from ..runtime.model import Model
from ..runtime.prefix_cache import Hit, StateCache
from ..runtime.prefix_plan import DENSITY, MIN_BRANCH, chunk_end
from ..runtime.radix import common_prefix
from ..runtime.speculative import Chooser, Draft, check_draft, draft_length
from ..runtime.state import Stepper
from .logprobs import TokenLogprob, prompt_scores
from .metrics import Metrics
from .request import Request, Update
from .settings import EngineConfig

__all__ = ["Engine", "EngineBusy", "EngineClosed", "EngineConfig", "Request", "Update"]

log = logging.getLogger("hybridrt.serve")


class EngineBusy(HybridrtError):
    """The queue of waiting requests is full; retry later."""


class EngineClosed(HybridrtError):
    """The engine is not running (still loading, failed to load, or shut down)."""


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
        self.cache: StateCache | None = None  # made once the model is loaded (its identity, its state sizes)
        self._load = model if callable(model) else (lambda: model)
        self._load_assistant = assistant if callable(assistant) or assistant is None else (lambda: assistant)
        self.model: Model | None = None
        self.assistant: Model | None = None
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.cond = threading.Condition()
        self.warmup_s: float | None = None  # the warm-up step before ready (seconds)
        self.waiting: deque[Request] = deque()
        self.prefilling: list[Request] = []
        self.running: list[Request] = []
        self.batch: Stepper | None = None
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
            model = self._load()
            self._loaded(model)
            if self._load_assistant is not None:
                self.assistant = check_draft(model, self._load_assistant())
            self.warmup_s = self._warm(model, self.assistant)
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
        for req in [r for r in admitted if r in self.running]:  # prompts cached whole
            try:
                self._join(req)
            except Exception as e:  # its row is not in the batch: it leaves the running list alone
                log.exception("engine step failed")
                self.running.remove(req)
                self._send(req, Update([], "error", req.cached_tokens, error=f"{type(e).__name__}: {e}"))
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
        return True

    @staticmethod
    def _warm(model: Model, assistant: Model | None) -> float:
        """One prefill and decode step on each model before the engine says it is ready, so
        that no client's request pays for a session's first run (its allocations, its kernels'
        first calls). Returns the seconds it took."""
        t0 = time.perf_counter()
        token = model.manifest.special_tokens.get("bos_token_id") or 0
        for m in (model, assistant):
            if m is not None:
                m.generate([int(token)] * 4, max_new_tokens=2, eos_token_id=[], repetition_penalty=1.0)
        seconds = time.perf_counter() - t0
        log.info("warmed up in %.0f ms", seconds * 1000)
        return seconds

    def _loaded(self, model: Model) -> None:
        """Take the loaded model: its vocabulary and its prefix state cache."""
        self.model = model
        self.vocab = int(model.manifest.vocab_size)
        self.cache = self._make_cache(model)

    def _make_cache(self, model: Model) -> StateCache:
        c = self.config
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
        self.metrics.cache = cache
        return cache

    def _admit(self) -> list[Request]:
        admitted = []
        while self.waiting and len(self.prefilling) + len(self.running) < self.config.slots:
            req = self.waiting.popleft()
            if req.cancelled:  # its job still waits for a last update
                self._send(req, Update([], "cancelled", req.cached_tokens))
            else:
                req.admitted = time.perf_counter()
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
        assert self.model is not None and self.cache is not None
        req.start(self.model.eos_token_ids, self.model.tokenizer, self.vocab)
        if self.cache.enabled and req.prompt_logprobs is None:
            # A prompt stored whole (with its last logits) joins the decode batch at once; any
            # other looks the cache up when its prefill turn comes (the state it resumes from
            # may be stored by then).
            hit = self.cache.lookup(req.prompt, whole=True)
            if hit is not None and hit.logits is not None:
                self._resumed(req, hit)
                req.marks = []
                self._prefilled(req, hit.logits, join=False)  # joins after the others' first tokens
                return
        # Prompts already prefilling store a state where this one parts from them.
        for other in self.prefilling:
            if other.marks is not None and other is not req:
                at = common_prefix(req.prompt, other.prompt)
                # Not passed yet, and worth a state (see prefix_cache.MIN_BRANCH).
                if (
                    other.fed < at < len(other.prompt)
                    and at >= other.cached_tokens + MIN_BRANCH
                    and at not in other.marks
                ):
                    other.marks = sorted([*other.marks, at])

    def _resume(self, req: Request) -> bool:
        """req's first prefill turn: resume from the cache and plan its checkpoints; True when
        the cache held its whole prompt (nothing to prefill)."""
        assert self.cache is not None
        cache = self.cache if self.cache.enabled else None
        # A scored prompt needs the logits of every position, which the cache does not keep.
        hit = None if cache is None or req.prompt_logprobs is not None else cache.lookup(req.prompt)
        if hit is None:
            self.metrics.cache_misses.inc()
        else:
            self._resumed(req, hit)
            if hit.logits is not None:
                req.marks = []
                self._prefilled(req, hit.logits)
                return True
        others = [r.prompt for r in [*self.waiting, *self.prefilling] if r is not req]
        req.marks = [] if cache is None else cache.plan(req.prompt, req.fed, others)
        return False

    def _states(self, req: Request) -> Stepper:
        """req's own states, made when its prefill starts: the requests admitted behind it hold
        none (64 admitted at once would otherwise hold 64 models' worth of states)."""
        assert self.model is not None
        if req.rows is None:
            # A speculative round takes back its verifying call: with a draft the states keep
            # two sets; without one they are read and written in place (runtime.bound).
            ring = 2 if self.assistant is not None else 1
            req.rows = self.model.stepper(1, len(req.prompt) + req.cfg.max_new_tokens, ring=ring)
            if req.resume is not None:
                req.rows.set_row(0, req.resume.states, req.resume.length)
                req.resume = None
        return req.rows

    def _resumed(self, req: Request, hit: Hit) -> None:
        req.resume, req.fed, req.cached_tokens = hit.snapshot, hit.snapshot.length, hit.snapshot.length
        self.metrics.cache_hits.inc()
        self.metrics.cache_hit_tokens.inc(req.fed)

    def _prefill(self, req: Request) -> None:
        if req.marks is None and self._resume(req):
            return
        assert req.marks is not None and self.cache is not None
        rows = self._states(req)
        end = chunk_end(req.fed, self.config.chunk, len(req.prompt), req.marks)
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
            if end in req.marks:
                self.cache.put(req.prompt[:end], rows.row(0))
            return
        # The first token goes out before the prompt's states are copied into the cache: `rows`
        # (now the decode batch, or copied into it) holds them until the next decode step.
        self._prefilled(req, logits)
        if end in req.marks:
            self.cache.put(req.prompt, rows.row(0), logits)

    def _prefilled(self, req: Request, logits: np.ndarray, join: bool = True) -> None:
        """The prompt is in the states: sample the first token, then join the decode batch
        (a score-only request ends here). join=False leaves the joining to the caller (_join):
        requests resumed together send their first tokens before any of them joins."""
        self.prefilling.remove(req)
        self.metrics.prompt_tokens.inc(len(req.prompt))
        if req.score_only:
            self._send(req, Update([], "length", req.cached_tokens, prompt_logprobs=req.scored))
        elif self._advance(req, logits[:1]):
            self.running.append(req)
            if join:
                self._join(req)
            return
        req.rows = req.resume = None

    def _join(self, req: Request) -> None:
        """req (running, its first token sent) brings its states into the decode batch."""
        if self.batch is not None and req.rows is None and req.resume is not None:
            # Cached states go straight into the batch (no states of its own to make).
            self._feed_lag()
            self.batch.append_row(req.resume, len(req.prompt) + req.cfg.max_new_tokens)
        else:
            rows = self._states(req)
            if self.batch is None:
                self.batch = rows
                rows.reserve(self.config.slots)
            else:
                self._feed_lag()
                self.batch.extend(rows)
        req.rows = req.resume = None

    def _decode(self) -> None:
        assert self.batch is not None
        self._feed_lag()  # after speculative rounds, when others now wait
        ids = np.asarray([[r.tokens[-1]] for r in self.running], dtype=np.int64)
        logits = self.batch.forward(ids)
        keep = []
        for i, req in enumerate(self.running):
            if self._advance(req, logits[i : i + 1]):
                keep.append(i)
            elif self.cache is not None and self.cache.enabled:
                # The states have seen all but the reply's last token: a chat turn continues here.
                self.cache.put(req.prompt + req.tokens[:-1], self.batch.row(i), None)
        self._keep(keep)

    def _speculates(self, req: Request) -> bool:
        """Whether req's next tokens come from a speculative round (it must be alone)."""
        seeded = req.cfg.sampling and req.cfg.seed is not None
        constrained = req.grammar is not None  # its masks apply to plain steps only
        return self.assistant is not None and not (seeded or constrained or req.logprobs is not None)

    def _speculate(self) -> None:
        """One speculative round of the lone running request (see the module docstring)."""
        assert self.batch is not None and self.assistant is not None and self.model is not None
        req = self.running[0]
        if req.draft is None or req.chooser is None:
            assert req.rng is not None
            req.draft = Draft.start(self.model, self.assistant, req.cfg, len(req.prompt) + req.cfg.max_new_tokens)
            req.chooser = Chooser(req.cfg, req.eos, req.rng, req.tally)
        pending = req.tokens_from(int(self.batch.lengths[0]))
        remaining = req.cfg.max_new_tokens - len(req.tokens)
        k = draft_length(req.draft.schedule, remaining, self.batch, req.draft.stepper, len(pending))
        if k < 1:
            t_step = time.perf_counter()
            self._decode()
            if len(pending) == 1:
                req.draft.schedule.observe_step(time.perf_counter() - t_step)
            return
        # Counted before the round: a request that finishes inside it is answered from there, and
        # what a reader sees once it is answered must include its drafts.
        self.metrics.drafted_tokens.inc(k)
        accepted, live = req.draft.round(
            self.batch, req.tokens_from, k, req.chooser, len(req.tokens), partial(self._emit, req)
        )
        self.metrics.accepted_tokens.inc(accepted)
        if not live:
            # Finished inside the round: the row is back to before the round's call.
            if self.cache is not None and self.cache.enabled:
                seen = (req.prompt + req.tokens)[: int(self.batch.lengths[0])]
                self.cache.put(seen, self.batch.row(0), None)
            self._keep([])

    def _feed_lag(self) -> None:
        """Feed the lone running request's lag (drafts it kept that its recurrent row took back),
        so that its row has seen all but its last token."""
        if self.batch is not None and self.batch.batch == 1:  # running[0] is its row
            pending = self.running[0].tokens_from(int(self.batch.lengths[0]))
            if len(pending) > 1:
                feed(self.batch, np.asarray([pending[:-1]], dtype=np.int64))

    def _advance(self, req: Request, logits: np.ndarray) -> bool:
        """Sample req's next token from logits [1, V] and send it; False once req is finished."""
        token, entry = req.choose(logits)
        return self._emit(req, token, entry)

    def _emit(self, req: Request, token: int, entry: TokenLogprob | None = None) -> bool:
        """Record and send req's next token; False once req is finished."""
        reason = req.record(token)
        now = time.perf_counter()
        (self.metrics.inter_token if req.last else self.metrics.ttft).observe(now - (req.last or req.submitted))
        req.first = req.first or now
        req.last = now
        self.metrics.generated_tokens.inc()
        update = Update([token], reason, req.cached_tokens, logprobs=None if entry is None else [entry])
        if req.prompt_logprobs is not None and len(req.tokens) == 1:
            update.prompt_logprobs = req.scored
        self._send(req, update)
        return reason is None

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
        """Keep only these rows of the decode batch (ascending indices into self.running). The
        last rows fill the places of those that leave, so a leaving row moves at most one other."""
        if not keep:
            self.running, self.batch = [], None
            return
        if len(keep) == len(self.running):  # nobody left (most decode steps)
            return
        kept, tail = set(keep), [i for i in keep if i >= len(keep)]
        index = [i if i in kept else tail.pop() for i in range(len(keep))]
        self.running = [self.running[i] for i in index]
        if self.batch is not None and len(index) < self.batch.batch:
            self.batch.reorder(index)

    def _send(self, req: Request, update: Update) -> None:
        try:
            req.emit(update)
        except Exception:  # the receiver is gone (its event loop closed); the request is over
            req.cancelled = True

    def stats(self) -> dict[str, int]:
        return {
            "waiting": len(self.waiting),
            "busy_slots": len(self.prefilling) + len(self.running),
            "cache_entries": 0 if self.cache is None else len(self.cache),
            "cache_bytes": 0 if self.cache is None else self.cache.memory,
        }
