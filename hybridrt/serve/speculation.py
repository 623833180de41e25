"""Speculative rounds in the engine (hybridrt.serve.engine).

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
request is about to join the batch, the lag is fed first (`feed_lag`), so batched rows take
one token each.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from ..runtime.decode import feed
from ..runtime.model import Model
from ..runtime.speculative import Chooser, Draft, draft_length
from ..runtime.state import Stepper
from .metrics import Metrics
from .request import Request


class Speculation:
    """The engine's speculative rounds: its model, the draft model, the metrics they count."""

    def __init__(self, model: Model, assistant: Model, metrics: Metrics) -> None:
        self.model, self.assistant, self.metrics = model, assistant, metrics

    @staticmethod
    def applies(req: Request) -> bool:
        """Whether req's next tokens may come from a speculative round (it must be alone)."""
        seeded = req.cfg.sampling and req.cfg.seed is not None
        constrained = req.grammar is not None  # its masks apply to plain steps only
        return not (seeded or constrained or req.logprobs is not None)

    def round(self, batch: Stepper, req: Request, step: Callable[[], None], emit: Callable[[int], bool]) -> bool:
        """One round of req, the lone row of `batch`: its draft's tokens verified in one call and
        sent through `emit`, or `step` (a plain decode step) where no draft is worth its call.
        False once req finished inside the round (its row is then back to before the call)."""
        if req.draft is None or req.chooser is None:
            assert req.rng is not None
            req.draft = Draft.start(self.model, self.assistant, req.cfg, len(req.prompt) + req.cfg.max_new_tokens)
            req.chooser = Chooser(req.cfg, req.eos, req.rng, req.tally)
        pending = req.tokens_from(int(batch.lengths[0]))
        remaining = req.cfg.max_new_tokens - len(req.tokens)
        k = draft_length(req.draft.schedule, remaining, batch, req.draft.stepper, len(pending))
        if k < 1:
            t_step = time.perf_counter()
            step()
            if len(pending) == 1:
                req.draft.schedule.observe_step(time.perf_counter() - t_step)
            return True
        # Counted before the round: a request that finishes inside it is answered from there, and
        # what a reader sees once it is answered must include its drafts.
        self.metrics.drafted_tokens.inc(k)
        accepted, live = req.draft.round(batch, req.tokens_from, k, req.chooser, len(req.tokens), emit)
        self.metrics.accepted_tokens.inc(accepted)
        return live


def feed_lag(batch: Stepper | None, running: list[Request]) -> None:
    """Feed the lone running request's lag (drafts it kept that its recurrent row took back),
    so that its row has seen all but its last token."""
    if batch is not None and batch.batch == 1:  # running[0] is its row
        pending = running[0].tokens_from(int(batch.lengths[0]))
        if len(pending) > 1:
            feed(batch, np.asarray([pending[:-1]], dtype=np.int64))
