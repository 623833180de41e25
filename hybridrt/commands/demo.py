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
# Until the shipped model records its recommended settings (generation_config.json), the
# demo applies them itself: documents were framed as <s> ... </s>, and it loops without a penalty.
FALLBACK_PENALTY = 1.3


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="export the shipped default model, check parity, stream a completion")
    p.add_argument("--prompt", default=PROMPT, help="prompt to complete")
    p.add_argument("--max-new-tokens", type=int, default=96, help="tokens to generate")
    p.add_argument(
        "--repetition-penalty",
        type=float,
        help=f"default: the model's recommended one, else {FALLBACK_PENALTY} (a small model loops without one)",
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
    from ..runtime.sampling import GenerationConfig
    from ..runtime.validate import check_text

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
    prompt: Any = args.prompt
    if not model.manifest.generation:
        # The default model saw each training file framed as <s> ... </s>: start like a file.
        assert model.tokenizer is not None, "the default model ships a tokenizer"
        bos = model.manifest.special_tokens.get("bos_token_id")
        prompt = ([bos] if bos is not None else []) + model.tokenizer.encode(prompt, add_special_tokens=False).ids
        kwargs.setdefault("repetition_penalty", FALLBACK_PENALTY)
    stream = model.stream(prompt, **kwargs)
    for piece in stream:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    stats = stream.stats
    say(
        f"{stats.new_tokens} tokens: prefill {stats.prompt_tokens} tokens in {stats.prefill_ms:.1f} ms, "
        f"decode {stats.decode_tokens_per_s:.1f} tokens/s"
    )
    return 0
