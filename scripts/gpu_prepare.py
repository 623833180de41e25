"""Prepare what scripts/gpu_check.py runs on a CUDA machine, on this (CPU) machine: for every
family of the test suite (tests/family_checkpoints.BUILDERS), its tiny checkpoint, the ONNX
export with onnxruntime's fused operators (float32; onnxruntime-gpu 1.31 runs it through
graphs/compat.py), its float16 conversions (`quantize --mode float16`: attention float32,
fused16; with `--kv-dtype float16`, attention and its KV buffers float16, fused16kv), and the reference
from transformers on the CPU in float32 (the logits of a prompt, 16 greedy tokens after it).

python scripts/gpu_prepare.py -o gpuwork [--families jamba llama ...]

docs/gpu.md gives the whole procedure (what to carry to the GPU machine, the commands there).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

PROMPT = 24
NEW = 16
# (directory, its float16 conversions: name -> KV dtype, fused operators)
VARIANTS = (("fused", {"fused16": "float32", "fused16kv": "float16"}, True),)


def prompt_ids(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, 320, (1, PROMPT))


def prepare(name: str, out: Path, text: Path) -> None:
    from family_checkpoints import BUILDERS
    from transformers import AutoModelForCausalLM

    import hybridrt
    from hybridrt.quantization import quantize

    t0 = time.perf_counter()
    ckpt = out / "hf"
    if not (ckpt / "config.json").exists():
        BUILDERS[name](ckpt)
    small = {"agreement_prompts": 2, "eval_tokens": 128, "eval_window": 128}
    for f32, halves, fused in VARIANTS:
        if not (out / f32 / "hybridrt.json").exists():
            hybridrt.export_model(ckpt, out / f32, fused_ops=fused, validate=False)
        for f16, kv in halves.items():
            if (out / f16 / "hybridrt.json").exists():
                continue
            try:
                quantize(out / f32, out / f16, "float16", kv_dtype=kv, eval_text=text, **small)
            except Exception as exc:  # reported, and the family's other graphs still go
                (out / f"{f16}.error").write_text(f"{type(exc).__name__}: {exc}")
                print(f"{name}: {f16} failed: {exc}", flush=True)
    if (out / "ref.npz").exists():
        return
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    ids = prompt_ids()
    with torch.no_grad():
        logits = model(torch.tensor(ids)).logits.float().numpy()
        greedy = model.generate(
            torch.tensor(ids), do_sample=False, max_new_tokens=NEW, min_new_tokens=NEW, pad_token_id=0
        )[0, PROMPT:].numpy()
    np.savez(out / "ref.npz", ids=ids, logits=logits, greedy=greedy)
    print(f"{name}: {time.perf_counter() - t0:.1f} s", flush=True)


def main() -> None:
    from checkpoints import TEXT
    from family_checkpoints import BUILDERS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--output", type=Path, required=True)
    ap.add_argument("--families", nargs="*", default=sorted(BUILDERS))
    args = ap.parse_args()
    root = args.output / "families"
    root.mkdir(parents=True, exist_ok=True)
    text = args.output / "text.txt"
    text.write_text(TEXT * 8, encoding="utf-8")
    for name in args.families:
        if not (root / name / "ref.npz").exists():
            shutil.rmtree(root / name, ignore_errors=True)
        prepare(name, root / name, text)


if __name__ == "__main__":
    main()
