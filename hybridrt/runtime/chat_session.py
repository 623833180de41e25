"""A conversation whose states persist between calls (Model.session)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from ..errors import GenerationError
from . import decode as dec
from .prefix_cache import StateCache
from .sampling import GenerationConfig
from .speculative import Draft, Source, check_draft, speculate
from .state import Stepper
from .streaming import Output, TextStream
from .text import Prompts, need_tokenizer, stop_check


class Conversant(Source, Protocol):
    """What a chat session needs of its model (runtime.model.Model)."""

    eos_token_ids: tuple[int, ...]

    @property
    def max_length(self) -> int: ...

    def generation_config(self, **kwargs: Any) -> GenerationConfig: ...

    def prompt_rows(
        self, prompt: Any, cfg: GenerationConfig | None = None, add_special_tokens: bool = True
    ) -> Prompts: ...

    def check_length(
        self, rows: Sequence[Sequence[int]], cfg: GenerationConfig, past: int = 0, memory: bool = True
    ) -> None: ...

    def _capacity_for(self, rows: Sequence[Sequence[int]], cfg: GenerationConfig, past: int = 0) -> int: ...

    def _steps(
        self,
        stepper: Stepper,
        rows: Sequence[Sequence[int]],
        cfg: GenerationConfig,
        stats: dec.GenerationStats,
        history: Sequence[Sequence[int]] | None = None,
        cache: StateCache | None = None,
    ) -> Iterator[np.ndarray]: ...

    def _pieces(self, steps: Iterator[np.ndarray], stats: dec.GenerationStats) -> Iterator[str]: ...

    def _format(self, prompts: Prompts, tokens: list[list[int]], per_prompt: int = 1) -> Output: ...


class ChatSession:
    """One sequence whose states persist between calls: a later call prefills only the tokens
    its states have not seen (the new prompt, plus at least the last token of the previous
    reply). Greedy output over several calls equals one call on the concatenated tokens.
    With assistant_model, the draft's states persist too (until another draft is given).
    With a prefix state `cache`, a turn without a draft resumes from the deepest state stored
    for the conversation (a new session whose history the cache has seen prefills only the
    rest) and stores states there."""

    def __init__(self, model: Conversant, cache: StateCache | None = None) -> None:
        self.model = model
        self.cache = cache
        self.reset()

    def reset(self) -> None:
        """Forget the conversation: the next call starts from fresh states."""
        self.stepper: Stepper | None = None
        self.history: list[int] = []  # every token of the conversation, the pending ones included
        self.pending: list[int] = []  # in the history but not yet fed to the states
        self.draft_model: Conversant | None = None
        self.draft: Draft | None = None

    def generate(self, prompt: Any, assistant_model: Conversant | None = None, **kwargs: Any) -> Output:
        """As Model.generate, for one prompt, continuing the conversation."""
        return self.generate_with_stats(prompt, assistant_model, **kwargs)[0]

    def generate_with_stats(
        self, prompt: Any, assistant_model: Conversant | None = None, timeout: float | None = None, **kwargs: Any
    ) -> tuple[Output, dec.GenerationStats]:
        deadline = dec.deadline_after(timeout)
        cfg, prompts = self._prepare(prompt, kwargs)
        stats = dec.GenerationStats()
        for _ in dec.until(self._steps(prompts, cfg, stats, assistant_model), deadline, stats):
            pass
        return self.model._format(prompts, stats.tokens), stats

    def stream(
        self, prompt: Any, assistant_model: Conversant | None = None, timeout: float | None = None, **kwargs: Any
    ) -> TextStream:
        """As Model.stream, continuing the conversation."""
        deadline = dec.deadline_after(timeout)
        cfg, prompts = self._prepare(prompt, kwargs)
        need_tokenizer(self.model.tokenizer)
        stats = dec.GenerationStats()
        steps = dec.until(self._steps(prompts, cfg, stats, assistant_model), deadline, stats)
        return TextStream(self.model._pieces(steps, stats), stats)

    def _prepare(self, prompt: Any, kwargs: dict[str, Any]) -> tuple[GenerationConfig, Prompts]:
        m = self.model
        cfg = m.generation_config(**kwargs)
        if cfg.num_beams > 1:
            raise GenerationError(
                "beam search needs the whole sequence before it answers, and a chat session answers turn "
                "by turn; use Model.generate() on the conversation"
            )
        # Special tokens (BOS) open a conversation, not each turn.
        prompts = m.prompt_rows(prompt, cfg, add_special_tokens=not self.history)
        if not prompts.single:
            raise GenerationError("a chat session holds one sequence: pass one prompt per call")
        m.check_length(prompts.rows, cfg, past=len(self.history))
        return cfg, prompts

    def _steps(
        self,
        prompts: Prompts,
        cfg: GenerationConfig,
        stats: dec.GenerationStats,
        assistant: Conversant | None = None,
    ) -> Iterator[np.ndarray]:
        m = self.model
        new = prompts.rows[0]
        context = self.history + new
        if assistant is not None:
            draft = check_draft(m, assistant)
            if self.draft_model is not draft or self.draft is None:
                # A new draft (or the first): it catches up on the whole conversation.
                room = len(context) + cfg.max_new_tokens
                self.draft = Draft.start(m, draft, cfg, room)
                self.draft_model = draft
                if self.stepper is None:
                    self.stepper = m.stepper(1, min(room + self.draft.schedule.max_k + 2, m.max_length), ring=2)
            if self.stepper is not None:  # turns without a draft ran it in place: now it must rewind a call
                self.stepper = self.stepper.rewinding(1)
        if self.stepper is None:
            # Room for this turn; later turns regrow the KV buffers (doubling) when they need more.
            self.stepper = m.stepper(1, m._capacity_for(prompts.rows, cfg, len(self.history)))
        stepper = self.stepper
        if assistant is not None:
            assert self.draft is not None
            eos = cfg.eos_ids(m.eos_token_ids)
            stop = stop_check(m.tokenizer, cfg.stops)
            steps = speculate(stepper, self.draft, context, cfg, eos, stats, None, stop)
        else:
            steps = m._steps(stepper, [self.pending + new], cfg, stats, [context], self.cache)
        try:
            yield from steps
        except Exception:
            self.reset()  # the states may be half-updated
            raise
        finally:
            if self.stepper is not None and stats.tokens:
                # Also when a stream is closed early: the states have seen a prefix of the history.
                self.history = context + stats.tokens[0]
                self.pending = self.history[int(stepper.lengths[0]) :]
