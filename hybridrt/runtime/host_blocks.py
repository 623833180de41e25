"""Host memory for stored states: a row's fixed-size states copied into one block, blocks reused.

The prefix state cache (runtime.prefix_cache) copies a row's conv and SSM states out of a
stepper at every checkpoint: tens of MB for a 0.3 B hybrid, between two prefill calls or before
a reply's next token. Memory the process has not written yet costs a page fault per 4 KiB on
its first write (about 14 ms for 27 MB on a 2-core host, against 2 ms to copy into memory
already written), and numpy's huge-page advice for arrays from 4 MiB can stall longer while the
kernel compacts memory (about 55 ms for the same copy on such a host). So:

- a row's fixed-size states go into one block (`pack`), mapped directly and populated in one
  system call when new;
- while the server is idle, the cache makes blocks ready (up to KEEP, counted in its budget):
  new ones while there is room, else the memory of its least valued entry, which leaves a
  little early, once nothing else holds a view of it (a lookup's snapshot may still be read);
  `take` hands out a ready block, else a new one. A ready block is the first thing to go
  when the budget is short.
"""

from __future__ import annotations

import mmap
import sys
import threading
from collections.abc import Sequence

import numpy as np

KEEP = 4  # ready blocks kept at most
DIRECT = 1 << 22  # blocks from this size are mapped directly (numpy advises huge pages from 4 MiB)
ALIGN = 64


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def block_bytes(parts: Sequence[np.ndarray]) -> int:
    """The bytes of a block that holds `parts` (each 64-byte aligned)."""
    return sum(aligned(x.nbytes) for x in parts)


def new_block(nbytes: int) -> np.ndarray:
    """A block of nbytes: mapped privately (pages populated at once where the system can) from
    DIRECT bytes, else numpy's own memory."""
    if nbytes < DIRECT or not hasattr(mmap, "MAP_ANONYMOUS"):
        return np.empty(nbytes, np.uint8)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
    return np.frombuffer(mmap.mmap(-1, nbytes, flags=flags), np.uint8)


def pack(parts: Sequence[np.ndarray], block: np.ndarray) -> list[np.ndarray]:
    """Copies of `parts` written into views of `block` (block_bytes(parts) bytes)."""
    out, at = [], 0
    for x in parts:
        out.append(block[at : at + x.nbytes].view(x.dtype).reshape(x.shape))
        out[-1][...] = x
        at += aligned(x.nbytes)
    return out


def _count(block: np.ndarray) -> int:
    return sys.getrefcount(block)


def _one_variable() -> int:
    block = np.empty(1, np.uint8)
    return _count(block)


ALONE = _one_variable()  # the references a block has when one variable of a caller holds it


def alone(block: np.ndarray) -> bool:
    """Whether nothing but the caller's one variable holds `block` (every view of a block
    refers to it: a lookup's snapshot still read holds it too)."""
    return sys.getrefcount(block) <= ALONE


class Blocks:
    """Blocks ready for the next snapshots' fixed states (see the module docstring): nothing
    else holds them. Thread-safe."""

    def __init__(self) -> None:
        self.ready: list[np.ndarray] = []
        self.lock = threading.Lock()

    def take(self, nbytes: int) -> np.ndarray:
        """A ready block of nbytes, else a new one."""
        with self.lock:
            for i, block in enumerate(self.ready):
                if block.nbytes == nbytes:
                    return self.ready.pop(i)
        return new_block(nbytes)

    def add(self, nbytes: int) -> bool:
        """One more ready block, a new one."""
        block = new_block(nbytes)
        with self.lock:
            self.ready.append(block)
        return True

    def keep(self, block: np.ndarray) -> bool:
        """Keep `block` ready (the caller checked it is alone and drops its variable)."""
        with self.lock:
            self.ready.append(block)
        return True

    def held(self) -> int:
        """Bytes of the ready blocks (the cache counts them in its budget)."""
        with self.lock:
            return sum(b.nbytes for b in self.ready)

    def drop(self) -> bool:
        """Drop one ready block (False: none)."""
        with self.lock:
            return bool(self.ready) and self.ready.pop() is not None
