"""The engine: one thread owns the inference session and runs every request on it.

Continuous batching over a fixed pool of state slots. A request holds a slot from the start
of its prefill to its last token. Each turn of the loop:

1. admit waiting requests while slots are free;
2. prefill one chunk of the oldest request still prefilling, resumed from the prefix state
   cache where it can be (hybridrt.serve.prefill);
3. run one decode step for every row of the decode batch and sample each row's next token
   with its own config and random generator.

A request whose prefill ends samples its first token and joins the decode batch; finished,
cancelled and timed-out requests leave it, between steps. Greedy tokens equal
`Model.generate` on the prompt alone: every row carries its own states, mask and positions.
With an assistant (draft) model, a lone request decodes in speculative rounds (serve.speculation).

The decode batch and each prefilling request's states are runtime state batches
(`Model.stepper`): bound on the model's device, so `--provider cuda` keeps every state on
the GPU between steps; rows join (`extend`) and leave (`reorder`) between steps. A batch
whose last row left is kept for the next request: one that continues what that row has seen
(a chat's next turn) continues in it, one straight after that does not prefills in a second
kept batch (serve.prefill.Prompts.park); idle turns store its states and ready memory for
checkpoints (Prompts.tidy); after `idle_release_s` its memory goes back. Requests: serve.request.
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
from ..runtime.model import Model
from ..runtime.prefix_cache import StateCache
from ..runtime.speculative import check_draft
from ..runtime.state import Stepper
from .logprobs import TokenLogprob
from .metrics import Metrics
from .prefill import Prompts, warm_up
from .request import Request, Update
from .settings import EngineConfig
from .speculation import Speculation, feed_lag

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
        self.prompts: Prompts | None = None  # the prompt side, made once the model is loaded
        self.cache: StateCache | None = None  # the prompts' prefix state cache (its identity, its state sizes)
        self._load = model if callable(model) else (lambda: model)
        self._load_assistant = assistant if callable(assistant) or assistant is None else (lambda: assistant)
        self.model: Model | None = None
        self.assistant: Model | None = None
        self.speculation: Speculation | None = None  # with an assistant
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.warmup_s: float | None = None  # the warm-up step before ready (seconds)
        self.waiting: deque[Request] = deque()
        self.prefilling: list[Request] = []
        self.running: list[Request] = []
        self.batch: Stepper | None = None
        self.closing, self.cond = False, threading.Condition()
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
            if self._load_assistant is not None:
                self.assistant = check_draft(model, self._load_assistant())
            self._loaded(model)
            self.warmup_s = warm_up(model, self.assistant)
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
                assert self.prompts is not None  # (made before the first turn)
                self.prompts.wait_idle(self.cond, self.config.idle_release_s)
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
            if alone and self.speculation is not None and self.speculation.applies(self.running[0]):
                self._guard(self.running, self._speculate)
            else:
                self._guard(self.running, self._decode)
        self.metrics.busy_slots.set(len(self.prefilling) + len(self.running))
        return True

    def _loaded(self, model: Model) -> None:
        """Take the loaded model (and the assistant, loaded first), its prompt side and prefix
        state cache. A speculative round takes back its verifying call: with a draft, a
        request's states keep two sets; without, they are read and written in place."""
        self.model, self.vocab = model, int(model.manifest.vocab_size)
        ring = 2 if self.assistant is not None else 1
        self.prompts = Prompts(model, self.config, self.metrics, self.prefilling, ring)
        self.cache = self.prompts.cache
        if self.assistant is not None:
            self.speculation = Speculation(model, self.assistant, self.metrics)

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
        """An admitted request: a prompt stored whole (with its last logits) joins the decode
        batch at once; any other waits for its prefill turn."""
        assert self.model is not None and self.prompts is not None
        req.start(self.model.eos_token_ids, self.model.tokenizer, self.vocab)
        logits = self.prompts.cached_whole(req)
        if logits is not None:
            self._prefilled(req, logits, join=False)  # joins after the others' first tokens

    def _prefill(self, req: Request) -> None:
        assert self.prompts is not None
        done = self.prompts.prefill(
            req, lambda: [r.prompt for r in [*self.waiting, *self.prefilling] if r is not req], not self.running
        )
        if done is not None:
            # The first token goes out before the prompt's states are copied into the cache: its
            # rows (now the decode batch, or copied into it) hold them until the next decode step.
            logits, store = done
            self._prefilled(req, logits)
            store()

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
            feed_lag(self.batch, self.running)
            self.batch.append_row(req.resume, len(req.prompt) + req.cfg.max_new_tokens)
        else:
            assert self.prompts is not None
            rows = self.prompts.states(req)
            if self.batch is None:
                self.batch = rows
                rows.reserve(self.config.slots)
            else:
                feed_lag(self.batch, self.running)
                self.batch.extend(rows)
        req.rows = req.resume = None

    def _decode(self) -> None:
        assert self.batch is not None
        feed_lag(self.batch, self.running)  # after speculative rounds, when others now wait
        ids = np.asarray([[r.tokens[-1]] for r in self.running], dtype=np.int64)
        logits = self.batch.forward(ids)
        keep, seen = [], None
        for i, req in enumerate(self.running):
            if self._advance(req, logits[i : i + 1]):
                keep.append(i)
            elif self.cache is not None and self.cache.enabled:
                # The states have seen all but the reply's last token: a chat turn continues here.
                # A lone row stays where it is (Prompts.park) until another request needs it.
                seen = req.prompt + req.tokens[:-1]
                if len(self.running) > 1:
                    self.cache.put(seen, self.batch.row(i, self.cache.blocks), None, reply=True)
        self._keep(keep, seen if len(self.running) == 1 else None)

    def _speculate(self) -> None:
        """One speculative round of the lone running request (hybridrt.serve.speculation)."""
        assert self.batch is not None and self.speculation is not None
        req = self.running[0]
        if not self.speculation.round(self.batch, req, self._decode, partial(self._emit, req)):
            # Finished inside the round: the row is back to before the round's call.
            if self.cache is not None and self.cache.enabled:
                seen = (req.prompt + req.tokens)[: int(self.batch.lengths[0])]
                self.cache.put(seen, self.batch.row(0, self.cache.blocks), None, reply=True)
            self._keep([])

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

    def _keep(self, keep: list[int], seen: list[int] | None = None) -> None:
        """Keep only these rows of the decode batch (ascending indices into self.running): the last
        rows fill the places of those that leave, so a leaving row moves at most one other."""
        if not keep:  # `seen`: what the one row left has seen, not stored yet
            if self.prompts is not None and self.batch is not None:  # the next request's buffers
                self.prompts.park(self.batch, seen)
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
        entries, memory = (0, 0) if self.cache is None else (len(self.cache), self.cache.memory)
        busy = len(self.prefilling) + len(self.running)
        return {"waiting": len(self.waiting), "busy_slots": busy, "cache_entries": entries, "cache_bytes": memory}
