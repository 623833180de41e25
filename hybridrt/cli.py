"""hybridrt: export hybrid SSM/attention language models to ONNX and run them without torch.

Start with `hybridrt demo` (export the shipped model, check parity, stream a completion);
then `hybridrt export CHECKPOINT -o DIR`, `hybridrt generate DIR "prompt"`, and `hybridrt
COMMAND --help` for each command's options. Errors are one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from typing import Any, NoReturn

from ._version import __version__
from .commands import COMMANDS
from .errors import HybridrtError

# Modules of the extras, and the extra that installs each.
EXTRAS = {
    "torch": "export",
    "onnx": "export",
    "onnxscript": "export",
    "safetensors": "export",
    "transformers": "dev",
    "starlette": "serve",
    "uvicorn": "serve",
    "prometheus_client": "serve",
    "jinja2": "serve",
}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Shows an option's default after its help, where there is a default worth showing."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            action.option_strings
            and "%(default)" not in text
            and "default" not in text
            and default not in (None, False, [], argparse.SUPPRESS)
        ):
            text += " (default: %(default)s)"
        return text


class Parser(argparse.ArgumentParser):
    """Usage errors as one line on stderr with exit code 2, like every other CLI error."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="hybridrt", description=__doc__)
    parser.add_argument("--version", action="version", version=f"hybridrt {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    for name in COMMANDS:
        importlib.import_module(f"hybridrt.commands.{name}").add_parser(sub)
    return parser


def flags(message: str, parser: argparse.ArgumentParser | None) -> str:
    """A library message in the command's terms: `max_new_tokens` -> `--max-new-tokens`,
    `do_sample=False` -> `--no-do-sample`, `(force=True)` after `--force` dropped."""
    if parser is None:
        return message
    for action in parser._actions:
        if not action.option_strings:
            continue
        negative = None
        if isinstance(action, argparse.BooleanOptionalAction):
            negative = next(o for o in action.option_strings if o.startswith("--no-"))
        flag = max((o for o in action.option_strings if o != negative), key=len)
        dest = re.escape(action.dest)
        message = re.sub(rf"\b{dest}=True\b", flag, message)
        message = re.sub(rf"\b{dest}=False\b", negative or f"no {flag}", message)
        if "_" in action.dest or action.dest in ("temperature", "seed"):
            message = re.sub(rf"(?<![-\w]){dest}\b", flag, message)
    return re.sub(r"(--[\w-]+) \(\1\)", r"\1", message)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command = _subparser(parser, args.command)
    module = importlib.import_module(f"hybridrt.commands.{args.command.replace('-', '_')}")
    try:
        code = int(module.run(args) or 0)
        sys.stdout.flush()  # inside the try: a closed pipe shows up here, not at exit
        return code
    except HybridrtError as e:
        return _fail(flags(str(e), command))
    except ModuleNotFoundError as e:
        extra = EXTRAS.get((e.name or "").split(".")[0])
        if extra is None:
            raise
        return _fail(
            f"`hybridrt {args.command}` needs the `{extra}` extra (missing module {e.name}): "
            f"pip install 'hybridrt[{extra}]'"
        )
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, and keep Python from complaining
        # again when it flushes stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return 130


def _fail(message: str) -> int:
    print(f"hybridrt: error: {' '.join(message.split())}", file=sys.stderr)
    return 2


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(name)
    return None


if __name__ == "__main__":
    sys.exit(main())
