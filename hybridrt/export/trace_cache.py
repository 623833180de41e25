"""Traced templates kept on disk between exports (optional): `HYBRIDRT_TRACE_CACHE=DIR`.

Tracing is most of an export's time below a billion parameters (torch.export takes seconds per
distinct layer, whatever its width), and a template holds no weight (fragments.py: weights are
graph inputs). So exports of one architecture with other weights or other options (another
--quantize mode, layout, seed of a test checkpoint, the candidates of a quantization search)
can share each template. The key holds everything a trace reads: the whole translated config,
the layer index, fused or plain operators, the graph contract, the versions of torch, onnx and
onnxscript, and the content of the sources that build and trace a layer (this package's
models, export and graph code, and the module of every layer and feed-forward kind the config
uses, registered ones included). Entries are written to a temporary file and renamed, under a
file lock, so concurrent exports of one template trace it once.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
from google.protobuf.message import DecodeError

from ..config import HybridConfig
from ..ffn_kinds import FFN_KINDS
from ..graphs.contract import GraphContract
from ..kinds import LAYER_KINDS
from .fragments import TRACE_CACHE_ENV, Template

ENV = TRACE_CACHE_ENV
PACKAGE = Path(__file__).resolve().parents[1]
TRACED_SOURCES = ("models", "export", "graphs", "kinds.py", "config.py")


@functools.cache
def _package_sources() -> str:
    h = hashlib.sha256()
    for part in TRACED_SOURCES:
        paths = sorted((PACKAGE / part).rglob("*.py")) if (PACKAGE / part).is_dir() else [PACKAGE / part]
        for path in paths:
            h.update(str(path.relative_to(PACKAGE)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


@functools.cache
def _module_source(module: str) -> str:
    spec = importlib.util.find_spec(module)
    origin = spec.origin if spec is not None else None
    return hashlib.sha256(Path(origin).read_bytes()).hexdigest() if origin and os.path.isfile(origin) else module


@functools.cache
def _versions() -> tuple[str, ...]:
    import onnxscript
    import torch

    return torch.__version__, onnx.__version__, onnxscript.__version__


def template_key(cfg: HybridConfig, index: int, fused: bool, contract: GraphContract) -> str:
    """The key of layer `index`'s template (-1: the outer graph)."""
    kinds = {LAYER_KINDS[k].module for k in cfg.layer_types} | {FFN_KINDS[k].module for k in cfg.ffn_types}
    kind_sources = sorted(_module_source(m.split(":")[0]) for m in kinds if m)
    parts = {
        "config": cfg.to_dict(),
        "index": index,
        "fused": fused,
        "contract": [repr(contract.inputs), repr(contract.outputs)],
        "versions": _versions(),
        "sources": [_package_sources(), *kind_sources],
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=repr).encode()).hexdigest()[:32]


@dataclass
class TraceCache:
    """get(key, trace) -> a template from `directory`, or traced and stored there."""

    directory: Path | None
    hits: int = 0
    misses: int = 0
    errors: list[str] = field(default_factory=list)

    @classmethod
    def from_env(cls) -> TraceCache:
        where = os.environ.get(ENV)
        return cls(Path(where) if where else None)

    def get(self, key: str, trace: Callable[[], Template]) -> Template:
        if self.directory is None:
            return trace()
        from filelock import FileLock

        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{key}.onnx"
        with FileLock(str(path) + ".lock"):
            cached = self._read(path)
            if cached is not None:
                self.hits += 1
                os.utime(path.with_suffix(".json"))  # last read: what a pruning of old entries goes by
                return cached
            template = trace()
            self.misses += 1
            self._write(path, template)
            return template

    def record(self) -> dict[str, Any] | None:
        """For the manifest's provenance: where, and how many templates came from it."""
        if self.directory is None:
            return None
        record: dict[str, Any] = {"directory": str(self.directory), "hits": self.hits, "traced": self.misses}
        if self.errors:
            record["damaged"] = self.errors
        return record

    def _read(self, path: Path) -> Template | None:
        meta = path.with_suffix(".json")
        if not (path.is_file() and meta.is_file()):
            return None
        try:
            info = json.loads(meta.read_text())
            data = path.read_bytes()
            if hashlib.sha256(data).hexdigest() != info["sha256"]:
                raise ValueError("its graph does not match its checksum")
            return Template(int(info["index"]), onnx.load_from_string(data), list(info["weights"]))
        except (OSError, ValueError, KeyError, TypeError, DecodeError) as e:
            self.errors.append(f"{path.name}: {e}")  # a damaged entry is traced again
            return None

    def _write(self, path: Path, template: Template) -> None:
        data = template.model.SerializeToString()
        info = {"index": template.index, "weights": template.weights, "sha256": hashlib.sha256(data).hexdigest()}
        for target, content in ((path, data), (path.with_suffix(".json"), json.dumps(info).encode())):
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            tmp.write_bytes(content)
            os.replace(tmp, target)
