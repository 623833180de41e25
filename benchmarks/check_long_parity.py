"""Exactness of the ONNX graphs on every family at long prompts and after many decode steps.

python benchmarks/check_long_parity.py [--lengths 1 37 300 2048] [--steps 1000] [--standard-ops]
    [--wide STD] [--released CONFIG.json ... [--every-expert]] [FAMILY ...]

Builds each family's tiny random checkpoint (tests/family_checkpoints.py, max length raised to
4,096 where the config has one), or with --released a released Qwen3.5 / Qwen3-Next config file
at its own widths, four layers deep (tests/family_checkpoints.make_released_gated_delta;
--every-expert routes each token to all of an MoE's experts, so that no near-tie of a random
router flips a choice between the two sides); with --wide, every 2-D weight but the embedding
redrawn at STD/sqrt(fan_in) (tests/family_checkpoints.widen_weights). Exports it (fused operators,
the default; with --standard-ops, the standard-operator graph that the transformers.js and
onnxruntime-genai layouts carry: fused_ops=False, fuse_norms=False) and measures the export's
parity report (hybridrt.export.parity.measure_parity) at the given prompt lengths and over
`--steps` decode steps from states whose rows have seen different numbers of tokens, each side
carrying its own states. Prints one row per family; exits 1 if any is above 1e-4.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main() -> int:
    from family_checkpoints import BUILDERS, make_released_gated_delta, widen_weights

    import hybridrt
    from hybridrt.export.parity import TOLERANCE, measure_parity, ort_runner
    from hybridrt.models.loading.checkpoint import load_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("families", nargs="*", default=sorted(BUILDERS))
    ap.add_argument("--lengths", type=int, nargs="+", default=[1, 37, 300, 2048])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--standard-ops", action="store_true", help="the layouts' graph (no com.microsoft scans)")
    ap.add_argument("--wide", type=float, help="redraw the 2-D weights at this std/sqrt(fan_in)")
    ap.add_argument("--released", type=Path, nargs="+", default=[], help="released config.json files")
    ap.add_argument("--every-expert", action="store_true", help="--released MoE: route each token to every expert")
    ap.add_argument("--json", type=Path, help="also write the reports here")
    args = ap.parse_args()
    reports, failed = {}, False
    print(f"{'family':<16} {'prompts':<22} {'steps':>5} {'max |dlogits|':>14} {'max |dstate|':>13} {'s':>6}")
    released = functools.partial(make_released_gated_delta, every_expert=args.every_expert)
    builders = {p.stem: functools.partial(released, config=p) for p in args.released}
    for name in builders if args.released else args.families:
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            if args.released:
                src = builders[name](Path(tmp) / "src")
            else:
                src = BUILDERS[name](Path(tmp) / "src", max_position_embeddings=4096)
            if args.wide:
                widen_weights(src, args.wide)
            fused = not args.standard_ops
            hybridrt.export_model(src, Path(tmp) / "out", fused_ops=fused, fuse_norms=fused)
            model, _ = load_model(src)
            report = measure_parity(
                model, ort_runner(Path(tmp) / "out" / "model.onnx", model), args.lengths, decode_steps=args.steps
            )
        reports[name] = report
        failed |= not report["passed"]
        prompts = ",".join(str(c["seq"]) for c in report["prompt"])
        print(
            f"{name:<16} {prompts:<22} {report['decode']['steps']:>5} {report['max_abs_logits']:>14.2e} "
            f"{report['max_abs_state']:>13.2e} {time.perf_counter() - t0:>6.0f}",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(reports, indent=2))
    print(f"tolerance {TOLERANCE}: {'FAILED' if failed else 'all passed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
