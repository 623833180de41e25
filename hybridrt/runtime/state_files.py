"""The prefix state cache's disk tier (runtime.prefix_cache): one file per stored state.

Under DIR/<model identity>/, a state is NAME.bin (its arrays' bytes, one after another: the
states in the order of the graph's pasts, then the last logits when stored) and NAME.json (the
tokens it follows, each array's dtype and shape, its byte count and crc32, and what values it:
prefill seconds saved, hits). NAME is a hash of the tokens. Both are written to temporary
names and renamed, data first, so a record never names missing or partial data; a file that
does not match its record is dropped when read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..graphs.manifest import Manifest

log = logging.getLogger("hybridrt.cache")

FILE_FORMAT = 1
DISK_SHARE = 0.5  # of the free space in the directory at start, the default cap


@dataclass(frozen=True)
class Record:
    name: str
    tokens: list[int]
    nbytes: int
    cost: float
    hits: int
    has_logits: bool


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


class StateFiles:
    def __init__(self, where: Path, cap: int) -> None:
        self.where = where
        self.cap = cap

    @classmethod
    def open(cls, root: Path, owner: str, cap: int | None) -> StateFiles:
        """The tier under root/owner, made if needed; OSError when it cannot be written."""
        where = root / owner
        where.mkdir(parents=True, exist_ok=True)
        probe = where / f".probe.{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
        return cls(where, int(DISK_SHARE * shutil.disk_usage(where).free) if cap is None else cap)

    def records(self) -> Iterator[Record | str]:
        """The states stored here; a string (the reason) for each record that is unusable."""
        for meta in sorted(self.where.glob("*.json")):
            try:
                info = json.loads(meta.read_text())
                if info["format"] != FILE_FORMAT or (self.where / f"{meta.stem}.bin").stat().st_size != info["bytes"]:
                    raise ValueError("not this format, or its data is not its size")
                yield Record(meta.stem, info["tokens"], info["bytes"], info["cost"], info["hits"], info["has_logits"])
            except (OSError, ValueError, KeyError, TypeError) as e:
                yield f"{meta.name}: {e}"

    def write(self, tokens: Sequence[int], arrays: list[np.ndarray], cost: float, hits: int, has_logits: bool) -> str:
        """Store arrays (the states, then the logits if has_logits) after `tokens`; returns its
        name. OSError when the directory cannot take it (full, gone, read-only)."""
        name = hashlib.sha256(np.asarray(tokens, dtype=np.int64).tobytes()).hexdigest()[:40]
        info: dict[str, Any] = {
            "format": FILE_FORMAT,
            "tokens": list(tokens),
            "bytes": sum(a.nbytes for a in arrays),
            "cost": cost,
            "hits": hits,
            "has_logits": has_logits,
            "arrays": [[str(a.dtype), list(a.shape)] for a in arrays],
        }
        crc = 0
        tmp = self.where / f".{name}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            for a in arrays:
                data = np.ascontiguousarray(a).data
                crc = zlib.crc32(data, crc)
                f.write(data)
        os.replace(tmp, self.where / f"{name}.bin")
        info["crc32"] = crc
        tmp.write_text(json.dumps(info))
        os.replace(tmp, self.where / f"{name}.json")
        return name

    def read(self, name: str) -> list[np.ndarray]:
        """The arrays stored as `name`, each in memory of its own (the cache frees them apart: KV
        it shares may outlive the rest); ValueError or OSError when they cannot be read back."""
        info = json.loads((self.where / f"{name}.json").read_text())
        arrays, crc = [], 0
        with open(self.where / f"{name}.bin", "rb") as f:
            for dtype, shape in info["arrays"]:
                a = np.empty(shape, dtype)
                data = a.reshape(-1).view(np.uint8).data
                if f.readinto(data) != a.nbytes:
                    raise ValueError("its data is shorter than its record")
                crc = zlib.crc32(data, crc)
                arrays.append(a)
            if f.read(1) or sum(a.nbytes for a in arrays) != info["bytes"] or crc != info["crc32"]:
                raise ValueError("its data does not match its checksum")
        return arrays

    def read_states(self, name: str, has_logits: bool) -> tuple[list[np.ndarray], np.ndarray | None] | None:
        """An entry's states and last logits stored as `name`; None (with a warning) when they
        cannot be read back."""
        try:
            arrays = self.read(name)
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("prefix cache: dropping a stored state that cannot be read: %s", e)
            return None
        logits = arrays.pop() if has_logits else None
        return arrays, logits

    def remove(self, name: str) -> None:
        for suffix in (".json", ".bin"):  # the record first: data without one is never read
            try:
                os.unlink(self.where / f"{name}{suffix}")
            except OSError:
                pass
