"""How close 4-bit jamba-125m stays to its float export by block size and algorithm (notes
section 7): the KL and teacher-forced agreement of benchmarks/quant_closeness.py, on its prompts.

python docs/notes/onnxruntime-fused-ops/block_closeness.py build/bench/jamba-125m/float 32:asym 64:asym 128:asym 32:sym

Each spec is BLOCK:asym|sym[:rtn|hqq|gptq]; gptq needs a tokenizer.json in the float directory
and calibrates on build/heldout/heldout-stdlib.txt. Quantized copies go to /tmp/block-closeness.
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
import quant_closeness as qc  # noqa: E402

import hybridrt  # noqa: E402
from hybridrt.quantization import quantize  # noqa: E402

src = Path(sys.argv[1])
vocab = hybridrt.load(src).manifest.vocab_size
prompts = np.random.default_rng(0).integers(3, vocab, (qc.PROMPTS, qc.PROMPT)).tolist()
ref, ref_logits = qc.run_onnx(src, prompts, None)
for spec in sys.argv[2:]:
    block, kind, algo = (spec.split(":") + ["rtn"])[:3]
    out = Path("/tmp/block-closeness") / f"{src.parent.name}-{block}-{kind}-{algo}"
    if not (out / "hybridrt.json").exists():
        extra = {"calibration": ["build/heldout/heldout-stdlib.txt"]} if algo == "gptq" else {}
        quantize(src, out, "int4", block_size=int(block), symmetric=kind == "sym", algo=algo, **extra)
    own, logits = qc.run_onnx(out, prompts, ref)
    s = qc.scores(ref, ref_logits, own, logits)
    print(spec, f"KL {s['kl']:.4f}  forced agreement {s['forced_agreement']:.3f}", flush=True)
