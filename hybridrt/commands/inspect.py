"""`hybridrt inspect DIR`: architecture, states, files, provenance and parity figures."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="describe an exported model directory")
    p.add_argument("model", help="exported directory (holding hybridrt.json)")


def run(args: argparse.Namespace) -> int:
    from ..graphs.inspect import describe

    print(describe(args.model))
    return 0
