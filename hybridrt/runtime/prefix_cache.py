"""Prefix state cache: states after chosen prefixes of prompts and replies, found by longest common
prefix in a radix tree (runtime.radix), kept in memory within a byte budget and, optionally, on
disk (runtime.state_files). Where a prefill stores them is runtime.prefix_plan's.

Memory is a budget (default: MEMORY_SHARE of the memory available at start). When it is exceeded,
entries leave in order of value (GreedyDual-Size-Frequency: prefill seconds the entry saves per
byte, times one plus its hits over one plus its passes (requests that resumed past it), on top of
a clock that rises with each eviction, so old entries age out). What an entry saves is counted
beyond its nearest stored ancestor, which a lookup would resume from without it: a request's end
after a long shared system prompt saves its few own tokens, not the whole prompt again; a
conversation's checkpoints its later turns passed leave before another's last. An entry's KV is
shared with its ancestors (runtime.kv_pieces): it copies only the positions past the nearest one
in memory, each piece is counted once, and its bytes for valuing are those its leaving frees.
With a directory, an evicted entry moves to disk (its own file, its KV whole, read back when a
lookup needs it) instead of vanishing, within its own byte cap; a server restarted on the same
directory finds them again. Files live under the model's identity (a hash of every file the
export lists and of its state specs): another model never reads them; an unwritable directory
turns the disk tier off with a warning, failing no request. States are exact by default;
`stored="bfloat16"` (opt-in, apart on disk) halves float32 ones' bytes, a resumed request then
close to a cold one (benchmarks/bench_state_dtype.py: how close)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import GenerationError
from ..graphs.contract import TensorSpec
from .cache_entry import CacheStats, Entry, Hit, around, candidates, passed, stored_entries
from .host_blocks import KEEP, Blocks, aligned, alone
from .input_checks import available_memory
from .kv_pieces import hold, pieces_for, release, split
from .prefix_plan import fixed_sizes, marks
from .radix import RadixTree, common_prefix
from .retokenize import Tails
from .state import Snapshot, _fit, narrowed, widened
from .state_files import StateFiles, identity

log = logging.getLogger("hybridrt.cache")

MEMORY_SHARE = 0.25
STORED = ("float32", "bfloat16")  # how states are kept: as the graph has them, or float32 as bfloat16


class StateCache:
    """See the module docstring. `pasts` are the model's state specs, `owner` its identity.

    memory_bytes: None for MEMORY_SHARE of the available memory, 0 to store nothing. stored: see above.
    directory: the disk tier's root (None: memory only; runtime.state_files); disk_bytes: its cap (None: DISK_SHARE
    of the free space there). spacing: tokens between checkpoints inside prompts (None: from
    each prompt's length and the state sizes, see spacing_for; 0: none). tokenizer: the model's (runtime.retokenize)."""

    def __init__(
        self,
        pasts: Sequence[TensorSpec],
        owner: str,
        memory_bytes: int | None = None,
        directory: str | Path | None = None,
        disk_bytes: int | None = None,
        spacing: int | None = None,
        stored: str = "float32",
        tokenizer: Any | None = None,
    ) -> None:
        if stored not in STORED:
            raise GenerationError(f"stored must be one of {', '.join(STORED)}, got {stored!r}")
        for name, value in (("memory_bytes", memory_bytes), ("disk_bytes", disk_bytes), ("spacing", spacing)):
            if value is not None and (not isinstance(value, int) or value < 0):
                raise GenerationError(f"{name} must be an integer >= 0 or None, got {value!r}")
        self.pasts = list(pasts)
        self.kv_specs = [s for s in self.pasts if s.is_kv]
        self.owner = owner
        self.stored = stored
        self.recurrent = any(not s.is_kv for s in self.pasts)
        self.memory_bytes = int(MEMORY_SHARE * available_memory()) if memory_bytes is None else memory_bytes
        self.spacing = spacing  # None: spacing_for each prompt
        self.tails = Tails(tokenizer)
        self.state_bytes = sum(fixed_sizes(self.pasts))
        self.block_bytes = sum(aligned(n) for n in fixed_sizes(self.pasts))  # a row's fixed states
        self.blocks = Blocks()  # host memory for them, made ready while idle (runtime.host_blocks)
        self.keep_ready = min(KEEP, self.memory_bytes // (16 * self.block_bytes)) if self.recurrent else 0
        self.tree: RadixTree[Entry] = RadixTree()
        self.entries: set[Entry] = set()
        self.memory = 0  # bytes of states held in memory
        self.disk = 0  # bytes of states in the disk tier
        self.clock, self.uses = 0.0, 0  # the eviction clock; uses, for recency
        self.seconds_per_token = 1e-3  # refined by observe()
        self.stats = CacheStats()
        self.lock = threading.RLock()  # the engine writes; metrics read from other threads
        self.files: StateFiles | None = None  # the disk tier
        if directory is not None:
            self._open(Path(directory), disk_bytes)

    @classmethod
    def for_model(cls, model: Any, **options: Any) -> StateCache:
        """A cache for `model` (a loaded hybridrt Model, its tokenizer too); options as the constructor's."""
        owner = identity(model.manifest, Path(model.path))
        return cls(model.manifest.pasts, owner, tokenizer=model.tokenizer, **options)

    @property
    def enabled(self) -> bool:
        return self.memory_bytes > 0

    def __len__(self) -> int:
        return len(self.entries)

    def observe(self, tokens: int, seconds: float) -> None:
        """A prefill call of `tokens` took `seconds`: the rate that values entries."""
        if tokens > 0 and seconds > 0:
            self.seconds_per_token = 0.8 * self.seconds_per_token + 0.2 * seconds / tokens

    def plan(
        self, tokens: Sequence[int], start: int, others: Sequence[Sequence[int]] = (), tail: bool = True
    ) -> list[int]:
        """Checkpoint positions after `start` for a prefill of `tokens` (runtime.prefix_plan; tail=False: a row's
        tokens continued exactly); `others`: prompts queued beside it. Entries passed count it (Entry.value)."""
        with self.lock:
            match = self.tree.match(tokens) if self.entries else None
            self._reprice([] if match is None else passed(match, start))
        parts = ([] if match is None else [match.agree]) + [common_prefix(tokens, o) for o in others]
        rates = (self.spacing, self.state_bytes, self.seconds_per_token)
        return marks(len(tokens), start, self.recurrent, *rates, parts, self.tails.of(tokens) if tail else 0)

    def lookup(
        self, tokens: Sequence[int], whole: bool = False, counted: bool = True, widen: bool = True
    ) -> Hit | None:
        """The deepest stored state to resume `tokens` from: one whose prefix they start with,
        leaving at least one token to feed unless its logits are stored; for a model without
        recurrent state, also any longer stored prefix cut to where it agrees. `whole`: only a
        state of all of `tokens` with its logits (nothing left to prefill). counted=False: a
        state read for another cache (a peer replica's), which counts its own hit; widen=False:
        as stored (bfloat16 bits where `stored` is bfloat16, which `put` takes as they are)."""
        if not self.enabled or not tokens:
            return None
        with self.lock:
            self.stats.lookups += counted
            match = self.tree.match(tokens)
            for entry, length in candidates(self.tree, match, len(tokens), whole, not self.recurrent):
                entry.hits += 1
                entry.priority = self._priority(entry)
                read = self._states(entry, length)
                if read is None:
                    continue
                states, logits = read
                if length < entry.length:  # KV only: cut to the agreeing prefix
                    states = [_fit(x, s, length) for s, x in zip(self.pasts, states)]
                if self.stored == "bfloat16" and widen:
                    states = widened(states)
                logits = logits.copy() if logits is not None and length == len(tokens) == entry.length else None
                if counted:
                    self.stats.hit(length, length * self.seconds_per_token)
                return Hit(Snapshot(states, length), logits, match.agree, entry.reply and length == entry.length)
            return None

    def depth(self, tokens: Sequence[int]) -> int:
        """Tokens of `tokens` the deepest stored state would resume (0: none); no lookup is
        counted and nothing is read back (a peer's state is worth fetching beyond this)."""
        if not self.enabled or not tokens:
            return 0
        with self.lock:
            found = candidates(self.tree, self.tree.match(tokens), len(tokens), False, False)
            return max((d for _, d in found), default=0)

    def put(
        self, tokens: Sequence[int], snapshot: Snapshot, logits: np.ndarray | None = None, reply: bool = False
    ) -> None:
        """The states after `tokens` (snapshot.length of them), their last logits if known; reply: a reply's end."""
        if not self.enabled or not tokens:
            return
        if snapshot.length != len(tokens):
            raise ValueError(f"a snapshot of {snapshot.length} tokens stored under {len(tokens)}")
        row_logits = None if logits is None else np.array(logits[:1], dtype=np.float32)
        whole, states = self.stored == "float32", [np.asarray(x) for x in snapshot.states]  # (Spans joined)
        states, block = (states, snapshot.block) if whole else (narrowed(states), None)
        nbytes = sum(x.nbytes for x in states) + (0 if row_logits is None else row_logits.nbytes)
        if nbytes > self.memory_bytes and (self.files is None or nbytes > self.files.cap):
            return  # it would leave at once
        with self.lock:
            match = self.tree.match(tokens)
            old = match.path[0][1] if match.path and match.path[0][0].depth == len(tokens) else None
            if old is not None and (old.has_logits or row_logits is None):
                old.hits, old.reply = old.hits + 1, old.reply or reply  # the same states: count a use
                old.priority = self._priority(old)
                return
            base = next((e for _, e in match.path if e.states is not None), None)  # KV shared with it
            node, _ = self.tree.insert(tokens, None)  # type: ignore[arg-type]
            cost = len(tokens) * self.seconds_per_token
            fixed, kv = split(self.pasts, states)
            entry = Entry(node, nbytes, cost, fixed, row_logits, row_logits is not None, block=block, reply=reply)
            pieces, new = pieces_for(kv, self.kv_specs, len(tokens), base, owned=not whole)  # (Stepper.row_at)
            self._reprice(hold(entry, pieces[: len(pieces) - (new is not None)]))  # the shared ones stay
            if old is not None:
                self._forget(old, keep_node=True)
                entry.hits, entry.reply = old.hits, entry.reply or old.reply
            node.value = entry
            entry.priority = self._priority(entry)
            self._reprice(around(self.tree, entry))  # its ancestor now has a state below it
            incoming = entry.own() + (0 if new is None else new.nbytes)
            self._fit(incoming)  # room first: the budget holds at every moment, not after the fact
            hold(entry, pieces)  # its own piece too, counted from here
            self.entries.add(entry)
            self.memory += incoming
            self._reprice([entry])  # ancestors that left meanwhile may have left it pieces alone
            self.stats.checkpoints += 1
            self._fit()  # an entry larger than the memory budget goes to disk at once

    # Tiers.

    def _priority(self, entry: Entry) -> float:
        self.uses += 1
        entry.used, entry.base = self.uses, self.clock
        return self.clock + entry.value()

    def _reprice(self, entries: Sequence[Entry]) -> None:
        """New values for entries whose nearest stored ancestor changed (one was stored or left)."""
        for entry in entries:
            if entry in self.entries:
                entry.priority = entry.base + entry.value()

    def _fit(self, incoming: int = 0) -> None:
        """Evict the least valued states until `incoming` more bytes fit in memory (to the disk
        tier where there is one, itself kept within its cap)."""
        while self.memory + self.blocks.held() + incoming > self.memory_bytes:
            if not (self.blocks.drop() or self._evict()):  # a ready block goes first
                break
        self._fit_disk()

    def _evict(self, keep: bool = False) -> bool:
        """The least valued entry in memory leaves it (to the disk tier, or gone); False if none
        is there. keep: its block is kept ready if nothing else holds it (runtime.host_blocks)."""
        held = [e for e in self.entries if e.states is not None]
        if not held:
            return False
        victim = min(held, key=lambda e: (e.priority, e.used))
        self.clock = max(self.clock, victim.priority)
        self.stats.evictions += 1
        block, victim.block = victim.block, None
        if self.files is not None and (victim.file is not None or self._write(victim)):
            self._unload(victim)
        else:
            self._forget(victim)
        if not keep:
            return True
        return block is not None and block.nbytes == self.block_bytes and alone(block) and self.blocks.keep(block)

    def _fit_disk(self, incoming: int = 0) -> None:
        while self.files is not None and self.disk + incoming > self.files.cap:
            stored = [e for e in self.entries if e.file is not None]
            if not stored:
                break
            victim = min(stored, key=lambda e: (e.priority, e.used))
            self._drop_file(victim)
            if victim.states is None:
                self._forget(victim)

    def _forget(self, entry: Entry, keep_node: bool = False) -> None:
        self.entries.discard(entry)
        if entry.states is not None:
            self._unload(entry)
        self._drop_file(entry)
        if not keep_node:
            near = around(self.tree, entry)
            self.tree.remove(entry.node)
            self._reprice(near)

    def _unload(self, entry: Entry) -> None:
        """entry's states leave memory (to disk, or gone); KV pieces another entry holds stay."""
        freed, alone = release(entry)
        self.memory -= entry.own() + freed
        entry.states, entry.logits, entry.block = None, None, None
        self._reprice(alone)

    def prepare(self) -> bool:
        """Idle time: one more block ready for a checkpoint's fixed states (runtime.host_blocks),
        within the budget: a new one where there is room, else the least valued entry's, which
        leaves a little early; False when there is nothing to do."""
        if not self.recurrent or len(self.blocks.ready) >= self.keep_ready:
            return False
        with self.lock:
            if self.memory + self.blocks.held() + self.block_bytes <= self.memory_bytes:
                return self.blocks.add(self.block_bytes)
            return self._evict(keep=True)

    def _states(self, entry: Entry, length: int) -> tuple[list[np.ndarray], np.ndarray | None] | None:
        """entry's states (KV of at least `length` positions) and logits, read back from disk
        when they are only there (None if unreadable): its file holds its whole KV, held alone
        once read, sharing no piece (the simplest correct choice: the pieces it had may be gone).
        The entry may leave memory again at once (a small budget): the arrays returned stay valid."""
        if entry.states is not None:
            return entry.whole(self.pasts, length, spans=True), entry.logits
        assert entry.file is not None
        read = None if self.files is None else self.files.read_states(entry.file, entry.has_logits)
        self.stats.disk_reads += read is not None
        if read is None:
            self._forget(entry)
            return None
        self._fit(entry.nbytes)
        if entry in self.entries:  # (making room may have dropped its file, and so the entry)
            entry.load(self.pasts, *read)
            self.memory += entry.nbytes
            self._fit()
        return read

    def _open(self, root: Path, disk_bytes: int | None) -> None:
        try:
            owner = self.owner if self.stored == "float32" else f"{self.owner}-{self.stored}"
            self.files = StateFiles.open(root, owner, disk_bytes)
        except OSError as e:
            return self._warn(f"the cache directory {root} cannot be written ({e}); states stay in memory only")
        for entry in stored_entries(self.files, self.tree):
            entry.priority = self._priority(entry)
            self.entries.add(entry)
            self.disk += entry.nbytes
        self._reprice(list(self.entries))  # each counted beyond its ancestors, read in any order
        if self.entries:
            n, where = len(self.entries), self.files.where
            log.info("prefix cache: %d stored states (%.1f MB) found in %s", n, self.disk / 1e6, where)
        self._fit()

    def _write(self, entry: Entry) -> bool:
        """Move entry's states to a file of their own, its KV whole (shared pieces joined); False
        (and the disk tier off) on failure."""
        assert self.files is not None and entry.states is not None
        if entry.nbytes > self.files.cap:
            return False
        arrays = [*entry.whole(self.pasts, entry.length), *([] if entry.logits is None else [entry.logits])]
        self._fit_disk(entry.nbytes)
        try:
            entry.file = self.files.write(entry.node.key(), arrays, entry.cost, entry.hits, entry.logits is not None)
        except OSError as e:
            self._warn(f"writing to {self.files.where} failed ({e}); states stay in memory only")
            self.files = None
            return False
        self.disk += entry.nbytes
        self.stats.disk_writes += 1
        return True

    def _drop_file(self, entry: Entry) -> None:
        if entry.file is not None:
            if self.files is not None:
                self.files.remove(entry.file)
            self.disk, entry.file = self.disk - entry.nbytes, None

    def _warn(self, message: str) -> None:
        log.warning("prefix cache: %s", message)
        self.stats.warnings.append(message)
