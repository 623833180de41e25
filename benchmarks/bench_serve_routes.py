"""Serving several models and routes, measured on 127.0.0.1; each server in its own process.

    python benchmarks/bench_serve_routes.py overhead --model DIR [--baseline-src OLD_CHECKOUT] [--rounds 3]
    python benchmarks/bench_serve_routes.py split --a DIR --b DIR [--clients 8] [--seconds 60]

`overhead`: one-stream decode tokens/s of one greedy stream of --tokens tokens, through (a) the
model's own name and (b) a split route between two copies of it, with every request's log line
written to a file; with --baseline-src, also (c) a server of another checkout (PYTHONPATH) that
writes no request log and has no routes. The servers are started in turn, --rounds times
(alternated: this machine is shared and noisy); the median of each is reported with the ratio.
`split`: --clients concurrent clients for --seconds against a 90/10 split route between models a
and b, each client a distinct user; per variant: requests, completion tokens, tokens/s and
end-to-end latency p50/p95, and the share of requests each variant got.
Both write JSON to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

PROMPT = "def fibonacci(n):\n"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(args: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], str]:
    port = _port()
    cmd = [sys.executable, "-m", "hybridrt.cli", "serve", *args, "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"server did not start: {' '.join(cmd)}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()


def _decode_rate(url: str, model: str, tokens: int) -> float:
    """Tokens/s of one greedy stream after its first token (decode only)."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": tokens, "min_tokens": tokens, "temperature": 0}
    times = []
    with httpx.stream("POST", url + "/v1/completions", json=body | {"stream": True}, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                times.append(time.perf_counter())
    return (len(times) - 1) / (times[-1] - times[0])


def overhead(args: argparse.Namespace) -> dict[str, Any]:
    log = Path(args.out).with_suffix(".requests.log")
    setups: dict[str, tuple[list[str], dict[str, str] | None, str]] = {
        "own name, logged": ([f"m={args.model}", "--log-file", str(log)], None, "m"),
        "split route, logged": (
            [f"a={args.model}", f"b={args.model}", "--route", "ab=split:a:1,b:1", "--log-file", str(log)],
            None,
            "ab",
        ),
    }
    if args.baseline_src:
        old = os.environ | {"PYTHONPATH": str(Path(args.baseline_src).resolve())}
        setups["baseline checkout, no log"] = ([args.model, "--model-name", "m"], old, "m")
    rates: dict[str, list[float]] = {k: [] for k in setups}
    for r in range(args.rounds):
        for name, (serve_args, env, model) in setups.items():
            proc, url = _start(serve_args, env)
            try:
                _decode_rate(url, model, 16)  # warm
                rates[name].append(_decode_rate(url, model, args.tokens))
            finally:
                _stop(proc)
            print(f"round {r + 1} {name}: {rates[name][-1]:.1f} tok/s", flush=True)
    medians = {k: statistics.median(v) for k, v in rates.items()}
    ref = medians.get("baseline checkout, no log", medians["own name, logged"])
    return {
        "tokens": args.tokens,
        "rounds": rates,
        "median_tok_s": medians,
        "vs_reference": {k: v / ref for k, v in medians.items()},
    }


async def _client(http: httpx.AsyncClient, url: str, user: str, stop_at: float, out: list[dict[str, Any]]) -> None:
    body = {"model": "ab", "prompt": PROMPT, "max_tokens": 32, "temperature": 0, "user": user}
    while time.monotonic() < stop_at:
        t0 = time.perf_counter()
        r = await http.post(url + "/v1/completions", json=body, timeout=300)
        out.append(
            {
                "variant": r.headers.get("x-hybridrt-route", "=?").split("=")[1],
                "status": r.status_code,
                "tokens": r.json()["usage"]["completion_tokens"] if r.status_code == 200 else 0,
                "seconds": time.perf_counter() - t0,
            }
        )


def split(args: argparse.Namespace) -> dict[str, Any]:
    proc, url = _start([f"a={args.a}", f"b={args.b}", "--route", "ab=split:a:90,b:10", "--slots", str(args.clients)])
    out: list[dict[str, Any]] = []
    try:

        async def run() -> None:
            async with httpx.AsyncClient() as http:
                stop_at = time.monotonic() + args.seconds
                await asyncio.gather(*(_client(http, url, f"user-{i}", stop_at, out) for i in range(args.clients)))

        t0 = time.perf_counter()
        asyncio.run(run())
        wall = time.perf_counter() - t0
    finally:
        _stop(proc)
    report: dict[str, Any] = {"clients": args.clients, "seconds": wall, "variants": {}}
    for variant in sorted({x["variant"] for x in out}):
        rows = [x for x in out if x["variant"] == variant]
        lat = sorted(x["seconds"] for x in rows)
        report["variants"][variant] = {
            "requests": len(rows),
            "share": len(rows) / len(out),
            "errors": sum(x["status"] != 200 for x in rows),
            "completion_tokens": sum(x["tokens"] for x in rows),
            "tokens_per_s": sum(x["tokens"] for x in rows) / wall,
            "latency_p50_s": lat[len(lat) // 2],
            "latency_p95_s": lat[min(len(lat) - 1, int(len(lat) * 0.95))],
        }
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    o = sub.add_parser("overhead")
    o.add_argument("--model", required=True)
    o.add_argument("--baseline-src")
    o.add_argument("--rounds", type=int, default=3)
    o.add_argument("--tokens", type=int, default=256)
    o.add_argument("--out", default="build/serve_overhead.json")
    s = sub.add_parser("split")
    s.add_argument("--a", required=True)
    s.add_argument("--b", required=True)
    s.add_argument("--clients", type=int, default=8)
    s.add_argument("--seconds", type=float, default=60)
    s.add_argument("--out", default="build/serve_split.json")
    args = parser.parse_args()
    report = overhead(args) if args.command == "overhead" else split(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
