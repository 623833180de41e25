"""A new user's first runs of the `hybridrt` command, in real subprocesses: a runtime-only
install (the export extra's modules made unimportable) gets one line naming the extra, and
output piped into `head` ends quietly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXTRA_MODULES = (
    "torch",
    "onnx",
    "onnxscript",
    "safetensors",
    "transformers",
    "starlette",
    "uvicorn",
    "prometheus_client",
)
# `python -c` with the export and serve extras' modules blocked, as a plain `pip install hybridrt` has them.
RUNTIME_ONLY = (
    "import sys\n"
    f"for m in {EXTRA_MODULES!r}: sys.modules[m] = None\n"
    "from hybridrt.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)
CLI = "import sys\nfrom hybridrt.cli import main\nsys.exit(main(sys.argv[1:]))\n"


def _env(cache: Path) -> dict[str, str]:
    return os.environ | {"PYTHONPATH": str(ROOT), "HYBRIDRT_CACHE": str(cache)}


@pytest.mark.parametrize(
    "argv, says",
    [
        (["demo"], "pip install 'hybridrt[export]'"),
        (["export", "default", "-o", "{tmp}/out"], "pip install 'hybridrt[export]'"),
        (["quantize", "{onnx}", "-o", "{tmp}/q", "--mode", "int4"], "pip install 'hybridrt[export]'"),
        (["generate", "default", "hi"], "has not been exported yet"),
        (["serve", "{onnx}", "--port", "0"], "pip install 'hybridrt[serve]'"),
    ],
)
def test_runtime_only_install_names_the_extra(jamba_onnx: Path, tmp_path: Path, argv: list[str], says: str) -> None:
    """Regression: these crashed with a ModuleNotFoundError traceback without the export extra."""
    args = [a.format(tmp=tmp_path, onnx=jamba_onnx) for a in argv]
    done = subprocess.run(
        [sys.executable, "-c", RUNTIME_ONLY, *args], capture_output=True, text=True, env=_env(tmp_path / "cache")
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hybridrt: error:") and says in lines[0], done.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "q").exists()


def test_generate_piped_into_head_ends_quietly(jamba_onnx: Path, tmp_path: Path) -> None:
    """Regression: `hybridrt generate ... | head -1` ended in a BrokenPipeError traceback."""
    cmd = [sys.executable, "-c", CLI, "generate", str(jamba_onnx), "def", "--max-new-tokens", "300"]
    with subprocess.Popen(
        cmd + ["--min-new-tokens", "300"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(tmp_path),
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.read(1)
        proc.stdout.close()  # the reader goes away, as `head -c 1` does
        err = proc.stderr.read().decode()
        code = proc.wait()
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert code == 0


def test_inspect_piped_into_head_ends_quietly(jamba_onnx: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        f"{sys.executable} -c '{CLI}' inspect {jamba_onnx} | head -1",
        shell=True,
        capture_output=True,
        text=True,
        env=_env(tmp_path),
    )
    assert done.stdout.startswith("model") and done.stdout.count("\n") == 1
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


def test_a_long_step_says_it_is_still_running(capsys: pytest.CaptureFixture[str]) -> None:
    """Regression: tracing, parity and GPTQ ran for up to 13 minutes without a line of output."""
    import time

    from hybridrt.commands.common import Ticker

    with Ticker(every=1.0) as say:
        say("tracing (onnx)")
        time.sleep(2.5)
    err = capsys.readouterr().err
    assert "tracing (onnx)" in err and "... still tracing (onnx) (" in err
    assert "\r" not in err


def test_server_exports_the_default_model_in_a_child_process(tmp_path: Path) -> None:
    """`hybridrt serve default` on a first run exports in a child process: the server's own
    process never imports torch, so its memory is the runtime's alone."""
    code = (
        "import sys; from hybridrt.commands.common import model_dir; d = model_dir('default', isolated=True); "
        "print((d / 'hybridrt.json').is_file(), 'torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=_env(tmp_path / "cache"), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"]
