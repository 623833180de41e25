"""`hybridrt serve --ray` on a local Ray cluster: affinity routing against Ray's own router on
concurrent multi-turn conversations, a turn sent past its busy replica with states moved or
prefilled again (`moves`, by history length), two replicas against one of twice the threads, a
replica killed under load, and autoscaling under a load ramp. `--only` runs some of them and
keeps the others' figures from the JSON of an earlier run.

    python benchmarks/bench_ray.py --model build/prefix/onnx-int4 --template build/prefix/chatml.jinja \\
        --rounds 2 --out docs/bench/ray

The model is the granite-h-350m int4 export of benchmarks/bench_prefix_cache.py's `prepare`. Each
server runs in its own process on a local cluster of --cpus CPUs; routers alternate round by
round. TTFT is the client's, from sending a streamed request to its first token; reused tokens
are what the replica reports (usage.prompt_tokens_details.cached_tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_prefix_cache import REPLY, Words, request  # noqa: E402

PORT = 8650


@contextmanager
def cluster(model: Path, template: Path, cpus: int, log: Path, *flags: str) -> Iterator[str]:
    """`hybridrt serve MODEL --ray ...` in its own process (its own local cluster); the URL."""
    cmd = ["hybridrt", "serve", str(model), "--ray", "--ray-cpus", str(cpus), "--port", str(PORT)]
    cmd += ["--model-name", "m", "--chat-template", str(template), "--slots", "8", *flags]
    env = os.environ | {"RAY_USAGE_STATS_ENABLED": "0"}
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{PORT}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            raise RuntimeError(f"the Ray app did not come up: {log}")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        subprocess.run(["ray", "stop", "--force"], capture_output=True)


def _replicas(url: str, n: int) -> set[str]:
    """Replica names seen on `n` distinct one-token requests (at least one per replica, likely)."""
    seen = set()
    for i in range(n):
        body = {"model": "m", "prompt": f"warm up {i} " * 8, "max_tokens": 1}
        seen.add(httpx.post(f"{url}/v1/completions", json=body, timeout=300).headers["x-hybridrt-replica"])
    return seen


# Workloads.


def conversations(url: str, words: list[Words], turns: int = 6) -> dict[str, Any]:
    """len(words) conversations at once, each resending its history with ~150 new tokens a turn."""

    def one(w: Words) -> list[dict[str, Any]]:
        history, out = "", []
        for t in range(turns):
            history += ("\n" if history else "") + f"User: {w.text(150 if t else 128)}\nAssistant:"
            r = request(url, "completions", {"prompt": history, "max_tokens": REPLY, "ignore_eos": True})
            history += r["text"]
            out.append(r)
        return out

    with ThreadPoolExecutor(len(words)) as pool:
        runs = list(pool.map(one, words))
    by_turn = list(zip(*runs))
    return {
        "ttft_p50_ms": [statistics.median(r["ttft_ms"] for r in turn) for turn in by_turn],
        "ttft_p90_ms": [sorted(r["ttft_ms"] for r in turn)[int(0.9 * len(turn))] for turn in by_turn],
        "cached": [sum(r["cached"] or 0 for r in turn) for turn in by_turn],
        "prompt_tokens": [sum(r["prompt_tokens"] or 0 for r in turn) for turn in by_turn],
    }


def moves(url: str, words: Words, lengths: tuple[int, ...] = (64, 256, 1024, 2048), busy: int = 8) -> dict[str, Any]:
    """Per history length: turn 1 on its replica, that replica then held busy (`busy` open
    streams, the affinity bound), turn 2 (the reply and ~32 new tokens) sent elsewhere: its TTFT
    and what moved (x-hybridrt-state-from: tokens, bytes, milliseconds)."""
    out: dict[str, Any] = {"length": [], "ttft_ms": [], "cached": [], "moved": [], "home_kept": []}
    for n in lengths:
        history = f"User: {words.text(n)}\nAssistant:"
        first = httpx.post(
            f"{url}/v1/completions", json={"model": "m", "prompt": history, "max_tokens": REPLY}, timeout=600
        )
        home = first.headers["x-hybridrt-replica"]
        turn2 = history + first.json()["choices"][0]["text"] + f"\nUser: {words.text(32)}\nAssistant:"
        hold = {"model": "m", "max_tokens": 2000, "ignore_eos": True, "stream": True}
        with ExitStack() as streams:
            for i in range(busy):
                body = hold | {"prompt": f"{history} {i}"}
                streams.enter_context(httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600))
            t0 = time.perf_counter()
            body = {
                "model": "m",
                "prompt": turn2,
                "max_tokens": 4,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            ttft, cached, moved, replica = None, None, None, None
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as r:
                replica, moved = r.headers["x-hybridrt-replica"], r.headers.get("x-hybridrt-state-from")
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        chunk = json.loads(line[6:])
                        if chunk.get("choices") and ttft is None:
                            ttft = 1e3 * (time.perf_counter() - t0)
                        cached = ((chunk.get("usage") or {}).get("prompt_tokens_details") or {}).get(
                            "cached_tokens", cached
                        )
        out["length"].append(words.count(turn2))
        out["ttft_ms"].append(ttft)
        out["cached"].append(cached)
        out["moved"].append(moved)
        out["home_kept"].append(replica == home)
    return out


def throughput(url: str, words: Words, streams: int = 16, tokens: int = 64) -> dict[str, Any]:
    prompts = [words.text(128) for _ in range(streams)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        list(
            pool.map(
                lambda p: request(url, "completions", {"prompt": p, "max_tokens": tokens, "ignore_eos": True}), prompts
            )
        )
    wall = time.perf_counter() - t0
    return {"streams": streams, "tokens": streams * tokens, "wall_s": wall, "tok_s": streams * tokens / wall}


def kill_one(url: str, words: Words, streams: int = 16, seconds: float = 20.0) -> dict[str, Any]:
    """Clients keep `streams` streamed requests going for `seconds`; one replica is killed after
    a quarter of it. Every request ends answered (its [DONE]), errored (an error status or event)
    or lost (no end within 120 s)."""
    counts = {"answered": 0, "errored": 0, "lost": 0}
    lock, victim = threading.Lock(), dict[str, Any]()
    stop_at = time.monotonic() + seconds

    def client(i: int) -> None:
        while time.monotonic() < stop_at:
            body = {"model": "m", "prompt": words.text(64), "max_tokens": 48, "ignore_eos": True, "stream": True}
            outcome = "lost"
            try:
                with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
                    with lock:
                        victim.setdefault("pid", r.headers.get("x-hybridrt-replica-pid"))
                    if r.status_code != 200:
                        outcome = "errored"
                    else:
                        for line in r.iter_lines():
                            if line == "data: [DONE]":
                                outcome = "answered"
                            elif line.startswith("data: ") and '"error"' in line:
                                outcome = "errored"
            except httpx.TimeoutException:
                outcome = "lost"
            except httpx.HTTPError:
                outcome = "errored"  # the connection ended unfinished: the client knows
            with lock:
                counts[outcome] += 1

    with ThreadPoolExecutor(streams) as pool:
        futures = [pool.submit(client, i) for i in range(streams)]
        time.sleep(seconds / 4)
        killed_at = time.monotonic()
        os.kill(int(victim["pid"]), signal.SIGKILL)
        for f in futures:
            f.result()
    back = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if len(_replicas(url, 6)) == 2:
            back = time.monotonic() - killed_at
            break
    return counts | {"replaced_after_s": back}


def autoscale(url: str, words: Words, steps: tuple[int, ...] = (1, 4, 8, 8, 4, 1, 0, 0)) -> dict[str, Any]:
    """Client streams step by step (15 s each); the engine's running replicas sampled each second."""
    import ray
    from ray import serve

    ray.init(address="auto", log_to_driver=False)
    trace: list[dict[str, Any]] = []
    t0, load, outcomes = time.monotonic(), {"n": 0}, {"answered": 0, "failed": 0}
    done = threading.Event()

    def client(i: int) -> None:
        while not done.is_set():
            if i >= load["n"]:
                time.sleep(0.2)
                continue
            body = {"prompt": words.text(96), "max_tokens": 32, "ignore_eos": True}
            try:
                request(url, "completions", body)
                outcomes["answered"] += 1
            except httpx.HTTPError:
                outcomes["failed"] += 1

    def replicas() -> int:
        status = serve.status().applications["hybridrt"].deployments["engine"]
        return int({str(getattr(k, "value", k)): v for k, v in status.replica_states.items()}.get("RUNNING", 0))

    with ThreadPoolExecutor(max(steps)) as pool:
        futures = [pool.submit(client, i) for i in range(max(steps))]
        for n in steps:
            load["n"] = n
            for _ in range(15):
                trace.append({"t": round(time.monotonic() - t0, 1), "streams": n, "replicas": replicas()})
                time.sleep(1)
        done.set()
        for f in futures:
            f.result()
    ray.shutdown()
    return {"trace": trace, **outcomes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--template", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--conversations", type=int, default=16)
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("docs/bench/ray"))
    ap.add_argument("--only", nargs="*", default=["routers", "moves", "replicas", "kill", "autoscale"])
    args = ap.parse_args()
    tokenizer = args.model / "tokenizer.json"
    logs = Path(tempfile.gettempdir()) / "hybridrt-bench-ray-logs"
    logs.mkdir(parents=True, exist_ok=True)
    # A run of some workloads (--only) keeps the other workloads' figures of an earlier run.
    earlier = args.out.with_suffix(".json")
    results: dict[str, Any] = json.loads(earlier.read_text()) if earlier.is_file() else {}
    results["setup"] = {"model": str(args.model), "cpus": args.cpus, "host": os.uname().nodename}
    if "routers" in args.only or "rounds" not in results:
        results["rounds"] = []
    two = ["--replicas", "2", "--replica-cpus", "1", "--threads", "1"]
    for r in range(args.rounds if "routers" in args.only else 0):
        order = ["affinity", "default"] if r % 2 == 0 else ["default", "affinity"]
        one_round = {}
        for router in order:
            with cluster(
                args.model, args.template, args.cpus, logs / f"{router}-{r}.log", *two, "--ray-router", router
            ) as url:
                _replicas(url, 8)
                words = [Words(tokenizer) for _ in range(args.conversations)]
                for i, w in enumerate(words):
                    w.at = (997 * i) % (len(w.words) - 8)  # each conversation its own text
                one_round[router] = conversations(url, words)
            print(router, json.dumps(one_round[router]), flush=True)
        results["rounds"].append(one_round)
    if "moves" in args.only:
        results["moves"] = {}
        for r in range(args.rounds):
            for state_moves in ("on", "off") if r % 2 == 0 else ("off", "on"):
                log = logs / f"moves-{state_moves}-{r}.log"
                with cluster(args.model, args.template, args.cpus, log, *two, "--ray-state-moves", state_moves) as url:
                    _replicas(url, 8)
                    w = Words(tokenizer)
                    w.at = 4001 * (r + 1)
                    got = moves(url, w)
                results["moves"].setdefault(state_moves, []).append(got)
                print("moves", state_moves, json.dumps(got), flush=True)
    if "replicas" in args.only:
        shapes = {
            "2 replicas x 1 thread": two,
            "1 replica x 2 threads": ["--replicas", "1", "--replica-cpus", "2", "--threads", "2"],
        }
        results["throughput"] = {}
        for r in range(args.rounds):
            for name, flags in shapes.items() if r % 2 == 0 else reversed(shapes.items()):
                with cluster(args.model, args.template, args.cpus, logs / f"tput-{r}.log", *flags) as url:
                    _replicas(url, 4)
                    got = throughput(url, Words(tokenizer))
                results["throughput"].setdefault(name, []).append(got)
                print(name, json.dumps(got), flush=True)
    if "kill" in args.only:
        with cluster(args.model, args.template, args.cpus, logs / "kill.log", *two) as url:
            _replicas(url, 8)
            results["kill"] = kill_one(url, Words(tokenizer))
        print("kill", json.dumps(results["kill"]), flush=True)
    if "autoscale" in args.only:
        scale = [
            "--replicas",
            "1",
            "--max-replicas",
            "2",
            "--target-ongoing",
            "2",
            "--replica-cpus",
            "1",
            "--threads",
            "1",
        ]
        with cluster(args.model, args.template, args.cpus, logs / "autoscale.log", *scale) as url:
            results["autoscale"] = autoscale(url, Words(tokenizer))
        print("autoscale", json.dumps(results["autoscale"]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    report(results, args.out)


def _fmt(values: list[Any]) -> str:
    return ", ".join("-" if v is None else f"{v:.0f}" if isinstance(v, float) else str(v) for v in values)


def _moved(header: str | None) -> str:
    if not header:
        return "-"
    fields = dict(f.split("=") for f in header.split("; ")[1:])
    return f"{fields['tokens']} / {int(fields['bytes']) / 2**20:.1f} MiB / {fields['ms']}"


def report(results: dict[str, Any], out: Path) -> None:
    setup = results.get("setup", {})
    lines = ["# hybridrt serve --ray (benchmarks/bench_ray.py)", ""]
    lines += [
        f"Model {Path(setup.get('model', '?')).name} (the granite-h-350m shape, int4), a local Ray cluster of "
        f"{setup.get('cpus', '?')} CPUs, each shape in its own server process, routers alternating by round; "
        "16 concurrent completions conversations, each turn resending its history with ~150 new tokens and "
        "taking 24 reply tokens.",
        "",
    ]
    for i, rnd in enumerate(results["rounds"], 1):
        lines += [f"## Round {i}: 16 conversations of 6 turns at once, 2 replicas x 1 thread", ""]
        lines += [
            "| router | TTFT p50 by turn, ms | TTFT p90 by turn, ms | reused tokens by turn | prompt tokens by turn |"
        ]
        lines += ["|---|---|---|---|---|"]
        for router, rec in rnd.items():
            lines.append(
                f"| {router} | {_fmt(rec['ttft_p50_ms'])} | {_fmt(rec['ttft_p90_ms'])} | "
                f"{_fmt(rec['cached'])} | {_fmt(rec['prompt_tokens'])} |"
            )
        lines.append("")
    if "moves" in results:
        lines += ["## A turn sent past its busy replica: its states moved, or prefilled again", ""]
        lines += [
            "Turn 1 (a history of about 64 to 2,048 tokens) on its replica; that replica then held by 8 open streams "
            "(the affinity bound), so turn 2 (the reply and ~32 new tokens) goes to the other replica, 2 replicas x 1 "
            "thread. Moved: tokens of the state / its bytes / the move's milliseconds (x-hybridrt-state-from).",
            "",
        ]
        lines += [
            "| state moves | round | turn-2 prompt tokens | TTFT, ms | reused tokens | moved (tokens, bytes, ms) |"
        ]
        lines += ["|---|---|---|---|---|---|"]
        for mode, runs in results["moves"].items():
            for i, rec in enumerate(runs, 1):
                moved = "; ".join(_moved(m) for m in rec["moved"])
                figures = f"{_fmt(rec['length'])} | {_fmt(rec['ttft_ms'])} | {_fmt(rec['cached'])}"
                lines.append(f"| {mode} | {i} | {figures} | {moved} |")
        lines.append("")
    if "throughput" in results:
        lines += ["## 16 streams (128-token prompts, 64 tokens each): aggregate decode", ""]
        lines += ["| shape | tok/s by round |", "|---|---|"]
        for name, runs in results["throughput"].items():
            rates = ", ".join(f"{r['tok_s']:.1f}" for r in runs)
            lines.append(f"| {name} | {rates} |")
        lines.append("")
    if "kill" in results:
        k = results["kill"]
        lines += [
            "## One of 2 replicas killed (SIGKILL) under 16 streams",
            "",
            f"answered {k['answered']}, errored {k['errored']}, lost {k['lost']}; "
            f"2 replicas answering again {k['replaced_after_s']:.0f} s after the kill"
            if k["replaced_after_s"] is not None
            else f"answered {k['answered']}, errored {k['errored']}, lost {k['lost']}; not replaced within 120 s",
            "",
        ]
    if "autoscale" in results:
        lines += [
            "## Autoscaling (1 to 2 replicas, target 2 requests in hand each)",
            "",
            "| t, s | streams | replicas |",
        ]
        lines += ["|---|---|---|"]
        scaled = results["autoscale"]
        lines += [f"| {p['t']} | {p['streams']} | {p['replicas']} |" for p in scaled["trace"][::3]]
        lines += ["", f"requests answered {scaled['answered']}, failed {scaled['failed']}", ""]
    out.with_suffix(".md").write_text("\n".join(lines))
    _plot(results, out.with_suffix(".png"))


def _plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for i, rnd in enumerate(results["rounds"], 1):
        for router, rec in rnd.items():
            style = "-" if router == "affinity" else "--"
            axes[0].plot(range(1, 7), rec["ttft_p50_ms"], style, marker="o", label=f"{router}, round {i}")
            axes[1].plot(range(1, 7), rec["cached"], style, marker="o", label=f"{router}, round {i}")
    axes[0].set(xlabel="turn", ylabel="TTFT p50, ms", title="16 conversations, 2 replicas")
    axes[1].set(xlabel="turn", ylabel="reused tokens (all 16)", title="tokens resumed from a cached state")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
