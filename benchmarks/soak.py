"""Soak `hybridrt serve`: minutes of client churn against one server process while its RSS is
sampled, to show that memory stays flat under streams that finish, streams dropped early,
requests cancelled by a client timeout, connections that send nothing, and bad requests.

    python benchmarks/soak.py [--model default] [--minutes 30] [--clients 6] [--out report.json]

Prints RSS at start and end, the slope of a least-squares line through the samples after the
warm-up (of RSS, and of RSS less the prefix cache, which grows by design up to its --cache-mb),
every outcome counted, and exits 1 on any 5xx answer or a SIGTERM exit other than 0.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

KEY = "soak-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPTS = ["def fibonacci(n):\n", "import os\n", "class Stack:\n", "# parse a CSV file\n", "for i in range(10):"]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cache_mib(url: str, name: str = "hybridrt_prefix_cache_bytes") -> float:
    """A prefix cache gauge of /metrics in MiB: bytes in memory (default), on disk, or a budget."""
    text = httpx.get(url + "/metrics", headers=AUTH, timeout=10).text
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(found.group(1)) / 2**20 if found else 0.0


def conversation(url: str) -> str:
    """A conversation of a few turns, each resending the history: new states at every turn."""
    words = "the of a state cache turn prompt token reply model layer scan keeps resumes from".split()
    history = ""
    for _ in range(random.randint(2, 4)):
        history += f"User: {' '.join(random.choices(words, k=random.randint(20, 120)))}\nAssistant:"
        body = {"model": "default", "prompt": history, "max_tokens": 16, "temperature": 0}
        r = httpx.post(url + "/v1/completions", headers=AUTH, json=body, timeout=60)
        if r.status_code != 200:
            return f"conversation {r.status_code}"
        history += r.json()["choices"][0]["text"] + "\n"
    return "conversation 200"


def chat(max_tokens: int, stream: bool) -> dict:
    messages = [{"role": "user", "content": random.choice(PROMPTS)}]
    return {"model": "default", "messages": messages, "max_tokens": max_tokens, "stream": stream, "temperature": 0.8}


def full_stream(url: str) -> str:
    with httpx.stream("POST", url + "/v1/chat/completions", headers=AUTH, json=chat(48, True), timeout=60) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    return f"stream {r.status_code}" + (" done" if lines and lines[-1] == "data: [DONE]" else " cut")


def dropped_stream(url: str) -> str:
    with httpx.stream("POST", url + "/v1/chat/completions", headers=AUTH, json=chat(400, True), timeout=60) as r:
        keep = random.randint(1, 8)
        for i, _ in enumerate(r.iter_lines()):
            if i >= keep:
                break
    return f"dropped {r.status_code}"


def cancelled(url: str) -> str:
    try:
        r = httpx.post(url + "/v1/completions", headers=AUTH, timeout=random.uniform(0.05, 0.5),
                       json={"model": "default", "prompt": random.choice(PROMPTS), "max_tokens": 400})  # fmt: skip
        return f"cancelled-late {r.status_code}"
    except httpx.TimeoutException:
        return "cancelled ok"


def bad(url: str) -> str:
    cases = [
        ("/v1/chat/completions", b"{not json", AUTH),
        ("/v1/chat/completions", json.dumps({"model": "default", "messages": "hi"}).encode(), AUTH),
        ("/v1/completions", json.dumps({"model": "default", "prompt": "x", "max_tokens": -1}).encode(), AUTH),
        ("/v1/completions", json.dumps({"model": "nope", "prompt": "x"}).encode(), AUTH),
        ("/v1/completions", json.dumps({"model": "default", "prompt": "x"}).encode(), {"Authorization": "Bearer no"}),
    ]
    path, body, headers = random.choice(cases)
    r = httpx.post(url + path, content=body, headers=headers | {"content-type": "application/json"}, timeout=30)
    return f"bad {r.status_code}"


def silent(url: str) -> str:
    host, port = url.rsplit("/", 1)[1].split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # and leaves mid-header
    return "silent ok"


ACTIONS = [
    full_stream,
    full_stream,
    dropped_stream,
    dropped_stream,
    cancelled,
    bad,
    bad,
    silent,
    conversation,
    conversation,
]


def churn(url: str, until: float, counts: Counter, lock: threading.Lock) -> None:
    while time.monotonic() < until:
        action = random.choice(ACTIONS)
        try:
            outcome = action(url)
        except httpx.HTTPError as e:
            outcome = f"{action.__name__} {type(e).__name__}"
        with lock:
            counts[outcome] += 1


def slope_mib_per_min(samples: list[tuple[float, float]]) -> float:
    n = len(samples)
    if n < 2:
        return 0.0
    mt = sum(t for t, _ in samples) / n
    mr = sum(r for _, r in samples) / n
    var = sum((t - mt) ** 2 for t, _ in samples)
    return 60 * sum((t - mt) * (r - mr) for t, r in samples) / var


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--cache-mb", type=float, default=256.0, help="the server's prefix cache")
    ap.add_argument("--cache-dir", help="the prefix cache's disk tier (default: none)")
    ap.add_argument("--cache-disk-mb", type=float, help="the disk tier's cap")
    ap.add_argument("--sample-s", type=float, default=5.0)
    ap.add_argument("--warmup-s", type=float, default=60.0, help="samples before this are not in the slope")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "hybridrt.cli", "serve", args.model, "--port", str(port), "--api-key", KEY]
    cmd += ["--model-name", "default", "--slots", str(args.slots), "--cache-mb", str(args.cache_mb)]
    cmd += ["--log-level", "warning"]
    if args.cache_dir:
        cmd += ["--cache-dir", args.cache_dir]
    if args.cache_disk_mb is not None:
        cmd += ["--cache-disk-mb", str(args.cache_disk_mb)]
    server = subprocess.Popen(cmd)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and server.poll() is None:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        else:
            print("the server did not come up", file=sys.stderr)
            return 1
        counts: Counter = Counter()
        lock = threading.Lock()
        t0 = time.monotonic()
        until = t0 + 60 * args.minutes
        workers = [threading.Thread(target=churn, args=(url, until, counts, lock)) for _ in range(args.clients)]
        for w in workers:
            w.start()
        samples: list[tuple[float, float, float]] = []  # seconds, RSS, prefix cache (MiB)
        disk: list[float] = []  # the disk tier (MiB), at each sample
        budget = (
            cache_mib(url, "hybridrt_prefix_cache_budget_bytes"),
            cache_mib(url, "hybridrt_prefix_cache_disk_budget_bytes"),
        )
        while time.monotonic() < until:
            samples.append((time.monotonic() - t0, rss_mib(server.pid), cache_mib(url)))
            disk.append(cache_mib(url, "hybridrt_prefix_cache_disk_bytes"))
            t, rss, cached = samples[-1]
            print(
                f"{t:7.0f} s  RSS {rss:7.1f} MiB  cache {cached:6.1f} MiB  disk {disk[-1]:7.1f} MiB  "
                f"requests {sum(counts.values())}",
                flush=True,
            )
            time.sleep(args.sample_s)
        for w in workers:
            w.join(120)
        samples.append((time.monotonic() - t0, rss_mib(server.pid), cache_mib(url)))
        disk.append(cache_mib(url, "hybridrt_prefix_cache_disk_bytes"))
        server.send_signal(signal.SIGTERM)
        code = server.wait(120)
    finally:
        if server.poll() is None:
            server.kill()
    steady = [s for s in samples if s[0] >= args.warmup_s] or samples
    report = {
        "minutes": args.minutes,
        "clients": args.clients,
        "slots": args.slots,
        "requests": sum(counts.values()),
        "outcomes": dict(sorted(counts.items())),
        "rss_start_mib": round(samples[0][1], 1),
        "rss_after_warmup_mib": round(steady[0][1], 1),
        "rss_end_mib": round(samples[-1][1], 1),
        "rss_max_mib": round(max(r for _, r, _ in samples), 1),
        "cache_end_mib": round(samples[-1][2], 1),
        "cache_max_mib": round(max(c for _, _, c in samples), 1),
        "cache_budget_mib": round(budget[0], 1),
        "disk_max_mib": round(max(disk), 1),
        "disk_cap_mib": round(budget[1], 1),
        "slope_mib_per_min_after_warmup": round(slope_mib_per_min([(t, r) for t, r, _ in steady]), 3),
        "slope_less_cache_mib_per_min_after_warmup": round(slope_mib_per_min([(t, r - c) for t, r, c in steady]), 3),
        "sigterm_exit_code": code,
        "samples_s_rss_cache_disk": [
            [round(t, 1), round(r, 1), round(c, 1), round(d, 1)] for (t, r, c), d in zip(samples, disk)
        ],
    }
    print(json.dumps({k: v for k, v in report.items() if not k.startswith("samples")}, indent=2))
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    server_errors = sum(v for k, v in counts.items() if re.search(r"\b5\d\d\b", k))
    return 1 if server_errors or code != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
