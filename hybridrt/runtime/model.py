"""A loaded model: generate and stream (chat sessions that keep their states between turns:
chat_session.py; streams and time limits: streaming.py)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import GenerationError
from ..graphs.manifest import Manifest, merge
from . import decode as dec
from .beam import beam_search
from .bound import BoundStepper
from .chat_session import ChatSession
from .decode_session import DecodeSession
from .evaluate import evaluate
from .input_checks import check_cache_use, check_rows_fit, rows_that_fit
from .prefix_cache import StateCache
from .sampling import GenerationConfig
from .speculative import Draft, check_draft, speculate
from .state import StepOptions, Stepper
from .state_files import identity
from .streaming import Output, TextStream, text_pieces
from .text import Prompts, as_prompts, decode, need_tokenizer, stop_check

BEAMS_NEED_GENERATE = "beam search needs the whole sequence before it answers; use generate()"


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
        # With cuda_graph on a graph with control flow: the session of the one-token graph that
        # runs the captured steps (runtime/decode_session.py); None: this session runs them.
        self.decode_session: DecodeSession | None = None
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
        deadline = dec.deadline_after(timeout)
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
                for _ in dec.until(self._speculative(draft, row, cfg, runs[-1]), deadline, runs[-1]):
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
        for _ in dec.until(self._steps(stepper, prompts.rows, cfg, stats, cache=cache), deadline, stats):
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
                for _ in dec.until(self._steps(self.stepper(len(part), capacity), part, cfg, stats), deadline, stats):
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
        deadline = dec.deadline_after(timeout)
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
        return TextStream(self._pieces(dec.until(steps, deadline, stats), stats), stats)

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
        made_for_model = isinstance(cache, StateCache) and cache.owner == identity(self.manifest, self.path)
        check_cache_use(made_for_model, prompts, cfg, assistant is not None)

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
        options = StepOptions(self.device, ring, self.cuda_graph, self.length_inputs, self.batched_chunks)
        if self.decode_session is not None:
            options = replace(options, decode=(self.decode_session.session, self.decode_session.inputs))
        if self.io_binding:
            return BoundStepper(self.inference_session, self.manifest, batch, capacity, options)
        from .plain import PlainStepper  # for comparison and debugging: imported only when asked for

        return PlainStepper(self.inference_session, self.manifest, batch, capacity, options)

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
        check_rows_fit(self.manifest, rows, cfg, past, memory)

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
        return text_pieces(self.tokenizer, steps, stats)

    def _format(self, prompts: Prompts, tokens: list[list[int]], per_prompt: int = 1) -> Output:
        """Outputs of `per_prompt` sequences per prompt (tokens: prompt-major) as generate gives them."""
        outputs: list[Any] = [decode(self.tokenizer, t) for t in tokens] if prompts.text else tokens
        if per_prompt > 1:
            outputs = [outputs[i : i + per_prompt] for i in range(0, len(outputs), per_prompt)]
        return outputs[0] if prompts.single else outputs
