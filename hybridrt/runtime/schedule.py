"""How many tokens a draft model proposes per round of speculative decoding (runtime.speculative)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .sampling import GenerationConfig

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
