"""One request on the engine: what it asks for, its sampling state, and the updates it sends.

A request samples its tokens with its own config, random generator and tally of the tokens
its penalties read (runtime.sampling, the one sampler). Logprobs
(hybridrt.serve.logprobs) cost only the requests that ask: `logprobs` scores each new token
from the logits it was sampled from; `prompt_logprobs` (echo) scores every prompt token from
the prefill's all-position logits; `score_only` (max_tokens 0) ends after the prefill.
A constrained request (hybridrt.serve.grammar) masks its logits with its grammar before it
samples (penalties and sampling apply to the allowed tokens only; min_tokens does not hold
back an EOS the grammar asks for), feeds the grammar every token, and stops once the grammar
can take no more; logprobs stay those of the raw logits.

Shapes: V = vocabulary size; `logits` [1, V] (one row's last position).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..runtime.decode import StopCheck
from ..runtime.sampling import GenerationConfig, Tally, sample
from ..runtime.speculative import Chooser, Draft
from ..runtime.state import Snapshot, Stepper
from ..runtime.text import stop_check
from .grammar import Matcher
from .logprobs import TokenLogprob, score


@dataclass
class Update:
    """What the engine sends back: new tokens, and at the end why the request finished
    ("stop", "length", "timeout", "cancelled" or "error"); with `logprobs`, one entry per
    token; with `prompt_logprobs`, the prompt's entries (in the request's first update)."""

    tokens: list[int]
    finish_reason: str | None = None
    cached_tokens: int = 0
    error: str | None = None
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob] | None = None


@dataclass(eq=False)
class Request:
    prompt: list[int]
    cfg: GenerationConfig
    emit: Callable[[Update], None]  # called on the engine thread; must not block
    timeout: float | None = None
    logprobs: int | None = None  # alternatives per new token (None: no logprobs)
    prompt_logprobs: int | None = None  # alternatives per prompt token (None: the prompt is not scored)
    score_only: bool = False  # no new tokens: the prompt's logprobs only (max_tokens 0)
    grammar: Matcher | None = None  # the constraint its tokens are sampled under
    submitted: float = field(default_factory=time.perf_counter)
    cancelled: bool = False
    # Engine-side progress.
    tokens: list[int] = field(default_factory=list)
    cached_tokens: int = 0
    fed: int = 0
    rows: Stepper | None = None  # its own states while it prefills (made when its prefill starts)
    resume: Snapshot | None = None  # the prefix cache's states it starts from, until `rows` exists
    marks: list[int] | None = None  # where its prefill stores states (None: not looked up yet)
    held: int | None = None  # a checkpoint taken just before the prompt's last call, stored after it
    scored: list[TokenLogprob] = field(default_factory=list)  # the prompt's entries so far
    admitted: float = 0.0  # when it took a state slot (perf_counter; 0: still waiting)
    first: float = 0.0  # when its first token was sent
    taken: threading.Event | None = None  # set once the server's event loop holds an update of it (jobs.Job)
    last: float = 0.0
    rng: np.random.Generator | None = None
    eos: tuple[int, ...] = ()
    stop: StopCheck | None = None
    tally: Tally = field(default_factory=Tally)  # what its penalties read (made in start)
    # Speculative decoding: the draft's own states and schedule, and how tokens are chosen.
    draft: Draft | None = None
    chooser: Chooser | None = None

    def expired(self, now: float) -> bool:
        return self.timeout is not None and now - self.submitted > self.timeout

    def start(self, eos: tuple[int, ...] | list[int], tokenizer: Any, vocab: int) -> None:
        """Sampling state, once the request holds a slot (eos: the model's EOS ids)."""
        self.rng = np.random.default_rng(self.cfg.seed)
        self.eos = self.cfg.eos_ids(eos)
        self.stop = stop_check(tokenizer, self.cfg.stops)
        self.tally = Tally.start(self.cfg, [self.prompt], vocab)

    def choose(self, logits: np.ndarray) -> tuple[int, TokenLogprob | None]:
        """The next token sampled from logits [1, V], and its logprob entry when asked."""
        assert self.rng is not None
        raw = logits
        suppress = self.cfg.suppressed(self.eos, len(self.tokens))
        if self.grammar is not None:
            logits, suppress = self.grammar.constrain(logits), ()
        token = int(sample(logits, self.cfg, self.rng, self.tally, suppress)[0])
        entry = None if self.logprobs is None else score(raw, [token], self.logprobs)[0]
        return token, entry

    def record(self, token: int) -> str | None:
        """Take `token` as the next one; the finish reason it brings, if any."""
        self.tokens.append(token)
        self.tally.add([token])
        complete = self.grammar is not None and self.grammar.consume(token)
        if complete or token in self.eos or (self.stop is not None and self.stop(self.tokens)):
            return "stop"
        if len(self.tokens) >= self.cfg.max_new_tokens:
            return "length"
        return None

    def tokens_from(self, start: int) -> list[int]:
        """The prompt and tokens from position `start` on, without joining the whole sequence."""
        n = len(self.prompt)
        return self.prompt[start:] + self.tokens if start < n else self.tokens[start - n :]
