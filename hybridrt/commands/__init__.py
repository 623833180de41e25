"""CLI subcommands: each module has `add_parser(subparsers)` and `run(args) -> int`; a command's
name is its module's with "-" for "_"."""

COMMANDS = ("demo", "export", "inspect", "generate", "eval", "quantize", "bench", "serve", "triton", "package_lambda")
