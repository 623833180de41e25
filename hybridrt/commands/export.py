"""`hybridrt export SRC -o OUT [--format onnx|torchscript|pt2] [--force]`."""

from __future__ import annotations

import argparse


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
        )
    print(describe(args.output, manifest))
    prov = manifest.provenance
    print(f"export took {prov['export_seconds']:.1f} s, peak RSS {prov['export_peak_rss_mb']:.0f} MB")
    return 0
