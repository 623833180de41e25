"""`hybridrt package-lambda MODEL -o OUT [--python 3.12] [--bytecode-python PATH] [--force]`.

Packages an exported model and the runtime-only hybridrt for AWS Lambda: OUT/lambda.zip (a zip
deployment), OUT/Dockerfile with the hybridrt wheel and OUT/model/ (a container image), and
OUT/sizes.json. "default" exports the default model first when its cached export is missing,
which needs the `export` extra (torch); the Lambda itself never exports. See
hybridrt/deploy/lambda_package.py and docs/deployment.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..deploy.lambda_package import DEFAULT_PYTHON, LAMBDA_LIMIT, PLATFORMS


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("package-lambda", help="package a model for AWS Lambda (zip deployment and container image)")
    p.add_argument("model", help="exported ONNX directory (holding hybridrt.json and model.onnx), or 'default'")
    p.add_argument("-o", "--output", metavar="OUT", required=True, type=Path, help="output directory")
    p.add_argument("--python", choices=sorted(PLATFORMS), default=DEFAULT_PYTHON, help="the Lambda Python runtime")
    p.add_argument("--bytecode-python", help="a Python of the runtime's version to compile bytecode with")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")


def run(args: argparse.Namespace) -> int:
    from ..deploy.lambda_package import package
    from .common import model_dir

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    done = package(model_dir(args.model), args.output, args.python, args.bytecode_python, force=args.force, say=say)
    mb = 1e6
    print(
        f"wrote {done.directory}: lambda.zip {done.zip_bytes / mb:.1f} MB ({done.unzipped_bytes / mb:.1f} MB "
        f"unzipped; AWS limit {LAMBDA_LIMIT / mb:.0f} MB), Dockerfile, {done.wheel}, model/"
    )
    if not done.under_lambda_limit:
        say("the unzipped size exceeds Lambda's zip limit: deploy the container image instead")
    return 0
