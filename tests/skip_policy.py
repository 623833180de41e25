"""A pytest plugin (tests/conftest.py loads it): a skip is a test that did not run, so the only
reasons allowed are the hardware a machine may lack. The run ends with every skip and its
reason, and any other skip (a missing package, a missing tool) fails it."""

from __future__ import annotations

import pytest

ALLOWED_SKIPS = ("no GPU", "no Arm")


def skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def _skipped(config: pytest.Config) -> list[pytest.TestReport]:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    return list(reporter.stats.get("skipped", [])) if reporter else []


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput"):  # xdist worker: the controller sees every report
        return
    unlisted = [r for r in _skipped(session.config) if not skip_reason(r).startswith(ALLOWED_SKIPS)]
    if unlisted and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    skipped = _skipped(terminalreporter.config)
    terminalreporter.write_line(f"skips: {len(skipped)} (allowed only for: {', '.join(ALLOWED_SKIPS)})")
    for report in skipped:
        reason = skip_reason(report)
        verdict = "allowed" if reason.startswith(ALLOWED_SKIPS) else "NOT ALLOWED, fails the run"
        terminalreporter.write_line(f"  {verdict}: {report.nodeid}: {reason}")
