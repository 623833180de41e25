"""Greedy tokens and logits of an exported model, recorded on one machine and checked on another.

    python scripts/arm_greedy.py record MODEL_DIR REF.json    # on x86, where the graph was exported
    python scripts/arm_greedy.py check MODEL_DIR REF.json     # on aarch64 (scripts/arm_check.sh)

`check` prints, per prompt, whether the greedy tokens equal the recorded ones and the max
|Δlogits| over the prompt and its continuation (one forward pass from zero states), and
exits 1 when any greedy sequence differs. Torch-free: needs only `pip install hybridrt`.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime

import hybridrt
from hybridrt.runtime.evaluate import ort_logits_fn

PROMPTS = ("def fibonacci(n):", "class Stack:\n    def push(self, x):", "import numpy as np\n", "for i in range(")
NEW_TOKENS = 32


def run(model_dir: Path) -> dict[str, object]:
    model = hybridrt.load(model_dir, "cpu")
    logits_fn = ort_logits_fn(model)
    rows = []
    for prompt in PROMPTS:
        ids = model.prompt_rows(prompt).rows[0]
        t0 = time.perf_counter()
        tokens = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=[])
        seconds = time.perf_counter() - t0
        logits = logits_fn(np.array([ids + tokens], np.int64))
        rows.append({"prompt": prompt, "ids": ids, "tokens": tokens, "logits": logits.tolist(), "seconds": seconds})
    return {"machine": platform.machine(), "onnxruntime": onnxruntime.__version__, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=("record", "check"))
    p.add_argument("model", type=Path)
    p.add_argument("reference", type=Path)
    args = p.parse_args(argv)
    here = run(args.model)
    if args.action == "record":
        args.reference.write_text(json.dumps(here))
        print(f"recorded {len(here['rows'])} prompts on {here['machine']} (onnxruntime {here['onnxruntime']})")
        return 0
    ref = json.loads(args.reference.read_text())
    print(
        f"reference: {ref['machine']}, onnxruntime {ref['onnxruntime']}; here: {here['machine']}, "
        f"onnxruntime {here['onnxruntime']}"
    )
    same_all, worst = True, 0.0
    for mine, theirs in zip(here["rows"], ref["rows"]):
        assert mine["ids"] == theirs["ids"], "the tokenizer gives other prompt ids here"
        same = mine["tokens"] == theirs["tokens"]
        delta = float(np.max(np.abs(np.array(mine["logits"]) - np.array(theirs["logits"]))))
        same_all, worst = same_all and same, max(worst, delta)
        print(
            f"{mine['prompt']!r:45} greedy {'equal' if same else 'DIFFERENT'} ({len(mine['tokens'])} tokens), "
            f"max |dlogits| {delta:.2e}, {mine['seconds']:.2f} s here vs {theirs['seconds']:.2f} s"
        )
    print(f"greedy equality: {'yes' if same_all else 'NO'} on {len(here['rows'])} prompts; max |dlogits| {worst:.2e}")
    return 0 if same_all else 1


if __name__ == "__main__":
    sys.exit(main())
