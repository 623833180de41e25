"""The prefix state cache's records (runtime.prefix_cache): an entry, a lookup's answer, the counters."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..graphs.contract import TensorSpec
from .kv_pieces import Piece, hold, joined, merged, pieces_for, split
from .radix import Match, Node, RadixTree
from .state import Snapshot
from .state_files import StateFiles

log = logging.getLogger("hybridrt.cache")


@dataclass(eq=False)
class Entry:
    node: Node[Entry]
    nbytes: int  # all of its states and logits, as a file holds them
    cost: float  # prefill seconds it saves
    states: list[np.ndarray] | None  # its fixed-size (conv, SSM) states; None: on disk only
    logits: np.ndarray | None  # [1, V] after the last token, when known
    has_logits: bool
    file: str | None = None  # its name in the disk tier
    hits: int = 0
    passes: int = 0  # prefills on its path that started at or past it (StateCache.plan)
    priority: float = 0.0
    base: float = 0.0  # the cache's clock when it was last stored or used
    used: int = 0  # when it was last stored or used (breaks ties in value: the older leaves first)
    block: np.ndarray | None = None  # the memory its fixed states are views of (runtime.host_blocks)
    kv: list[Piece] = field(default_factory=list)  # its KV in memory, pieces shared along its path (runtime.kv_pieces)
    reply: bool = False  # stored at a reply's end: a chat template's next turn resumes there

    @property
    def length(self) -> int:
        return self.node.depth

    def whole(self, pasts: Sequence[TensorSpec], length: int, spans: bool = False) -> list[np.ndarray]:
        """Its states in memory, in the order of the pasts, its KV pieces joined to `length`
        positions (with `spans`, a KV of several pieces as kv_pieces.Spans)."""
        assert self.states is not None
        return merged(pasts, self.states, joined(self.kv, [s for s in pasts if s.is_kv], length, spans))

    def load(self, pasts: Sequence[TensorSpec], states: list[np.ndarray], logits: np.ndarray | None) -> None:
        """Its states (in the order of the pasts, its whole KV) and logits back in memory, its KV
        one piece of its own."""
        self.states, kv = split(pasts, states)
        self.logits = logits
        hold(self, pieces_for(kv, [s for s in pasts if s.is_kv], self.length, None)[0])

    def value(self) -> float:
        """Prefill seconds per byte it saves beyond its nearest stored ancestor (which a lookup
        would resume from without it), times one plus its hits, over one plus its passes
        (prefills that started at or past it) and one more if a state is stored below it: a
        conversation's next turn resumes from its last state and goes on past it, so its
        earlier checkpoints serve only a request that parts from it there (an edit, a
        regenerated turn), while a shared prompt that request after request resumes from keeps
        its worth. Its bytes are those its leaving frees (`unshared`: KV its descendants share
        stays). Radix nodes without a value or children are pruned: a node with children has a
        stored state below it."""
        saves = self.cost * (self.length - self.node.held_above()) / max(self.length, 1)
        covered = 1 if self.node.children else 0
        return (self.hits + 1) / (self.passes + 1 + covered) * saves / max(self.unshared(), 1)

    def own(self) -> int:
        """Bytes in memory that are its alone whatever it shares: its fixed states and logits."""
        return sum(x.nbytes for x in self.states or []) + (0 if self.logits is None else self.logits.nbytes)

    def unshared(self) -> int:
        """Bytes its leaving memory frees: `own` and the KV pieces no other entry holds; its
        file's bytes when it is on disk only."""
        if self.states is None:
            return self.nbytes
        return self.own() + sum(p.nbytes for p in self.kv if len(p.holders) == 1)


@dataclass(frozen=True)
class Hit:
    """A lookup's answer: resume from `snapshot` (its length tokens seen) and, when the whole
    request is stored, its last `logits` [1, V]; `agree` tokens agreed with what was stored;
    `reply`: the snapshot is a reply's end (put(reply=True))."""

    snapshot: Snapshot
    logits: np.ndarray | None
    agree: int
    reply: bool = False


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

    def hit(self, tokens: int, seconds: float) -> None:
        """A lookup resumed `tokens` tokens, saving about `seconds` of prefill."""
        self.hits += 1
        self.hit_tokens += tokens
        self.saved_seconds += seconds


def candidates(
    tree: RadixTree[Entry], match: Match[Entry], length: int, whole: bool, cut: bool
) -> list[tuple[Entry, int]]:
    """The stored states a lookup of `length` tokens (`match`: their walk down `tree`) may
    resume from, deepest first, each with the tokens it resumes: those of a prefix that leaves a
    token to feed or holds its last logits (`whole`: of all the tokens, with logits); with
    `cut` (KV alone, which can be cut to any prefix), first any longer stored prefix cut to
    where it agrees."""
    found = [(e, n.depth) for n, e in match.path if n.depth < length or e.has_logits]
    if whole:
        return [(e, d) for e, d in found if d == length]
    agree = min(match.agree, length - 1)
    if cut and agree > 0 and (not found or found[0][1] < agree):
        deeper = next((e for _, e in tree.below(match.end) if e.length >= agree), None)
        if deeper is not None:
            found.insert(0, (deeper, agree))
    return found


def around(tree: RadixTree[Entry], entry: Entry) -> list[Entry]:
    """The entries whose value entry's coming or leaving changes: its nearest stored ancestor
    (whether a state is stored below it) and those below it (what they save beyond theirs)."""
    up = entry.node.above()
    below = [e for _, e in tree.below(entry.node) if e is not entry]
    return below if up is None or up.value is None else [up.value, *below]


def passed(match: Match[Entry], start: int) -> list[Entry]:
    """The entries on `match`'s path that a request prefilling from `start` passes (stored at or
    before it: the one it resumed from too, whose hit it has spent), each counted a pass
    (Entry.value)."""
    found = [e for n, e in match.path if n.depth <= start]
    for entry in found:
        entry.passes += 1
    return found


def stored_entries(files: StateFiles, tree: RadixTree[Entry]) -> list[Entry]:
    """The entries a disk tier holds, placed in `tree` (states on disk only, not priced yet);
    a record that cannot be read is skipped with a warning."""
    found = []
    for record in files.records():
        if isinstance(record, str):
            log.warning("prefix cache: skipping %s", record)
            continue
        node, _ = tree.insert(record.tokens, None)  # type: ignore[arg-type]
        entry = Entry(node, record.nbytes, record.cost, None, None, record.has_logits, record.name, record.hits)
        node.value = entry
        found.append(entry)
    return found
