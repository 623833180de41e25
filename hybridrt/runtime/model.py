"""A loaded model: generate, stream, and chat sessions that keep their states between turns."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import GenerationError, GenerationTimeout
from ..graphs.generation import merge
from ..graphs.manifest import Manifest
from . import decode as dec
from .beam import beam_search
from .bound import BoundStepper
from .evaluate import evaluate
from .input_checks import check_eos_ids, check_memory, rows_that_fit
from .prefix_cache import StateCache
from .sampling import GenerationConfig
from .speculative import Draft, check_draft, speculate
from .state import PlainStepper, Stepper
from .state_files import identity
from .text import Prompts, StreamDecoder, as_prompts, decode, need_tokenizer, stop_check

Output = str | list[str] | list[int] | list[list[int]] | list[list[str]] | list[list[list[int]]]
BEAMS_NEED_GENERATE = "beam search needs the whole sequence before it answers; use generate()"


class TextStream(Iterator[str]):
    """Text pieces of a continuation as they are generated; `stats` fills in as it runs and
    is complete once the stream is exhausted (or closed)."""

    def __init__(self, pieces: Iterator[str], stats: dec.GenerationStats) -> None:
        self._pieces = pieces
        self.stats = stats

    def __next__(self) -> str:
        return next(self._pieces)

    def close(self) -> None:
        """Stop generating; a chat session keeps the states of the tokens so far."""
        close = getattr(self._pieces, "close", None)
        if close is not None:
            close()


class Model:
    """One ONNX Runtime session over an exported directory; see hybridrt.load.

    generate(prompt, **GenerationConfig fields): text in -> text out (str, or list for a list);
    token ids in -> the new token ids (list[int], or one list per prompt for a batch).
    num_beams > 1 runs beam search (as transformers'); with num_return_sequences r > 1 each
    prompt gives a list of its r best outputs, best first (a str prompt: list[str]; ids:
    list[list[int]]; a batch: one such list per prompt).
    generate_with_stats returns (output, GenerationStats); stream's TextStream carries .stats.

    assistant_model=draft (another loaded Model of the same tokenizer) decodes speculatively
    (hybridrt.runtime.speculative): greedy output is the same as without it, sampled output
    follows the same distribution; stats report drafts proposed and kept. A batch then runs
    one prompt after another.

    evaluate(text) scores a text (perplexity, bits per byte; hybridrt.runtime.evaluate).

    For callers that run their own loop (the server engine, beam search, scripts):
    generation_config(**kwargs) resolves settings, prompt_rows(prompt) gives token rows,
    check_length(rows, cfg) checks they fit, and stepper(batch, capacity) gives a state batch
    (hybridrt.runtime.state.Stepper): logits for ids from carried states, rows that join,
    leave and rewind.
    """

    def __init__(
        self,
        path: Path,
        manifest: Manifest,
        session: Any,
        tokenizer: Any | None,
        device: tuple[str, int],
        io_binding: bool = True,
    ) -> None:
        self.path = path
        self.manifest = manifest
        self.inference_session = session
        self.tokenizer = tokenizer
        self.device = device
        self.io_binding = io_binding
        # False on onnxruntime 1.31 (graphs/compat.py): a chunk after a past takes one row.
        self.batched_chunks = True
        # Decode steps bound to fixed buffers and replayed as CUDA graphs (loader's cuda_graph);
        # length_inputs: attention's lengths the graph reads as inputs (graphs/compat.py).
        self.cuda_graph = False
        self.length_inputs: tuple[str, ...] = ()
        special = manifest.special_tokens
        eos = special.get("eos_token_id")
        self.eos_token_ids: tuple[int, ...] = () if eos is None else tuple(np.atleast_1d(eos).astype(int).tolist())
        pad = special.get("pad_token_id")
        self.pad_token_id = int(pad if pad is not None else (self.eos_token_ids or (0,))[0])

    def __repr__(self) -> str:
        return f"Model({str(self.path)!r}, {self.manifest.architecture}, providers={self.providers})"

    @property
    def providers(self) -> list[str]:
        """The execution providers the session runs on, in order."""
        return list(self.inference_session.get_providers())

    @property
    def max_length(self) -> int:
        return self.manifest.max_length

    @property
    def weight_bytes(self) -> int:
        """Bytes of the graph and its external weights on disk."""
        files = [self.path / f for f in self.manifest.files if f.startswith(self.manifest.graph_file)]
        return sum(f.stat().st_size for f in files if f.is_file())

    def generate(
        self,
        prompt: Any,
        assistant_model: Model | None = None,
        cache: StateCache | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> Output:
        """Generate for one prompt or a batch (each row as if alone). With a prefix state
        `cache` (Model.state_cache), one prompt resumes from the deepest state stored for it
        and leaves states there for later calls. With `timeout` (seconds), the call stops after
        the step that passes it and raises GenerationTimeout (its .stats: the tokens so far)."""
        return self.generate_with_stats(prompt, assistant_model, cache, timeout, **kwargs)[0]

    def generate_with_stats(
        self,
        prompt: Any,
        assistant_model: Model | None = None,
        cache: StateCache | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> tuple[Output, dec.GenerationStats]:
        """As generate, with what the generation did: token counts and timings."""
        deadline = _deadline(timeout)
        cfg = self.generation_config(**kwargs)
        prompts = self.prompt_rows(prompt, cfg)
        fit = rows_that_fit(self.manifest, max(len(r) for r in prompts.rows) + cfg.max_new_tokens) // cfg.num_beams
        batches = assistant_model is None and cache is None and 1 <= fit < len(prompts.rows)
        self.check_length(prompts.rows, cfg, memory=not batches)
        if cache is not None:  # one prompt, no beams, no draft: the plain loop below
            self._check_cache(cache, prompts, cfg, assistant_model)
        if assistant_model is not None:
            if cfg.num_beams > 1:
                raise GenerationError(
                    "beam search and an assistant_model do not combine: pass num_beams=1 to decode "
                    "speculatively, or no assistant_model for beam search"
                )
            draft = check_draft(self, assistant_model)
            runs = []
            for row in prompts.rows:
                runs.append(dec.GenerationStats())
                for _ in until(self._speculative(draft, row, cfg, runs[-1]), deadline, runs[-1]):
                    pass
            stats = dec.GenerationStats.combine(runs)
            return self._format(prompts, stats.tokens), stats
        if cfg.num_beams > 1 and deadline is not None:
            raise GenerationError("timeout does not stop beam search, which ends all beams at once: drop one")
        if batches:  # more rows than the memory limit holds at once: in batches that fit, one after another
            return self._in_batches(prompts, cfg, fit, deadline)
        stats = dec.GenerationStats()
        capacity = self._capacity_for(prompts.rows, cfg)
        if cfg.num_beams > 1:
            stepper = self.stepper(len(prompts.rows) * cfg.num_beams, capacity)
            eos = cfg.eos_ids(self.eos_token_ids)
            tokens = beam_search(stepper, prompts.rows, cfg, eos, stats)
            return self._format(prompts, tokens, cfg.num_return_sequences), stats
        stepper = self.stepper(len(prompts.rows), capacity)
        for _ in until(self._steps(stepper, prompts.rows, cfg, stats, cache=cache), deadline, stats):
            pass
        return self._format(prompts, stats.tokens), stats

    def _in_batches(
        self, prompts: Prompts, cfg: GenerationConfig, fit: int, deadline: float | None
    ) -> tuple[Output, dec.GenerationStats]:
        """generate's rows `fit` at a time (each row is generated as if alone, so the tokens are
        those of one batch); the stats of the batches combined, in row order."""
        runs, tokens = [], []
        for start in range(0, len(prompts.rows), fit):
            part = prompts.rows[start : start + fit]
            stats = dec.GenerationStats()
            capacity = self._capacity_for(part, cfg)
            if cfg.num_beams > 1:
                stepper = self.stepper(len(part) * cfg.num_beams, capacity)
                tokens += beam_search(stepper, part, cfg, cfg.eos_ids(self.eos_token_ids), stats)
            else:
                for _ in until(self._steps(self.stepper(len(part), capacity), part, cfg, stats), deadline, stats):
                    pass
                tokens += stats.tokens
            runs.append(stats)
        combined = dec.GenerationStats.combine(runs)
        return self._format(prompts, tokens, cfg.num_return_sequences if cfg.num_beams > 1 else 1), combined

    def stream(
        self,
        prompt: str | Sequence[int],
        assistant_model: Model | None = None,
        cache: StateCache | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> TextStream:
        """Text pieces of one prompt's continuation, as they are generated (see TextStream);
        `cache` and `timeout` as generate's (the timeout raised by the iteration). Closing the
        stream stops the generation: nothing more is computed."""
        deadline = _deadline(timeout)
        cfg = self.generation_config(**kwargs)
        if cfg.num_beams > 1:
            raise GenerationError(BEAMS_NEED_GENERATE)
        need_tokenizer(self.tokenizer)
        prompts = self.prompt_rows(prompt, cfg)
        if not prompts.single:
            raise GenerationError("stream() takes one prompt; use generate() for a batch")
        self.check_length(prompts.rows, cfg)
        stats = dec.GenerationStats()
        if cache is not None:
            self._check_cache(cache, prompts, cfg, assistant_model)
        if assistant_model is not None:
            steps = self._speculative(check_draft(self, assistant_model), prompts.rows[0], cfg, stats)
        else:
            stepper = self.stepper(1, self._capacity_for(prompts.rows, cfg))
            steps = self._steps(stepper, prompts.rows, cfg, stats, cache=cache)
        return TextStream(self._pieces(until(steps, deadline, stats), stats), stats)

    def session(self, cache: StateCache | None = None) -> ChatSession:
        """A conversation whose states carry over from one generate() call to the next; with a
        prefix state `cache`, its first turn resumes from it and every turn leaves states there."""
        if cache is not None:
            self._check_cache(cache)
        return ChatSession(self, cache)

    def state_cache(
        self,
        memory_bytes: int | None = None,
        directory: str | Path | None = None,
        disk_bytes: int | None = None,
        spacing: int | None = None,
        stored: str = "float32",
    ) -> StateCache:
        """A prefix state cache for this model (hybridrt.runtime.prefix_cache): pass it to
        generate, stream or session. memory_bytes: its budget (default: a quarter of the memory
        available now); directory: a disk tier that outlives the process; disk_bytes: that
        tier's cap (default: half its free space); spacing: tokens between states stored
        inside long prompts (default: about 16 a prompt, by its length); stored: "bfloat16"
        keeps float32 states at half the bytes (resumed requests close to, not equal to, cold ones)."""
        return StateCache.for_model(
            self,
            memory_bytes=memory_bytes,
            directory=directory,
            disk_bytes=disk_bytes,
            spacing=spacing,
            stored=stored,
        )

    def _check_cache(
        self,
        cache: StateCache,
        prompts: Prompts | None = None,
        cfg: GenerationConfig | None = None,
        assistant: Model | None = None,
    ) -> None:
        if not isinstance(cache, StateCache) or cache.owner != identity(self.manifest, self.path):
            raise GenerationError("cache= takes a StateCache made for this model: model.state_cache()")
        if prompts is not None and not prompts.single:
            raise GenerationError("cache= takes one prompt; generate a batch without it, or one prompt at a time")
        if cfg is not None and cfg.num_beams > 1:
            raise GenerationError("beam search does not resume from a prefix state cache: drop cache= or num_beams")
        if assistant is not None:
            raise GenerationError(
                "speculative decoding does not resume from a prefix state cache: drop cache= or assistant_model"
            )

    def evaluate(
        self, text: str, window: int | None = None, stride: int | None = None, progress: Any = None
    ) -> dict[str, Any]:
        """Perplexity and bits per byte of `text` (sliding windows: hybridrt.runtime.evaluate)."""
        return evaluate(self, text, window, stride, progress)

    # The lower layer, for callers that run their own loop (see the class docstring).

    def generation_config(self, **kwargs: Any) -> GenerationConfig:
        """The settings generate() would use: the caller's parameters over the model's
        recommended ones (manifest `generation`, from the checkpoint's generation_config.json)."""
        GenerationConfig.from_kwargs(**kwargs)  # the caller's own values, checked first
        return GenerationConfig.from_kwargs(**merge(self.manifest.generation, kwargs))

    def prompt_rows(self, prompt: Any, cfg: GenerationConfig | None = None, add_special_tokens: bool = True) -> Prompts:
        """Token rows of a prompt (text, ids, or a batch of either); text gets the BOS token first
        when cfg (by default the model's recommended settings) asks for it with add_bos_token."""
        cfg = cfg or self.generation_config()
        prompts = as_prompts(prompt, self.tokenizer, self.manifest.vocab_size, add_special_tokens)
        bos = self.manifest.special_tokens.get("bos_token_id")
        if prompts.text and add_special_tokens and cfg.add_bos_token and isinstance(bos, int):
            for row in prompts.rows:
                if row[0] != bos:
                    row.insert(0, bos)
        return prompts

    def stepper(self, batch: int, capacity: int, ring: int = 1) -> Stepper:
        """A state batch of `batch` fresh rows (zero states, lengths 0) with KV buffers of
        `capacity` positions, regrown when a call needs more: bound on the session's device
        (unless the model was loaded with io_binding=False). `ring`: how many sets of
        fixed-size states it keeps, so that it can rewind ring - 1 calls; with 1 (no rewinds)
        the states that can be are read and written in place (runtime.bound)."""
        if self.io_binding:
            stepper: Stepper = BoundStepper(
                self.inference_session,
                self.manifest,
                batch,
                capacity,
                self.device,
                ring,
                capture=self.cuda_graph,
                length_inputs=self.length_inputs,
            )
        else:
            stepper = PlainStepper(self.inference_session, self.manifest, batch, capacity)
        stepper.batched_chunks = self.batched_chunks
        return stepper

    def _speculative(
        self, draft: Model, row: list[int], cfg: GenerationConfig, stats: dec.GenerationStats
    ) -> Iterator[np.ndarray]:
        room = len(row) + cfg.max_new_tokens
        drafter = Draft.start(self, draft, cfg, room)
        target = self.stepper(1, min(room + drafter.schedule.max_k + 2, self.max_length), ring=2)
        eos = cfg.eos_ids(self.eos_token_ids)
        return speculate(target, drafter, list(row), cfg, eos, stats, None, stop_check(self.tokenizer, cfg.stops))

    def _capacity_for(self, rows: Sequence[Sequence[int]], cfg: GenerationConfig, past: int = 0) -> int:
        """KV positions a generation needs: the longest row after `past` tokens, plus
        max_new_tokens (within the model's max length)."""
        return min(past + max(len(r) for r in rows) + cfg.max_new_tokens, self.max_length)

    def check_length(
        self, rows: Sequence[Sequence[int]], cfg: GenerationConfig, past: int = 0, memory: bool = True
    ) -> None:
        """GenerationError unless rows (after `past` tokens) and cfg.max_new_tokens fit the model:
        its max length, its vocabulary (EOS ids) and (with `memory`) the batch memory limit.
        Also for callers that run their own decode loop (hybridrt.serve)."""
        longest = past + max(len(r) for r in rows)
        if longest + cfg.max_new_tokens > self.max_length:
            raise GenerationError(
                f"prompt of {longest} tokens + max_new_tokens {cfg.max_new_tokens} exceeds the model's max length "
                f"{self.max_length}; shorten the prompt or lower max_new_tokens"
            )
        check_eos_ids(cfg.eos_ids(()), self.manifest.vocab_size)
        if memory:
            check_memory(self.manifest, len(rows) * cfg.num_beams, longest + cfg.max_new_tokens)

    def _steps(
        self,
        stepper: Stepper,
        rows: Sequence[Sequence[int]],
        cfg: GenerationConfig,
        stats: dec.GenerationStats,
        history: Sequence[Sequence[int]] | None = None,
        cache: StateCache | None = None,
    ) -> Iterator[np.ndarray]:
        eos = cfg.eos_ids(self.eos_token_ids)
        stop = stop_check(self.tokenizer, cfg.stops)
        return dec.generate(stepper, rows, cfg, eos, self.pad_token_id, stats, history, stop, cache)

    def _pieces(self, steps: Iterator[np.ndarray], stats: dec.GenerationStats) -> Iterator[str]:
        stream = StreamDecoder(self.tokenizer)
        done = 0
        for _ in steps:
            for token in stats.tokens[0][done:]:
                piece = stream.push(token)
                if piece:
                    yield piece
            done = len(stats.tokens[0])
        tail = stream.flush()
        if tail:
            yield tail

    def _format(self, prompts: Prompts, tokens: list[list[int]], per_prompt: int = 1) -> Output:
        """Outputs of `per_prompt` sequences per prompt (tokens: prompt-major) as generate gives them."""
        outputs: list[Any] = [decode(self.tokenizer, t) for t in tokens] if prompts.text else tokens
        if per_prompt > 1:
            outputs = [outputs[i : i + per_prompt] for i in range(0, len(outputs), per_prompt)]
        return outputs[0] if prompts.single else outputs


class ChatSession:
    """One sequence whose states persist between calls: a later call prefills only the tokens
    its states have not seen (the new prompt, plus at least the last token of the previous
    reply). Greedy output over several calls equals one call on the concatenated tokens.
    With assistant_model, the draft's states persist too (until another draft is given).
    With a prefix state `cache`, a turn without a draft resumes from the deepest state stored
    for the conversation (a new session whose history the cache has seen prefills only the
    rest) and stores states there."""

    def __init__(self, model: Model, cache: StateCache | None = None) -> None:
        self.model = model
        self.cache = cache
        self.reset()

    def reset(self) -> None:
        """Forget the conversation: the next call starts from fresh states."""
        self.stepper: Stepper | None = None
        self.history: list[int] = []  # every token of the conversation, the pending ones included
        self.pending: list[int] = []  # in the history but not yet fed to the states
        self.draft_model: Model | None = None
        self.draft: Draft | None = None

    def generate(self, prompt: Any, assistant_model: Model | None = None, **kwargs: Any) -> Output:
        """As Model.generate, for one prompt, continuing the conversation."""
        return self.generate_with_stats(prompt, assistant_model, **kwargs)[0]

    def generate_with_stats(
        self, prompt: Any, assistant_model: Model | None = None, timeout: float | None = None, **kwargs: Any
    ) -> tuple[Output, dec.GenerationStats]:
        deadline = _deadline(timeout)
        cfg, prompts = self._prepare(prompt, kwargs)
        stats = dec.GenerationStats()
        for _ in until(self._steps(prompts, cfg, stats, assistant_model), deadline, stats):
            pass
        return self.model._format(prompts, stats.tokens), stats

    def stream(
        self, prompt: Any, assistant_model: Model | None = None, timeout: float | None = None, **kwargs: Any
    ) -> TextStream:
        """As Model.stream, continuing the conversation."""
        deadline = _deadline(timeout)
        cfg, prompts = self._prepare(prompt, kwargs)
        need_tokenizer(self.model.tokenizer)
        stats = dec.GenerationStats()
        steps = until(self._steps(prompts, cfg, stats, assistant_model), deadline, stats)
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
        assistant: Model | None = None,
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


def _deadline(timeout: float | None) -> float | None:
    """The monotonic time a call with `timeout` seconds must stop by (None: no limit)."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise GenerationError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    return time.monotonic() + float(timeout)


def until(steps: Iterator[Any], deadline: float | None, stats: dec.GenerationStats) -> Iterator[Any]:
    """`steps` until `deadline`: after the step that passes it, the steps are closed (their
    loop's cleanup runs: a session's states stay consistent) and GenerationTimeout is raised."""
    if deadline is None:
        yield from steps
        return
    close = getattr(steps, "close", lambda: None)  # a generator's: its loop's cleanup runs now
    try:
        for item in steps:
            yield item
            if time.monotonic() > deadline:
                close()
                n = sum(len(t) for t in stats.tokens)
                raise GenerationTimeout(f"generation passed its timeout after {n} new tokens", stats)
    finally:
        close()
