"""The tests' build cache (tests/exports.py): keyed by what an export depends on, never used
stale, built once when several workers ask for it at once."""

from __future__ import annotations

import multiprocessing
import shutil
from pathlib import Path

import exports
import pytest
from checkpoints import make_llama

import hybridrt
from hybridrt.graphs.manifest import read_manifest


def _copy_package(tmp_path: Path) -> Path:
    copy = tmp_path / "hybridrt"
    shutil.copytree(exports.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "data"))
    return copy


@pytest.mark.parametrize(
    "edited",
    [
        "models/mixers/mamba2.py",  # a mixer, found by name at run time (no import graph shows it)
        "models/families/granitemoehybrid.py",
        "graphs/contract.py",
        "export/fuse.py",  # an export pass
        "export/streamed.py",
        "quantization/methods.py",
        "runtime/input_checks.py",
        "kinds.py",
    ],
)
def test_an_edit_to_what_an_export_runs_changes_the_key(tmp_path: Path, edited: str) -> None:
    copy = _copy_package(tmp_path)
    before = exports.source_key(copy)
    path = copy / edited
    path.write_text(path.read_text() + "\n# edited\n")
    assert exports.source_key(copy) != before


def test_an_edit_to_the_server_or_cli_keeps_the_key(tmp_path: Path) -> None:
    """The server and the command line run no export: editing them keeps every cached export."""
    copy = _copy_package(tmp_path)
    before = exports.source_key(copy)
    for edited in ("serve/app.py", "commands/export.py", "cli.py"):
        path = copy / edited
        path.write_text(path.read_text() + "\n# edited\n")
    assert exports.source_key(copy) == before


def _fresh(out: Path) -> None:
    out.mkdir()
    (out / "model.txt").write_text("fresh")


def test_an_entry_written_into_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression guard: a test that writes into a cached directory must not poison the next
    reader; the entry's digest no longer matches and it is built again."""
    monkeypatch.setattr(exports, "_root", tmp_path)
    monkeypatch.setattr(exports, "TALLY", exports.Counter())
    first = exports._entry("t", "x", "key", _fresh)
    assert exports._entry("t", "x", "key", _fresh) == first
    assert exports.TALLY["t builds"] == 1 and exports.TALLY["t hits"] == 1
    (first / "model.txt").write_text("written by a test")
    again = exports._entry("t", "x", "key", _fresh)
    assert (again / "model.txt").read_text() == "fresh"
    assert exports.TALLY["stale entries rebuilt"] == 1 and exports.TALLY["t builds"] == 2


def test_a_failed_build_leaves_no_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exports, "_root", tmp_path)
    monkeypatch.setattr(exports, "TALLY", exports.Counter())

    def broken(out: Path) -> None:
        out.mkdir()
        (out / "half.txt").write_text("half")
        raise RuntimeError("build failed")

    with pytest.raises(RuntimeError, match="build failed"):
        exports._entry("t", "x", "key", broken)
    assert [p.name for p in tmp_path.iterdir()] == ["t-x-key.lock"]
    assert (exports._entry("t", "x", "key", _fresh) / "model.txt").read_text() == "fresh"


def _slow_build(root: str, log: str) -> str:
    """In a worker process: ask for one entry whose build takes a while, logging each build."""
    import time

    exports.configure(Path(root))

    def build(out: Path) -> None:
        with open(log, "a") as f:
            f.write("built\n")
        time.sleep(1.0)
        _fresh(out)

    return str(exports._entry("t", "x", "key", build))


def test_workers_asking_at_once_build_an_entry_once(tmp_path: Path) -> None:
    log = tmp_path / "log.txt"
    context = multiprocessing.get_context("spawn")
    with context.Pool(3) as pool:
        paths = pool.starmap(_slow_build, [(str(tmp_path / "root"), str(log))] * 3)
    assert len(set(paths)) == 1 and log.read_text() == "built\n"


def test_a_changed_package_exports_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The export key holds the package's sources: under another source key the same request is
    another entry, built afresh, never the one built from other code."""
    first = exports.export(make_llama, validate=False)
    monkeypatch.setattr(exports, "_root", tmp_path)
    monkeypatch.setattr(exports, "_package_key", lambda: "another version of the package")
    monkeypatch.setattr(exports, "TALLY", exports.Counter())
    second = exports.export(make_llama, validate=False)
    assert second != first and exports.TALLY["onnx builds"] == 1
    assert read_manifest(second).provenance["created"] >= read_manifest(first).provenance["created"]
    prompt = [5, 6, 7]
    assert hybridrt.load(second).generate(prompt, max_new_tokens=4) == hybridrt.load(first).generate(
        prompt, max_new_tokens=4
    )


def test_options_at_their_default_share_an_entry() -> None:
    """fused_ops=True is export_model's default: the same build as no option."""
    assert exports.export(make_llama, fused_ops=True) == exports.export(make_llama)
