"""`hybridrt quantize MODEL -o OUT --mode int8-static|int8-dynamic|int4|int8-weight [...]`.

Writes a quantized copy of an exported directory and prints its quality report against the
float parent; a --max-ppl-ratio or --min-greedy-agreement gate that fails exits non-zero
with nothing written.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import QuantizationError
from ..quantization.auto import OBJECTIVES
from ..quantization.modes import ALGOS, CALIB_METHODS, KV_DTYPES, MODES, QuantConfig

if TYPE_CHECKING:
    from ..graphs.manifest import Manifest

DEFAULTS = QuantConfig()
BLOCK_SIZE_NOTE = (
    "onnxruntime keeps 2 floats a block in memory, so at int4 64 streams 5 bits a weight instead of 6: "
    "faster decode, further from float (docs/quantization.md)"
)


def add_block_size(p: argparse._ActionsContainer, modes: str) -> None:
    """The --block-size option of `quantize` and `export --quantize`; `modes`: which it applies to."""
    p.add_argument(
        "--block-size", type=int, default=DEFAULTS.block_size, help=f"weights per scale ({modes}); {BLOCK_SIZE_NOTE}"
    )


def _bool(value: str) -> bool:
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("quantize", help="quantize an exported ONNX directory (int8, int4) with a quality report")
    p.add_argument("model", help="exported ONNX directory, or 'default'")
    p.add_argument("-o", "--output", required=True, help="output directory (must not exist unless --force)")
    p.add_argument("--mode", choices=list(MODES), help="; ".join(f"{k}: {v}" for k, v in MODES.items()))
    _add_auto_options(p)
    algos = ", ".join(f"{m}: {'|'.join(a)}" for m, a in ALGOS.items())
    p.add_argument(
        "--algo",
        help=f"weight-only algorithm ({algos}; default mse for int4, rtn for int8-weight). mse searches each "
        "4-bit block's scale for the least squared error, in symmetric blocks (closer to float than rtn's zero "
        "points, and the faster symmetric kernel); rtn rounds to nearest, with zero points unless --symmetric. "
        "hqq's float zero points have no int8 kernel in onnxruntime's CPU MatMulNBits: closer to float, several "
        "times slower there. awq (with --calibration) scales each weight's input channels by its activations on "
        "the text before mse's search, and divides the inputs back (one Mul a node)",
    )
    add_block_size(p, "weight-only modes")
    p.add_argument(
        "--accuracy-level",
        type=int,
        default=DEFAULTS.accuracy_level,
        help="MatMulNBits compute: 4 = int8 activations (fast CPU kernels), 0 = float (weight-only modes)",
    )
    p.add_argument(
        "--symmetric",
        action="store_true",
        help="rtn/gptq blocks with a scale and no zero point (as llama.cpp's q4_0; faster 4-bit kernels); "
        "int4's default mse blocks are symmetric already",
    )
    p.add_argument(
        "--vocab-bits",
        type=int,
        default=DEFAULTS.vocab_bits,
        choices=(4, 8),
        help="bits of the embedding table and LM head, stored block-wise and once when tied (default 8)",
    )
    p.add_argument(
        "--kv-dtype",
        default=DEFAULTS.kv_dtype,
        choices=KV_DTYPES,
        help="attention KV buffers: int8 stores them with per-channel scales calibrated on --calibration text "
        "(a quarter of float32's memory); float16 (with --mode float16) runs attention in float16 with float16 "
        "buffers, which onnxruntime's CUDA kernel attends on the GPU; float32 keeps the export's",
    )
    _add_calibration_options(p)
    _add_report_options(p)
    p.add_argument("--force", action="store_true", help="replace an existing output directory")
    p.add_argument("--json", action="store_true", help="print the manifest's quantization record as JSON")


HQQ_NOTE = (
    "note: hqq keeps float zero points, which onnxruntime's CPU MatMulNBits runs through its slow "
    "fallback path (no int8 kernel): expect decode several times slower on the CPU than --algo rtn "
    "(docs/quantization.md, rtn, hqq or gptq)"
)


def _add_calibration_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--calib-method", default=DEFAULTS.calib_method, choices=CALIB_METHODS, help="int8-static ranges")
    p.add_argument("--calibration", nargs="+", type=Path, default=[], metavar="PATH", help="text or JSONL files")
    p.add_argument("--samples", type=int, default=DEFAULTS.samples, help="calibration windows")
    p.add_argument("--seq-len", type=int, default=DEFAULTS.seq_len, help="tokens per calibration window")
    p.add_argument("--decode-steps", type=int, default=DEFAULTS.decode_steps, help="decode-step feeds per window")
    p.add_argument("--exclude", action="append", default=[], metavar="PATTERN", help="keep matching nodes float")
    p.add_argument("--include", action="append", default=[], metavar="PATTERN", help="quantize matching nodes")
    p.add_argument(
        "--float-activations",
        action="append",
        metavar="PATTERN",
        help="int8-static: matching MatMuls keep a float input and get 8-bit block-wise weights "
        "(repeatable; replaces the default list: */mixer/out_proj/*, */ffn/down_proj/*; 'none' for no such node)",
    )
    p.add_argument(
        "--keep-float-default",
        type=_bool,
        default=DEFAULTS.keep_float_default,
        metavar="BOOL",
        help="apply the default keep-float list (SSM scan, dt, norms, conv, router); false drops it",
    )


def _add_auto_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--auto",
        action="store_true",
        help="instead of --mode: build the candidates that fit --budget-mb, drop those that fail a gate, keep the "
        "fastest (--objective) by measurement on this machine, and write it with its plan (plan.json)",
    )
    p.add_argument(
        "--plan", type=Path, metavar="PLAN_JSON", help="write a plan's chosen candidate again, measuring nothing"
    )
    p.add_argument(
        "--recheck",
        action="store_true",
        help="measure the model an --auto run wrote at -o again (quality against MODEL, speed) on this machine and "
        "say whether its plan still holds (exit 1 if a gate fails now)",
    )
    p.add_argument("--budget-mb", type=float, help="--auto: weights plus the states and KV of --context x --batch")
    p.add_argument("--context", type=int, default=2048, help="--auto: tokens per sequence the budget holds")
    p.add_argument("--batch", type=int, default=1, help="--auto: sequences the budget holds")
    p.add_argument("--objective", default="decode", choices=OBJECTIVES, help="--auto: what the winner is best at")
    p.add_argument("--candidates", help="--auto: comma-separated candidate names to try (default: all)")
    p.add_argument("--max-nll-delta", type=float, help="--auto: drop a candidate whose NLL rises more than this")
    p.add_argument("--max-kl", type=float, help="--auto: drop a candidate whose mean KL to float exceeds this")


def _add_report_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--eval-text", type=Path, help="held-out text for the report (default: calibration text left over)")
    p.add_argument("--eval-tokens", type=int, default=DEFAULTS.eval_tokens, help="held-out tokens the report scores")
    p.add_argument(
        "--agreement-prompts", type=int, default=DEFAULTS.agreement_prompts, help="prompts for greedy agreement"
    )
    p.add_argument("--max-ppl-ratio", type=float, help="fail if perplexity(quantized) / perplexity(float) exceeds this")
    p.add_argument("--min-greedy-agreement", type=float, help="fail if greedy agreement is below this")


def run(args: argparse.Namespace) -> int:
    from ..graphs.inspect import describe_vocab
    from .common import Ticker

    if args.recheck:
        return _recheck(args)

    with Ticker() as say:
        manifest = _quantize(args, say)
    q = manifest.quantization or {}
    plan = manifest.provenance.get("plan")
    if args.json:
        print(json.dumps(q | ({"plan": plan} if plan else {})))
        return 0
    if plan:
        print(plan_table(Path(args.output) / plan["file"]))
        return 0
    r, size = q.get("report"), q["size"]
    algo = f" {q['algo']}" if q["algo"] else ""
    floats = q.get("float_activations") or {}
    mixed = f" ({len(floats)} of them with float activations)" if floats else ""
    print(
        f"{args.output}: {q['mode']}{algo}, {len(q['quantized_nodes'])} nodes quantized{mixed}, "
        f"{len(q['excluded'])} kept float | {size['bytes'] / 1e6:.2f} MB ({size['ratio']:.3f} of the float graph)"
    )
    if q["algo"] == "hqq":
        print(HQQ_NOTE)
    kv = q.get("kv_cache")
    if kv:
        print(
            f"KV cache: {kv['dtype']} in {len(kv['layers'])} attention layers, per-channel scales from "
            f"{kv['calibration_windows']} calibration windows"
        )
    v, vocab = q.get("vocab") or {}, describe_vocab(q.get("vocab"))
    if vocab:
        print(
            f"embedding/LM head: {vocab} | {v['bytes'] / 1e6:.2f} MB (float {v['parent_bytes'] / 1e6:.2f} MB); "
            f"other weights {(size['bytes'] - v['bytes']) / 1e6:.2f} MB"
        )
    if r is None:
        print(f"no quality report: {q.get('report_skipped')}")
        return 0
    print(
        f"vs float on {r['tokens']} held-out tokens: NLL {r['nll_quantized']:.4f} (Δ {r['nll_delta']:+.4f}) | "
        f"perplexity ratio {r['ppl_ratio']:.4f} | mean KL {r['mean_kl']:.2e} | greedy agreement "
        f"{r['greedy_agreement']:.3f} ({r['prompts']} prompts x {r['greedy_tokens']} tokens)"
    )
    sys.stdout.flush()
    return 0


def _quantize(args: argparse.Namespace, say: Callable[[str], None]) -> Manifest:
    from ..quantization import auto, plan
    from ..quantization.api import quantize
    from .common import model_dir

    chosen = [args.auto, args.plan is not None, args.mode is not None]
    if sum(chosen) != 1:
        raise QuantizationError("give one of --mode MODE, --auto, or --plan PLAN_JSON")
    if args.plan is not None:
        return plan.replay(model_dir(args.model), args.output, args.plan, force=args.force, progress=say)
    # What --auto and --mode both take: the texts, the calibration windows, the report's size.
    common = {
        "calibration": args.calibration,
        "eval_text": args.eval_text,
        "samples": args.samples,
        "seq_len": args.seq_len,
        "eval_tokens": args.eval_tokens,
        "agreement_prompts": args.agreement_prompts,
        "force": args.force,
        "progress": say,
    }
    if args.auto:
        return auto.choose(
            model_dir(args.model),
            args.output,
            budget_bytes=None if args.budget_mb is None else int(args.budget_mb * 2**20),
            context=args.context,
            batch=args.batch,
            gates=auto.Gates(args.max_ppl_ratio, args.max_nll_delta, args.max_kl, args.min_greedy_agreement),
            objective=args.objective,
            only=None if args.candidates is None else [c.strip() for c in args.candidates.split(",")],
            **common,
        )
    return quantize(
        model_dir(args.model),
        args.output,
        args.mode,
        algo=args.algo,
        block_size=args.block_size,
        accuracy_level=args.accuracy_level,
        symmetric=args.symmetric,
        vocab_bits=args.vocab_bits,
        kv_dtype=args.kv_dtype,
        calib_method=args.calib_method,
        decode_steps=args.decode_steps,
        exclude=args.exclude,
        include=args.include,
        float_activations=None
        if args.float_activations is None
        else [p for p in args.float_activations if p.lower() != "none"],
        keep_float_default=args.keep_float_default,
        max_ppl_ratio=args.max_ppl_ratio,
        min_greedy_agreement=args.min_greedy_agreement,
        **common,
    )


def plan_table(path: Path) -> str:
    """A plan's candidates, one line each (hybridrt quantize --auto, hybridrt inspect)."""
    plan = json.loads(path.read_text())
    budget = "none" if plan["budget_bytes"] is None else f"{plan['budget_bytes'] / 2**20:.1f} MiB"
    lines = [
        f"plan: {plan['chosen']} chosen by {plan['objective']} among {len(plan['candidates'])} candidates "
        f"(budget {budget}, context {plan['context']} x batch {plan['batch']}; {plan['machine']['cpu']}; "
        f"{plan['seconds']} s)"
    ]
    for c in plan["candidates"]:
        q, speed = c["quality"] or {}, c["speed"] or {}
        size = "-" if c["total_bytes"] is None else f"{c['total_bytes'] / 2**20:.1f} MiB"
        figures = f"ppl x{q['ppl_ratio']:.4f} KL {q['mean_kl']:.2e} agree {q['greedy_agreement']:.2f}" if q else ""
        rate = f"{speed['decode_tokens_per_s']:.1f} tok/s" if speed else ""
        lines.append(f"  {c['status']:8} {c['name']:28} {size:>11} {figures} {rate} | {c['why']}")
    return "\n".join(lines)


def _recheck(args: argparse.Namespace) -> int:
    from ..quantization.plan import recheck
    from .common import Ticker, model_dir

    if args.mode is not None or args.auto or args.plan is not None:
        raise QuantizationError("--recheck measures an existing --auto output at -o; give it alone")
    with Ticker() as say:
        result = recheck(model_dir(args.model), args.output, progress=say)
    if args.json:
        print(json.dumps(result))
    else:
        q, was = result["quality"], result["planned_quality"] or {}
        rate, planned = result["decode_tokens_per_s"], result["planned_decode_tokens_per_s"]
        speed = (
            f"{rate:.1f} decode tok/s (plan: {planned:.1f}, x{result['speed_ratio']:.2f})"
            if rate
            else "speed not planned"
        )
        verdict = "holds" if result["holds"] else "no longer holds: " + "; ".join(result["failures"])
        print(
            f"{result['chosen']}: {verdict} "
            f"| ppl x{q['ppl_ratio']:.4f} (plan x{was.get('ppl_ratio', float('nan')):.4f}), KL {q['mean_kl']:.2e} "
            f"(plan {was.get('mean_kl', float('nan')):.2e}) | {speed} | on {result['machine']['cpu']} "
            f"(plan: {result['planned_machine']['cpu']})"
        )
    return 0 if result["holds"] else 1
