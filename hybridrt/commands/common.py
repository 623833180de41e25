"""Helpers shared by subcommands."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .. import default_model
from ..errors import GraphError

if TYPE_CHECKING:
    from ..runtime.decode import GenerationStats
    from ..runtime.streaming import TextStream


def stage(t0: float, message: str) -> None:
    print(f"[{time.perf_counter() - t0:6.1f}s] {message}", file=sys.stderr, flush=True)


class Ticker:
    """A progress callback that prints each stage to stderr and, while one stage runs longer
    than `every` seconds, a line saying it is still running: no long step is silent. Plain
    lines (no carriage returns or padding), so a log file reads as well as a terminal."""

    def __init__(self, t0: float | None = None, every: float = 10.0, prefix: str = "") -> None:
        self.t0 = time.perf_counter() if t0 is None else t0
        self.every, self.prefix = every, prefix
        self.message, self.since = "", 0.0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._tick, daemon=True)

    def __enter__(self) -> Ticker:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()

    def __call__(self, message: str) -> None:
        self.message, self.since = message, time.perf_counter()
        stage(self.t0, self.prefix + message)

    def _tick(self) -> None:
        # A line after `every` seconds of one stage, then at doubling intervals up to a
        # minute: a 13-minute GPTQ step gives about 15 lines, not 80.
        wait, shown = self.every, ""
        while not self.done.wait(1.0):
            message, since = self.message, self.since
            running = time.perf_counter() - since
            if message != shown:
                wait, shown = self.every, message
            if message and running >= wait:
                stage(self.t0, f"{self.prefix}... still {message.strip().rstrip('.')} ({running:.0f} s)")
                wait = running + min(running, 60.0)


def write_stream(stream: TextStream) -> GenerationStats:
    """Writes each piece of `stream` to stdout as it comes, then a newline; its stats."""
    for piece in stream:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return stream.stats


def model_dir(name: str, isolated: bool = False) -> Path:
    """An exported directory; "default" exports the shipped model on first use (needs torch).

    `isolated` exports in a child process, so that a long-running caller (the server) never
    holds torch and the exporter's memory: its RSS stays that of the runtime alone."""
    if not default_model.is_default(name):
        return Path(name)
    try:
        return default_model.exported_dir()
    except GraphError as not_exported:
        if not all(importlib.util.find_spec(m) is not None for m in ("onnx", "torch")):
            # The runtime-only install cannot export; exported_dir's message says how.
            raise not_exported from None
        if isolated:
            code = "from hybridrt.commands.common import model_dir; model_dir('default')"
            done = subprocess.run([sys.executable, "-c", code], check=False)
            if done.returncode != 0:
                status = done.returncode
                raise GraphError(f"exporting the default model failed (exit status {status}); see above") from None
            return default_model.exported_dir()
        with Ticker(prefix="default model: ") as say:
            directory, _ = default_model.ensure_exported(say)
        return directory
