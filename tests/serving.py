"""A real server on 127.0.0.1 for the serve tests."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

import hybridrt
from hybridrt.serve import EngineConfig, ServeConfig
from hybridrt.serve.server import Running, build, start_in_thread

KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@contextlib.contextmanager
def running(
    model: Any | Callable[[], Any], wait: bool = True, assistant: Any = None, **kwargs: Any
) -> Iterator[Running]:
    """Serve `model` (or a loader), with a draft model if `assistant`, with EngineConfig/ServeConfig
    fields from kwargs."""
    engine_fields = set(EngineConfig.__dataclass_fields__)
    engine = EngineConfig(**{k: v for k, v in kwargs.items() if k in engine_fields})
    serve = ServeConfig(**{"api_key": KEY} | {k: v for k, v in kwargs.items() if k not in engine_fields})
    eng, app = build(model, engine, serve, assistant)
    server = start_in_thread(eng, app)
    try:
        if wait:
            assert eng.ready.wait(60)
        yield server
    finally:
        server.stop()


def metric(url: str, name: str) -> float:
    """One sample of /metrics, e.g. metric(url, 'hybridrt_busy_slots')."""
    text = httpx.get(f"{url}/metrics", headers=AUTH).text
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


def wait_for(check: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


def server_fixture(model: str, **options: Any) -> Any:
    """A module-scoped `server` fixture: `running` over the fixture named `model` (a model
    directory, loaded here, or a loaded model) with EngineConfig/ServeConfig fields `options`."""

    @pytest.fixture(scope="module")
    def server(request: pytest.FixtureRequest) -> Iterator[Running]:
        value = request.getfixturevalue(model)
        with running(hybridrt.load(value) if isinstance(value, Path) else value, **options) as s:
            yield s

    return server


def client_of(server: Running) -> openai.OpenAI:
    """The openai package's client of `server`, with the key and no retries."""
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)


def sse_data(response: httpx.Response) -> Iterator[str]:
    """The `data:` payloads of a streamed response, as they arrive. Events end at a blank line,
    as SSE has them; the server writes JSON with raw non-ASCII text, so a payload may hold
    characters that str.splitlines (httpx's iter_lines) would split on, such as U+2028."""
    buffer = ""
    for text in response.iter_text():
        buffer += text
        while "\n\n" in buffer:
            event, buffer = buffer.split("\n\n", 1)
            if event.startswith("data: "):
                yield event[6:]
    if buffer.startswith("data: "):  # a stream cut after its last event's own line
        yield buffer.rstrip("\n")[6:]
