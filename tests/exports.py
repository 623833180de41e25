"""The tests' build cache: tiny checkpoints, their exports and their quantized graphs, each built
once per key and shared by every worker of a run and by the next run on the same checkout.

A key is a hash of everything the output depends on, as a build system keys its outputs:

- a checkpoint: its builder's name, seed and overrides, the source of the tests' builder
  modules (BUILDER_SOURCES) and the versions of torch, transformers and tokenizers;
- an export: its checkpoint's key (or, for a directory such as the shipped default model, the
  content of its files), the export options, the versions of the export stack, and the content
  of every package source an export can run: all of hybridrt but the server and the command
  line (NOT_EXPORT), since mixers and families are found by name at run time, which no import
  graph shows;
- a quantized graph: its parent's key, the mode and options, the content of any text file
  passed, and the same package sources.

Entries are built in a temporary directory and renamed into place under a file lock, so the
first worker that needs one builds it and the others wait for it, then read it. Each entry
records a digest of its files; every hit checks it, so a test that wrote into a cached
directory cannot poison later runs: such an entry is rebuilt (and counted as stale).

Nothing here skips a check that a test asserts: exports are built with their parity check
(`validate`) only where a test reads it (the family and export suites).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

from filelock import FileLock

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "hybridrt"
# The modules a checkpoint builder may run (tests/checkpoints.py and friends); a builder's own
# module is keyed too. This module is not: bump BUILD_VERSION when a change here changes what an
# entry holds (how a builder is called, the layout of an entry).
BUILDER_SOURCES = ("checkpoints.py", "family_checkpoints.py", "toy_kind.py")
BUILD_VERSION = 1
# Package sources no export or quantization runs: the server and the command line.
NOT_EXPORT = ("serve", "commands", "cli.py")
STACK = ("torch", "transformers", "tokenizers", "safetensors", "onnx", "onnxscript", "onnxruntime", "numpy")
# Quick quantization options for the tiny models: REPORT, a quality report on a few held-out
# windows; QUICK, that and a few calibration samples (static int8, the int8 KV cache's scales).
REPORT = {"agreement_prompts": 4, "eval_tokens": 192, "eval_window": 128}
QUICK = {"samples": 3, "seq_len": 32, "decode_steps": 2} | REPORT

# Per-process tally, reported by conftest.py at the end of a run (summed over workers).
TALLY: Counter[str] = Counter()
_root: Path | None = None


UNUSED_DAYS = 3  # an entry no run has read for this long is removed (old keys pile up otherwise)


def configure(root: Path, prune: bool = False) -> None:
    """Where entries live (conftest.py: the pytest cache directory); with `prune`, remove the
    entries no run has read for UNUSED_DAYS."""
    global _root
    _root = root
    root.mkdir(parents=True, exist_ok=True)
    if prune:
        cutoff = time.time() - UNUSED_DAYS * 86400
        for record in root.glob("*/entry.json"):
            if record.stat().st_mtime < cutoff:
                shutil.rmtree(record.parent, ignore_errors=True)
        for record in root.glob("traces/*.json"):  # hybridrt.export.trace_cache's entries
            if record.stat().st_mtime < cutoff:
                record.with_suffix(".onnx").unlink(missing_ok=True)
                record.unlink(missing_ok=True)


def root() -> Path:
    if _root is None:  # imported outside pytest (a script): a private directory
        configure(Path(tempfile.gettempdir()) / f"hybridrt-test-builds-{os.getuid()}")
    assert _root is not None
    return _root


# --- keys ---------------------------------------------------------------------------------------


def digest_files(directory: Path, names: Iterable[Path] | None = None) -> str:
    """sha256 over the relative names and contents of the files under `directory`."""
    h = hashlib.sha256()
    paths = sorted(p for p in (names if names is not None else directory.rglob("*")) if p.is_file())
    for path in paths:
        h.update(str(path.relative_to(directory)).encode() + b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def export_sources(package: Path = PACKAGE) -> list[Path]:
    """The package files an export or a quantization can run or read: every file under
    `package` but the server, the command line and bytecode."""
    return [
        p
        for p in sorted(package.rglob("*"))
        if p.is_file()
        and "__pycache__" not in p.parts
        and p.relative_to(package).parts[0] not in NOT_EXPORT
        and not p.name.endswith(".pyc")
    ]


def source_key(package: Path = PACKAGE) -> str:
    """The key part that a change to a mixer, the graph contract or an export pass changes."""
    return digest_files(package, export_sources(package))


@functools.cache
def _package_key() -> str:
    return source_key()


@functools.cache
def _builder_key() -> str:
    return digest_files(TESTS, [TESTS / n for n in BUILDER_SOURCES])


@functools.cache
def _file_key(path: Path) -> str:
    """A builder's own module (a test file that defines one), by content."""
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""


@functools.cache
def _stack() -> dict[str, str]:
    out = {}
    for name in STACK:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def _hash(parts: dict[str, Any]) -> str:
    parts = parts | {"build": BUILD_VERSION}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=_canonical).encode()).hexdigest()[:20]


def _canonical(value: Any) -> Any:
    """A JSON form of option values: a text file by its content, a function by its name."""
    if isinstance(value, Path):
        if value.is_file():
            return {"file": hashlib.sha256(value.read_bytes()).hexdigest()}
        return {"path": str(value)}
    if callable(value):
        return {"callable": f"{value.__module__}.{value.__qualname__}"}
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    raise TypeError(f"cannot key a {type(value).__name__} option ({value!r})")


# --- entries ------------------------------------------------------------------------------------

# The key of each directory this module returned: an export of a cached checkpoint, or a
# quantization of a cached export, keys its parent by it rather than by hashing its files.
_keys: dict[Path, str] = {}


def _entry(kind: str, label: str, key: str, build: Callable[[Path], None]) -> Path:
    """The output of entry `key`, `<root>/<kind>-<label>-<key>/<label>` (a directory named as a
    test would name it), built by `build(out)` if absent or changed since it was built."""
    entry = root() / f"{kind}-{label}-{key}"
    out, record = entry / label, entry / "entry.json"
    with FileLock(str(entry) + ".lock"):
        if record.is_file():
            if json.loads(record.read_text())["digest"] == digest_files(out):
                record.touch()  # read now: kept by the pruning in configure()
                TALLY[f"{kind} hits"] += 1
                _keys[out] = key
                return out
            TALLY["stale entries rebuilt"] += 1  # a test wrote into it: never use it
        shutil.rmtree(entry, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{kind}-{label}-", dir=root()))
        try:
            t0 = time.perf_counter()
            build(tmp / label)
            seconds = time.perf_counter() - t0
            (tmp / "entry.json").write_text(
                json.dumps({"digest": digest_files(tmp / label), "seconds": round(seconds, 2)})
            )
            tmp.rename(entry)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        TALLY[f"{kind} builds"] += 1
        TALLY["build seconds"] += round(seconds)
    _keys[out] = key
    return out


def _without_defaults(function: Callable[..., Any], options: dict[str, Any]) -> dict[str, Any]:
    """Options as keyed: one left at `function`'s default is the same build as one not given."""
    defaults = {k: p.default for k, p in inspect.signature(function).parameters.items()}
    return {k: v for k, v in options.items() if k not in defaults or defaults[k] != v}


def _name(builder: Callable[..., Path]) -> str:
    return f"{builder.__module__}.{builder.__qualname__}"


def checkpoint(builder: Callable[..., Path], seed: int = 0, **overrides: Any) -> Path:
    """builder(directory, seed=seed, **overrides) (tests/checkpoints.py, family_checkpoints.py,
    or any module's function of a directory), built once; keyed also by the builder's module."""
    sources = _builder_key() + _file_key(Path(inspect.getsourcefile(builder) or ""))
    key = _hash({"builder": _name(builder), "seed": seed, "overrides": overrides, "sources": sources} | _stack())
    label = builder.__name__.removeprefix("make_")
    return _entry("ckpt", label, key, lambda out: _build_checkpoint(builder, out, seed, overrides))


def _build_checkpoint(builder: Callable[..., Path], out: Path, seed: int, overrides: dict[str, Any]) -> None:
    if "seed" in inspect.signature(builder).parameters:
        builder(out, seed=seed, **overrides)
    else:
        assert seed == 0, f"{_name(builder)} takes no seed"
        builder(out, **overrides)


def _source(src: Path | Callable[..., Path]) -> tuple[Path, str]:
    """A checkpoint directory and its key part."""
    if callable(src):
        src = checkpoint(src)
    src = Path(src).resolve()
    return src, _keys.get(src) or digest_files(src)


def export(src: Path | Callable[..., Path], *, validate: bool = False, **options: Any) -> Path:
    """hybridrt.export_model(src, out, validate=validate, **options), built once. `src` is a
    builder (tests/checkpoints.py) or a checkpoint directory (keyed by its files)."""
    import hybridrt

    ckpt, parent = _source(src)
    options = _without_defaults(hybridrt.export_model, options)
    key = _hash({"src": parent, "validate": validate, "options": options, "package": _package_key()} | _stack())

    def build(out: Path) -> None:
        hybridrt.export_model(ckpt, out, validate=validate, **options)

    return _entry("onnx", ckpt.name, key, build)


def family(builder: Callable[..., Path]) -> Path:
    """The family suite's export of `builder`'s checkpoint: default options, parity checked (the
    suite asserts it). Every test that wants "the family's graph" asks for this one entry."""
    return export(builder, validate=True)


def quantized(src: Path, mode: str, **options: Any) -> Path:
    """hybridrt.quantization.quantize(src, out, mode, **options) of an export this module
    returned (or any graph directory, keyed by its files), built once."""
    from hybridrt.quantization import quantize

    src = Path(src).resolve()
    parent = _keys.get(src) or digest_files(src)
    options = _without_defaults(quantize, options)
    key = _hash({"src": parent, "mode": mode, "options": options, "package": _package_key()} | _stack())
    return _entry("quant", f"{src.name}-{mode}", key, lambda out: quantize(src, out, mode, **options))


def external_copy(src: Path, dst: Path) -> Path:
    """A copy of the exported directory `src` at `dst` whose weights live in an external data
    file (as every export of a shipped size has them), its manifest's file list updated."""
    import onnx

    from hybridrt.graphs.manifest import read_manifest

    shutil.copytree(src, dst)
    model = onnx.load(str(dst / "model.onnx"))
    onnx.save_model(model, str(dst / "model.onnx"), save_as_external_data=True, location="model.onnx.data")
    manifest = read_manifest(dst)
    manifest.record_files(dst)
    manifest.write(dst)
    return dst
