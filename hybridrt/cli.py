"""The `hybridrt` command. Subcommands live in hybridrt.commands, one module each."""

from __future__ import annotations

import argparse
import importlib
import sys

from ._version import __version__
from .commands import COMMANDS
from .errors import HybridrtError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hybridrt", description=__doc__)
    parser.add_argument("--version", action="version", version=f"hybridrt {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"hybridrt.commands.{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    module = importlib.import_module(f"hybridrt.commands.{args.command}")
    try:
        return int(module.run(args) or 0)
    except HybridrtError as e:
        print(f"hybridrt: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
