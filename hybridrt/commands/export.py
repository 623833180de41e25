"""`hybridrt export SRC -o OUT [--format onnx|torchscript|pt2] [--layout hybridrt|transformers-js]
[--quantize int4|int8-weight|int8-dynamic] [--force]`."""

from __future__ import annotations

import argparse
from pathlib import Path

# interop.layouts.LAYOUTS, the default first; written out here because importing hybridrt.export
# imports torch, which the CLI's other commands must run without (tests/test_interop_tjs.py
# checks the two agree).
LAYOUTS = ("hybridrt", "transformers-js", "onnxruntime-genai")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="export a Hugging Face checkpoint directory (or 'default') to a graph")
    p.add_argument("src", help="checkpoint directory with config.json and *.safetensors, or 'default'")
    p.add_argument("-o", "--output", required=True, help="output directory (must not exist unless --force)")
    p.add_argument(
        "--format",
        default="onnx",
        choices=["onnx", "torchscript", "pt2"],
        help="graph format; the runtime runs onnx, torchscript and pt2 are for PyTorch users",
    )
    p.add_argument(
        "--layout",
        default=LAYOUTS[0],
        choices=LAYOUTS,
        help="the directory to write: hybridrt's own (model.onnx + hybridrt.json), or the one "
        "transformers.js or onnxruntime-genai loads as it is (docs/interop.md)",
    )
    p.add_argument("--force", action="store_true", help="replace an existing output directory")
    p.add_argument("--no-validate", action="store_true", help="skip the parity check against PyTorch")
    p.add_argument(
        "--plain-ops",
        action="store_true",
        help="standard ONNX operators only (no onnxruntime com.microsoft fused ops), for other ONNX runtimes",
    )
    p.add_argument(
        "--no-fuse-norms",
        action="store_true",
        help="keep each RMSNorm as plain operators (by default they become onnxruntime's fused "
        "SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization)",
    )
    from ..quantization.direct import DIRECT_MODES
    from ..quantization.modes import QuantConfig
    from .quantize import add_block_size

    DEFAULTS = QuantConfig()

    q = p.add_argument_group("quantize while exporting (the same result as export, then `hybridrt quantize`)")
    q.add_argument("--quantize", choices=DIRECT_MODES, help="quantize each layer as it is written")
    add_block_size(q, "int4, int8-weight")
    q.add_argument(
        "--algo",
        choices=("rtn", "mse", "hqq"),
        help="int4 weights: mse (default) searches each symmetric block's scale for the least squared error; rtn "
        "rounds to nearest, with zero points unless --symmetric (the only choice for int8-weight); hqq has float "
        "zero points (no int8 kernel: slow on the CPU)",
    )
    q.add_argument("--symmetric", action="store_true", help="rtn blocks with a scale and no zero point")
    q.add_argument("--accuracy-level", type=int, default=DEFAULTS.accuracy_level, help="MatMulNBits compute level")
    q.add_argument("--vocab-bits", type=int, default=DEFAULTS.vocab_bits, choices=(4, 8), help="embedding/LM head bits")
    q.add_argument("--exclude", action="append", default=[], metavar="PATTERN", help="keep matching nodes float")
    q.add_argument(
        "--eval-text",
        type=Path,
        help="held-out text for the quality report against float (the float graph is written beside, then removed)",
    )


def run(args: argparse.Namespace) -> int:
    from .. import export_model
    from ..graphs.inspect import describe
    from .common import Ticker

    with Ticker() as say:
        manifest = export_model(
            args.src,
            args.output,
            format=args.format,
            force=args.force,
            validate=not args.no_validate,
            fused_ops=not args.plain_ops,
            fuse_norms=not args.no_fuse_norms,
            progress=say,
            quantize=args.quantize,
            quantize_options=_options(args) if args.quantize else None,
            eval_text=args.eval_text,
            layout=args.layout,
        )
    if args.layout != LAYOUTS[0]:
        out = Path(args.output)
        files = sorted(str(f.relative_to(out)) for f in out.rglob("*") if f.is_file())
        print(f"wrote {out} ({args.layout}): {', '.join(files)}")
    else:
        print(describe(args.output, manifest))
    prov = manifest.provenance
    print(f"export took {prov['export_seconds']:.1f} s, peak RSS {prov['export_peak_rss_mb']:.0f} MB")
    return 0


def _options(args: argparse.Namespace) -> dict[str, object]:
    return {
        "algo": args.algo,
        "block_size": args.block_size,
        "symmetric": args.symmetric,
        "accuracy_level": args.accuracy_level,
        "vocab_bits": args.vocab_bits,
        "exclude": args.exclude,
    }
