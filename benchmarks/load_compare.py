"""Serving under load, side by side: `hybridrt serve` and llama.cpp's `llama-server`, driven by guidellm.

    python benchmarks/load_compare.py \\
        --hybridrt /work/bench/g350-int4-serve \\
        --gguf /work/peers/convert/granite-h-350m/q4_0.gguf \\
        --llama-server /work/peers/llama.cpp-build/bin/llama-server \\
        --guidellm /work/venvs/load/bin/guidellm --tokenizer /work/peers/tokenizer \\
        --levels 1,16,64 --seconds 60,90,120 --out build/load-compare

Both servers run as subprocesses on 127.0.0.1 for the whole comparison, each with --threads (2) CPU
threads and --slots (64) sequences decoded together (hybridrt `--slots`, llama.cpp `--parallel` with
continuous batching and a context of --ctx-per-slot tokens per slot). For each concurrency level,
the servers take turns (the order flips from one level to the next, so that drift in the machine's
other load falls on both): guidellm's `concurrent` profile keeps that many streams busy with
/v1/completions requests of a --prompt-tokens synthetic prompt (counted by the shared tokenizer)
and exactly --output-tokens streamed tokens, for that level's bounded time.

Exactly N output tokens are asked of both servers with guidellm's default body (`ignore_eos: true`,
`stream_options.continuous_usage_stats`, vLLM's fields, which both servers take). Before the levels,
that body is sent once to each server and the answers are recorded under "default_body_probe".

Token counts of finished requests come from each server's `usage` (guidellm reads it when the
stream carries it; a request cut off by the window's end counts its streamed chunks), so a
difference in tokenization would not skew the throughput. Reported per server and level, from guidellm's
per-request records: successful requests/s, output tokens/s (every token streamed in the window,
finished requests or not), TTFT p50/p95 and inter-token latency p50/p95 (guidellm's per-request
inter-token mean) over every request that got its first token in the window, finished or cut off
by the window's end (at 64 streams few finish in a short window), errored and unfinished requests,
prompt and output tokens per finished request (from usage), the server's CPU
seconds in the window and its RSS. Writes OUT/summary.json, each guidellm report as
OUT/<server>-c<level>.json, the server logs, and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from load_test import rss_mb

SERVERS = ("hybridrt", "llama.cpp")
REQUIRED = ("hybridrt", "gguf", "llama_server", "guidellm", "tokenizer")
MODEL_NAME = "bench"
HZ = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_cmd(name: str, args: argparse.Namespace, port: int) -> list[str]:
    if name == "hybridrt":
        cmd = [sys.executable, "-m", "hybridrt.cli", "serve", str(args.hybridrt), "--host", "127.0.0.1"]
        cmd += ["--port", str(port), "--slots", str(args.slots), "--threads", str(args.threads)]
        return cmd + ["--model-name", MODEL_NAME, "--log-level", "warning"]
    cmd = [str(args.llama_server), "-m", str(args.gguf), "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["-t", str(args.threads), "-tb", str(args.threads), "--parallel", str(args.slots), "--cont-batching"]
    return cmd + ["-c", str(args.slots * args.ctx_per_slot), "--alias", MODEL_NAME]


def start(name: str, args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    """Start one server and wait until /health says ok (hybridrt answers 200 while loading)."""
    port = free_port()
    log = (args.out / f"{name}-server.log").open("w")
    proc = subprocess.Popen(server_cmd(name, args, port), stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            r = httpx.get(url + "/health", timeout=5)
            if r.status_code == 200 and r.json().get("status") == "ok":
                return proc, url
        except (httpx.HTTPError, ValueError):
            pass
        if proc.poll() is not None:
            raise SystemExit(f"{name} exited with {proc.returncode}; see {log.name}")
        time.sleep(0.5)
    proc.terminate()
    raise SystemExit(f"{name} was not healthy in 600 s")


def default_body(output_tokens: int) -> dict[str, Any]:
    """The body guidellm 0.8 sends to /v1/completions for a fixed output length (stop: None is dropped)."""
    return {
        "model": MODEL_NAME,
        "prompt": "def main():",
        "max_tokens": output_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }


def probe(url: str, output_tokens: int) -> dict[str, Any]:
    """Send guidellm's default body once; the status, the first bytes, and the usage if it streamed."""
    out: dict[str, Any] = {"request": default_body(output_tokens)}
    with httpx.stream("POST", url + "/v1/completions", json=out["request"], timeout=300) as r:
        text = r.read().decode(errors="replace")
    out["status"] = r.status_code
    out["response_head"] = text[:300]
    for line in text.splitlines():
        if line.startswith("data: {") and '"usage"' in line:
            usage = json.loads(line[6:]).get("usage")
            if usage:
                out["usage"] = usage
    return out


def warm(url: str, name: str, output_tokens: int) -> None:
    body = default_body(output_tokens) | {"stream": False}
    body.pop("stream_options")
    r = httpx.post(url + "/v1/completions", json=body, timeout=600)
    r.raise_for_status()


def scenario(name: str, url: str, streams: int, seconds: float, args: argparse.Namespace, report: Path) -> dict:
    backend: dict[str, Any] = {"kind": "openai_http", "target": url, "request_format": "/v1/completions"}
    data = {"kind": "synthetic_text", "prompt_tokens": args.prompt_tokens, "output_tokens": args.output_tokens}
    return {
        "metadata": {"name": f"{name}-c{streams}"},
        "spec": {
            "backend": backend,
            "profile": {"kind": "concurrent", "streams": streams},
            "tokenizer": {"kind": "huggingface_auto", "model": str(args.tokenizer)},
            "data": [data],
            "constraints": [{"kind": "max_duration", "seconds": seconds}],
            "outputs": [{"kind": "json", "path": str(report)}],
        },
    }


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ


def run_level(name: str, servers: dict, streams: int, seconds: float, args) -> dict[str, Any]:
    proc, url = servers[name]
    others = {n: p for n, (p, _) in servers.items() if n != name}
    idle0 = {n: cpu_seconds(p.pid) for n, p in others.items()}
    report = args.out / f"{name}-c{streams}.json"
    conf = args.out / f"{name}-c{streams}.scenario.json"
    conf.write_text(json.dumps(scenario(name, url, streams, seconds, args, report), indent=2))
    cmd = [str(args.guidellm), "run", "-c", str(conf), "--disable-console-interactive"]
    load0, cpu0 = os.getloadavg()[0], cpu_seconds(proc.pid)
    with (args.out / f"{name}-c{streams}.guidellm.log").open("w") as log:
        done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    row: dict[str, Any] = {"server": name, "streams": streams, "seconds": seconds}
    row["server_cpu_s"] = round(cpu_seconds(proc.pid) - cpu0, 1)
    row["idle_servers_cpu_s"] = {n: round(cpu_seconds(p.pid) - idle0[n], 1) for n, p in others.items()}
    row["server_rss_mb"] = round(rss_mb(proc.pid))
    row["loadavg_1m_before_after"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
    if done.returncode != 0 or not report.exists():
        row["error"] = f"guidellm exited with {done.returncode}; see {name}-c{streams}.guidellm.log"
        return row
    return row | summarize(json.loads(report.read_text())["benchmarks"][0])


def _pcts(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None}
    return {"p50": round(float(np.percentile(values, 50)), 1), "p95": round(float(np.percentile(values, 95)), 1)}


def summarize(bench: dict[str, Any]) -> dict[str, Any]:
    """The table's figures from guidellm's per-request records."""
    reqs = bench["requests"]
    ok, errored, unfinished = reqs.get("successful", []), reqs.get("errored", []), reqs.get("incomplete", [])
    duration = float(bench["duration"])
    streamed = sum(r.get("output_tokens") or 0 for r in ok + unfinished)

    def values(key: str, among: list[dict[str, Any]]) -> list[float]:
        return [float(r[key]) for r in among if r.get(key) is not None]

    metrics = bench["metrics"]
    return {
        "duration_s": round(duration, 1),
        "requests": len(ok),
        "errored": len(errored),
        "incomplete": len(unfinished),
        "with_first_token": sum(1 for r in ok + unfinished if r.get("time_to_first_token_ms") is not None),
        "error_samples": [str(r.get("info", {}).get("error") or r.get("error"))[:300] for r in errored[:3]],
        "requests_per_s": round(len(ok) / duration, 3),
        "output_tokens_per_s": round(streamed / duration, 1),
        "guidellm_output_tokens_per_s_mean": round(metrics["output_tokens_per_second"]["total"]["mean"], 1),
        "ttft_ms": _pcts(values("time_to_first_token_ms", ok + unfinished)),
        "itl_ms": _pcts(values("inter_token_latency_ms", ok + unfinished)),
        "prompt_tokens_median": float(np.median(values("prompt_tokens", ok))) if ok else None,
        "output_tokens_median": float(np.median(values("output_tokens", ok))) if ok else None,
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| server | streams | s | req/s | output tok/s | TTFT p50 / p95 ms | ITL p50 / p95 ms | "
        "requests with a first token | errors | unfinished | prompt / output tokens | server CPU s | RSS MB |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['server']} | {r['streams']} | {r['seconds']} | failed: {r['error']} |||||||||")
            continue
        ttft, itl = r["ttft_ms"], r["itl_ms"]
        tokens = f"{_num(r['prompt_tokens_median'])} / {_num(r['output_tokens_median'])}"
        lines.append(
            f"| {r['server']} | {r['streams']} | {r['duration_s']:.0f} | {r['requests_per_s']:.2f} "
            f"| {r['output_tokens_per_s']:.1f} | {_num(ttft['p50'])} / {_num(ttft['p95'])} "
            f"| {_num(itl['p50'])} / {_num(itl['p95'])} | {r['with_first_token']} of {r['requests'] + r['incomplete']} "
            f"| {r['errored']} | {r['incomplete']} | {tokens} | {r['server_cpu_s']} | {r['server_rss_mb']} |"
        )
    return "\n".join(lines)


def _num(x: float | None) -> str:
    return "–" if x is None else f"{x:.0f}"


def resummarize(out: Path) -> None:
    """Recompute the figures of an earlier run from its guidellm reports, and print its table."""
    summary = json.loads((out / "summary.json").read_text())
    for row in summary["rows"]:
        report = out / f"{row['server']}-c{row['streams']}.json"
        if "error" not in row and report.exists():
            row |= summarize(json.loads(report.read_text())["benchmarks"][0])
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(table(summary["rows"]))


def versions(args: argparse.Namespace) -> dict[str, str]:
    out: dict[str, str] = {}
    if args.llama_server.exists():
        done = subprocess.run([str(args.llama_server), "--version"], capture_output=True, text=True)
        out["llama-server"] = " ".join((done.stdout + done.stderr).split())[:200]
    done = subprocess.run([str(args.guidellm), "--version"], capture_output=True, text=True)
    out["guidellm"] = done.stdout.strip()
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    out["hybridrt_commit"] = done.stdout.strip()
    import onnxruntime

    out["onnxruntime"] = onnxruntime.__version__
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hybridrt", type=Path, help="int4 export directory (with tokenizer.json)")
    ap.add_argument("--gguf", type=Path, help="q4_0 GGUF of the same checkpoint")
    ap.add_argument("--llama-server", type=Path)
    ap.add_argument("--guidellm", type=Path, help="guidellm in its own virtual environment")
    ap.add_argument("--tokenizer", type=Path, help="the tokenizer both models were built with")
    ap.add_argument("--levels", default="1,16,64", help="concurrent streams, comma-separated")
    ap.add_argument("--seconds", default="60,90,120", help="per level (one value, or one per level)")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx-per-slot", type=int, default=320, help="llama-server context per slot (tokens)")
    ap.add_argument("--servers", default=",".join(SERVERS), help="which to run: hybridrt,llama.cpp")
    ap.add_argument("--out", type=Path, default=Path("build/load-compare"))
    ap.add_argument("--resummarize", action="store_true", help="only recompute and print OUT's table")
    args = ap.parse_args()
    if args.resummarize:
        resummarize(args.out)
        return
    missing = [f"--{k.replace('_', '-')}" for k in REQUIRED if getattr(args, k) is None]
    if missing:
        ap.error("the following arguments are required: " + ", ".join(missing))
    levels = [int(x) for x in args.levels.split(",")]
    seconds = [float(x) for x in args.seconds.split(",")]
    seconds = seconds * len(levels) if len(seconds) == 1 else seconds
    if len(seconds) != len(levels):
        raise SystemExit("--seconds needs one value or one per level")
    names = [n for n in args.servers.split(",") if n]
    args.out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"versions": versions(args), "args": {k: str(v) for k, v in vars(args).items()}}
    servers: dict[str, tuple[subprocess.Popen, str]] = {}
    rows: list[dict[str, Any]] = []
    try:
        for name in names:
            servers[name] = start(name, args)
            summary.setdefault("commands", {})[name] = server_cmd(name, args, 0)
        summary["default_body_probe"] = {n: probe(url, args.output_tokens) for n, (_, url) in servers.items()}
        for name, (_, url) in servers.items():
            warm(url, name, args.output_tokens)
        summary["rss_start_mb"] = {n: round(rss_mb(p.pid)) for n, (p, _) in servers.items()}
        for i, (streams, secs) in enumerate(zip(levels, seconds)):
            for name in names if i % 2 == 0 else names[::-1]:
                row = run_level(name, servers, streams, secs, args)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
        for proc, _ in servers.values():
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    rows.sort(key=lambda r: (r["streams"], names.index(r["server"])))
    summary["rows"] = rows
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
