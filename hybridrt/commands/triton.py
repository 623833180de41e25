"""`hybridrt triton MODEL -o REPO [--name NAME] [--max-batch-size N] [--kv-capacity N] [--gpu]`.

Writes REPO/NAME, a model of a Triton Inference Server repository for its onnxruntime backend:
config.pbtxt with sequence batching (direct strategy, START/READY/CORRID controls) and one
zero-initialised implicit state per state of the manifest. See docs/deployment.md.
"""

from __future__ import annotations

import argparse

from ..deploy.triton import DEFAULT_KV_CAPACITY, DEFAULT_MAX_BATCH_SIZE, TritonOptions

OPTIONS = TritonOptions()


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("triton", help="write a Triton Inference Server model repository (onnxruntime backend)")
    p.add_argument("model", help="exported ONNX directory (holding hybridrt.json and model.onnx), or 'default'")
    p.add_argument("-o", "--output", required=True, help="model repository directory (other models in it are kept)")
    p.add_argument("--name", default=OPTIONS.name, help="the model's name in Triton (default: the directory's name)")
    p.add_argument(
        "--max-batch-size",
        type=int,
        default=OPTIONS.max_batch_size,
        help=f"batch slots per instance (default: {DEFAULT_MAX_BATCH_SIZE}, or 0 when an input has no batch dim)",
    )
    p.add_argument(
        "--kv-capacity",
        type=int,
        default=OPTIONS.kv_capacity,
        help=f"KV rows per sequence for fixed-size KV graphs (default: {DEFAULT_KV_CAPACITY} or the max length)",
    )
    p.add_argument("--gpu", action="store_true", help="instances on GPUs (KIND_GPU) instead of CPUs")
    p.add_argument("--instances", type=int, default=OPTIONS.instances, help="model instances")
    p.add_argument(
        "--idle-seconds",
        type=float,
        default=OPTIONS.idle_seconds,
        help="a sequence idle this long loses its slot and states",
    )
    p.add_argument("--force", action="store_true", help="replace an existing REPO/NAME")


def run(args: argparse.Namespace) -> int:
    from ..deploy.triton import write_repository
    from .common import model_dir

    options = TritonOptions(
        args.name, args.max_batch_size, args.kv_capacity, args.gpu, args.instances, args.idle_seconds
    )
    target = write_repository(model_dir(args.model), args.output, options, force=args.force)
    print(f"wrote {target}: config.pbtxt, 1/model.onnx, hybridrt/ (tokenizer and manifest for clients)")
    print(f"serve it with: tritonserver --model-repository {target.parent.resolve()}")
    return 0
