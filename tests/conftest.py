"""Session-scoped fixtures: tiny checkpoints and their exports, built once per run."""

from __future__ import annotations

import json
import os
import socket
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import exports
import pytest
import toy_kind
from checkpoints import TEXT, make_jamba, make_llama
from family_checkpoints import BUILDERS
from fuzzing import TALLY

from hybridrt.export.trace_cache import ENV as TRACE_CACHE
from hybridrt.runtime.providers import THREADS_ENV

pytest_plugins = ["skip_policy"]  # any skip but for no GPU or no Arm fails the run
_worker_tallies: list[dict[str, dict[str, int]]] = []


def pytest_configure(config: pytest.Config) -> None:
    cache = getattr(config, "cache", None)  # None with -p no:cacheprovider
    root = Path(cache.mkdir("hybridrt-builds")) if cache else config.rootpath / ".pytest_cache" / "hybridrt-builds"
    exports.configure(root, prune=not hasattr(config, "workerinput"))
    # Exports of one architecture share its traced layers (hybridrt.export.trace_cache), in every
    # worker and in the CLI's child processes; tests of the cache itself set their own.
    os.environ.setdefault(TRACE_CACHE, str(root / "traces"))
    workers = getattr(config, "workerinput", {}).get("workercount")
    if workers:
        _share_cores(int(workers))


def _share_cores(workers: int) -> None:
    """Each xdist worker, and every process it starts, gets its share of the cores: torch's
    and onnxruntime's pools (HYBRIDRT_THREADS) otherwise each start one thread per core: on two
    cores, a warm run took 239 s that way and 137 s with a thread per worker."""
    import torch

    share = max(1, (os.cpu_count() or 1) // workers)
    for name in (THREADS_ENV, "OMP_NUM_THREADS"):
        os.environ.setdefault(name, str(share))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def _tallies() -> dict[str, dict[str, int]]:
    return {"exports": dict(exports.TALLY), "fuzz": dict(TALLY)}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """xdist: each worker's tallies, sent in its workeroutput."""
    _worker_tallies.append(json.loads(node.workeroutput.get("tallies", "{}")))


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["tallies"] = json.dumps(_tallies())


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The build cache's hits and builds (tests/exports.py) and the fuzz suite's tally
    (tests/test_fuzz.py), summed over workers."""
    if hasattr(terminalreporter.config, "workeroutput"):
        return
    total: dict[str, Counter[str]] = {"exports": Counter(), "fuzz": Counter()}
    for tallies in [_tallies(), *_worker_tallies]:
        for name, counts in tallies.items():
            total[name].update(counts)
    built = total["exports"]
    if built:
        hits = sum(v for k, v in built.items() if k.endswith("hits"))
        builds = sum(v for k, v in built.items() if k.endswith("builds"))
        detail = ", ".join(f"{k} {v}" for k, v in sorted(built.items()))
        terminalreporter.write_line(f"build cache: {hits} hits, {builds} built ({detail})")
    fuzz = total["fuzz"]
    if fuzz:
        terminalreporter.write_line(
            f"fuzz: {sum(fuzz.values())} cases, {fuzz['worked']} worked, {fuzz['typed error']} typed errors, "
            f"{fuzz['failure']} failures"
        )


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """A check that must not need the network (a CI runner, an air-gapped cluster): any socket
    the test opens fails it."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the check tried to open a network connection")

    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture(scope="session")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A text file of the tests' source code: calibration and held-out text (tests/checkpoints.TEXT)."""
    path = tmp_path_factory.mktemp("text") / "code.txt"
    path.write_text(TEXT * 8, encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def jamba_dir() -> Path:
    return exports.checkpoint(make_jamba)


@pytest.fixture(scope="session")
def llama_dir() -> Path:
    return exports.checkpoint(make_llama)


@pytest.fixture(scope="session", params=["jamba", "llama"])
def ckpt_dir(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(f"{request.param}_dir")


@pytest.fixture(scope="session")
def jamba_onnx() -> Path:
    """The family suite's export of the tiny Jamba (with its parity check, which it asserts)."""
    return exports.family(make_jamba)


@pytest.fixture(scope="session")
def llama_onnx() -> Path:
    return exports.family(make_llama)


@pytest.fixture(scope="session", params=["jamba", "llama"])
def onnx_dir(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(f"{request.param}_onnx")


@pytest.fixture(scope="session")
def default_onnx() -> Path:
    """The shipped default model (Mamba1 + attention), exported once."""
    from hybridrt.default_model import CHECKPOINT_DIR

    return exports.export(CHECKPOINT_DIR)


@pytest.fixture(scope="session")
def jamba_int4(jamba_onnx: Path, text_file: Path) -> Path:
    """The tiny Jamba quantized to int4: a draft model that keeps some of its drafts."""
    return exports.quantized(jamba_onnx, "int4", eval_text=text_file, **exports.QUICK)


@pytest.fixture(scope="session")
def llama_kv8(llama_onnx: Path, text_file: Path) -> Path:
    """The tiny Llama with float weights and an int8 KV cache (quantize --mode none --kv-dtype int8)."""
    return exports.quantized(llama_onnx, "none", calibration=[text_file], kv_dtype="int8", **exports.QUICK)


# Every family of tests/family_checkpoints.BUILDERS, built and exported once (tests/exports.py) for
# the suites that run on all of them (test_families, test_beam): a module defines a `family`
# fixture over the names and asks for `ckpt` / `exported`.


@pytest.fixture
def ckpt(family: str) -> Path:
    return exports.checkpoint(BUILDERS[family])


@pytest.fixture
def exported(family: str) -> Path:
    """The family's export, with its parity check (the family suite asserts it)."""
    return exports.family(BUILDERS[family])


@pytest.fixture
def toy_registered() -> Iterator[None]:
    """tests/toy_kind.py's layer kind "ema" (one state, an exponential moving average) and its
    family, registered as a third party would, and unregistered afterwards."""
    from hybridrt.kinds import LAYER_KINDS, LayerKind, register_kind
    from hybridrt.models.loading.registry import FAMILIES, Family, register

    register_kind(LayerKind("ema", "toy_kind:EmaMixer", (toy_kind.EMA_STATE,), "toy moving average"))
    register(Family("toy_ema", toy_kind.translate))
    try:
        yield
    finally:
        LAYER_KINDS.pop("ema")
        FAMILIES.pop("toy_ema")
