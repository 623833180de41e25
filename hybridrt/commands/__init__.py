"""CLI subcommands: each module has `add_parser(subparsers)` and `run(args) -> int`."""

COMMANDS = ("demo", "export", "inspect", "generate", "eval", "quantize", "bench", "serve", "triton")
