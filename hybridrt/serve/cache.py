"""Prefix state cache: the states after a prompt or a chat turn, kept in an LRU with a byte cap.

An SSM state cannot be trimmed back to a shorter prefix, so entries are stored at the exact
token boundaries where conversations continue (the end of a prompt, the end of a reply) and a
lookup finds the longest stored key that starts the new tokens. An entry stored with the
last-position logits can serve a request whose tokens equal its key (nothing to prefill);
one stored without (a reply's states have not seen its last token) needs at least one more.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..runtime.state import Snapshot


@dataclass(frozen=True)
class Entry:
    row: Snapshot  # one row's states, never mutated: users write them into their own states
    logits: np.ndarray | None  # [1, V] after the key's last token, when known

    @property
    def nbytes(self) -> int:
        return self.row.nbytes + (0 if self.logits is None else self.logits.nbytes)


class PrefixCache:
    """LRU of token tuple -> Entry, at most `max_bytes` of states in all (0 turns it off)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.entries: OrderedDict[tuple[int, ...], Entry] = OrderedDict()
        self.lengths: dict[int, int] = {}  # key length -> how many keys have it
        self.bytes = 0
        self.lock = threading.Lock()  # the engine writes; metrics read from other threads

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def __len__(self) -> int:
        return len(self.entries)

    def put(self, tokens: Sequence[int], row: Snapshot, logits: np.ndarray | None) -> None:
        entry = Entry(row, None if logits is None else np.array(logits[:1], dtype=np.float32))
        if not tokens or entry.nbytes > self.max_bytes:
            return
        key = tuple(tokens)
        with self.lock:
            old = self.entries.pop(key, None)
            if old is not None:
                self._forget(key, old)
            self.entries[key] = entry
            self.bytes += entry.nbytes
            self.lengths[len(key)] = self.lengths.get(len(key), 0) + 1
            while self.bytes > self.max_bytes:
                k, e = self.entries.popitem(last=False)
                self._forget(k, e)

    def get(self, tokens: Sequence[int]) -> tuple[int, Entry] | None:
        """The longest usable entry whose key starts `tokens`: (key length, entry), or None."""
        with self.lock:
            for n in sorted(self.lengths, reverse=True):
                if n > len(tokens):
                    continue
                key = tuple(tokens[:n])
                entry = self.entries.get(key)
                if entry is not None and (n < len(tokens) or entry.logits is not None):
                    self.entries.move_to_end(key)
                    return n, entry
        return None

    def _forget(self, key: tuple[int, ...], entry: Entry) -> None:
        self.bytes -= entry.nbytes
        self.lengths[len(key)] -= 1
        if not self.lengths[len(key)]:
            del self.lengths[len(key)]
