"""A loaded model: generate, stream, and chat sessions that keep their states between turns."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import GenerationError
from ..graphs.generation import merge
from ..graphs.manifest import Manifest
from . import decode as dec
from .sampling import GenerationConfig
from .state import Cache, new_cache
from .text import Prompts, StreamDecoder, as_prompts, decode, need_tokenizer
from .validate import check_eos_ids, check_memory

Output = str | list[str] | list[int] | list[list[int]]


class Model:
    """One ONNX Runtime session over an exported directory; see hybridrt.load.

    generate(prompt, **GenerationConfig fields): text in -> text out (str, or list for a list);
    token ids in -> the new token ids (list[int], or one list per prompt for a batch).
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
        self.last_stats: dec.Progress | None = None
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

    def generate(self, prompt: Any, **kwargs: Any) -> Output:
        """Generate for one prompt or a batch (left-padded; each row as if alone)."""
        cfg = self.config(kwargs)
        prompts = self.prompts(prompt, cfg)
        self.check_length(prompts.rows, cfg)
        progress = dec.Progress()
        for _ in self.steps(self.new_cache(len(prompts.rows)), prompts.rows, cfg, progress):
            pass
        return self.format(prompts, progress.tokens)

    def stream(self, prompt: str | Sequence[int], **kwargs: Any) -> Iterator[str]:
        """Text pieces of one prompt's continuation, as they are generated."""
        cfg = self.config(kwargs)
        need_tokenizer(self.tokenizer)
        prompts = self.prompts(prompt, cfg)
        if not prompts.single:
            raise GenerationError("stream() takes one prompt; use generate() for a batch")
        self.check_length(prompts.rows, cfg)
        progress = dec.Progress()
        return self.pieces(self.steps(self.new_cache(1), prompts.rows, cfg, progress), progress)

    def session(self) -> ChatSession:
        """A conversation whose states carry over from one generate() call to the next."""
        return ChatSession(self)

    # Building blocks shared with ChatSession.

    def config(self, kwargs: dict[str, Any]) -> GenerationConfig:
        """The caller's parameters over the model's recommended ones (manifest `generation`)."""
        GenerationConfig.from_kwargs(**kwargs)  # the caller's own values, checked first
        return GenerationConfig.from_kwargs(**merge(self.manifest.generation, kwargs))

    def prompts(self, prompt: Any, cfg: GenerationConfig, add_special_tokens: bool = True) -> Prompts:
        """Prompt rows; text gets the BOS token first when cfg.add_bos_token asks for it."""
        prompts = as_prompts(prompt, self.tokenizer, self.manifest.vocab_size, add_special_tokens)
        bos = self.manifest.special_tokens.get("bos_token_id")
        if prompts.text and add_special_tokens and cfg.add_bos_token and isinstance(bos, int):
            for row in prompts.rows:
                if row[0] != bos:
                    row.insert(0, bos)
        return prompts

    def new_cache(self, batch: int) -> Cache:
        return new_cache(self.inference_session, self.manifest, batch, self.device, self.io_binding)

    def check_length(self, rows: Sequence[Sequence[int]], cfg: GenerationConfig, past: int = 0) -> None:
        longest = past + max(len(r) for r in rows)
        if longest + cfg.max_new_tokens > self.max_length:
            raise GenerationError(
                f"prompt of {longest} tokens + max_new_tokens {cfg.max_new_tokens} exceeds the model's max length "
                f"{self.max_length}; shorten the prompt or lower max_new_tokens"
            )
        check_eos_ids(cfg.eos_ids(()), self.manifest.vocab_size)
        check_memory(self.manifest, len(rows), longest + cfg.max_new_tokens, max(len(r) for r in rows))

    def steps(
        self,
        cache: Cache,
        rows: Sequence[Sequence[int]],
        cfg: GenerationConfig,
        progress: dec.Progress,
        history: Sequence[Sequence[int]] | None = None,
    ) -> Iterator[np.ndarray]:
        self.last_stats = progress
        eos = cfg.eos_ids(self.eos_token_ids)
        return dec.generate(cache, rows, cfg, eos, self.pad_token_id, progress, history, self._stop_check(cfg))

    def _stop_check(self, cfg: GenerationConfig) -> dec.StopCheck | None:
        stops = cfg.stops
        if not stops:
            return None
        need_tokenizer(self.tokenizer)
        longest = max(len(s) for s in stops)

        def stop(tokens: list[int]) -> bool:
            # A token holds at least one byte and a character at most four, so this tail
            # covers any stop string that the newest token completes.
            tail = decode(self.tokenizer, tokens[-4 * longest - 4 :])
            return any(s in tail for s in stops)

        return stop

    def pieces(self, steps: Iterator[np.ndarray], progress: dec.Progress) -> Iterator[str]:
        stream = StreamDecoder(self.tokenizer)
        done = 0
        for _ in steps:
            for token in progress.tokens[0][done:]:
                piece = stream.push(token)
                if piece:
                    yield piece
            done = len(progress.tokens[0])
        tail = stream.flush()
        if tail:
            yield tail

    def format(self, prompts: Prompts, tokens: list[list[int]]) -> Output:
        if prompts.text:
            texts = [decode(self.tokenizer, t) for t in tokens]
            return texts[0] if prompts.single else texts
        return tokens[0] if prompts.single else tokens


class ChatSession:
    """One sequence whose states persist between calls: a later call prefills only its new
    tokens (plus the last token of the previous reply, which the states have not seen yet).
    Greedy output over several calls equals one call on the concatenated tokens."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.reset()

    def reset(self) -> None:
        """Forget the conversation: the next call starts from fresh states."""
        self.cache: Cache | None = None
        self.history: list[int] = []  # every token of the conversation, the pending one included
        self.pending: list[int] = []  # sampled but not yet fed to the states

    def generate(self, prompt: Any, **kwargs: Any) -> Output:
        cfg, prompts = self._prepare(prompt, kwargs)
        progress = dec.Progress()
        for _ in self._steps(prompts, cfg, progress):
            pass
        return self.model.format(prompts, progress.tokens)

    def stream(self, prompt: Any, **kwargs: Any) -> Iterator[str]:
        cfg, prompts = self._prepare(prompt, kwargs)
        need_tokenizer(self.model.tokenizer)
        progress = dec.Progress()
        return self.model.pieces(self._steps(prompts, cfg, progress), progress)

    def _prepare(self, prompt: Any, kwargs: dict[str, Any]) -> tuple[GenerationConfig, Prompts]:
        m = self.model
        cfg = m.config(kwargs)
        # Special tokens (BOS) open a conversation, not each turn.
        prompts = m.prompts(prompt, cfg, add_special_tokens=not self.history)
        if not prompts.single:
            raise GenerationError("a chat session holds one sequence: pass one prompt per call")
        m.check_length(prompts.rows, cfg, past=len(self.history))
        return cfg, prompts

    def _steps(self, prompts: Prompts, cfg: GenerationConfig, progress: dec.Progress) -> Iterator[np.ndarray]:
        if self.cache is None:
            self.cache = self.model.new_cache(1)
        new = prompts.rows[0]
        rows = [self.pending + new]
        history = [self.history + new]
        try:
            yield from self.model.steps(self.cache, rows, cfg, progress, history)
        except Exception:
            self.reset()  # the states may be half-updated
            raise
        finally:
            if self.cache is not None and progress.tokens:
                # Also when a stream is closed early: the states have seen all but the last token.
                self.history = history[0] + progress.tokens[0]
                self.pending = progress.tokens[0][-1:]
