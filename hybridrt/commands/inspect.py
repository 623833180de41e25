"""`hybridrt inspect DIR`: architecture, states, files, provenance and parity figures."""

from __future__ import annotations

import argparse
import sys

from ..errors import GraphError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="describe an exported model directory")
    p.add_argument("model", help="exported directory (holding hybridrt.json)")
    p.add_argument("--no-verify", action="store_true", help="skip checking each file's size and sha256")


def run(args: argparse.Namespace) -> int:
    """Describe the directory, then check its files against the manifest: a damaged
    directory prints its description and exits 2 with what is wrong."""
    from pathlib import Path

    from ..graphs.inspect import describe
    from ..graphs.manifest import read_manifest, verify_files

    manifest = read_manifest(args.model)
    print(describe(args.model, manifest))
    if args.no_verify:
        return 0
    sys.stdout.flush()
    verify_files(Path(args.model), manifest)
    if not (Path(args.model) / manifest.graph_file).is_file():
        raise GraphError(f"{Path(args.model) / manifest.graph_file} is missing; re-export the model")
    print(f"check        {len(manifest.files)} files match their recorded size and sha256")
    return 0
