"""`hybridrt generate MODEL PROMPT [--max-new-tokens N --temperature T ... --no-stream]`.

Streams the continuation to stdout; a last line on stderr gives prefill time and decode speed.
"""

from __future__ import annotations

import argparse
import sys

from ..runtime.sampling import GenerationConfig

DEFAULTS = GenerationConfig()


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate text with an exported model (torch-free)")
    p.add_argument("model", help="exported directory (holding hybridrt.json and model.onnx), or 'default'")
    p.add_argument("prompt", help="prompt text")
    p.add_argument("--max-new-tokens", type=int, default=DEFAULTS.max_new_tokens)
    p.add_argument("--min-new-tokens", type=int, default=DEFAULTS.min_new_tokens)
    p.add_argument("--temperature", type=float, help="sample at this temperature (0: greedy; default: greedy)")
    p.add_argument("--top-k", type=int, help="sample from the k most likely tokens")
    p.add_argument("--top-p", type=float, help="sample from the smallest set holding this probability mass")
    p.add_argument("--repetition-penalty", type=float, default=DEFAULTS.repetition_penalty)
    p.add_argument("--seed", type=int, help="seed for sampling")
    p.add_argument("--stop", action="append", dest="stop_strings", help="stop after this string (repeatable)")
    p.add_argument("--provider", default="auto", help="auto, cpu, cuda, acl, xnnpack, or a full provider name")
    p.add_argument("--allow-fallback", action="store_true", help="run on CPU if the provider is missing")
    p.add_argument("--threads", type=int, help="CPU intra-op threads")
    p.add_argument("--no-stream", action="store_true", help="print the whole text at the end")


def run(args: argparse.Namespace) -> int:
    from ..runtime import load
    from .common import model_dir

    model = load(model_dir(args.model), args.provider, allow_fallback=args.allow_fallback, threads=args.threads)
    kwargs = {
        k: getattr(args, k)
        for k in ("max_new_tokens", "min_new_tokens", "temperature", "top_k", "top_p", "repetition_penalty", "seed")
    }
    kwargs["stop_strings"] = args.stop_strings
    if args.no_stream:
        text, stats = model.generate_with_stats(args.prompt, **kwargs)
        print(text)
    else:
        stream = model.stream(args.prompt, **kwargs)
        for piece in stream:
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        stats = stream.stats
    print(
        f"{stats.new_tokens} tokens on {', '.join(model.providers)}: prefill {stats.prompt_tokens} tokens in "
        f"{stats.prefill_ms:.1f} ms, decode {stats.decode_tokens_per_s:.1f} tokens/s",
        file=sys.stderr,
    )
    return 0
