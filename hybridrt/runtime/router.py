"""Length-based routing over two exported models that share a tokenizer.

A hybrid with few attention layers keeps its per-token cost flat as the context grows, while
an attention-heavy model of the same quality may be faster on short prompts: `LengthRouter`
sends prompts shorter than `threshold` tokens to `short` and the others to `long` (the rule
`length_route`, which `hybridrt serve`'s length routes apply too), and keeps per-route counts
and latencies. A batch goes whole to the route of its longest prompt.

    router = LengthRouter(hybridrt.load("out/llama"), hybridrt.load("out/jamba"), threshold=1024)
    text = router.generate(prompt, max_new_tokens=64)
    router.stats()  # {"short": {"requests": ..., "latency_ms": {"p50": ...}}, "long": {...}}
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from ..errors import GenerationError
from .decode import GenerationStats
from .model import Model, Output
from .streaming import TextStream

ROUTES = ("short", "long")


def length_route(tokens: int, threshold: int) -> str:
    """ "short" for a prompt of fewer than `threshold` tokens, else "long"."""
    return "long" if tokens >= threshold else "short"


class LengthRouter:
    """Routes each call to `short` (longest prompt under `threshold` tokens) or `long`."""

    def __init__(self, short: Model, long: Model, threshold: int) -> None:
        if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
            raise GenerationError(f"threshold must be a positive number of tokens, got {threshold!r}")
        _check_same_tokenizer(short, long)
        self.models = {"short": short, "long": long}
        self.threshold = threshold
        self._lock = threading.Lock()
        self._records: dict[str, list[tuple[int, int, float]]] = {r: [] for r in ROUTES}

    def route(self, prompt: Any) -> str:
        """The route a prompt (text, ids, or a batch of either) takes."""
        rows = self.models["short"].prompt_rows(prompt).rows
        return length_route(max(len(r) for r in rows), self.threshold)

    def generate(self, prompt: Any, **kwargs: Any) -> Output:
        return self.generate_with_stats(prompt, **kwargs)[0]

    def generate_with_stats(self, prompt: Any, **kwargs: Any) -> tuple[Output, GenerationStats]:
        """As Model.generate_with_stats, on the prompt's route; the stats say which (`route`)."""
        name = self.route(prompt)
        t0 = time.perf_counter()
        out, stats = self.models[name].generate_with_stats(prompt, **kwargs)
        self._record(name, stats, time.perf_counter() - t0)
        stats.route = name
        return out, stats

    def stream(self, prompt: Any, **kwargs: Any) -> TextStream:
        """As Model.stream, on the prompt's route; recorded once the stream is exhausted or closed."""
        name = self.route(prompt)
        t0 = time.perf_counter()
        inner = self.models[name].stream(prompt, **kwargs)

        def pieces() -> Any:
            try:
                yield from inner
            finally:
                inner.close()
                self._record(name, inner.stats, time.perf_counter() - t0)

        stream = TextStream(pieces(), inner.stats)
        inner.stats.route = name
        return stream

    def _record(self, name: str, stats: GenerationStats, seconds: float) -> None:
        with self._lock:
            self._records[name].append((stats.prompt_tokens, stats.new_tokens, seconds))

    def stats(self) -> dict[str, Any]:
        """Per route: requests, prompt and new tokens, and call latency (ms) mean/p50/p95/max."""
        with self._lock:
            records = {r: list(v) for r, v in self._records.items()}
        out: dict[str, Any] = {"threshold": self.threshold}
        for name, rows in records.items():
            ms = np.array([r[2] * 1e3 for r in rows])
            out[name] = {
                "model": str(self.models[name].path),
                "requests": len(rows),
                "prompt_tokens": int(sum(r[0] for r in rows)),
                "new_tokens": int(sum(r[1] for r in rows)),
                "latency_ms": (
                    {
                        "mean": float(ms.mean()),
                        "p50": float(np.percentile(ms, 50)),
                        "p95": float(np.percentile(ms, 95)),
                        "max": float(ms.max()),
                    }
                    if len(rows)
                    else None
                ),
            }
        return out


def _check_same_tokenizer(a: Model, b: Model) -> None:
    """Both models read token ids the same way: same vocabulary, same tokenizer file."""
    if a.manifest.vocab_size != b.manifest.vocab_size:
        raise GenerationError(
            f"{a.path} and {b.path} have different vocabularies ({a.manifest.vocab_size} vs "
            f"{b.manifest.vocab_size} tokens); a router needs two models of one tokenizer"
        )
    tokenizers = [m.manifest.files.get("tokenizer.json", {}).get("sha256") for m in (a, b)]
    if tokenizers[0] != tokenizers[1]:
        raise GenerationError(
            f"{a.path} and {b.path} have different tokenizer.json files; a router needs two models of one tokenizer"
        )
