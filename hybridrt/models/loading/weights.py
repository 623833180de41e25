"""A checkpoint's weights, read one tensor at a time from its safetensors shards.

Nothing is read until a tensor is asked for, and then only that tensor (in float32, renamed to
our parameter names, converted by the family), or the parts the family merges into it
(registry.Merge: legacy per-expert tensors stacked, separate projections concatenated). Tensors are
read with plain positioned reads rather than through a memory map: pages of a mapped shard
that export has read would stay in the process's resident set until the shard is closed, so
a 14 GB checkpoint would show as 14 GB of export memory; read pages stay in the page cache,
which the kernel reclaims, outside the process. The safetensors layout (an 8-byte header
length, a JSON header of dtype, shape and byte offsets, then the data) is read as its
specification gives it. Before any
work, the whole index is checked against the parameter shapes the config implies (a model
built on the meta device: no memory), so a mismatched checkpoint fails in a second with the
names at fault, not after an hour of export. The reference model (checkpoint.load_model) and
the streamed export (export.streamed) read through it alike.
"""

from __future__ import annotations

import json
import struct
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

from ...config import HybridConfig
from ...errors import CheckpointError
from .registry import Family, Merge

MAX_HEADER = 100 << 20
DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def expected_shapes(cfg: HybridConfig, src: Path) -> dict[str, tuple[int, ...]]:
    """Every checkpoint tensor the config implies (parameters and persistent buffers, tied
    weights once), with its shape, from a model built on the meta device."""
    from ..decoder import HybridForCausalLM

    try:
        with torch.device("meta"):
            model = HybridForCausalLM(cfg)
    except (TypeError, ValueError, RuntimeError, ZeroDivisionError) as e:
        raise CheckpointError(f"{src}: config.json describes a model that cannot be built ({e})") from None
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)
    return shapes


class Weights:
    """Our parameter name -> a float32 tensor read on demand. Use as a context manager (the
    shards stay open, memory-mapped, inside it)."""

    def __init__(self, src: Path, cfg: HybridConfig, family: Family, hf: dict[str, Any], files: list[Path]) -> None:
        """checkpoint.open_weights(src) builds one from a checkpoint directory."""
        self.src, self.cfg, self.family, self.hf, self.files = src, cfg, family, hf, files
        self._stack = ExitStack()
        self._handles: dict[Path, Any] = {}
        self._where: dict[str, tuple[Path, str]] = {}  # our name -> (shard, checkpoint name)
        self._merged: dict[str, tuple[Merge, dict[str, str]]] = {}  # parameter -> (merge, part key -> name)
        self._parts: set[str] = set()  # tensors read only as parts of a merged parameter
        self.shapes = expected_shapes(cfg, src)

    def __enter__(self) -> Weights:
        self._index(self.family, self.cfg)
        self._check()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()
        self._handles.clear()

    def _open(self, path: Path) -> tuple[Any, dict[str, Any], int]:
        """(file, header, start of the data) of a shard."""
        if path not in self._handles:
            f = self._stack.enter_context(path.open("rb"))
            try:
                (n,) = struct.unpack("<Q", f.read(8))
                if n > MAX_HEADER:
                    raise ValueError(f"header of {n} bytes")
                header = json.loads(f.read(n))
                header.pop("__metadata__", None)
                size = path.stat().st_size - 8 - n
                for entry in header.values():
                    start, end = entry["data_offsets"]
                    if entry["dtype"] not in DTYPES or not 0 <= start <= end <= size:
                        raise ValueError(f"entry {entry}")
            except (struct.error, ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
                raise CheckpointError(f"cannot read {path}: {e} (the file is truncated or not safetensors)") from None
            self._handles[path] = (f, header, 8 + n)
        return self._handles[path]

    def _index(self, family: Family, cfg: HybridConfig) -> None:
        for path in self.files:
            _, header, _ = self._open(path)
            for name in header:
                if family.ignored(name):
                    continue
                ours = family.rename(name, cfg)
                merge = family.merge_of(ours)
                if merge is not None:
                    how, target, part = merge
                    self._merged.setdefault(target, (how, {}))[1][part] = ours
                    self._parts.add(ours)
                self._where[ours] = (path, name)

    def names(self) -> list[str]:
        return [n for n in self._where if n not in self._parts] + list(self._merged)

    def _check(self) -> None:
        have = set(self.names())
        if self.cfg.tie_word_embeddings:
            have.discard("lm_head.weight")
        missing = [k for k in self.shapes if k not in have]
        unexpected = [k for k in have if k not in self.shapes]
        if missing:
            raise CheckpointError(
                f"{self.src}: weights missing for {len(missing)} parameters, e.g. {', '.join(missing[:4])} "
                "(config.json and the safetensors files do not describe the same model)"
            )
        if unexpected:
            raise CheckpointError(
                f"{self.src}: {len(unexpected)} tensors the {self.cfg.model_type} config does not account for, "
                f"e.g. {', '.join(unexpected[:4])}"
            )
        for name, (path, key) in self._where.items():
            if name in self.shapes and name not in self._parts:
                shape = tuple(self._open(path)[1][key]["shape"])
                if shape != self.shapes[name]:
                    raise CheckpointError(
                        f"{self.src}: tensor {name} has shape {shape} but config.json implies "
                        f"{self.shapes[name]}; the config and the weights do not match"
                    )

    def __getitem__(self, name: str) -> torch.Tensor:
        if name in self._merged:
            merge, parts = self._merged[name]
            tensor = merge.combine({k: self._read(n) for k, n in parts.items()}, self.cfg)
            if name in self.shapes and tuple(tensor.shape) != self.shapes[name]:
                raise CheckpointError(
                    f"{self.src}: {name}, merged from {', '.join(sorted(parts.values()))}, has shape "
                    f"{tuple(tensor.shape)} but config.json implies {self.shapes[name]}"
                )
            return tensor
        return self._read(name)

    def _read(self, name: str) -> torch.Tensor:
        path, key = self._where[name]
        f, header, base = self._open(path)
        entry = header[key]
        start, end = entry["data_offsets"]
        buf = bytearray(end - start)
        f.seek(base + start)
        if f.readinto(buf) != len(buf):
            raise CheckpointError(f"cannot read {key} from {path}: the file is truncated")
        dtype = DTYPES[entry["dtype"]]
        try:
            tensor = (
                torch.frombuffer(buf, dtype=dtype).reshape(entry["shape"])
                if buf
                else torch.zeros(entry["shape"], dtype=dtype)
            )
        except RuntimeError as e:
            raise CheckpointError(f"cannot read {key} from {path}: {e}") from None
        tensor = tensor.float()
        if self.family.convert is not None:
            tensor = self.family.convert(name, tensor, self.cfg)
        return tensor

    def nbytes(self) -> int:
        """float32 bytes of every weight (what a whole float graph would hold)."""
        return sum(4 * numel(shape) for shape in self.shapes.values())


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
