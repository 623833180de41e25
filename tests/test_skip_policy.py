"""The suite's skip policy (tests/skip_policy.py), run on a session of its own: a skip for a
missing GPU or Arm board is allowed and listed; any other skip is listed and fails the run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def _run(tmp_path: Path, reason: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_one.py").write_text(
        f"import pytest\n\ndef test_runs():\n    assert True\n\ndef test_skips():\n    pytest.skip({reason!r})\n"
    )
    env = os.environ | {"PYTHONPATH": str(TESTS)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "skip_policy", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )


@pytest.mark.parametrize("reason", ["no GPU: CUDA is not available", "no Arm board in reach"])
def test_a_skip_for_missing_hardware_passes_and_is_listed(tmp_path: Path, reason: str) -> None:
    done = _run(tmp_path, reason)
    assert done.returncode == 0, done.stdout
    assert f"allowed: test_one.py::test_skips: {reason}" in done.stdout


def test_any_other_skip_fails_the_run(tmp_path: Path) -> None:
    done = _run(tmp_path, "playwright is not installed")
    assert done.returncode == 1, done.stdout
    assert "NOT ALLOWED, fails the run: test_one.py::test_skips: playwright is not installed" in done.stdout
    assert "1 passed, 1 skipped" in done.stdout
