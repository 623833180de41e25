"""One structured line per HTTP request, written when the request ends, whatever its end.

The server's middleware (app.Guard) opens a `RequestRecord` for every request (its id is the
client's `X-Request-ID` when that is a usable one, else a new one, and the response carries it
back in the same header); the route fills in what it learns (model, tokens, the job's timings,
finish reasons) and the error handlers the error; the middleware writes the line once the
response has been sent in full (a stream's last event included) or the client went away. So
4xx answers, 429s, timeouts and disconnects each write exactly one line, as successes do.

The line is JSON on the `hybridrt.requests` logger: request_id, time (UTC, ISO 8601), door (http
or grpc), method, path, status, model, route and variant (a routed model's choice), prompt_tokens, cached_tokens,
completion_tokens, queue_wait_s (the longest a choice waited for a state slot), ttft_s (to the
first token), total_s, finish_reason (one per choice), error, and the prompt's first N characters
only when `log_prompts` is N > 0. `configure` sends the logger to a rotating file or to stderr.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import re
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOGGER = logging.getLogger("hybridrt.requests")
HEADER = "x-request-id"
# A client's id is used as it is when it is short printable ASCII without spaces (it goes into
# logs and a response header); anything else is replaced by a fresh id.
USABLE_ID = re.compile(r"^[!-~]{1,128}$")


def request_id(given: bytes | None) -> str:
    """The client's X-Request-ID when usable, else a new one (32 hex digits)."""
    if given:
        text = given.decode("latin-1")
        if USABLE_ID.match(text):
            return text
    return uuid.uuid4().hex


@dataclass
class RequestRecord:
    """What one request's log line says; filled in while it runs."""

    request_id: str
    method: str
    path: str
    door: str = "http"  # "grpc": a call of the gRPC door (grpc_api.py), handed to the app as this request
    started: float = field(default_factory=time.perf_counter)
    wall: float = field(default_factory=time.time)
    status: int = 0
    model: str | None = None
    route: str | None = None
    variant: str | None = None
    prompt: str | None = None
    error: str | None = None
    job: Any = None  # the request's serve.jobs.Job, read when the line is written
    counts: dict[str, Any] = field(default_factory=dict)  # tokens and finish reasons, where there is no job

    def fields(self, log_prompts: int = 0) -> dict[str, Any]:
        out: dict[str, Any] = {
            "request_id": self.request_id,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(self.wall)) + f".{int(self.wall % 1 * 1000):03d}Z",
            "door": self.door,
            "method": self.method,
            "path": self.path,
            "status": self.status,
            "model": self.model,
            "route": self.route,
            "variant": self.variant,
            "prompt_tokens": 0,
            "cached_tokens": 0,
            "completion_tokens": 0,
            "queue_wait_s": None,
            "ttft_s": None,
            "total_s": round(time.perf_counter() - self.started, 6),
            "finish_reason": None,
            "error": self.error,
        }
        out |= self.counts
        if self.job is not None:
            out |= job_fields(self.job)
            out["error"] = self.error or next((c.error for c in self.job.choices if c.error), None)
        if log_prompts > 0 and self.prompt is not None:
            out["prompt"] = self.prompt[:log_prompts]
        return out


def job_fields(job: Any) -> dict[str, Any]:
    """Tokens, timings and finish reasons of a serve.jobs.Job."""
    usage = job.usage()
    requests = [c.request for c in job.choices]
    admitted = [r.admitted for r in requests if r.admitted]
    firsts = [r.first for r in requests if r.first]
    submitted = min(r.submitted for r in requests) if requests else None
    waits = [r.admitted - r.submitted for r in requests if r.admitted]
    return {
        "prompt_tokens": usage["prompt_tokens"],
        "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
        "completion_tokens": usage["completion_tokens"],
        "queue_wait_s": round(max(waits), 6) if waits and admitted else None,
        "ttft_s": round(min(firsts) - submitted, 6) if firsts and submitted is not None else None,
        # A choice the client left before its last update was read ends "cancelled" in the engine.
        "finish_reason": [c.finish_reason or ("cancelled" if job.cancelled else None) for c in job.choices],
    }


def write(record: RequestRecord, log_prompts: int = 0) -> dict[str, Any]:
    """Log the record's line (at INFO); returns its fields."""
    fields = record.fields(log_prompts)
    LOGGER.info(json.dumps(fields, ensure_ascii=False))
    return fields


def configure(log_file: str | None = None, max_bytes: int = 100 << 20, backups: int = 5) -> logging.Handler:
    """Send the request lines, bare, to `log_file` (rotated at max_bytes, `backups` old files
    kept) or to stderr; returns the handler (replacing one an earlier call installed)."""
    for old in [h for h in LOGGER.handlers if getattr(h, "hybridrt_requests", False)]:
        LOGGER.removeHandler(old)
        old.close()
    handler: logging.Handler
    if log_file is None:
        handler = logging.StreamHandler(sys.stderr)
    else:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        handler = logging.handlers.RotatingFileHandler(
            log_file, maxBytes=max_bytes, backupCount=backups, encoding="utf-8"
        )
    handler.setFormatter(logging.Formatter("%(message)s"))
    setattr(handler, "hybridrt_requests", True)  # noqa: B010 (marks the handler this module installed)
    LOGGER.addHandler(handler)
    LOGGER.setLevel(logging.INFO)
    LOGGER.propagate = False
    return handler
