"""Prefix state cache: states after chosen prefixes of prompts and replies, found by longest
common prefix, kept in memory within a byte budget and, optionally, on disk.

A hybrid's recurrent (conv, SSM) state cannot be cut back to a shorter prefix, so a request can
only resume from a state stored at or before the first token where it differs from what was
seen. States are therefore stored at checkpoints (`plan`):

- every `spacing` tokens of a long prompt (positions that are multiples of it, so prompts of
  different lengths that share a prefix share those checkpoints; see `spacing_for`);
- where a prompt parts from something already stored or from another queued prompt (a shared
  system prompt gets one exact checkpoint at its end, the first time a second request shows
  it), unless that is within MIN_BRANCH tokens of where the prefill starts;
- TAIL tokens before a prompt's end: a conversation resent as text is tokenized again, and the
  reply's first characters may merge with the prompt's last token, so the next turn agrees
  with this one up to a few tokens before its end, never to the end itself;
- at a prompt's end (with its last logits: the same prompt again prefills nothing) and at a
  reply's end (what a chat template's next turn continues from).

Spacing: a prefill of L new tokens gets about DENSITY checkpoints, every power of two near
L / DENSITY tokens (at least MIN_SPACING, at most MAX_SPACING), so a request that parts from it
anywhere re-prefills at most about 1/DENSITY of it (a new question after a long shared system
prompt: ~6% of the first request's prefill, then nothing more once its branch point is
stored); a turn that appends a few hundred tokens to a cached conversation stores only its
tail and end. A checkpoint is never closer than the tokens whose prefill takes as long as
reading the checkpoint back from disk (its fixed-size states, S bytes a row, at
READ_BYTES_PER_S and the measured prefill rate): below that, storing it saves nothing. The
fixed-size states weigh the same at every position; value-based eviction (below) drops the
checkpoints that are never used first, since a shallow checkpoint saves less prefill per byte
than a deep one. A model without recurrent state needs no checkpoints inside prompts: its KV
can be cut to any prefix, so any stored entry that agrees further serves (`lookup`).

Memory is a budget (default: MEMORY_SHARE of the memory available at start). When it is
exceeded, entries leave in order of value (GreedyDual-Size-Frequency: prefill seconds the entry
saves per byte, times one plus its hits, on top of a clock that rises with each eviction, so
old entries age out). With a directory, an evicted entry moves to disk (its own file, read
back when a lookup needs it) instead of vanishing, within its own byte cap; a server restarted
on the same directory finds them again. Files live under the model's identity (a hash of every
file the export lists and of its state specs): another model never reads them. A directory
that cannot be written turns the disk tier off with a warning; no request fails for it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import GenerationError
from ..graphs.contract import TensorSpec
from ..graphs.manifest import Manifest
from .radix import Node, RadixTree, common_prefix
from .state import Snapshot, _fit
from .state_files import StateFiles

log = logging.getLogger("hybridrt.cache")

TAIL = 4
DENSITY = 16
MIN_SPACING, MAX_SPACING = 256, 8192
MIN_BRANCH = 64  # a branch point closer than this to where a prefill starts is not stored
READ_BYTES_PER_S = 1e9
MEMORY_SHARE = 0.25


def available_memory() -> int:
    """Bytes of memory available now (MemAvailable on Linux; physical pages elsewhere)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 4 << 30


def identity(manifest: Manifest, directory: Path) -> str:
    """What a stored state belongs to: every file of the export (sha256, as the manifest
    records them) and the state specs; an export without recorded files is named by its path
    and its graph's size and time."""
    parts: dict[str, Any] = {"files": manifest.files, "pasts": [s.to_dict() for s in manifest.pasts]}
    if not manifest.files:
        graph = directory / manifest.graph_file
        st = graph.stat() if graph.is_file() else None
        parts["graph"] = [str(directory.resolve()), st and st.st_size, st and st.st_mtime_ns]
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def fixed_bytes(pasts: Sequence[TensorSpec]) -> int:
    """Bytes of one row's fixed-size (conv, SSM) states: what every checkpoint holds."""
    return sum(_row_bytes(s, 0) for s in pasts if not s.is_kv)


def spacing_for(length: int, state_bytes: int, seconds_per_token: float) -> int:
    """Tokens between checkpoints in a prefill of `length` new tokens (see the module docstring):
    the power of two nearest length / DENSITY, or the one at or above the tokens whose prefill
    takes as long as reading a checkpoint back, if larger; within MIN_SPACING..MAX_SPACING."""
    near = 1 << max(0, round(math.log2(max(length / DENSITY, 1))))
    worth = state_bytes / READ_BYTES_PER_S / max(seconds_per_token, 1e-9)
    above = 1 << max(0, math.ceil(math.log2(max(worth, 1))))
    return min(max(near, above, MIN_SPACING), MAX_SPACING)


def _row_bytes(spec: TensorSpec, positions: int) -> int:
    n = 1
    for d in spec.dims[1:]:
        n *= positions if spec.kv_axis is not None and d == spec.dims[spec.kv_axis] else int(d)
    return n * np.dtype(spec.dtype).itemsize


def chunk_end(fed: int, chunk: int, length: int, marks: Sequence[int]) -> int:
    """Where a prefill call that starts at `fed` ends: after at most `chunk` tokens, at the
    prompt's end, or at the next checkpoint, so that storing a checkpoint costs a copy."""
    return min([fed + chunk, length, *(m for m in marks if m > fed)])


@dataclass(eq=False)
class Entry:
    node: Node[Entry]
    nbytes: int
    cost: float  # prefill seconds it saves
    states: list[np.ndarray] | None  # None: on disk only
    logits: np.ndarray | None  # [1, V] after the last token, when known
    has_logits: bool
    file: str | None = None  # its name in the disk tier
    hits: int = 0
    priority: float = 0.0
    used: int = 0  # when it was last stored or used (breaks ties in value: the older leaves first)

    @property
    def length(self) -> int:
        return self.node.depth


@dataclass(frozen=True)
class Hit:
    """A lookup's answer: resume from `snapshot` (its length tokens seen) and, when the whole
    request is stored, its last `logits` [1, V]; `agree` tokens agreed with what was stored."""

    snapshot: Snapshot
    logits: np.ndarray | None
    agree: int


@dataclass
class CacheStats:
    lookups: int = 0
    hits: int = 0
    hit_tokens: int = 0
    checkpoints: int = 0
    evictions: int = 0
    disk_writes: int = 0
    disk_reads: int = 0
    saved_seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)


class StateCache:
    """See the module docstring. `pasts` are the model's state specs, `owner` its identity.

    memory_bytes: None for MEMORY_SHARE of the available memory, 0 to store nothing.
    directory: the disk tier's root (None: memory only; runtime.state_files); disk_bytes: its cap (None: DISK_SHARE
    of the free space there). spacing: tokens between checkpoints inside prompts (None: from
    each prompt's length and the state sizes, see spacing_for; 0: none)."""

    def __init__(
        self,
        pasts: Sequence[TensorSpec],
        owner: str,
        memory_bytes: int | None = None,
        directory: str | Path | None = None,
        disk_bytes: int | None = None,
        spacing: int | None = None,
    ) -> None:
        for name, value in (("memory_bytes", memory_bytes), ("disk_bytes", disk_bytes), ("spacing", spacing)):
            if value is not None and (not isinstance(value, int) or value < 0):
                raise GenerationError(f"{name} must be an integer >= 0 or None, got {value!r}")
        self.pasts = list(pasts)
        self.owner = owner
        self.recurrent = any(not s.is_kv for s in self.pasts)
        self.memory_bytes = int(MEMORY_SHARE * available_memory()) if memory_bytes is None else memory_bytes
        self.spacing = spacing  # None: spacing_for each prompt
        self.state_bytes = fixed_bytes(self.pasts)
        self.tree: RadixTree[Entry] = RadixTree()
        self.entries: set[Entry] = set()
        self.memory = 0  # bytes of states held in memory
        self.disk = 0  # bytes of states in the disk tier
        self.clock = 0.0
        self.uses = 0
        self.seconds_per_token = 1e-3  # refined by observe()
        self.stats = CacheStats()
        self.lock = threading.RLock()  # the engine writes; metrics read from other threads
        self.files: StateFiles | None = None  # the disk tier
        if directory is not None:
            self._open(Path(directory), disk_bytes)

    @classmethod
    def for_model(cls, model: Any, **options: Any) -> StateCache:
        """A cache for `model` (a loaded hybridrt Model); options as the constructor's."""
        return cls(model.manifest.pasts, identity(model.manifest, Path(model.path)), **options)

    @property
    def enabled(self) -> bool:
        return self.memory_bytes > 0

    def __len__(self) -> int:
        return len(self.entries)

    def observe(self, tokens: int, seconds: float) -> None:
        """A prefill call of `tokens` took `seconds`: the rate that values entries."""
        if tokens > 0 and seconds > 0:
            self.seconds_per_token = 0.8 * self.seconds_per_token + 0.2 * seconds / tokens

    def plan(self, tokens: Sequence[int], start: int, others: Sequence[Sequence[int]] = ()) -> list[int]:
        """Checkpoint positions after `start` for a prefill of `tokens` (see the module
        docstring); `others` are prompts queued beside it."""
        end = len(tokens)
        marks = {end}
        if not self.recurrent:  # KV can be cut to any prefix: the end is enough
            return [end] if end > start else []
        if end - TAIL > start:
            marks.add(end - TAIL)
        every = self.spacing
        if every is None:
            every = spacing_for(end - start, self.state_bytes, self.seconds_per_token)
        if every:
            marks.update(range((start // every + 1) * every, end, every))
        with self.lock:
            parts = [self.tree.match(tokens).agree] if self.entries else []
        parts += [common_prefix(tokens, o) for o in others]
        marks.update(a for a in parts if start + MIN_BRANCH <= a < end)
        return sorted(m for m in marks if m > start)

    def lookup(self, tokens: Sequence[int], whole: bool = False) -> Hit | None:
        """The deepest stored state to resume `tokens` from: one whose prefix they start with,
        leaving at least one token to feed unless its logits are stored; for a model without
        recurrent state, also any longer stored prefix cut to where it agrees. `whole`: only a
        state of all of `tokens` with its logits (nothing left to prefill)."""
        if not self.enabled or not tokens:
            return None
        with self.lock:
            self.stats.lookups += 1
            match = self.tree.match(tokens)
            candidates = [(e, n.depth) for n, e in match.path if n.depth < len(tokens) or e.has_logits]
            if whole:
                candidates = [(e, d) for e, d in candidates if d == len(tokens)]
            cut = min(match.agree, len(tokens) - 1)
            if not whole and not self.recurrent and cut > 0 and (not candidates or candidates[0][1] < cut):
                deeper = next((e for _, e in self.tree.below(match.end) if e.length >= cut), None)
                if deeper is not None:
                    candidates.insert(0, (deeper, cut))
            for entry, length in candidates:
                entry.hits += 1
                entry.priority = self._priority(entry)
                read = self._states(entry)
                if read is None:
                    continue
                states, logits = read
                if length < entry.length:  # KV only: cut to the agreeing prefix
                    states = [_fit(x, s, length) for s, x in zip(self.pasts, states)]
                logits = logits if length == len(tokens) == entry.length else None
                self.stats.hits += 1
                self.stats.hit_tokens += length
                self.stats.saved_seconds += length * self.seconds_per_token
                return Hit(Snapshot(states, length), None if logits is None else logits.copy(), match.agree)
            return None

    def put(self, tokens: Sequence[int], snapshot: Snapshot, logits: np.ndarray | None = None) -> None:
        """Store the states after `tokens` (snapshot.length == len(tokens)), with the last
        position's logits when known."""
        if not self.enabled or not tokens:
            return
        if snapshot.length != len(tokens):
            raise ValueError(f"a snapshot of {snapshot.length} tokens stored under {len(tokens)}")
        row_logits = None if logits is None else np.array(logits[:1], dtype=np.float32)
        nbytes = snapshot.nbytes + (0 if row_logits is None else row_logits.nbytes)
        if nbytes > self.memory_bytes and (self.files is None or nbytes > self.files.cap):
            return  # it would leave at once
        with self.lock:
            match = self.tree.match(tokens)
            old = match.path[0][1] if match.path and match.path[0][0].depth == len(tokens) else None
            if old is not None and (old.has_logits or row_logits is None):
                old.hits += 1  # the same states again: keep the entry, count it as used
                old.priority = self._priority(old)
                return
            node, _ = self.tree.insert(tokens, None)  # type: ignore[arg-type]
            entry = Entry(
                node,
                nbytes,
                len(tokens) * self.seconds_per_token,
                list(snapshot.states),
                row_logits,
                row_logits is not None,
            )
            if old is not None:
                self._forget(old, keep_node=True)
                entry.hits = old.hits
            node.value = entry
            entry.priority = self._priority(entry)
            self.entries.add(entry)
            self.memory += nbytes
            self.stats.checkpoints += 1
            self._fit()

    # Tiers.

    def _priority(self, entry: Entry) -> float:
        self.uses += 1
        entry.used = self.uses
        return self.clock + (entry.hits + 1) * entry.cost / max(entry.nbytes, 1)

    def _fit(self) -> None:
        while self.memory > self.memory_bytes:
            victim = min((e for e in self.entries if e.states is not None), key=lambda e: (e.priority, e.used))
            self.clock = max(self.clock, victim.priority)
            self.stats.evictions += 1
            if self.files is not None and (victim.file is not None or self._write(victim)):
                self.memory -= victim.nbytes
                victim.states, victim.logits = None, None
            else:
                self._forget(victim)
        while self.files is not None and self.disk > self.files.cap:
            victim = min((e for e in self.entries if e.file is not None), key=lambda e: (e.priority, e.used))
            self._drop_file(victim)
            if victim.states is None:
                self._forget(victim)

    def _forget(self, entry: Entry, keep_node: bool = False) -> None:
        self.entries.discard(entry)
        if entry.states is not None:
            self.memory -= entry.nbytes
        if entry.file is not None:
            self._drop_file(entry)
        if not keep_node:
            self.tree.remove(entry.node)

    def _states(self, entry: Entry) -> tuple[list[np.ndarray], np.ndarray | None] | None:
        """entry's states and logits, read back from disk when they are only there (None if
        unreadable). The entry may leave memory again at once (a small budget): the arrays
        returned stay valid."""
        if entry.states is not None:
            return entry.states, entry.logits
        read = self._read(entry)
        if read is None:
            self._forget(entry)
            return None
        entry.states, entry.logits = read
        self.memory += entry.nbytes
        self._fit()
        return read

    def _open(self, root: Path, disk_bytes: int | None) -> None:
        try:
            self.files = StateFiles.open(root, self.owner, disk_bytes)
        except OSError as e:
            return self._warn(f"the cache directory {root} cannot be written ({e}); states stay in memory only")
        for record in self.files.records():
            if isinstance(record, str):
                log.warning("prefix cache: skipping %s", record)
                continue
            node, _ = self.tree.insert(record.tokens, None)  # type: ignore[arg-type]
            entry = Entry(node, record.nbytes, record.cost, None, None, record.has_logits, record.name, record.hits)
            entry.priority = self._priority(entry)
            node.value = entry
            self.entries.add(entry)
            self.disk += entry.nbytes
        if self.entries:
            where = self.files.where
            log.info("prefix cache: %d stored states (%.1f MB) found in %s", len(self.entries), self.disk / 1e6, where)
        self._fit()

    def _write(self, entry: Entry) -> bool:
        """Move entry's states to a file of their own; False (and the disk tier off) on failure."""
        assert self.files is not None and entry.states is not None
        if entry.nbytes > self.files.cap:
            return False
        arrays = [*entry.states, *([] if entry.logits is None else [entry.logits])]
        try:
            entry.file = self.files.write(entry.node.key(), arrays, entry.cost, entry.hits, entry.logits is not None)
        except OSError as e:
            self._warn(f"writing to {self.files.where} failed ({e}); states stay in memory only")
            self.files = None
            return False
        self.disk += entry.nbytes
        self.stats.disk_writes += 1
        return True

    def _read(self, entry: Entry) -> tuple[list[np.ndarray], np.ndarray | None] | None:
        assert entry.file is not None
        if self.files is None:
            return None
        try:
            arrays = self.files.read(entry.file)
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("prefix cache: dropping a stored state that cannot be read: %s", e)
            return None
        self.stats.disk_reads += 1
        logits = arrays.pop() if entry.has_logits else None
        return arrays, logits

    def _drop_file(self, entry: Entry) -> None:
        if entry.file is None:
            return
        if self.files is not None:
            self.files.remove(entry.file)
        self.disk -= entry.nbytes
        entry.file = None

    def _warn(self, message: str) -> None:
        log.warning("prefix cache: %s", message)
        self.stats.warnings.append(message)
