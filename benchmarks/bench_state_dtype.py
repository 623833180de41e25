"""How close a request resumed from bfloat16-stored states (`--cache-dtype bfloat16`,
`model.state_cache(stored="bfloat16")`) stays to a cold one, and what it saves.

    python benchmarks/bench_state_dtype.py MODEL_DIR [--prompts 8] [--length 512] [--new-tokens 32]

For each of --prompts random prompts of --length tokens: the logits of one more token after the
prompt, cold and resumed from the prompt's stored states (exact and bfloat16): max |Δlogits| and
KL(cold || resumed); the greedy continuation of --new-tokens tokens, resumed against cold (the
share of equal tokens, position by position); and the bytes one stored state takes.
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np

import hybridrt
from hybridrt.runtime.decode import prefill_cached
from hybridrt.runtime.evaluate import bench_rows, log_softmax


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()
    model = hybridrt.load(args.model)
    rows = bench_rows([model.manifest], args.prompts, args.length, seed=1)
    out: dict[str, dict[str, list[float]]] = {}
    for stored in ("float32", "bfloat16"):
        figures: dict[str, list[float]] = {"max_abs_logits": [], "kl": [], "greedy_agreement": [], "bytes": []}
        for row in rows:
            tokens = row + [row[0]]
            cold = np.array(model.stepper(1, len(tokens) + 4).forward(np.asarray([tokens], dtype=np.int64)))
            cache = model.state_cache(stored=stored, spacing=0)
            want = model.generate(row, cache=cache, max_new_tokens=args.new_tokens, eos_token_id=[])
            resumed, _ = prefill_cached(model.stepper(1, len(tokens) + 4), tokens, cache)
            p, q = log_softmax(cold.astype(np.float64)), log_softmax(np.array(resumed).astype(np.float64))
            got = model.generate(row, cache=cache, max_new_tokens=args.new_tokens, eos_token_id=[])
            figures["max_abs_logits"].append(float(np.abs(np.array(resumed) - cold).max()))
            figures["kl"].append(float((np.exp(p) * (p - q)).sum(-1).max()))
            figures["greedy_agreement"].append(float(np.mean(np.asarray(got) == np.asarray(want))))
            figures["bytes"].append(cache.memory / max(len(cache), 1))
        out[stored] = figures
        print(
            f"{stored:9} max |Δlogits| {max(figures['max_abs_logits']):.2e} | KL max {max(figures['kl']):.2e} | "
            f"greedy agreement {statistics.mean(figures['greedy_agreement']):.3f} | "
            f"{statistics.mean(figures['bytes']) / 2**20:.2f} MiB a stored state"
        )
    print(json.dumps({k: {f: statistics.mean(v) for f, v in d.items()} for k, d in out.items()}))


if __name__ == "__main__":
    main()
