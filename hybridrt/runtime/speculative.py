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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from .decode import GenerationStats, StopCheck, _record, feed
from .sampling import GenerationConfig, distribution, draw, processed_logits
from .state import Checkpoint, Stepper

# Longest draft a schedule may reach; a draft stepper keeps this many + 1 sets of states.
MAX_DRAFT = 16
# With drafting off (adaptive schedule), plain steps between one-token probes of the draft
# (a probe costs the draft a call over every token it missed, and the target a re-run).
PROBE = 64
# Plain steps the adaptive schedule runs first, to time one step of the target.
WARMUP = 2


@dataclass
class DraftSchedule:
    """How many tokens the draft proposes next round.

    "adaptive": the k that maximizes expected tokens per unit of time, (1 - a^(k+1)) / (1 - a)
    tokens for the time of k draft steps and one verify call (k c + 1, plus one more target
    call when a recurrent target rejects a draft and runs the kept ones again), from the running
    per-token acceptance rate a and the ratio c of a draft step's time to a verify call's
    (both decayed so that they follow the text); k = 0 (plain target steps) when no k
    beats one token per call, with a one-token probe every PROBE steps to see whether the
    draft has become useful. "heuristic": transformers' rule, +2 after a round that kept every
    draft and -1 otherwise. "constant": always `k`.

    c starts as the ratio of the two models' weight bytes (decode reads every weight once per
    call) and follows measured times only when `timed`: for greedy decoding, whose output
    no schedule changes, and for unseeded sampling. Seeded sampling keeps the schedule a
    function of the tokens alone, so that one seed always gives the same text. When timed,
    the adaptive schedule also runs its first WARMUP steps plain to time a target step, and
    stops drafting whenever its rounds yield fewer tokens per second than plain steps do
    (small models, whose calls cost mostly their fixed overhead, are where the model above
    is too hopeful).
    """

    k: int
    mode: str = "adaptive"
    max_k: int = MAX_DRAFT
    kept: float = 1.0  # decayed counts behind the acceptance rate (a prior of 1 of 2)
    rejected: float = 1.0
    cost: float = 0.3  # draft step / verify call, seconds over seconds
    timed: bool = True
    rerun: float = 0.0  # extra target calls a rejection costs: 1 for a recurrent target
    idle: int = 0  # plain steps since drafting stopped (adaptive)
    probe: int = PROBE  # plain steps between probes: doubles after each probe that fails
    warmup: int = 0  # plain steps still to run first (adaptive, timed)
    step_s: float = 0.0  # decayed seconds of one plain target step (0: not measured yet)
    round_rate: float = 0.0  # decayed tokens per second of drafting rounds

    @classmethod
    def of(cls, cfg: GenerationConfig, cost: float = 0.3, recurrent: bool = True) -> DraftSchedule:
        k = int(cfg.num_assistant_tokens)
        timed = not cfg.sampling or cfg.seed is None
        mode, top = cfg.num_assistant_tokens_schedule, max(k, MAX_DRAFT)
        warmup = WARMUP if mode == "adaptive" and timed else 0
        return cls(k, mode, top, cost=cost, timed=timed, rerun=1.0 if recurrent else 0.0, warmup=warmup)

    def next_k(self) -> int:
        """Drafts for the next round (0: a plain step of the target)."""
        if self.warmup > 0:
            self.warmup -= 1
            return 0
        if self.k == 0:
            self.idle += 1
            if self.idle > self.probe:
                self.k, self.idle = 1, 0
                self.probe = min(2 * self.probe, 64 * PROBE)  # back to PROBE once drafting pays
        return self.k

    @property
    def acceptance(self) -> float:
        return self.kept / (self.kept + self.rejected)

    def observe_step(self, seconds: float) -> None:
        """Learn from one plain one-token step of the target."""
        self.step_s = seconds if self.step_s == 0 else 0.8 * self.step_s + 0.2 * seconds

    def update(self, proposed: int, accepted: int, draft_step_s: float, verify_s: float, round_s: float = 0.0) -> None:
        """Learn from one round: `accepted` of `proposed` drafts kept; round_s is the whole
        round's time (drafting, any re-run, verifying)."""
        if self.mode == "heuristic":
            self.k = self.k + 2 if accepted == proposed else max(1, self.k - 1)
        elif self.mode == "adaptive":
            decay = 0.9
            self.kept = decay * self.kept + accepted
            self.rejected = decay * self.rejected + (accepted < proposed)
            if self.timed and verify_s > 0:
                self.cost = decay * self.cost + (1 - decay) * draft_step_s / verify_s
            self.k = self.best_k()
            if self.timed and round_s > 0:
                rate = (accepted + 1) / round_s
                self.round_rate = rate if self.round_rate == 0 else 0.8 * self.round_rate + 0.2 * rate
                if self.step_s > 0 and self.round_rate * self.step_s < 1:
                    self.k = 0  # measured: plain steps are faster
            if self.k > 0:
                self.probe = PROBE
        self.k = min(self.k, self.max_k)

    def best_k(self) -> int:
        a = min(self.acceptance, 0.999)
        ks = np.arange(1, self.max_k + 1)
        gain = (1 - a ** (ks + 1)) / (1 - a) / (ks * self.cost + 1 + (1 - a**ks) * self.rerun)
        return int(ks[gain.argmax()]) if gain.max() > 1 else 0


class Chooser:
    """How one sequence picks its tokens under cfg: greedy or sampled, with the repetition
    penalty over `seen` [V] (None: no penalty) and EOS suppressed before min_new_tokens.
    `index` below is the 0-based number of the new token being chosen."""

    def __init__(
        self, cfg: GenerationConfig, eos: Sequence[int], rng: np.random.Generator, seen: np.ndarray | None
    ) -> None:
        self.cfg, self.eos, self.rng, self.seen = cfg, tuple(eos), rng, seen

    def _suppress(self, index: int) -> tuple[int, ...]:
        return self.eos if index < self.cfg.min_new_tokens else ()

    def probs(self, row: np.ndarray, seen: np.ndarray | None, index: int) -> np.ndarray:
        """The distribution [V] of the token from logits [V]."""
        return distribution(row[None], self.cfg, None if seen is None else seen[None], self._suppress(index))[0]

    def pick(self, row: np.ndarray, seen: np.ndarray | None, index: int) -> int:
        """The token from logits [V]: the argmax, or a draw from `probs`."""
        if not self.cfg.sampling:
            logits = processed_logits(row[None], self.cfg, None if seen is None else seen[None], self._suppress(index))
            return int(logits[0].argmax())
        return int(draw(self.probs(row, seen, index)[None], self.rng)[0])

    def seen_copy(self) -> np.ndarray | None:
        return None if self.seen is None else self.seen.copy()


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
    seen = chooser.seen_copy()
    for i in range(k):
        if chooser.cfg.sampling:
            q = chooser.probs(row, seen, index + i)
            token = int(draw(q[None], chooser.rng)[0])
            out.q.append(q)
        else:
            token = chooser.pick(row, seen, index + i)
        out.tokens.append(token)
        if seen is not None:
            seen[token] = True
        if i + 1 < k:
            row = draft.forward(np.asarray([[token]], dtype=np.int64))[0]
            out.marks.append(draft.checkpoint())
    return out


def judge(verify: np.ndarray, proposal: Proposal, chooser: Chooser, index: int) -> tuple[int, int]:
    """(drafts kept, the token after them) from the target's logits [k + 1, V] after its
    pending tokens and each draft."""
    seen = chooser.seen_copy()
    for i, d in enumerate(proposal.tokens):
        if chooser.cfg.sampling:
            replacement = accept_or_replace(chooser.probs(verify[i], seen, index + i), proposal.q[i], d, chooser.rng)
        else:
            best = chooser.pick(verify[i], seen, index + i)
            replacement = None if best == d else best
        if replacement is not None:
            return i, replacement
        if seen is not None:
            seen[d] = True
    k = len(proposal.tokens)
    return k, chooser.pick(verify[k], seen, index + k)  # every draft kept: one more from the target


def draft_length(schedule: DraftSchedule, remaining: int, target: Stepper | None, pending: int, draft: Stepper) -> int:
    """Drafts for the next round: the schedule's, within the new tokens left (the round adds
    one of its own) and the room left in both models (`target` None: not limited here)."""
    k = min(schedule.next_k(), remaining - 1, draft.manifest.max_length - int(draft.lengths[0]))
    if target is not None:
        k = min(k, target.manifest.max_length - int(target.lengths[0]) - pending)
    return k


def speculate(
    target: Stepper,
    draft: Stepper,
    context: list[int],
    cfg: GenerationConfig,
    eos: Sequence[int],
    stats: GenerationStats,
    schedule: DraftSchedule,
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
    pend_t = context[int(target.lengths[0]) :]
    stats.prompt_tokens = len(pend_t)
    t0 = time.perf_counter()
    logits = feed(target, np.asarray([pend_t], dtype=np.int64))[0]
    pend_d = context[int(draft.lengths[0]) :]
    if pend_d:
        feed(draft, np.asarray([pend_d], dtype=np.int64))
    stats.prefill_s = time.perf_counter() - t0
    seen = _seen(history if history is not None else context, target.vocab) if cfg.repetition_penalty != 1.0 else None
    chooser = Chooser(cfg, eos, np.random.default_rng(cfg.seed), seen)
    eos_ids = np.asarray(eos, dtype=np.int64)
    live = np.ones(1, dtype=bool)

    def emit(token: int) -> np.ndarray:
        nonlocal live
        tokens = np.asarray([token], dtype=np.int64)
        live = _record(stats.tokens, tokens, live, eos_ids, stop)
        if seen is not None:
            seen[token] = True
        return tokens

    t0 = time.perf_counter()
    try:
        first = chooser.pick(logits, seen, 0)
        yield emit(first)
        pend_t, pend_d = [first], [first]
        while live[0] and len(out) < cfg.max_new_tokens:
            k = draft_length(schedule, cfg.max_new_tokens - len(out), target, len(pend_t), draft)
            if k < 1:  # drafting off, or no room left to draft: one plain step of the target
                t_step = time.perf_counter()
                logits = feed(target, np.asarray([pend_t], dtype=np.int64))[0]
                if len(pend_t) == 1:
                    schedule.observe_step(time.perf_counter() - t_step)
                token = chooser.pick(logits, seen, len(out))
                pend_d.append(token)
                pend_t = [token]
                yield emit(token)
                stats.decode_tokens += 1
                continue
            t_draft = time.perf_counter()
            proposal = propose(draft, pend_d, k, chooser, len(out))
            t_verify = time.perf_counter()
            if len(pend_t) > 1:
                # Drafts kept last round, taken back out of the recurrent states with the rest
                # of that call: run them again, so that a rewind never reaches before them.
                feed(target, np.asarray([pend_t[:-1]], dtype=np.int64))
                pend_t = pend_t[-1:]
            before = target.checkpoint()
            verify = target.forward(np.asarray([pend_t + proposal.tokens], dtype=np.int64), last=k + 1)[0]
            accepted, last = judge(verify, proposal, chooser, len(out))
            t_end = time.perf_counter()
            schedule.update(k, accepted, (t_verify - t_draft) / k, t_end - t_verify, t_end - t_draft)
            stats.draft_tokens += k
            stats.accepted_tokens += accepted
            stats.rounds += 1
            for token in proposal.tokens[:accepted] + [last]:
                yield emit(token)
                stats.decode_tokens += 1
                if not live[0]:
                    break
            if not live[0]:
                # Stopped inside the round: back to where both had seen only the old context.
                target.rewind(before)
                draft.rewind(proposal.marks[0])
                break
            if accepted == k:
                pend_t, pend_d = [last], [proposal.tokens[-1], last]
                continue
            draft.rewind(proposal.marks[accepted])
            pend_d = [last]
            if target.recurrent:
                target.rewind(before)
                pend_t = pend_t + proposal.tokens[:accepted] + [last]
            else:  # attention only: the kept drafts' keys and values are already in place
                target.rewind(before, keep=len(pend_t) + accepted)
                pend_t = [last]
    finally:
        stats.decode_s = time.perf_counter() - t0


def accept_or_replace(p: np.ndarray, q: np.ndarray, drafted: int, rng: np.random.Generator) -> int | None:
    """The speculative sampling rule for one drafted token (drawn from q): None when it is
    kept (with probability min(1, p/q)), else its replacement drawn from max(0, p - q). The
    token that comes out is distributed as p. p, q: [V] target and draft distributions."""
    if rng.random() * q[drafted] <= p[drafted]:
        return None
    residual = np.maximum(p - q, 0.0)
    return int(draw((residual if residual.sum() > 0 else p)[None], rng)[0])


def _seen(tokens: Sequence[int], vocab: int) -> np.ndarray:
    seen = np.zeros(vocab, dtype=bool)
    seen[np.asarray(tokens, dtype=np.int64)] = True
    return seen
