"""The cost of constrained decoding per constrained row per decode step (hybridrt.serve.grammar).

python benchmarks/bench_grammar.py MODEL_DIR_OR_TOKENIZER_JSON [...] --steps 2000

For each tokenizer (an exported model's directory, or a bare tokenizer.json), walks the
grammars of a JSON schema and of a forced tool call with random logits for `--steps` tokens
(a new matcher whenever one completes), timing what the engine adds to a constrained row's
step: the llguidance mask (`mask`), turning it into -inf on the row's logits (`apply`), and
feeding the sampled token (`consume`). Prints a Markdown table of milliseconds per step
(median and 99th percentile of the whole).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from tokenizers import Tokenizer

from hybridrt.serve.grammar import Constraint, Matcher, matchers
from hybridrt.serve.tools import Tools

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 5},
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["street", "zip"],
        },
    },
    "required": ["name", "age", "email", "tags", "address"],
    "additionalProperties": False,
}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["C", "F"]}},
            "required": ["city", "unit"],
        },
    },
}


class Vocabulary:
    """What grammar.matchers reads of a model: its tokenizer, vocabulary size and EOS ids."""

    def __init__(self, path: Path) -> None:
        self.tokenizer = Tokenizer.from_file(str(path if path.is_file() else path / "tokenizer.json"))
        self.manifest = SimpleNamespace(vocab_size=self.tokenizer.get_vocab_size())
        ids = (self.tokenizer.token_to_id(t) for t in ("</s>", "<|endoftext|>", "<|im_end|>"))
        self.eos_token_ids = (next((i for i in ids if i is not None), 0),)


def walk(model: Vocabulary, constraint: Constraint, steps: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    vocab = model.manifest.vocab_size
    times: dict[str, list[float]] = {"mask": [], "apply": [], "consume": []}
    m: Matcher = matchers(model, constraint, 1)[0]  # type: ignore[arg-type]
    for _ in range(steps):
        logits = rng.standard_normal((1, vocab)).astype(np.float32)
        t0 = time.perf_counter()
        allowed = m.allowed()
        t1 = time.perf_counter()
        masked = np.where(allowed[None], logits, np.float32(-np.inf))
        t2 = time.perf_counter()
        token = int(masked.argmax())
        done = m.consume(token) or token in model.eos_token_ids
        t3 = time.perf_counter()
        times["mask"].append(t1 - t0)
        times["apply"].append(t2 - t1)
        times["consume"].append(t3 - t2)
        if done:
            m = matchers(model, constraint, 1)[0]  # type: ignore[arg-type]
    return {k: np.asarray(v) * 1e3 for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    grammars = {
        "json_schema": Constraint.json_schema(SCHEMA, "response_format"),
        "tool call": Tools((TOOL,), "required").constraint(),
    }
    print("| tokenizer | vocab | grammar | mask ms | apply ms | consume ms | total ms (p50 / p99) |")
    print("|---|---|---|---|---|---|---|")
    for path in args.paths:
        model = Vocabulary(path)
        for name, constraint in grammars.items():
            assert constraint is not None
            t = walk(model, constraint, args.steps)
            total = t["mask"] + t["apply"] + t["consume"]
            cells = " | ".join(f"{np.median(t[k]):.3f}" for k in ("mask", "apply", "consume"))
            row = f"{np.median(total):.3f} / {np.percentile(total, 99):.3f}"
            print(f"| {path.name} | {model.manifest.vocab_size} | {name} | {cells} | {row} |")
    print(json.dumps({"steps": args.steps}))


if __name__ == "__main__":
    main()
