"""Which quantized nodes move a model's greedy tokens: int8-dynamic with one node group left float at a time.

python benchmarks/quant_agreement.py build/bench/jamba-125m/float --work build/agree

For the float export DIR: the default int8-dynamic quantization, then one variant per node group
(`--exclude` pattern) kept float, each scored against the float model on the same random-id
prompts: share of identical greedy tokens (position by position) and the mean KL divergence
and max |difference| of the next-token logits after each prompt. Random ids and random weights:
the figures rank node groups by how much they move the output, not a quality on real text.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from hybridrt.runtime.evaluate import log_softmax

GROUPS = {
    "default": (),
    "mixer in_proj float": ("*/mixer/in_proj/*",),
    "mixer x_proj float": ("*/mixer/x_proj/*",),
    "mixer out_proj float": ("*/mixer/out_proj/*",),
    "attention q/k/v/o float": ("*/mixer/q_proj/*", "*/mixer/k_proj/*", "*/mixer/v_proj/*", "*/mixer/o_proj/*"),
    "feed-forward float": ("*/ffn/*",),
    "ffn down_proj float": ("*/ffn/down_proj/*",),
    "ffn gate/up float": ("*/ffn/gate_proj/*", "*/ffn/up_proj/*"),
    "vocabulary float": ("/lm_head/*", "/model/embed_tokens/*"),
}


def main() -> None:
    import hybridrt
    from hybridrt.quantization import quantize

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--work", type=Path, default=Path("build/agree"))
    ap.add_argument("--mode", default="int8-dynamic")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    parent = hybridrt.load(args.model)
    rng = np.random.default_rng(0)
    prompts = rng.integers(3, parent.manifest.vocab_size, (args.prompts, 64)).tolist()
    greedy = {"max_new_tokens": args.tokens, "min_new_tokens": args.tokens, "do_sample": False, "eos_token_id": []}
    ref = np.asarray(parent.generate(prompts, **greedy))
    ref_logits = np.stack([parent.stepper(1, 64).forward(np.asarray([p]))[0] for p in prompts])
    rows = []
    for label, exclude in GROUPS.items():
        slug = "-".join(label.replace("/", " ").split())
        out = args.work / f"{args.model.parent.name}-{args.mode}-{slug}"
        if not (out / "hybridrt.json").exists():
            quantize(args.model, out, args.mode, exclude=exclude, keep_float_default=True)
        q = hybridrt.load(out)
        toks = np.asarray(q.generate(prompts, **greedy))
        logits = np.stack([q.stepper(1, 64).forward(np.asarray([p]))[0] for p in prompts])
        lp, lq = log_softmax(ref_logits.astype(np.float64)), log_softmax(logits.astype(np.float64))
        kl = float((np.exp(lp) * (lp - lq)).sum(-1).mean())
        row = {
            "variant": label,
            "agreement": float((toks == ref).mean()),
            "first_token_agreement": float((toks[:, 0] == ref[:, 0]).mean()),
            "kl": kl,
            "max_abs_logits": float(np.abs(logits - ref_logits).max()),
            "logit_std": float(ref_logits.std()),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    (args.work / f"{args.model.parent.name}-{args.mode}.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
