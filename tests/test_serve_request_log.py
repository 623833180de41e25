"""Per-request log lines of `hybridrt serve` on a real server on 127.0.0.1: exactly one valid JSON
line per request, whatever its end (success, stream, 4xx, 401, 429, 504, a client that leaves),
with the client's X-Request-ID returned; and the end-to-end and queue-wait histograms."""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from serving import AUTH, metric, running, wait_for

import hybridrt
from hybridrt.runtime.model import Model
from hybridrt.serve.request_log import LOGGER, configure, request_id

LONG = {"model": "default", "prompt": "import os\n", "max_tokens": 1500, "min_tokens": 1500, "stream": True}
SHORT = {"model": "default", "prompt": "def fibonacci(n):\n", "max_tokens": 5, "temperature": 0}


@pytest.fixture(scope="module")
def model(default_onnx: Path) -> Model:
    return hybridrt.load(default_onnx)


@pytest.fixture
def log_file(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "requests.log"
    handler = configure(str(path))
    yield path
    LOGGER.removeHandler(handler)
    handler.close()


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]  # each line is one JSON object


def _id(name: str) -> dict[str, str]:
    return AUTH | {"X-Request-ID": name}


def _read_one_line_and_leave(url: str, rid: str) -> None:
    with httpx.stream("POST", url + "/v1/completions", headers=_id(rid), json=LONG, timeout=60) as r:
        next(r.iter_lines())


def test_every_request_writes_one_json_line(model: Model, log_file: Path) -> None:
    with running(model, slots=1, max_queue=1, log_prompts=8) as s:
        good = httpx.post(s.url + "/v1/completions", headers=_id("good-1"), json=SHORT, timeout=60)
        assert good.status_code == 200 and good.headers["x-request-id"] == "good-1"
        with httpx.stream(
            "POST", s.url + "/v1/completions", headers=_id("stream-1"), json=SHORT | {"stream": True}, timeout=60
        ) as r:
            assert r.headers["x-request-id"] == "stream-1"
            assert "[DONE]" in r.read().decode()
        bad = httpx.post(s.url + "/v1/completions", headers=_id("bad-1"), json=SHORT | {"top_p": 7}, timeout=60)
        assert bad.status_code == 400 and bad.headers["x-request-id"] == "bad-1"
        key = httpx.post(s.url + "/v1/completions", headers={"X-Request-ID": "key-1"}, json=SHORT, timeout=60)
        assert key.status_code == 401
        fresh = httpx.get(s.url + "/v1/models", headers=AUTH | {"X-Request-ID": "not a usable id"}, timeout=60)
        assert re.fullmatch(r"[0-9a-f]{32}", fresh.headers["x-request-id"])
        with httpx.stream("POST", s.url + "/v1/completions", headers=_id("hold-1"), json=LONG, timeout=60) as held:
            lines = held.iter_lines()
            next(lines)  # it holds the only slot
            queued = threading.Thread(target=_read_one_line_and_leave, args=(s.url, "queued-1"))
            queued.start()
            assert wait_for(lambda: metric(s.url, "hybridrt_queue_depth") == 1)
            busy = httpx.post(s.url + "/v1/completions", headers=_id("busy-1"), json=SHORT, timeout=60)
            assert busy.status_code == 429
            lines.close()  # both streaming clients leave
        queued.join(30)
        assert wait_for(lambda: metric(s.url, "hybridrt_busy_slots") == 0, 5)
        # Each line is written once the response is over; the last one's may follow its answer.
        names = ["good-1", "stream-1", "bad-1", "key-1", "hold-1", "queued-1", "busy-1"]
        assert wait_for(lambda: {str(x["request_id"]) for x in _lines(log_file)} >= set(names))
        text = httpx.get(f"{s.url}/metrics", headers=AUTH).text
    with running(model, request_timeout=0.3) as s:  # 1,500 tokens cannot come in 0.3 s
        slow = httpx.post(s.url + "/v1/completions", headers=_id("slow-1"), json=LONG | {"stream": False}, timeout=60)
        assert slow.status_code == 504
        names.append("slow-1")
        assert wait_for(lambda: any(x["request_id"] == "slow-1" for x in _lines(log_file)))
    lines_by_id: dict[str, list[dict[str, object]]] = {}
    for line in _lines(log_file):
        lines_by_id.setdefault(str(line["request_id"]), []).append(line)
    for name in names:
        assert len(lines_by_id[name]) == 1, name  # exactly one line per request
    one = {name: lines_by_id[name][0] for name in names}
    usage = good.json()["usage"]
    g = one["good-1"]
    assert g["status"] == 200 and g["model"] == "default" and g["path"] == "/v1/completions"
    assert g["prompt_tokens"] == usage["prompt_tokens"] and g["completion_tokens"] == usage["completion_tokens"] == 5
    assert g["finish_reason"] == ["length"] and g["error"] is None
    assert 0 <= g["queue_wait_s"] <= g["ttft_s"] <= g["total_s"]  # type: ignore[operator]
    seen = model.tokenizer.decode(model.prompt_rows(SHORT["prompt"]).rows[0], skip_special_tokens=False)
    assert g["prompt"] == seen[:8] and seen.endswith("def fibonacci(n):\n")  # --log-prompts 8: the model's view
    assert one["stream-1"]["status"] == 200 and one["stream-1"]["completion_tokens"] == 5
    assert one["bad-1"]["status"] == 400 and "top_p" in str(one["bad-1"]["error"])
    assert one["key-1"]["status"] == 401 and "API key" in str(one["key-1"]["error"]) and one["key-1"]["model"] is None
    assert one["busy-1"]["status"] == 429 and "waiting" in str(one["busy-1"]["error"])
    assert one["hold-1"]["finish_reason"] == ["cancelled"] and one["queued-1"]["finish_reason"] == ["cancelled"]
    assert one["slow-1"]["status"] == 504 and one["slow-1"]["finish_reason"] == ["timeout"]
    # The histograms count the model's requests (their sums are seconds).
    served = re.search(r'^hybridrt_request_seconds_count\{model="default"\} (\S+)$', text, re.M)
    waited = re.search(r'^hybridrt_queue_wait_seconds_count\{model="default"\} (\S+)$', text, re.M)
    assert served and float(served.group(1)) >= 5 and waited and float(waited.group(1)) >= 3


def test_prompts_are_left_out_unless_asked(model: Model, log_file: Path) -> None:
    with running(model) as s:
        assert httpx.post(s.url + "/v1/completions", headers=_id("quiet-1"), json=SHORT, timeout=60).status_code == 200
        assert wait_for(lambda: any(x["request_id"] == "quiet-1" for x in _lines(log_file)))
    [line] = [x for x in _lines(log_file) if x["request_id"] == "quiet-1"]
    assert "prompt" not in line and line["completion_tokens"] == 5


def test_a_client_id_is_kept_only_when_usable() -> None:
    assert request_id(b"trace-42/a.b") == "trace-42/a.b"
    for bad in (None, b"", b"has space", b"x" * 129, "caf\u00e9".encode(), b"line\nbreak"):
        assert re.fullmatch(r"[0-9a-f]{32}", request_id(bad)), bad


def test_the_log_file_rotates(tmp_path: Path) -> None:
    path = tmp_path / "r.log"
    handler = configure(str(path), max_bytes=2_000, backups=2)
    try:
        for i in range(200):
            LOGGER.info(json.dumps({"request_id": str(i)}))
    finally:
        LOGGER.removeHandler(handler)
        handler.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["r.log", "r.log.1", "r.log.2"]  # two old files kept, the oldest dropped
    assert all(p.stat().st_size <= 2_000 for p in tmp_path.iterdir())
    assert logging.getLogger("hybridrt.requests").propagate is False  # not also in uvicorn's log
