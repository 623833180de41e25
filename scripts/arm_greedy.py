"""Greedy tokens and logits of an exported model, recorded on one machine and checked on another.

    python scripts/arm_greedy.py record MODEL_DIR REF.json    # on x86, where the graph was exported
    python scripts/arm_greedy.py check MODEL_DIR REF.json     # on aarch64 (scripts/arm_check.sh)

`check` prints, per prompt, whether the greedy tokens equal the recorded ones (if not, where
they part and how close the recorded top two logits were there) and the max |Δlogits| over
the prompt and the recorded continuation (one forward pass from zero states), and exits 1
when any greedy sequence differs. Torch-free: needs only `pip install hybridrt`.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime

import hybridrt
from hybridrt.runtime.evaluate import ort_logits_fn

PROMPTS = ("def fibonacci(n):", "class Stack:\n    def push(self, x):", "import numpy as np\n", "for i in range(")
NEW_TOKENS = 32


def run(model_dir: Path, reference: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Greedy tokens per prompt, and the logits of one forward pass over the prompt and its
    continuation: the reference's continuation when given, so that logits are compared on the
    same tokens even where the greedy choices part."""
    model = hybridrt.load(model_dir, "cpu")
    logits_fn = ort_logits_fn(model)
    rows = []
    for i, prompt in enumerate(PROMPTS):
        ids = model.prompt_rows(prompt).rows[0]
        t0 = time.perf_counter()
        tokens = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=[])
        seconds = time.perf_counter() - t0
        scored = tokens if reference is None else reference[i]["tokens"]
        logits = logits_fn(np.array([ids + scored], np.int64))
        rows.append({"prompt": prompt, "ids": ids, "tokens": tokens, "logits": logits.tolist(), "seconds": seconds})
    return {"machine": platform.machine(), "onnxruntime": onnxruntime.__version__, "rows": rows}


def compare(mine: dict[str, Any], theirs: dict[str, Any]) -> tuple[bool, float, str]:
    """Greedy equality, max |dlogits| on the reference's tokens, and a line saying both."""
    assert mine["ids"] == theirs["ids"], "the tokenizer gives other prompt ids here"
    ref = np.array(theirs["logits"])
    delta = float(np.max(np.abs(np.array(mine["logits"]) - ref)))
    same = mine["tokens"] == theirs["tokens"]
    verdict = f"equal ({len(mine['tokens'])} tokens)"
    if not same:
        # Where they part, and how close the reference's top two logits were there.
        k = next(j for j, (a, b) in enumerate(zip(mine["tokens"], theirs["tokens"])) if a != b)
        top2 = np.sort(ref[len(mine["ids"]) - 1 + k])[-2:]
        verdict = f"DIFFERENT from token {k} (reference top-2 margin there {top2[1] - top2[0]:.3f})"
    timing = f"{mine['seconds']:.2f} s here vs {theirs['seconds']:.2f} s"
    return same, delta, f"{mine['prompt']!r:45} greedy {verdict}, max |dlogits| {delta:.2e}, {timing}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=("record", "check"))
    p.add_argument("model", type=Path)
    p.add_argument("reference", type=Path)
    args = p.parse_args(argv)
    if args.action == "record":
        here = run(args.model)
        args.reference.write_text(json.dumps(here))
        print(f"recorded {len(here['rows'])} prompts on {here['machine']} (onnxruntime {here['onnxruntime']})")
        return 0
    ref = json.loads(args.reference.read_text())
    here = run(args.model, ref["rows"])
    print(
        f"reference: {ref['machine']}, onnxruntime {ref['onnxruntime']}; "
        f"here: {here['machine']}, onnxruntime {here['onnxruntime']}"
    )
    same_all, worst = True, 0.0
    for mine, theirs in zip(here["rows"], ref["rows"]):
        same, delta, line = compare(mine, theirs)
        same_all, worst = same_all and same, max(worst, delta)
        print(line)
    print(f"greedy equality: {'yes' if same_all else 'NO'} on {len(here['rows'])} prompts; max |dlogits| {worst:.2e}")
    return 0 if same_all else 1


if __name__ == "__main__":
    sys.exit(main())
