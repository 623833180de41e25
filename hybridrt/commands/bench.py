"""`hybridrt bench MODEL [MODEL ...]`: prompt time and decode speed of one or more exported
directories on the same workload, in one run, with ratios to the first (the float parent
beside its quantized children, say). Runtime only: no torch.

Workload: batch `--batch` (default 1), a `--prompt-tokens` prompt of random ids (default
128), `--new-tokens` greedy tokens (default 128, never stopped early). Each model loads,
warms up, then the models take turns `--repeats` times, so drift in machine load hits them
alike; the medians are reported. Sizes are the graph files' bytes.

With `--assistant DRAFT`, every model also runs with DRAFT proposing tokens (speculative
decoding, `--num-assistant-tokens`, `--schedule`) on the same workload: its decode tokens/s,
the speed-up over the model alone, the share of drafted tokens kept, and whether its greedy
tokens equal the model's alone (they must).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from ..runtime.input_checks import SCHEDULES


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="prompt time and decode tokens/s of exported models, side by side (torch-free)")
    p.add_argument("models", nargs="+", help="exported directories (or 'default'); ratios are to the first")
    p.add_argument("--prompt-tokens", type=int, default=128, help="tokens per prompt (random ids)")
    p.add_argument("--new-tokens", type=int, default=128, help="greedy tokens per run, never stopped early")
    p.add_argument("--batch", type=int, default=1, help="prompts per run")
    p.add_argument("--repeats", type=int, default=3, help="runs per model; medians are reported")
    p.add_argument("--threads", type=int, help="CPU intra-op threads")
    p.add_argument("--provider", default="auto", help="auto, cpu, cuda, acl, xnnpack, or a full provider name")
    p.add_argument("--seed", type=int, default=0, help="seed of the random prompt ids")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--assistant", help="exported draft model: also run each model with speculative decoding")
    p.add_argument("--num-assistant-tokens", type=int, default=5, help="drafted tokens per round to begin with")
    p.add_argument(
        "--schedule", default="adaptive", choices=SCHEDULES, help="how the draft length changes (default adaptive)"
    )


def run(args: argparse.Namespace) -> int:
    from ..errors import GenerationError
    from .common import model_dir

    for name in ("prompt_tokens", "new_tokens", "batch", "repeats", "num_assistant_tokens"):
        if getattr(args, name) < 1:
            raise GenerationError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    results = bench([model_dir(m) for m in args.models], args)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(table(results, args))
    return 0


def bench(directories: list[Path], args: argparse.Namespace) -> list[dict[str, Any]]:
    import os

    from ..runtime import load, share_thread_pool
    from ..runtime.evaluate import bench_rows
    from .common import model_dir

    if args.assistant is not None:  # two sessions taking turns: one thread pool for both
        share_thread_pool(args.threads or os.cpu_count() or 1, strict=False)
    models = [load(d, args.provider, threads=args.threads) for d in directories]
    draft = load(model_dir(args.assistant), args.provider, threads=args.threads) if args.assistant else None
    rows = bench_rows([m.manifest for m in models], args.batch, args.prompt_tokens, args.seed)
    settings = {"max_new_tokens": args.new_tokens, "min_new_tokens": args.new_tokens, "do_sample": False}
    speculative = {
        "assistant_model": draft,
        "num_assistant_tokens": args.num_assistant_tokens,
        "num_assistant_tokens_schedule": args.schedule,
    }
    for model in models:
        model.generate(rows, **settings | {"max_new_tokens": 4, "min_new_tokens": 4})  # warm-up
        if draft is not None:
            model.generate(rows, **settings | speculative | {"max_new_tokens": 4, "min_new_tokens": 4})
    runs: list[list[tuple[float, float]]] = [[] for _ in models]
    spec_runs: list[list[Any]] = [[] for _ in models]
    tokens: list[Any] = [None] * len(models)
    for _ in range(args.repeats):
        for i, model in enumerate(models):
            tokens[i], stats = model.generate_with_stats(rows, **settings)
            runs[i].append((stats.prefill_ms, stats.decode_tokens_per_s))  # all rows together
            if draft is not None:
                spec_runs[i].append(model.generate_with_stats(rows, **settings | speculative))
    results = []
    for directory, model, r, out, spec in zip(directories, models, runs, tokens, spec_runs):
        q = model.manifest.quantization or {}
        results.append(
            {
                "model": str(directory),
                "quantization": q.get("mode", "float") + (f" {q['algo']}" if q.get("algo") else ""),
                "graph_bytes": model.weight_bytes,
                "providers": model.providers,
                "prefill_ms": statistics.median(x[0] for x in r),
                "decode_tokens_per_s": statistics.median(x[1] for x in r),
                "greedy_same_as_first": out == tokens[0],
            }
        )
        if spec:
            rate = statistics.median(st.decode_tokens_per_s for _, st in spec)
            last = spec[-1][1]
            results[-1]["speculative"] = {
                "assistant": str(args.assistant),
                "decode_tokens_per_s": rate,
                "speedup": rate / results[-1]["decode_tokens_per_s"],
                "acceptance_rate": last.acceptance_rate,
                "tokens_per_round": last.decode_tokens / max(last.rounds, 1),
                "greedy_same_as_alone": all(o == out for o, _ in spec),
            }
    return results


def table(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    first = results[0]
    lines = [
        f"workload: batch {args.batch}, {args.prompt_tokens}-token prompt, {args.new_tokens} new tokens, greedy; "
        f"threads {args.threads or 'default'}; {', '.join(first['providers'])}; median of {args.repeats}",
        f"{'model':<40}{'quantization':<16}{'MB':>9}{'size':>7}{'prefill ms':>12}{'decode tok/s':>14}{'speed':>8}",
    ]
    for r in results:
        size = r["graph_bytes"] / first["graph_bytes"]
        speed = r["decode_tokens_per_s"] / first["decode_tokens_per_s"]
        name = r["model"] if len(r["model"]) <= 38 else "..." + r["model"][-35:]
        lines.append(
            f"{name:<40}{r['quantization']:<16}{r['graph_bytes'] / 1e6:>9.1f}{size:>6.2f}x"
            f"{r['prefill_ms']:>12.1f}{r['decode_tokens_per_s']:>14.1f}{speed:>7.2f}x"
        )
    for r in results:
        s = r.get("speculative")
        if s:
            name = r["model"] if len(r["model"]) <= 38 else "..." + r["model"][-35:]
            lines.append(
                f"{name:<40}with {Path(s['assistant']).name}: {s['decode_tokens_per_s']:.1f} tok/s "
                f"({s['speedup']:.2f}x alone), {100 * s['acceptance_rate']:.0f}% of drafts kept, "
                f"{s['tokens_per_round']:.2f} tokens per verify call, "
                f"greedy {'same' if s['greedy_same_as_alone'] else 'DIFFERENT'}"
            )
    return "\n".join(lines)
