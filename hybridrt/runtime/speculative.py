"""Speculative decoding: a draft model proposes tokens, the target checks them in one call.

A round, for one sequence: the draft runs k steps and proposes d1..dk; the target runs its
pending tokens and d1..dk as one call and returns the logits of the last k + 1 positions,
p1..p(k+1). Greedy keeps the longest prefix with argmax(p_i) = d_i and then takes the
target's own argmax at the first mismatch (or after the last draft), so the output equals
plain greedy decoding. Sampling keeps d_i with probability min(1, p_i(d_i) / q_i(d_i)) and
replaces the first rejected draft by a sample of max(0, p - q) renormalized, or samples
p(k+1) when every draft is kept (Leviathan et al., 2023; transformers' speculative
sampling): the tokens follow the target's distribution, whatever the draft proposes.

Rolling back without copying states: KV needs only the lengths set back, and both models'
fixed states rewind through their steppers' rings (hybridrt.runtime.state). The draft
returns to its states after the last kept draft, which its ring of num_assistant_tokens + 1
sets still holds. A verify call leaves the target's recurrent (SSM, conv) states only after
its last token, so after a rejection the target returns to its states before the call and
runs the kept drafts again, at the start of the next round; an attention-only target just
keeps the kept drafts' keys and values where the call wrote them.

Shapes: V = vocabulary size; one row throughout (rows of a batch run one after another).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

from ..errors import GenerationError
from ..graphs.manifest import Manifest
from .decode import GenerationStats, StopCheck, _record, feed
from .sampling import GenerationConfig, Tally, distribution, draw, processed_logits
from .schedule import DraftSchedule
from .state import Checkpoint, Stepper

Emit = Callable[[int], bool]  # takes a new token; False once the sequence is finished


class Chooser:
    """How one sequence picks its tokens under cfg: greedy or sampled, with the penalties over
    its `tally` (one row: sampling.Tally) and EOS suppressed before min_new_tokens. `index`
    below is the 0-based number of the new token being chosen; a round drafts and judges on
    copies of the tally, so that only the tokens kept count."""

    def __init__(self, cfg: GenerationConfig, eos: Sequence[int], rng: np.random.Generator, tally: Tally) -> None:
        self.cfg, self.eos, self.rng, self.tally = cfg, tuple(eos), rng, tally

    def probs(self, row: np.ndarray, tally: Tally, index: int) -> np.ndarray:
        """The distribution [V] of the token from logits [V]."""
        return distribution(row[None], self.cfg, tally, self.cfg.suppressed(self.eos, index))[0]

    def pick(self, row: np.ndarray, tally: Tally, index: int) -> int:
        """The token from logits [V]: the argmax, or a draw from `probs`."""
        if not self.cfg.sampling:
            logits = processed_logits(row[None], self.cfg, tally, self.cfg.suppressed(self.eos, index))
            return int(logits[0].argmax())
        return int(draw(self.probs(row, tally, index)[None], self.rng)[0])


@dataclass
class Proposal:
    """A round's drafts, their distributions (sampling only), and marks[i]: the draft's
    states once it has run i of them."""

    tokens: list[int]
    q: list[np.ndarray]
    marks: list[Checkpoint]


def propose(draft: Stepper, pending: Sequence[int], k: int, chooser: Chooser, index: int) -> Proposal:
    """Run the draft over `pending` (the context it has not seen) and draft k tokens, the
    first being new token number `index`."""
    row = feed(draft, np.asarray([pending], dtype=np.int64))[0]
    out = Proposal([], [], [draft.checkpoint()])
    tally = chooser.tally.copy()
    for i in range(k):
        if chooser.cfg.sampling:
            q = chooser.probs(row, tally, index + i)
            token = int(draw(q[None], chooser.rng)[0])
            out.q.append(q)
        else:
            token = chooser.pick(row, tally, index + i)
        out.tokens.append(token)
        tally.add([token])
        if i + 1 < k:
            row = draft.forward(np.asarray([[token]], dtype=np.int64))[0]
            out.marks.append(draft.checkpoint())
    return out


def judge(verify: np.ndarray, proposal: Proposal, chooser: Chooser, index: int) -> tuple[int, int]:
    """(drafts kept, the token after them) from the target's logits [k + 1, V] after its
    pending tokens and each draft."""
    tally = chooser.tally.copy()
    for i, d in enumerate(proposal.tokens):
        if chooser.cfg.sampling:
            replacement = accept_or_replace(chooser.probs(verify[i], tally, index + i), proposal.q[i], d, chooser.rng)
        else:
            best = chooser.pick(verify[i], tally, index + i)
            replacement = None if best == d else best
        if replacement is not None:
            return i, replacement
        tally.add([d])
    k = len(proposal.tokens)
    return k, chooser.pick(verify[k], tally, index + k)  # every draft kept: one more from the target


def draft_length(schedule: DraftSchedule, remaining: int, target: Stepper, draft: Stepper, pending: int = 1) -> int:
    """Drafts for the next round: the schedule's, within the new tokens left (the round adds
    one of its own) and the room left in both models after the target's `pending` tokens."""
    k = min(schedule.next_k(), remaining - 1, draft.manifest.max_length - int(draft.lengths[0]))
    return min(k, target.manifest.max_length - int(target.lengths[0]) - pending)


S = TypeVar("S", bound="Source")


class Source(Protocol):
    """What speculative decoding needs of a loaded model (runtime.model.Model)."""

    manifest: Manifest
    tokenizer: Any
    path: Any

    @property
    def weight_bytes(self) -> int: ...

    def stepper(self, batch: int, capacity: int, ring: int = 2) -> Stepper: ...


def check_draft(target: S, draft: object) -> S:
    """The draft model for speculative decoding; GenerationError unless it is a loaded model
    (of the target's class) that shares the target's vocabulary."""
    if not isinstance(draft, type(target)):
        raise GenerationError(f"assistant_model must be a model loaded with hybridrt.load, got {type(draft).__name__}")
    ours, theirs = target.manifest.vocab_size, draft.manifest.vocab_size
    same = ours == theirs
    if same and target.tokenizer is not None and draft.tokenizer is not None:
        same = target.tokenizer.get_vocab() == draft.tokenizer.get_vocab()
    if not same:
        raise GenerationError(
            f"assistant_model {draft.path} does not share this model's tokenizer (vocabularies of "
            f"{theirs} and {ours} tokens{', different tokens' if theirs == ours else ''}); a draft model "
            "must use the target's tokenizer"
        )
    return draft


@dataclass
class Draft:
    """A draft model's states for one sequence and its schedule: they carry over from round
    to round (and from one chat turn to the next)."""

    stepper: Stepper
    schedule: DraftSchedule

    @classmethod
    def start(cls, target: Source, draft: Source, cfg: GenerationConfig, room: int) -> Draft:
        """Fresh draft states with KV for `room` positions (within the draft's max length) and
        a ring that rewinds over the longest draft; the schedule starts from the ratio of the
        two models' sizes (decode reads every weight once per call)."""
        recurrent = target.manifest.recurrent
        schedule = DraftSchedule.of(cfg, cost=draft.weight_bytes / max(target.weight_bytes, 1), recurrent=recurrent)
        room = min(room + schedule.max_k + 2, draft.manifest.max_length)
        return cls(draft.stepper(1, room, ring=schedule.max_k + 1), schedule)

    def round(
        self, target: Stepper, tail: Callable[[int], list[int]], k: int, chooser: Chooser, index: int, emit: Emit
    ) -> tuple[int, bool]:
        """One round over row 0 of `target` (see the module docstring): the draft proposes k
        tokens, the target verifies them in one call, and each token kept (then the target's
        own) goes to `emit`, which says whether the sequence goes on. `tail(start)` is the
        sequence from position `start` on (the context and every token emitted so far); the
        first token drafted is new token number `index`. Returns (drafts kept, goes on).

        Afterwards both steppers have seen a prefix of the sequence: a recurrent target
        rejecting a draft returns to its states before the call, so it runs the kept drafts
        again at the start of the next round (they are in `tail`); a stop inside the round
        returns both to their states before it."""
        t_draft = time.perf_counter()
        proposal = propose(self.stepper, tail(int(self.stepper.lengths[0])), k, chooser, index)
        t_verify = time.perf_counter()
        pending = tail(int(target.lengths[0]))
        if len(pending) > 1:
            # Drafts kept last round, taken back out of the recurrent states with the rest of
            # that call: run them again, so that a rewind never reaches before them.
            feed(target, np.asarray([pending[:-1]], dtype=np.int64))
            pending = pending[-1:]
        before = target.checkpoint()
        verify = target.forward(np.asarray([pending + proposal.tokens], dtype=np.int64), last=k + 1)[0]
        accepted, last = judge(verify, proposal, chooser, index)
        t_end = time.perf_counter()
        self.schedule.update(k, accepted, (t_verify - t_draft) / k, t_end - t_verify, t_end - t_draft)
        for token in proposal.tokens[:accepted] + [last]:
            if not emit(token):
                target.rewind(before)
                self.stepper.rewind(proposal.marks[0])
                return accepted, False
        if accepted < k:
            self.stepper.rewind(proposal.marks[accepted])
            if target.recurrent:
                target.rewind(before)
            else:  # attention only: the kept drafts' keys and values are already in place
                target.rewind(before, keep=len(pending) + accepted)
        return accepted, True


def speculate(
    target: Stepper,
    draft: Draft,
    context: list[int],
    cfg: GenerationConfig,
    eos: Sequence[int],
    stats: GenerationStats,
    history: Sequence[int] | None = None,
    stop: StopCheck | None = None,
) -> Iterator[np.ndarray]:
    """Generate up to cfg.max_new_tokens after `context` (every token so far; each stepper has
    seen a prefix of it, `lengths[0]` tokens, and at least the target has one left to run);
    yields each new token as an int64 [1] array, recording it in `stats` as decode.generate does.

    On return both steppers have again seen a prefix of context + the new tokens, so a chat
    session can continue from them. `history` (default: context) is what the repetition
    penalty counts as seen.
    """
    stats.tokens = [[]]
    out = stats.tokens[0]
    schedule = draft.schedule

    def tail(start: int) -> list[int]:
        return context[start:] + out if start < len(context) else out[start - len(context) :]

    stats.prompt_tokens = len(context) - int(target.lengths[0])
    logits = _catch_up(target, draft.stepper, tail(int(target.lengths[0])), tail(int(draft.stepper.lengths[0])), stats)
    tally = Tally.start(cfg, [history if history is not None else context], target.vocab)
    chooser = Chooser(cfg, eos, np.random.default_rng(cfg.seed), tally)
    eos_ids = np.asarray(eos, dtype=np.int64)
    live = np.ones(1, dtype=bool)
    emitted: list[np.ndarray] = []

    def emit(token: int) -> bool:
        nonlocal live
        tokens = np.asarray([token], dtype=np.int64)
        live = _record(stats.tokens, tokens, live, eos_ids, stop)
        tally.add(tokens)
        emitted.append(tokens)
        return bool(live[0])

    t0 = time.perf_counter()
    try:
        emit(chooser.pick(logits, tally, 0))  # the first token comes from the prefill
        yield from emitted
        emitted.clear()
        while live[0] and len(out) < cfg.max_new_tokens:
            pending = tail(int(target.lengths[0]))
            k = draft_length(schedule, cfg.max_new_tokens - len(out), target, draft.stepper, len(pending))
            if k < 1:  # drafting off, or no room left to draft: one plain step of the target
                emit(chooser.pick(_plain_step(target, pending, schedule), tally, len(out)))
            else:
                accepted, _ = draft.round(target, tail, k, chooser, len(out), emit)
                stats.draft_tokens, stats.accepted_tokens = stats.draft_tokens + k, stats.accepted_tokens + accepted
                stats.rounds += 1
            stats.decode_tokens += len(emitted)
            yield from emitted
            emitted.clear()
    finally:
        stats.decode_s = time.perf_counter() - t0


def _catch_up(
    target: Stepper, draft: Stepper, pending: list[int], pending_draft: list[int], stats: GenerationStats
) -> np.ndarray:
    """Both steppers fed the context they have not seen; the target's last logits."""
    t0 = time.perf_counter()
    logits = feed(target, np.asarray([pending], dtype=np.int64))[0]
    if pending_draft:
        feed(draft, np.asarray([pending_draft], dtype=np.int64))
    stats.prefill_s = time.perf_counter() - t0
    return logits


def _plain_step(target: Stepper, pending: list[int], schedule: DraftSchedule) -> np.ndarray:
    """One call of the target on its pending tokens (a decode step's time feeds the schedule)."""
    t0 = time.perf_counter()
    logits = feed(target, np.asarray([pending], dtype=np.int64))[0]
    if len(pending) == 1:
        schedule.observe_step(time.perf_counter() - t0)
    return logits


def accept_or_replace(p: np.ndarray, q: np.ndarray, drafted: int, rng: np.random.Generator) -> int | None:
    """The speculative sampling rule for one drafted token (drawn from q): None when it is
    kept (with probability min(1, p/q)), else its replacement drawn from max(0, p - q). The
    token that comes out is distributed as p. p, q: [V] target and draft distributions."""
    if rng.random() * q[drafted] <= p[drafted]:
        return None
    residual = np.maximum(p - q, 0.0)
    return int(draw((residual if residual.sum() > 0 else p)[None], rng)[0])
