"""Calibration data: text files -> token windows -> the graph's real feeds.

A hybrid graph meets three kinds of input at run time, and static ranges must cover all:
a prompt from empty states, a prompt chunk continued from non-zero states, and one-token
decode steps whose conv/ssm states and KV past hold a real history. So each window of
L tokens (h = L // 2) yields:

  prompt     ids[0:L]  with zero states (KV buffers of L positions, past length 0)
  chunk      ids[h:L]  with the states the float model reached after ids[0:h]
  decode     ids[t]    for t = h .. h + decode_steps - 1, states advanced token by token
             by the float model (the parent's ONNX session)

Every feed holds every graph input (input_ids, past_lengths where the manifest declares
it, logit_positions for every position, every past.*), batch 1.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from onnxruntime.quantization import CalibrationDataReader

from ..errors import QuantizationError
from ..graphs.feeds import graph_feeds, zero_states
from ..graphs.manifest import Manifest
from ..runtime.input_checks import read_utf8

if TYPE_CHECKING:
    from .modes import QuantConfig

Feed = dict[str, np.ndarray]
NO_REPORT = (
    "the model directory has no tokenizer.json, so there is no held-out text to measure; "
    "copy the checkpoint's tokenizer.json into it for a quality report"
)


def read_texts(paths: Sequence[str | Path]) -> list[str]:
    """Plain UTF-8 files (the whole file is one text) or JSONL with a "text" field per line."""
    texts: list[str] = []
    for path in map(Path, paths):
        raw = read_utf8(path, "calibration file", QuantizationError)
        if path.suffix.lower() == ".jsonl":
            texts.extend(_jsonl_texts(path, raw))
        elif raw.strip():
            texts.append(raw)
    return [t for t in texts if t.strip()]


def read_inputs(
    cfg: QuantConfig, calibration: Sequence[str | Path], eval_text: str | Path | None
) -> tuple[list[str], list[str]]:
    """Calibration texts and evaluation texts, checked before any work is done."""
    texts = read_texts(calibration)
    if calibration and not texts:
        raise QuantizationError(f"the calibration files hold no text: {', '.join(map(str, calibration))}")
    if cfg.needs_text and not texts:
        label = f"{cfg.mode} {cfg.resolved_algo}" if cfg.weight_only else cfg.mode
        what = label if cfg.needs_calibration else "--kv-dtype int8 (its scales)"
        raise QuantizationError(f"{what} needs calibration text: pass --calibration FILE")
    eval_texts = read_texts([eval_text]) if eval_text is not None else []
    if eval_text is not None and not eval_texts:
        raise QuantizationError(f"the evaluation text {eval_text} is empty")
    if not eval_texts and not texts:
        raise QuantizationError("the quality report needs held-out text: pass --eval-text FILE or --calibration FILE")
    return texts, eval_texts


def _jsonl_texts(path: Path, raw: str) -> Iterator[str]:
    for n, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise QuantizationError(f"{path}:{n} is not JSON ({e.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise QuantizationError(f'{path}:{n} has no string "text" field')
        yield record["text"]


@dataclass(frozen=True)
class Split:
    """Calibration windows (token ids) and the held-out text the quality report scores."""

    windows: list[np.ndarray]
    held_out: str


def split_text(tokenizer: Any, texts: Sequence[str], samples: int, seq_len: int, eval_tokens: int) -> Split:
    """Windows of seq_len tokens from the start of the joined texts, at most `samples` of them
    and at most 4/5 of the tokens; the tokens after the last window (up to eval_tokens) are
    the held-out text."""
    text = "\n\n".join(texts)
    enc = tokenizer.encode(text, add_special_tokens=False)
    ids, offsets = np.asarray(enc.ids, dtype=np.int64), list(enc.offsets)
    n_cal = min(samples * seq_len, len(ids) * 4 // 5)
    windows = [ids[i : i + seq_len] for i in range(0, n_cal, seq_len)]
    windows = [w for w in windows if len(w) >= 2]
    if not windows:
        raise QuantizationError(f"the calibration text holds only {len(ids)} tokens; give more text")
    end = min(len(ids), n_cal + eval_tokens)
    held_out = text[offsets[n_cal][0] : offsets[end - 1][1]] if end > n_cal else ""
    return Split(windows, held_out)


def head(tokenizer: Any, text: str, n_tokens: int) -> str:
    """The text of the first n_tokens tokens."""
    offsets = tokenizer.encode(text, add_special_tokens=False).offsets
    return text if len(offsets) <= n_tokens else text[: offsets[n_tokens - 1][1]]


class FeedMaker:
    """Graph feeds for batch 1 and one float session to advance states with."""

    def __init__(self, session: Any, manifest: Manifest) -> None:
        self.session = session
        self.inputs = manifest.inputs
        self.pasts = manifest.pasts

    def feed(self, ids: np.ndarray, states: Feed, past_len: int) -> Feed:
        """ids [s] after past_len tokens whose states are `states` -> one feed (logits of
        every position: the LM head's input ranges see the whole window)."""
        return graph_feeds(self.inputs, ids[None, :].astype(np.int64), past_len, states, all_logits=True)

    def advance(self, feed: Feed) -> Feed:
        """Run the float graph; its presents, renamed as the next pasts."""
        _, *presents = self.session.run(None, feed)
        return {s.name: x for s, x in zip(self.pasts, presents)}

    def window_feeds(self, ids: np.ndarray, decode_steps: int) -> list[Feed]:
        """The prompt, chunk and decode feeds of one window (see the module docstring)."""
        h = len(ids) // 2
        zeros = zero_states(self.pasts, 1, len(ids))  # KV buffers that hold the whole window
        feeds = [self.feed(ids, zeros, 0)]
        states = self.advance(self.feed(ids[:h], zeros, 0))
        feeds.append(self.feed(ids[h:], states, h))
        for t in range(h, min(len(ids), h + decode_steps)):
            feeds.append(self.feed(ids[t : t + 1], states, t))
            states = self.advance(feeds[-1])
        return feeds


def calibration_feeds(model: Any, windows: Sequence[np.ndarray], decode_steps: int) -> list[Feed]:
    """Feeds for every window, states from `model` (a runtime Model of the float graph)."""
    maker = FeedMaker(model.inference_session, model.manifest)
    return [f for w in windows for f in maker.window_feeds(w, decode_steps)]


class CalibrationReader(CalibrationDataReader):  # type: ignore[misc]
    """onnxruntime's reader interface over precomputed feeds. Numpy only, so that GPTQ's
    deepcopy of the reader is cheap and safe. set_range serves quantize_static's strided
    calibration (see methods.int8_static)."""

    def __init__(self, feeds: list[Feed]) -> None:
        if not feeds:
            raise QuantizationError("no calibration feeds; give calibration text")
        self.feeds = feeds
        self.set_range(0, len(feeds))

    def get_next(self) -> Feed | None:
        if self.position >= self.end:
            return None
        self.position += 1
        return self.feeds[self.position - 1]

    def set_range(self, start_index: int, end_index: int) -> None:
        self.position, self.end = start_index, min(end_index, len(self.feeds))

    def rewind(self) -> None:
        self.set_range(0, len(self.feeds))

    def __len__(self) -> int:
        return len(self.feeds)
