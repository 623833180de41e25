"""Serving turn by turn with the prefix state cache, beside llama.cpp's llama-server on the same
checkpoint: conversations, an agent loop, a shared system prompt, concurrent repeats, and more
conversations than fit in memory (hybridrt's disk tier).

    # once: the granite-h-350m checkpoint with a sentencepiece tokenizer, hybridrt int4, GGUF q4_0
    python benchmarks/bench_prefix_cache.py prepare --work build/prefix --llama-bin LLAMA_CPP/build/bin \\
        --sdist llama_cpp_python-0.3.36.tar.gz
    # rounds of every workload on both servers; figures to docs/bench/prefix_cache.*
    python benchmarks/bench_prefix_cache.py run --work build/prefix --llama-bin LLAMA_CPP/build/bin --rounds 2

Both servers get 2 threads, 8 slots and a ChatML template (hybridrt through --chat-template).
Each round starts both (fresh, each in its own process). The workloads taken turn by turn (the
two conversations, the agent, the shared system prompt) go to both servers in step (`--pace
turns`, the default): each turn's request to one server, then to the other, who goes first
alternating by turn, each request after a pause of `--pause` seconds (0.5) in which neither
server works. The host's speed drifts from minute to minute by about as much as the servers
differ (a server's prompt rate moved 10-20% between two workloads a minute apart), so a turn's two
figures are taken about a second apart; the pause keeps one server's work after an answer (a
cache's stores) out of the other's turn, and is a client's time between turns. `--pace
workloads` runs each workload whole on one server, then on the other (who goes first
alternating by workload and by round), each request sent as soon as the one before has ended.
The single requests (one stream, concurrent repeats) always alternate by workload.
TTFT is measured by the client from sending a streamed request (on a new connection, from a
client made once) to its first token; cached tokens
are what each server reports (hybridrt: usage.prompt_tokens_details.cached_tokens; llama-server:
timings.cache_n). See ../shared/bench/README.md for building llama-server.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
CONFIG = HERE.parent.parent / "shared" / "bench" / "configs" / "granite-h-350m.json"
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
THREADS, SLOTS = 2, 8
# One client for every request, each on a connection of its own (llama-server closes a streamed
# one): a client made per request (its TLS context loaded) added ~21 ms to every TTFT measured.
CLIENT = httpx.Client(timeout=600, limits=httpx.Limits(max_keepalive_connections=0))


# Preparation.


def prepare(work: Path, llama_bin: Path, sdist: Path, config: Path) -> None:
    sys.path.insert(0, str(HERE))
    import prepare_peers as peers

    hf = work / "hf"
    if not (hf / "config.json").exists():
        subprocess.run([sys.executable, str(HERE / "make_bench_checkpoint.py"), str(config), "-o", str(hf)], check=True)
    tokenizer = peers.train_tokenizer(work / "tokenizer")
    peer = work / "peer-hf"
    if not (peer / "config.json").exists():
        peers.copy_checkpoint(hf, peer, tokenizer, "granite-h-350m")
        cfg = peers.granite_config_fixes(json.loads((peer / "config.json").read_text()))
        (peer / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    onnx = work / "onnx-int4"
    if not (onnx / "hybridrt.json").exists():
        cmd = ["hybridrt", "export", str(peer), "-o", str(onnx), "--quantize", "int4", "--no-validate"]
        subprocess.run(cmd, check=True)
    (work / "chatml.jinja").write_text(CHATML)
    gguf = work / "gguf"
    gguf.mkdir(exist_ok=True)
    if not (gguf / "f32.gguf").exists():
        llama = peers.extract_converter(sdist, work / "src")
        tmp = gguf / "f32.gguf.part"
        cmd = [
            sys.executable,
            "-c",
            peers.CONVERT,
            str(llama),
            "True",
            str(peer),
            "--outtype",
            "f32",
            "--outfile",
            str(tmp),
        ]
        subprocess.run(cmd, check=True)
        tmp.rename(gguf / "f32.gguf")
    if not (gguf / "q4_0.gguf").exists():
        cmd = [str(llama_bin / "llama-quantize"), str(gguf / "f32.gguf"), str(gguf / "q4_0.gguf"), "Q4_0", "2"]
        subprocess.run(cmd, check=True)


# Servers.


class Server:
    def __init__(self, name: str, cmd: list[str], port: int, log: Path) -> None:
        self.name, self.url = name, f"http://127.0.0.1:{port}"
        self.log = log.open("w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited: see {log}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{name} did not start in 600 s")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def start(name: str, work: Path, llama_bin: Path, port: int, extra: list[str] = ()) -> Server:  # type: ignore[assignment]
    if name == "hybridrt":
        cmd = ["hybridrt", "serve", str(work / "onnx-int4"), "--port", str(port), "--threads", str(THREADS)]
        cmd += ["--slots", str(SLOTS), "--model-name", "m", "--chat-template", str(work / "chatml.jinja"), *extra]
    else:
        cmd = [str(llama_bin / "llama-server"), "-m", str(work / "gguf" / "q4_0.gguf"), "--host", "127.0.0.1"]
        cmd += ["--port", str(port), "-t", str(THREADS), "-tb", str(THREADS), "-np", str(SLOTS), "-c", "98304"]
        cmd += ["--no-webui", "--chat-template", "chatml", "-a", "m", *extra]
    return Server(name, cmd, port, work / f"{name}-{port}.log")


# One streamed request: time to first token, the text, cached tokens.


def request(url: str, route: str, body: dict[str, Any]) -> dict[str, Any]:
    body = {"model": "m", "temperature": 0, "stream": True, "stream_options": {"include_usage": True}} | body
    t0 = time.perf_counter()
    ttft, text, cached, prompt_tokens, last = None, [], None, None, t0
    with CLIENT.stream("POST", f"{url}/v1/{route}", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                piece = choice.get("text") if "text" in choice else delta.get("content")
                if piece is not None and "role" not in delta:  # a chat stream's first chunk names the role only
                    ttft = ttft if ttft is not None else time.perf_counter() - t0
                    text.append(piece)
                    last = time.perf_counter()
            usage = chunk.get("usage") or {}
            if usage.get("prompt_tokens_details"):
                cached = usage["prompt_tokens_details"].get("cached_tokens", cached)
            prompt_tokens = usage.get("prompt_tokens", prompt_tokens)
            if "timings" in chunk:
                cached = chunk["timings"].get("cache_n", cached)
    n = body.get("max_tokens", 0)
    rate = (n - 1) / (last - t0 - ttft) if ttft is not None and n > 1 and last - t0 > ttft else None
    return {
        "ttft_ms": None if ttft is None else 1e3 * ttft,
        "text": "".join(text),
        "cached": cached,
        "prompt_tokens": prompt_tokens,
        "decode_tok_s": rate,
    }


# Text of a given size, the same every run.


class Words:
    def __init__(self, tokenizer: Path) -> None:
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(str(tokenizer))
        source = (Path(os.__file__).parent / "argparse.py").read_text() + (
            Path(os.__file__).parent / "typing.py"
        ).read_text()
        self.words = source.split()
        self.at = 0

    def text(self, tokens: int) -> str:
        """About `tokens` tokens of text."""
        out: list[str] = []
        while len(self.tok.encode(" ".join(out)).ids) < tokens:
            out.extend(self.words[self.at : self.at + 8])
            self.at = (self.at + 8) % (len(self.words) - 8)
        return " ".join(out)

    def count(self, text: str) -> int:
        return len(self.tok.encode(text).ids)


# Workloads: each returns a record of figures. Those taken turn by turn are generators of their
# requests (route, body), sent each request's answer, returning the record.

Turns = Generator[tuple[str, dict[str, Any]], dict[str, Any], dict[str, Any]]

REPLY = 24


def one_stream(url: str, words: Words) -> dict[str, Any]:
    r = request(url, "completions", {"prompt": words.text(128), "max_tokens": 64, "ignore_eos": True})
    return {"decode_tok_s": r["decode_tok_s"], "ttft_ms": r["ttft_ms"]}


def conversation_turns(words: Words, chat: bool, turns: int = 6) -> Turns:
    history, messages, out = "", [], []
    for t in range(turns):
        user = words.text(150 if t else 128)
        if chat:
            messages.append({"role": "user", "content": user})
            r = yield "chat/completions", {"messages": list(messages), "max_tokens": REPLY, "ignore_eos": True}
            messages.append({"role": "assistant", "content": r["text"]})
        else:
            history += ("\n" if history else "") + f"User: {user}\nAssistant:"
            r = yield "completions", {"prompt": history, "max_tokens": REPLY, "ignore_eos": True}
            history += r["text"]
        out.append(r)
    return {
        "ttft_ms": [r["ttft_ms"] for r in out],
        "cached": [r["cached"] for r in out],
        "prompt_tokens": [r["prompt_tokens"] for r in out],
    }


def agent_turns(words: Words, steps: int = 10) -> Turns:
    history = f"System: You are an agent with tools.\nTask: {words.text(100)}\nAssistant:"
    out = []
    for _ in range(steps):
        r = yield "completions", {"prompt": history, "max_tokens": REPLY, "ignore_eos": True}
        history += r["text"] + f"\nTool result: {words.text(200)}\nAssistant:"
        out.append(r)
    return {"ttft_ms": [r["ttft_ms"] for r in out], "cached": [r["cached"] for r in out]}


def system_prompt_turns(words: Words, system_tokens: int = 8000, requests: int = 16) -> Turns:
    system = f"System: {words.text(system_tokens)}\n"
    out = []
    for _ in range(requests):
        body = {"prompt": system + f"User: {words.text(30)}\nAssistant:", "max_tokens": 8, "ignore_eos": True}
        out.append((yield "completions", body))
    first = out[0]["ttft_ms"]
    return {
        "ttft_ms": [r["ttft_ms"] for r in out],
        "cached": [r["cached"] for r in out],
        "worst_later_share": max(r["ttft_ms"] for r in out[1:]) / first,
    }


def alone(url: str, turns: Turns) -> dict[str, Any]:
    """A workload's requests on one server, each sent as soon as the one before has ended."""
    try:
        asked = next(turns)
        while True:
            asked = turns.send(request(url, *asked))
    except StopIteration as done:
        return done.value


def in_step(urls: dict[str, str], make: Callable[[Words], Turns], words: Words, first: int, pause: float) -> dict:
    """A workload on every server turn by turn: each turn's request goes to one server, then to the
    other, who goes first alternating by turn (from `first`), each after `pause` seconds in which
    neither works (so the other's work after its answer, a cache's stores, is not in this one's
    turn). A turn's figures are then taken about a second apart, in the same state of the host."""
    names = list(urls)
    own = {n: copy.copy(words) for n in names}  # the same texts for each server
    turns = {n: make(own[n]) for n in names}
    asked = {n: next(turns[n]) for n in names}
    done: dict[str, dict[str, Any]] = {}
    k = first
    while asked:
        for n in names if k % 2 == 0 else names[::-1]:
            if n in asked:
                time.sleep(pause)
                try:
                    asked[n] = turns[n].send(request(urls[n], *asked[n]))
                except StopIteration as end:
                    done[n] = end.value
                    del asked[n]
        k += 1
    words.at = max(w.at for w in own.values())
    return done


def conversation(url: str, words: Words, chat: bool, turns: int = 6) -> dict[str, Any]:
    return alone(url, conversation_turns(words, chat, turns))


def agent(url: str, words: Words, steps: int = 10) -> dict[str, Any]:
    return alone(url, agent_turns(words, steps))


def shared_system_prompt(url: str, words: Words, system_tokens: int = 8000, requests: int = 16) -> dict[str, Any]:
    return alone(url, system_prompt_turns(words, system_tokens, requests))


def concurrent_repeats(url: str, words: Words, streams: int = 8) -> dict[str, Any]:
    prompts = [f"User: {words.text(300)}\nAssistant:" for _ in range(streams)]
    rounds = []
    body = {"max_tokens": 16, "ignore_eos": True}
    for _ in range(2):  # the second round's prompts were all seen one round earlier
        with ThreadPoolExecutor(streams) as pool:
            rounds.append(list(pool.map(lambda p: request(url, "completions", {"prompt": p} | body), prompts)))
    return {
        "ttft_p50_ms": [statistics.median(r["ttft_ms"] for r in rs) for rs in rounds],
        "cached_second_round": [r["cached"] for r in rounds[1]],
    }


def many_conversations(url: str, words: Words, conversations: int = 64, turns: int = 3) -> dict[str, Any]:
    """More conversations than the memory budget holds, taking turns: tokens reused against
    tokens reusable (the agreement of each prompt with its conversation's last prompt and reply)."""
    histories = ["" for _ in range(conversations)]
    reused = reusable = 0
    ttft = []
    for _ in range(turns):
        for c in range(conversations):
            before = histories[c]
            histories[c] += ("\n" if before else "") + f"User: {words.text(120)}\nAssistant:"
            r = request(url, "completions", {"prompt": histories[c], "max_tokens": 12, "ignore_eos": True})
            if before:
                a, b = words.tok.encode(before).ids, words.tok.encode(histories[c]).ids
                agree = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                reusable += agree
                reused += min(r["cached"] or 0, agree)
                ttft.append(r["ttft_ms"])
            histories[c] += r["text"]
    return {
        "reused": reused,
        "reusable": reusable,
        "share": reused / max(reusable, 1),
        "ttft_p50_ms": statistics.median(ttft),
    }


# The workloads taken turn by turn, and their turns (run: in_step with --pace turns).
STEPPED: dict[str, Callable[[Words], Turns]] = {
    "completions_conversation": lambda w: conversation_turns(w, chat=False),
    "chat_conversation": lambda w: conversation_turns(w, chat=True),
    "agent": agent_turns,
    "shared_system_prompt": system_prompt_turns,
}
PAUSE = 0.5  # seconds before each request with --pace turns

WORKLOADS: dict[str, Callable[[str, Words], dict[str, Any]]] = {
    "one_stream": one_stream,
    "completions_conversation": lambda u, w: conversation(u, w, chat=False),
    "chat_conversation": lambda u, w: conversation(u, w, chat=True),
    "agent": agent,
    "shared_system_prompt": shared_system_prompt,
    "concurrent_repeats": concurrent_repeats,
}


def run(
    work: Path,
    llama_bin: Path,
    rounds: int,
    out: Path,
    servers: list[str],
    workloads: list[str] | None = None,
    pace: str = "turns",
    pause: float = PAUSE,
) -> dict[str, Any]:
    chosen = {w: f for w, f in WORKLOADS.items() if workloads is None or w in workloads}
    words = Words(work / "peer-hf" / "tokenizer.json")
    results: dict[str, Any] = {"rounds": []}
    for k in range(rounds):
        record: dict[str, Any] = {name: {} for name in servers}
        live: dict[str, Server] = {}
        try:
            for j, name in enumerate(servers):  # both up, each in its own process, idle between its turns
                live[name] = start(name, work, llama_bin, 8700 + len(servers) * k + j)
            words.at = 0
            for i, (w, f) in enumerate(chosen.items()):
                if pace == "turns" and w in STEPPED:
                    urls = {name: live[name].url for name in servers}
                    for name, figures in in_step(urls, STEPPED[w], words, k + i, pause).items():
                        record[name][w] = figures
                    continue
                at = words.at
                for name in servers if (k + i) % 2 == 0 else servers[::-1]:  # who goes first alternates
                    words.at = at  # the same texts for each server
                    record[name][w] = f(live[name].url, words)
        finally:
            for server in live.values():
                server.stop()
        for name in servers:
            print(name, json.dumps(record[name])[:2000], flush=True)
        results["rounds"].append(record)
    # The disk tier: a small memory budget, 64 conversations.
    if "hybridrt" in servers and (workloads is None or "many_conversations" in workloads):
        words.at = 0
        disk = work / "states"
        shutil.rmtree(disk, ignore_errors=True)  # empty: an earlier run's states are of the same prompts
        server = start("hybridrt", work, llama_bin, 8790, ["--cache-mb", "512", "--cache-dir", str(disk)])
        try:
            results["many_conversations"] = many_conversations(server.url, words)
        finally:
            server.stop()
        print("many_conversations", results["many_conversations"], flush=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    report(results, out)
    return results


def _fmt(values: list[Any]) -> str:
    return ", ".join("-" if v is None else f"{v:.0f}" for v in values)


def medians(rounds: list[dict[str, Any]]) -> list[str]:
    """With several rounds: each server's median TTFT by turn over the rounds, for the workloads
    taken turn by turn, and the first server's against the second's (a turn's figure in one round
    moves with the host by about as much as the servers differ)."""
    names = list(rounds[0]) if rounds else []
    kinds = [("completions conversation", "completions_conversation"), ("chat conversation", "chat_conversation")]
    kinds.append(("agent, 10 steps", "agent"))
    kinds = [(t, w) for t, w in kinds if all(w in r[n] for r in rounds for n in names)]
    if len(rounds) < 2 or len(names) != 2 or not kinds:
        return []
    lines = [f"## Median over the {len(rounds)} rounds", ""]
    lines.append(f"| workload | {' | '.join(names)} | ratio | rounds with {names[0]} at or below, by turn |")
    lines.append("|---|---|---|---|---|")
    for title, w in kinds:
        per = [[statistics.median(v) for v in zip(*(r[n][w]["ttft_ms"] for r in rounds))] for n in names]
        ratio = ", ".join(f"{a / b:.2f}" for a, b in zip(*per))
        pairs = [zip(r[names[0]][w]["ttft_ms"], r[names[1]][w]["ttft_ms"]) for r in rounds]
        below = ", ".join(str(sum(a <= b for a, b in turn)) for turn in zip(*pairs))
        lines.append(f"| {title}: TTFT by turn, ms | {_fmt(per[0])} | {_fmt(per[1])} | {ratio} | {below} |")
    return [*lines, ""]


def report(results: dict[str, Any], out: Path) -> None:
    """A Markdown table per round (out.md) and TTFT by turn per workload (out.png)."""
    lines = ["# Prefix state cache, turn by turn (benchmarks/bench_prefix_cache.py)", ""]
    for k, record in enumerate(results["rounds"]):
        lines += [f"## Round {k + 1}", "", "| workload | " + " | ".join(record) + " |", "|---|" + "---|" * len(record)]
        rows = [
            ("one stream: decode tok/s", "one_stream", lambda r: f"{r['decode_tok_s']:.1f}"),
            ("completions conversation: TTFT by turn, ms", "completions_conversation", lambda r: _fmt(r["ttft_ms"])),
            ("completions conversation: cached tokens", "completions_conversation", lambda r: _fmt(r["cached"])),
            ("chat conversation: TTFT by turn, ms", "chat_conversation", lambda r: _fmt(r["ttft_ms"])),
            ("agent, 10 steps: TTFT by step, ms", "agent", lambda r: _fmt(r["ttft_ms"])),
            ("8,000-token system prompt, 16 requests: TTFT, ms", "shared_system_prompt", lambda r: _fmt(r["ttft_ms"])),
            (
                "... the slowest of the 15 later / the first",
                "shared_system_prompt",
                lambda r: f"{r['worst_later_share']:.3f}",
            ),
            (
                "8 concurrent streams, seen one round earlier: TTFT p50, ms",
                "concurrent_repeats",
                lambda r: _fmt(r["ttft_p50_ms"][1:]),
            ),
        ]
        for name, workload, cell in rows:
            if all(workload in r for r in record.values()):
                lines.append(f"| {name} | " + " | ".join(cell(r[workload]) for r in record.values()) + " |")
        lines.append("")
    lines += medians(results["rounds"])
    if "many_conversations" in results:
        m = results["many_conversations"]
        lines += [
            f"64 conversations taking 3 turns each through a 512 MiB memory budget with the disk tier: "
            f"{m['reused']:,} of {m['reusable']:,} reusable tokens reused ({100 * m['share']:.1f}%), TTFT p50 "
            f"{m['ttft_p50_ms']:.0f} ms.",
            "",
        ]
    out.with_suffix(".md").write_text("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = results["rounds"]
    panels = [
        w
        for w in ("completions_conversation", "chat_conversation", "agent", "shared_system_prompt")
        if all(w in r for record in rounds for r in record.values())
    ]
    if not panels:
        return
    fig, grid = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    axes = grid[0]
    for ax, w in zip(axes, panels):  # each server's median over the rounds; each round faint
        for k, name in enumerate(rounds[0]):
            each = [record[name][w]["ttft_ms"] for record in rounds]
            turns = range(1, len(each[0]) + 1)
            for one in each if len(each) > 1 else []:
                ax.plot(turns, one, color=f"C{k}", alpha=0.25, linewidth=0.8)
            ax.plot(turns, [statistics.median(v) for v in zip(*each)], color=f"C{k}", marker="o", label=name)
        of = f" (median of {len(rounds)} rounds)" if len(rounds) > 1 else ""
        ax.set_title(w.replace("_", " ") + of, fontsize=9)
        ax.set_xlabel("turn / request")
        ax.set_yscale("log" if w == "shared_system_prompt" else "linear")
    axes[0].set_ylabel("time to first token, ms")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=["prepare", "run"])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--llama-bin", type=Path, required=True, help="the folder with llama-server and llama-quantize")
    ap.add_argument("--sdist", type=Path, help="llama-cpp-python's source distribution (prepare: the converter)")
    ap.add_argument("--config", type=Path, default=CONFIG)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--servers", default="hybridrt,llama-server")
    ap.add_argument("--out", type=Path, default=HERE.parent / "docs" / "bench" / "prefix_cache")
    names = [*WORKLOADS, "many_conversations"]
    ap.add_argument("--workloads", help=f"a comma-separated subset of {','.join(names)} (default: all)")
    ap.add_argument(
        "--pace",
        choices=["turns", "workloads"],
        default="turns",
        help="turns: the conversations, the agent and the system prompt on both servers turn by turn; "
        "workloads: each workload whole on one server, then on the other",
    )
    ap.add_argument("--pause", type=float, default=PAUSE, help="seconds before each request with --pace turns")
    args = ap.parse_args()
    if args.step == "prepare":
        prepare(args.work, args.llama_bin, args.sdist, args.config)
    else:
        chosen = None if args.workloads is None else args.workloads.split(",")
        if chosen is not None and not set(chosen) <= set(names):
            ap.error(f"--workloads: unknown {sorted(set(chosen) - set(names))}; known: {', '.join(names)}")
        run(args.work, args.llama_bin, args.rounds, args.out, args.servers.split(","), chosen, args.pace, args.pause)


if __name__ == "__main__":
    main()
