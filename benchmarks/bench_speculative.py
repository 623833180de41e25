"""Speculative decoding against plain decoding, per target/draft pair, in one run.

python benchmarks/bench_speculative.py --pair TARGET=DRAFT [...] --text FILE --out docs/bench

For each pair of exported directories (same tokenizer): greedy decode of `--new-tokens`
after `--prompts` prompts of `--prompt-tokens` tokens taken from FILE (or random ids when the
target has no tokenizer), plain and with the draft under each schedule, the two taking turns
`--repeats` times; reports decode tokens/s (median), the speed-up, the share of drafted
tokens kept, tokens per verify call, the draft length the schedule settled on, and whether
the tokens equal plain greedy decoding. Figures go to OUT/speculative.json and .md.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np


def prompts_of(model: Any, text: Path | None, n: int, length: int) -> list[list[int]]:
    if text is None or model.tokenizer is None:
        return np.random.default_rng(0).integers(3, model.manifest.vocab_size, (n, length)).tolist()
    ids = model.tokenizer.encode(text.read_text(encoding="utf-8")).ids
    step = max((len(ids) - length) // n, 1)
    return [ids[i * step : i * step + length] for i in range(n)]


def main() -> None:
    import hybridrt

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", nargs="+", required=True, help="TARGET_DIR=DRAFT_DIR")
    ap.add_argument("--text", type=Path, help="prompts are cut from this text (default: random ids)")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--schedules", nargs="*", default=["adaptive", "heuristic", "constant"])
    ap.add_argument("--out", type=Path, default=Path("build/bench"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    hybridrt.runtime.share_thread_pool(args.threads)  # target and draft take turns on one pool
    rows = []
    for pair in args.pair:
        target_dir, draft_dir = pair.split("=", 1)
        target, draft = hybridrt.load(target_dir), hybridrt.load(draft_dir)
        prompts = prompts_of(target, args.text, args.prompts, args.prompt_tokens)
        greedy = {"max_new_tokens": args.new_tokens, "min_new_tokens": args.new_tokens, "do_sample": False}
        target.generate(prompts[0], **greedy | {"max_new_tokens": 4, "min_new_tokens": 4})  # warm-up
        plain_rates: list[float] = []
        spec: dict[str, list[Any]] = {s: [] for s in args.schedules}
        reference = [target.generate(p, **greedy) for p in prompts]
        for _ in range(args.repeats):
            for p in prompts:
                plain_rates.append(target.generate_with_stats(p, **greedy)[1].decode_tokens_per_s)
                for schedule in args.schedules:
                    kw = {"assistant_model": draft, "num_assistant_tokens_schedule": schedule}
                    spec[schedule].append((p, *target.generate_with_stats(p, **greedy | kw)))
        plain = statistics.median(plain_rates)
        for schedule, runs in spec.items():
            rate = statistics.median(st.decode_tokens_per_s for _, _, st in runs)
            drafted = sum(st.draft_tokens for _, _, st in runs)
            kept = sum(st.accepted_tokens for _, _, st in runs)
            rounds = sum(st.rounds for _, _, st in runs)
            same = all(out == reference[prompts.index(p)] for p, out, _ in runs)
            row = {
                "target": target_dir,
                "draft": draft_dir,
                "schedule": schedule,
                "plain_tok_s": plain,
                "speculative_tok_s": rate,
                "speedup": rate / plain,
                "acceptance": kept / drafted if drafted else float("nan"),
                "tokens_per_verify": (kept + rounds) / rounds if rounds else float("nan"),
                "drafted_per_round": drafted / rounds if rounds else 0.0,
                "greedy_same": same,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    (args.out / "speculative.json").write_text(json.dumps(rows, indent=2))
    lines = [
        "| target | draft | schedule | plain tok/s | with draft tok/s | speed-up | drafts kept | tokens/verify | "
        "drafts/round | greedy same |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['target']} | {r['draft']} | {r['schedule']} | {r['plain_tok_s']:.1f} | "
            f"{r['speculative_tok_s']:.1f} | {r['speedup']:.2f}x | {r['acceptance']:.2f} | "
            f"{r['tokens_per_verify']:.2f} | {r['drafted_per_round']:.2f} | {r['greedy_same']} |"
        )
    (args.out / "speculative.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
