"""The fuzz suite's bookkeeping: run a case, classify its outcome, keep a tally that the
test session prints at the end (tests/conftest.py)."""

from __future__ import annotations

import traceback
from collections import Counter
from collections.abc import Callable
from typing import Any

from hybridrt import HybridrtError

# outcome -> count over the session: "worked", "typed error", "failure"
TALLY: Counter[str] = Counter()


class Cases:
    """Runs the cases of one test; `failures` lists each case that neither worked nor raised
    a HybridrtError, with the exception's last frame."""

    def __init__(self) -> None:
        self.failures: list[str] = []
        self.count = 0

    def run(self, label: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
        """fn(*args, **kwargs) returning normally worked (or returns "typed error", as a CLI exit code 2
        does); a HybridrtError is a typed error; anything else is a failure."""
        self.count += 1
        try:
            outcome = "typed error" if fn(*args, **kwargs) == "typed error" else "worked"
        except HybridrtError:
            outcome = "typed error"
        except Exception as e:  # noqa: BLE001 - anything else is the bug this suite hunts
            outcome = "failure"
            where = traceback.extract_tb(e.__traceback__)[-1]
            self.failures.append(f"{label}: {type(e).__name__}: {e} ({where.filename}:{where.lineno})")
        TALLY[outcome] += 1
        return outcome

    def check(self, at_least: int) -> None:
        assert self.count >= at_least, f"only {self.count} cases generated, expected >= {at_least}"
        assert not self.failures, f"{len(self.failures)} of {self.count} cases failed:\n" + "\n".join(
            self.failures[:40]
        )
