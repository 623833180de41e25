"""The quality report of a quantized graph against its float parent, on held-out text.

- nll_delta, ppl_ratio: hybridrt.runtime.evaluate's sliding-window NLL of both models.
- mean_kl: KL(float || quantized) of the next-token distributions, averaged over the same
  positions the NLL scores (each token once, with the same context).
- greedy_agreement: share of identical tokens, position by position, over the first
  `agreement_tokens` greedy tokens for `agreement_prompts` prompts cut from the text
  (EOS does not stop either model, so both always produce the full count).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import QuantizationError
from ..runtime.evaluate import log_softmax, ort_logits_fn, score_text, scored_windows
from .modes import QuantConfig


def quality_report(parent: Any, quant: Any, text: str, cfg: QuantConfig) -> dict[str, Any]:
    """Figures for `quant` against `parent` (runtime Models of the same tokenizer) on `text`."""
    window = min(cfg.eval_window, parent.max_length)
    stride = max(1, window // 2)
    float_fn, quant_fn = ort_logits_fn(parent), ort_logits_fn(quant)
    kl_per_window: list[np.ndarray] = []

    def paired(chunk: np.ndarray) -> np.ndarray:
        q = quant_fn(chunk)
        p = log_softmax(float_fn(chunk).astype(np.float64))
        kl_per_window.append((np.exp(p) * (p - log_softmax(q.astype(np.float64)))).sum(axis=-1))
        return q

    ref = score_text(float_fn, parent.tokenizer, text, window, stride)
    got = score_text(paired, parent.tokenizer, text, window, stride)
    kl = _scored(kl_per_window, len(parent.tokenizer.encode(text, add_special_tokens=False).ids), window, stride)
    agreement, prompts = greedy_agreement(parent, quant, text, cfg)
    return {
        "nll_float": ref["nll_per_token"],
        "nll_quantized": got["nll_per_token"],
        "nll_delta": got["nll_per_token"] - ref["nll_per_token"],
        "ppl_float": ref["perplexity"],
        "ppl_quantized": got["perplexity"],
        "ppl_ratio": got["perplexity"] / ref["perplexity"],
        "mean_kl": float(kl.mean()),
        "greedy_agreement": agreement,
        "tokens": got["tokens"],
        "prompts": prompts,
        "greedy_tokens": cfg.agreement_tokens,
        "window": window,
        "stride": stride,
    }


def _scored(per_window: list[np.ndarray], n_tokens: int, window: int, stride: int) -> np.ndarray:
    """The rows of each window that evaluate.token_nll scores: each token once."""
    windows = scored_windows(n_tokens, window, stride)
    return np.concatenate([v[first - start - 1 : length - 1] for v, (start, length, first) in zip(per_window, windows)])


def greedy_agreement(parent: Any, quant: Any, text: str, cfg: QuantConfig) -> tuple[float, int]:
    """(share of identical greedy tokens, number of prompts)."""
    ids = parent.tokenizer.encode(text, add_special_tokens=False).ids
    length = min(cfg.prompt_tokens, len(ids))
    new = min(cfg.agreement_tokens, parent.max_length - length)
    starts = np.linspace(0, len(ids) - length, cfg.agreement_prompts).round().astype(int)
    prompts = [ids[s : s + length] for s in starts]
    kwargs = {"max_new_tokens": new, "do_sample": False, "eos_token_id": []}
    a = np.asarray(parent.generate(prompts, **kwargs))
    b = np.asarray(quant.generate(prompts, **kwargs))
    return float((a == b).mean()), len(prompts)


def finite(report: dict[str, Any]) -> bool:
    return all(math.isfinite(v) for v in report.values() if isinstance(v, float))


def check_gates(report: dict[str, Any], cfg: QuantConfig) -> None:
    if not finite(report):
        raise QuantizationError(f"the quantized model's figures are not finite: {report}")
    failed = []
    if cfg.max_ppl_ratio is not None and report["ppl_ratio"] > cfg.max_ppl_ratio:
        failed.append(f"perplexity ratio {report['ppl_ratio']:.4f} > --max-ppl-ratio {cfg.max_ppl_ratio}")
    if cfg.min_greedy_agreement is not None and report["greedy_agreement"] < cfg.min_greedy_agreement:
        failed.append(
            f"greedy agreement {report['greedy_agreement']:.3f} < --min-greedy-agreement {cfg.min_greedy_agreement}"
        )
    if failed:
        raise QuantizationError(f"quality gate failed, nothing written: {'; '.join(failed)}")
