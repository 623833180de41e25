"""`hybridrt demo`: the main job on the shipped default model, end to end.

Export to ONNX (cached; rebuilt only when the package's model changes), show the parity
figure measured at export, load with the torch-free runtime, stream a completion.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

PROMPT = "def fibonacci(n):\n"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="export the shipped default model, check parity, stream a completion")
    p.add_argument("--prompt", default=PROMPT, help="prompt to complete")
    p.add_argument("--max-new-tokens", type=int, default=96, help="tokens to generate")
    p.add_argument(
        "--repetition-penalty",
        type=float,
        help="default: the model's recommended one (its generation_config.json: 1.3 for the shipped model)",
    )
    p.add_argument("--rebuild", action="store_true", help="export again even if a cached export exists")


def run(args: argparse.Namespace) -> int:
    from ..export import export  # noqa: F401 - needs the export extra: say so before any output
    from .common import Ticker

    with Ticker() as say:
        return _run(args, say)


def _run(args: argparse.Namespace, say: Callable[[str], None]) -> int:
    from ..default_model import cached_export_dir, ensure_exported
    from ..runtime import load
    from ..runtime.input_checks import check_text
    from ..runtime.sampling import GenerationConfig
    from .common import write_stream

    # The flags are checked before the export, which takes a while.
    check_text([args.prompt])
    penalty = {} if args.repetition_penalty is None else {"repetition_penalty": args.repetition_penalty}
    GenerationConfig.from_kwargs(max_new_tokens=args.max_new_tokens, **penalty)
    if args.rebuild and cached_export_dir().exists():
        import shutil

        shutil.rmtree(cached_export_dir())
    say("[1/4] export: default model -> ONNX")
    directory, fresh = ensure_exported(lambda msg: say(f"      {msg}"))
    say(f"      {'exported to' if fresh else 'cached at'} {directory}")
    from ..graphs.manifest import read_manifest

    parity = read_manifest(directory).parity
    say(
        f"[2/4] parity vs PyTorch: max |Δlogits| {parity['max_abs_logits']:.2e}, "
        f"max |Δstate| {parity['max_abs_state']:.2e} (tolerance {parity['tolerance']:g})"
    )
    model = load(directory)
    say(
        f"[3/4] runtime: {model.manifest.architecture} {model.manifest.layer_types.count('mamba')} mamba + "
        f"{model.manifest.layer_types.count('attention')} attention layers on {', '.join(model.providers)}"
    )
    say("[4/4] completion (greedy):")
    sys.stdout.write(args.prompt)
    kwargs: dict[str, Any] = {"max_new_tokens": args.max_new_tokens, "do_sample": False}
    if args.repetition_penalty is not None:
        kwargs["repetition_penalty"] = args.repetition_penalty
    # The model's recommended settings (<s> first, a repetition penalty) come with its manifest.
    stats = write_stream(model.stream(args.prompt, **kwargs))
    say(
        f"{stats.new_tokens} tokens: prefill {stats.prompt_tokens} tokens in {stats.prefill_ms:.1f} ms, "
        f"decode {stats.decode_tokens_per_s:.1f} tokens/s"
    )
    return 0
