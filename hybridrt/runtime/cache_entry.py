"""The prefix state cache's records (runtime.prefix_cache): an entry, a lookup's answer, the counters."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from .radix import Node, RadixTree
from .state import Snapshot
from .state_files import StateFiles

log = logging.getLogger("hybridrt.cache")


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
    base: float = 0.0  # the cache's clock when it was last stored or used
    used: int = 0  # when it was last stored or used (breaks ties in value: the older leaves first)
    block: np.ndarray | None = None  # the memory its fixed states are views of (runtime.host_blocks)

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
