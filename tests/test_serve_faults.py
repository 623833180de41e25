"""`hybridrt serve` under real faults, on 127.0.0.1: SIGTERM while streams are open, a client
that vanishes mid-stream, a client that stops reading."""

from __future__ import annotations

import json
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from serving import AUTH, KEY, metric, running, sse_data, wait_for

import hybridrt
from hybridrt.runtime.model import Model

LONG = {"model": "default", "prompt": "import os\n", "max_tokens": 1500, "min_tokens": 1500, "stream": True}


@pytest.fixture(scope="module")
def model(default_onnx: Path) -> Model:
    return hybridrt.load(default_onnx)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def process(default_onnx: Path) -> Iterator[tuple[subprocess.Popen, str]]:
    """`hybridrt serve` as its own process, ready to answer."""
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "hybridrt.cli",
        "serve",
        str(default_onnx),
        "--port",
        str(port),
        "--api-key",
        KEY,
        "--model-name",
        "default",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return httpx.get(url + "/health", timeout=1).status_code == 200
        except httpx.TransportError:
            return proc.poll() is not None

    try:
        assert wait_for(healthy, 120) and proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)


def _events(url: str, body: dict, out: list[list[str]]) -> None:
    """Stream a completion; append its `data:` payloads, in order."""
    events: list[str] = []
    out.append(events)
    with httpx.stream("POST", url + "/v1/completions", headers=AUTH, json=body, timeout=120) as r:
        assert r.status_code == 200
        events += list(sse_data(r))


def test_sigterm_drains_open_streams_then_exits_0(process: tuple[subprocess.Popen, str]) -> None:
    """SIGTERM: the open streams get their last chunk and [DONE], new work gets 503, the
    process exits 0 (uvicorn alone closed the listener at once and re-raised SIGTERM: 143)."""
    proc, url = process
    body = LONG | {"max_tokens": 400, "min_tokens": 400}
    streams: list[list[str]] = []
    clients = [threading.Thread(target=_events, args=(url, body, streams)) for _ in range(2)]
    for t in clients:
        t.start()
    assert wait_for(lambda: metric(url, "hybridrt_busy_slots") == 2, 30)
    proc.send_signal(signal.SIGTERM)
    assert wait_for(lambda: httpx.get(url + "/health").status_code == 503, 5)
    refused = httpx.post(url + "/v1/completions", headers=AUTH, json=body | {"stream": False}, timeout=30)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
    for t in clients:
        t.join(120)
    assert proc.wait(60) == 0
    for events in streams:
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert len("".join(c["choices"][0]["text"] for c in chunks)) > 0


def _raw_stream(port: int, body: dict, rcvbuf: int | None = None) -> socket.socket:
    """An HTTP/1.1 streaming request on a bare socket, its response not read yet."""
    sock = socket.socket()
    if rcvbuf is not None:  # a small window, so that the server's writes back up soon
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
    sock.connect(("127.0.0.1", port))
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    sock.sendall(head.encode() + payload)
    return sock


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_a_client_that_vanishes_mid_stream_frees_its_slot(model: Model) -> None:
    """A client whose connection is reset after its first token holds its slot no longer: the
    next request runs at once, and the vanished one stopped long before its 1500 tokens."""
    with running(model, slots=1) as s:
        sock = _raw_stream(_port(s.url), LONG)
        received = b""
        while b"data: " not in received:
            received += sock.recv(65536)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST on close
        sock.close()
        assert wait_for(lambda: metric(s.url, "hybridrt_busy_slots") == 0, 3)
        r = httpx.post(
            s.url + "/v1/completions", headers=AUTH, json=LONG | {"max_tokens": 5, "min_tokens": 5, "stream": False}
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5
        assert metric(s.url, "hybridrt_generated_tokens_total") < 1000


def test_a_client_that_stops_reading_stalls_no_one(model: Model) -> None:
    """A client that never reads its stream: another client's stream runs to its end meanwhile,
    and once the stalled one's unsent backlog is full its slot is freed; when it reads again,
    its stream ends with a `slow_client` error and [DONE]."""
    with running(model, slots=2, stream_backlog=32) as s:
        stalled = _raw_stream(_port(s.url), LONG, rcvbuf=2048)
        assert wait_for(lambda: metric(s.url, "hybridrt_busy_slots") == 1, 10)
        started = time.monotonic()
        streams: list[list[str]] = []
        _events(s.url, LONG | {"max_tokens": 200, "min_tokens": 200}, streams)
        assert streams[0][-1] == "[DONE]" and len(streams[0]) > 100
        assert time.monotonic() - started < 20
        assert wait_for(lambda: metric(s.url, "hybridrt_busy_slots") == 0, 30)
        assert metric(s.url, "hybridrt_generated_tokens_total") < 1500
        stalled.settimeout(10)
        received = b""
        while not received.endswith(b"0\r\n\r\n"):  # the last chunk of the chunked body
            part = stalled.recv(65536)
            if not part:
                break
            received += part
        stalled.close()
        assert b'"code": "slow_client"' in received and b"data: [DONE]" in received
