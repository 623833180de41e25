"""Real clients against `hybridrt serve` on 127.0.0.1, through the scripts that run them
(benchmarks/run_lm_eval.py, benchmarks/run_schemathesis.py); skipped where a client is not installed."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _needs(*modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)}")


def _script(name: str, *args: str) -> str:
    done = subprocess.run([sys.executable, str(BENCHMARKS / name), *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_lm_eval_runs_and_its_loglikelihoods_are_hybridrts(default_onnx: Path, tmp_path: Path) -> None:
    """lm-eval's local-completions model (echo + logprobs for loglikelihood, and generate_until)
    runs to the end, and the script checks its loglikelihoods against token_nll's."""
    _needs("lm_eval", "tenacity")
    out = _script("run_lm_eval.py", str(default_onnx), "--out", str(tmp_path))
    assert "|hybridrt_code_choice|" in out and "|hybridrt_code_line  |" in out
    assert "loglikelihoods of 80 continuations" in out


def test_schemathesis_finds_no_server_error(jamba_onnx: Path) -> None:
    """Every generated request, valid or not, gets a documented answer and never a 5xx."""
    _needs("schemathesis")
    out = _script("run_schemathesis.py", str(jamba_onnx), "--max-examples", "10", "--workers", "1")
    assert "No issues found" in out and "5xx responses: {}" in out
