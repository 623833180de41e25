"""Load test of `hybridrt serve` on 127.0.0.1: concurrent streaming clients for a bounded time.

Starts the server as a subprocess (so its RSS is its own), then for each concurrency level
runs that many streaming clients for --seconds, each sending completions back to back.
Reports requests/s, generated tokens/s, TTFT and inter-token p50/p95/p99, errors and the
server's RSS at start and end; the 1-client level is the same work one request at a time,
the baseline of the batching speed-up. Writes a JSON report and a PNG of the latency
percentiles against concurrency.

    python benchmarks/load_test.py default --clients 64 --seconds 120
    python benchmarks/load_test.py out/model --levels 1,4,16 --seconds 30 --out build/load
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

PROMPTS = ["import os\n", "def main():\n", "class Config:\n    def __init__(self", "for line in open(", "# Parse"]


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def client(http: httpx.AsyncClient, i: int, stop_at: float, args: argparse.Namespace, out: dict) -> None:
    n = 0
    while time.monotonic() < stop_at:
        prompt: str | list[int] = PROMPTS[(i + n) % len(PROMPTS)]
        if args.prompt_tokens:  # token ids, different for every request (no prefix-cache hits)
            prompt = [(97 * i + 13 * n + 7 * j) % 8000 + 100 for j in range(args.prompt_tokens)]
        body = {
            "model": "default",
            "prompt": prompt,
            "max_tokens": args.max_tokens,
            "min_tokens": args.max_tokens,
            "temperature": 0,
            "stream": True,
        }
        n += 1
        t0 = last = time.perf_counter()
        tokens = 0
        try:
            async with http.stream("POST", "/v1/completions", json=body) as r:
                if r.status_code != 200:
                    out["errors"].append(f"{r.status_code}: {(await r.aread())[:200]!r}")
                    continue
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    if "error" in json.loads(line[6:]):
                        out["errors"].append(line[:200])
                        break
                    now = time.perf_counter()
                    (out["itl"] if tokens else out["ttft"]).append(now - (last if tokens else t0))
                    last, tokens = now, tokens + 1
        except httpx.HTTPError as e:
            out["errors"].append(f"{type(e).__name__}: {e}")
            continue
        out["requests"] += 1
        out["chunks"] += tokens


async def sample_rss(pid: int, stop_at: float, out: list[float]) -> None:
    while time.monotonic() < stop_at:
        out.append(rss_mb(pid))
        await asyncio.sleep(min(5.0, max(0.0, stop_at - time.monotonic())))
    out.append(rss_mb(pid))


async def level(url: str, pid: int, clients: int, args: argparse.Namespace) -> dict:
    out: dict = {"ttft": [], "itl": [], "errors": [], "requests": 0, "chunks": 0}
    limits = httpx.Limits(max_connections=clients + 4)
    rss: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        t0 = time.monotonic()
        stop_at = t0 + args.seconds
        users = [client(http, i, stop_at, args, out) for i in range(clients)]
        await asyncio.gather(sample_rss(pid, stop_at, rss), *users)
        elapsed = time.monotonic() - t0
        metrics = (await http.get("/metrics")).text
    generated = _metric(metrics, "hybridrt_generated_tokens_total")
    return {
        "clients": clients,
        "seconds": elapsed,
        "requests": out["requests"],
        "errors": len(out["errors"]),
        "error_samples": out["errors"][:5],
        "requests_per_s": out["requests"] / elapsed,
        "stream_chunks": out["chunks"],
        "generated_tokens_total": generated,
        "ttft_ms": _pcts(out["ttft"]),
        "inter_token_ms": _pcts(out["itl"]),
        "rss_mb_samples": rss,
    }


def _pcts(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {}
    return {f"p{p}": float(np.percentile(xs, p) * 1e3) for p in (50, 95, 99)}


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return float("nan")


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        "hybridrt.cli",
        "serve",
        args.model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--slots",
        str(args.slots),
        "--model-name",
        "default",
        "--log-level",
        "warning",
    ] + (["--threads", str(args.threads)] if args.threads else [])
    cmd += ["--provider", args.provider] if args.provider else []
    proc = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health").status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}")
        time.sleep(0.2)
    proc.terminate()
    raise SystemExit("the server did not become healthy in 600 s")


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    xs = [r["clients"] for r in results]
    for ax, key, title in ((axes[0], "ttft_ms", "time to first token"), (axes[1], "inter_token_ms", "inter-token")):
        for p in ("p50", "p95", "p99"):
            ax.plot(xs, [r[key].get(p, np.nan) for r in results], marker="o", label=p)
        ax.set(xscale="log", yscale="log", xlabel="concurrent clients", ylabel="ms", title=title)
        ax.legend()
    axes[2].plot(xs, [r["tokens_per_s"] for r in results], marker="o")
    axes[2].set(xscale="log", xlabel="concurrent clients", ylabel="generated tokens/s", title="throughput")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", default="default")
    p.add_argument("--clients", type=int, default=64, help="the highest concurrency level")
    p.add_argument("--levels", help="comma-separated concurrency levels (default: 1, 4, 16, CLIENTS)")
    p.add_argument("--seconds", type=float, default=120.0, help="per level")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, help="prompts of this many token ids instead of short texts")
    p.add_argument("--slots", type=int, default=64)
    p.add_argument("--threads", type=int)
    p.add_argument("--provider", help="the server's --provider (default: its own, auto)")
    p.add_argument("--out", type=Path, default=Path("build/load-test"))
    args = p.parse_args()
    levels = [int(x) for x in args.levels.split(",")] if args.levels else sorted({1, 4, 16, args.clients})
    args.out.mkdir(parents=True, exist_ok=True)
    proc, url = start_server(args)
    try:
        rss_start = rss_mb(proc.pid)
        results = []
        before = 0.0
        for clients in levels:
            r = asyncio.run(level(url, proc.pid, clients, args))
            r["tokens_per_s"] = (r["generated_tokens_total"] - before) / r["seconds"]
            before = r["generated_tokens_total"]
            r["rss_mb"] = rss_mb(proc.pid)
            results.append(r)
            print(
                f"{clients:3d} clients: {r['requests_per_s']:.2f} req/s, {r['tokens_per_s']:.0f} tokens/s, "
                f"TTFT p50/p95/p99 {_fmt(r['ttft_ms'])} ms, inter-token {_fmt(r['inter_token_ms'])} ms, "
                f"errors {r['errors']}, RSS {r['rss_mb_samples'][0]:.0f} -> {r['rss_mb']:.0f} MB "
                f"(peak {max(r['rss_mb_samples']):.0f})",
                flush=True,
            )
        base = results[0]["tokens_per_s"] if levels[0] == 1 else float("nan")
        report = {
            "model": args.model,
            "slots": args.slots,
            "max_tokens": args.max_tokens,
            "prompt_tokens": args.prompt_tokens,
            "seconds": args.seconds,
            "rss_start_mb": rss_start,
            "rss_end_mb": rss_mb(proc.pid),
            "levels": results,
            "speedup_vs_1_client": {r["clients"]: r["tokens_per_s"] / base for r in results},
        }
    finally:
        proc.terminate()
        proc.wait(60)
    (args.out / "report.json").write_text(json.dumps(report, indent=2))
    plot(results, args.out / "latency.png")
    print(
        f"RSS {report['rss_start_mb']:.0f} MB -> {report['rss_end_mb']:.0f} MB; speed-up vs 1 client: "
        + ", ".join(f"{k}: {v:.2f}x" for k, v in report["speedup_vs_1_client"].items())
    )
    print(f"wrote {args.out / 'report.json'} and {args.out / 'latency.png'}")


def _fmt(p: dict[str, float]) -> str:
    return "/".join(f"{p.get(k, float('nan')):.1f}" for k in ("p50", "p95", "p99"))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
