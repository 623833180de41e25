"""How close each quantization mode stays to its float parent, on every family and the bench models.

python benchmarks/quant_closeness.py --bench build/bench --families --work build/closeness --out docs/bench

For each float export (the bench models' exports under --bench, and with --families each tiny
random family checkpoint of tests/family_checkpoints.py, exported here) and each mode
(int8-dynamic, int8-weight, int4), on the same random-id prompts (64 tokens, then 32 greedy):

- free-running agreement: the share of positions where the quantized model's own greedy
  continuation has the float model's token (once one token differs, the contexts differ);
- teacher-forced agreement: the share of positions where the quantized model's top token
  equals the float model's when both read the float model's continuation;
- mean KL(float || quantized) of the next-token distributions over those positions;
- the float model's median margin between its top two logits, and the median |difference| of
  the quantized model's top-two margin from it: a small margin against the quantization
  noise is why a random-weight model's greedy tokens flip.

With --gguf MODEL=DIR (DIR holding f32.gguf, q8_0.gguf, q4_0.gguf from benchmarks/prepare_peers.py),
llama.cpp's q8_0 and q4_0 are scored the same way against llama.cpp's own f32, on the same ids.
Figures go to OUT/closeness.json and OUT/closeness.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from hybridrt.runtime.evaluate import log_softmax

MODES = ("int8-dynamic", "int8-weight", "int4")
PROMPT, NEW, PROMPTS = 64, 32, 6


def margins(logits: np.ndarray) -> np.ndarray:
    top = np.partition(logits, -2, axis=-1)
    return top[..., -1] - top[..., -2]


def scores(ref: np.ndarray, ref_logits: np.ndarray, own: np.ndarray, logits: np.ndarray) -> dict[str, float]:
    """ref/own [p, NEW] greedy tokens; *_logits [p, NEW, V] teacher-forced on ref's continuation."""
    lp, lq = log_softmax(ref_logits.astype(np.float64)), log_softmax(logits.astype(np.float64))
    return {
        "free_agreement": float((own == ref).mean()),
        "forced_agreement": float((logits.argmax(-1) == ref_logits.argmax(-1)).mean()),
        "kl": float((np.exp(lp) * (lp - lq)).sum(-1).mean()),
        "float_margin": float(np.median(margins(ref_logits))),
        "margin_shift": float(np.median(np.abs(margins(ref_logits) - margins(logits)))),
        "max_abs_logits": float(np.abs(logits - ref_logits).max()),
    }


def run_onnx(directory: Path, prompts: list[list[int]], ref: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(greedy continuations [p, NEW], logits [p, NEW, V] teacher-forced on ref's, or its own)."""
    import hybridrt

    model = hybridrt.load(directory)
    greedy = {"max_new_tokens": NEW, "min_new_tokens": NEW, "do_sample": False, "eos_token_id": []}
    own = np.asarray(model.generate(prompts, **greedy))
    forced = own if ref is None else ref
    logits = []
    for p, cont in zip(prompts, forced):
        stepper = model.stepper(1, PROMPT + NEW)
        seq = np.asarray([p + cont.tolist()[:-1]], dtype=np.int64)
        logits.append(stepper.forward(seq, all_logits=True)[0, PROMPT - 1 :])
    return own, np.stack(logits)


def run_gguf(path: Path, prompts: list[list[int]], ref: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    import llama_cpp

    llm = llama_cpp.Llama(str(path), n_ctx=PROMPT + NEW + 8, n_threads=2, logits_all=True, verbose=False)
    own, logits = [], []
    for i, p in enumerate(prompts):
        llm.reset()
        llm.eval(p)
        toks = []
        for _ in range(NEW):
            toks.append(int(llm.scores[llm.n_tokens - 1].argmax()))
            llm.eval([toks[-1]])
        own.append(toks)
        forced = toks if ref is None else ref[i].tolist()
        llm.reset()
        llm.eval(p + forced[:-1])
        logits.append(np.array(llm.scores[PROMPT - 1 : PROMPT + NEW - 1], dtype=np.float32))
    return np.asarray(own), np.stack(logits)


def quantized(src: Path, out: Path, mode: str, text: Path | None) -> Path:
    from hybridrt.quantization import quantize

    if not (out / "hybridrt.json").exists():
        quick = {"samples": 3, "seq_len": 32, "agreement_prompts": 2, "eval_tokens": 256}
        quantize(src, out, mode, eval_text=text, **(quick if text else {}))
    return out


def family_exports(work: Path) -> dict[str, Path]:
    """Every tiny family checkpoint of the test suite, exported (cached under work)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from family_checkpoints import BUILDERS

    import hybridrt

    out = {}
    for name, build in BUILDERS.items():
        float_dir = work / "families" / name / "float"
        if not (float_dir / "hybridrt.json").exists():
            hybridrt.export_model(build(work / "families" / name / "hf"), float_dir)
        out[name] = float_dir
    return out


def table(rows: list[dict[str, Any]]) -> str:
    cols = ["free_agreement", "forced_agreement", "kl", "float_margin", "margin_shift"]
    lines = ["| model | runtime | mode | " + " | ".join(c.replace("_", " ") for c in cols) + " |"]
    lines.append("|---" * (len(cols) + 3) + "|")
    for r in rows:
        cells = [f"{r[c]:.2e}" if c == "kl" else f"{r[c]:.3f}" for c in cols]
        lines.append(f"| {r['model']} | {r['runtime']} | {r['mode']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", type=Path, help="bench_peers.py's work directory (MODEL/float exports)")
    ap.add_argument("--models", nargs="*", default=["jamba-125m", "granite-h-125m", "llama-125m"])
    ap.add_argument("--families", action="store_true", help="also every tiny family checkpoint of the tests")
    ap.add_argument("--gguf", nargs="*", default=[], help="MODEL=DIR with f32/q8_0/q4_0 .gguf files")
    ap.add_argument("--modes", nargs="*", default=list(MODES))
    ap.add_argument("--work", type=Path, default=Path("build/closeness"))
    ap.add_argument("--out", type=Path, default=Path("build/closeness"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    text = args.work / "eval.txt"
    text.parent.mkdir(parents=True, exist_ok=True)
    import hybridrt.runtime.decode as decode_module

    text.write_text(Path(decode_module.__file__).read_text(encoding="utf-8") * 6, encoding="utf-8")
    targets: dict[str, tuple[Path, Path | None]] = {}
    for name in args.models if args.bench else []:
        float_dir = args.bench / name / "float"
        # An export without a tokenizer gets no quality report, so needs no held-out text.
        targets[name] = (float_dir, text if (float_dir / "tokenizer.json").exists() else None)
    if args.families:
        targets |= {f"{name} (tiny)": (d, text) for name, d in family_exports(args.work).items()}
    rows: list[dict[str, Any]] = []
    for name, (float_dir, eval_text) in targets.items():
        import hybridrt

        vocab = hybridrt.load(float_dir).manifest.vocab_size
        prompts = np.random.default_rng(0).integers(3, vocab, (PROMPTS, PROMPT)).tolist()
        ref, ref_logits = run_onnx(float_dir, prompts, None)
        for mode in args.modes:
            made = float_dir.parent / mode  # bench_peers.py's own quantizations, when present
            qdir = (
                made
                if (made / "hybridrt.json").exists()
                else quantized(float_dir, args.work / name.split()[0] / mode, mode, eval_text)
            )
            own, logits = run_onnx(qdir, prompts, ref)
            rows.append({"model": name, "runtime": "hybridrt", "mode": mode} | scores(ref, ref_logits, own, logits))
            print(json.dumps(rows[-1]), flush=True)
    for spec in args.gguf:
        name, directory = spec.split("=", 1)
        vocab = 32000
        prompts = np.random.default_rng(0).integers(3, vocab, (PROMPTS, PROMPT)).tolist()
        ref, ref_logits = run_gguf(Path(directory) / "f32.gguf", prompts, None)
        for mode in ("q8_0", "q4_0"):
            own, logits = run_gguf(Path(directory) / f"{mode}.gguf", prompts, ref)
            rows.append({"model": name, "runtime": "llama.cpp", "mode": mode} | scores(ref, ref_logits, own, logits))
            print(json.dumps(rows[-1]), flush=True)
    (args.out / "closeness.json").write_text(json.dumps(rows, indent=2))
    (args.out / "closeness.md").write_text(table(rows) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
