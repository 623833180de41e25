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
    rec = "default: the model's recommended value, else"
    p.add_argument("--max-new-tokens", type=int, help=f"tokens to generate at most ({rec} {DEFAULTS.max_new_tokens})")
    p.add_argument("--min-new-tokens", type=int, help=f"tokens before EOS may end the text ({rec} 0)")
    p.add_argument(
        "--do-sample",
        action=argparse.BooleanOptionalAction,
        help="sample (--do-sample) or decode greedily (--no-do-sample); default: sample when --temperature, "
        "--top-k or --top-p is given, else the model's recommendation, else greedy",
    )
    p.add_argument(
        "--temperature", type=float, help="sampling temperature > 0; 0 means greedy (default: 1 when sampling)"
    )
    p.add_argument("--top-k", type=int, help="sample from the k most likely tokens (default: off)")
    p.add_argument(
        "--top-p", type=float, help="sample from the smallest set holding this probability mass (default: off)"
    )
    p.add_argument("--repetition-penalty", type=float, help=f"> 1 discourages repeats ({rec} 1.0 = off)")
    p.add_argument(
        "--presence-penalty", type=float, help="in [-2, 2]: subtracted from a generated token's logit (0 = off)"
    )
    p.add_argument(
        "--frequency-penalty", type=float, help="in [-2, 2]: times how often a token was generated (0 = off)"
    )
    p.add_argument("--seed", type=int, help="seed for sampling (default: a fresh one each run)")
    p.add_argument("--stop", action="append", dest="stop_strings", help="stop after this string (repeatable)")
    p.add_argument(
        "--provider", default="auto", help="execution provider: auto, cpu, cuda, acl, xnnpack, or a full provider name"
    )
    p.add_argument("--allow-fallback", action="store_true", help="run on CPU if the provider is missing")
    p.add_argument("--threads", type=int, help="CPU intra-op threads")
    p.add_argument("--no-stream", action="store_true", help="print the whole text at the end")
    p.add_argument("--num-beams", type=int, help="beam search over this many beams (printed at the end; default 1)")
    p.add_argument("--num-return-sequences", type=int, help="with beams: the best this many, each after a '# n' line")
    p.add_argument("--length-penalty", type=float, help="with beams: finished scores / length ** this (default 1.0)")
    p.add_argument(
        "--early-stopping",
        choices=["true", "false", "never"],
        help="with beams: when the search ends, as transformers (default false)",
    )
    p.add_argument(
        "--assistant", help="exported draft model of the same tokenizer: decode speculatively (same greedy output)"
    )
    p.add_argument(
        "--num-assistant-tokens",
        type=int,
        help=f"drafted tokens per round to begin with ({DEFAULTS.num_assistant_tokens})",
    )


def run(args: argparse.Namespace) -> int:
    import os

    from ..runtime import load, share_thread_pool
    from .common import model_dir, write_stream

    if args.assistant is not None:  # two sessions taking turns: one thread pool for both
        share_thread_pool(args.threads or os.cpu_count() or 1, strict=False)
    model = load(model_dir(args.model), args.provider, allow_fallback=args.allow_fallback, threads=args.threads)
    if args.assistant is not None:
        draft = load(model_dir(args.assistant), args.provider, allow_fallback=args.allow_fallback, threads=args.threads)
    names = ("max_new_tokens", "min_new_tokens", "do_sample", "temperature", "top_k", "top_p")
    penalties = ("repetition_penalty", "presence_penalty", "frequency_penalty")
    # Flags left out keep the model's recommended values (its manifest's `generation`).
    beams = ("num_beams", "num_return_sequences", "length_penalty")
    given = (*names, *penalties, "seed", "stop_strings", "num_assistant_tokens", *beams)
    kwargs = {k: getattr(args, k) for k in given if getattr(args, k) is not None}
    if args.early_stopping is not None:
        kwargs["early_stopping"] = {"true": True, "false": False}.get(args.early_stopping, args.early_stopping)
    if args.assistant is not None:
        kwargs["assistant_model"] = draft
    if (args.num_beams or 1) > 1:  # beam search answers once the search ends
        out, stats = model.generate_with_stats(args.prompt, **kwargs)
        texts = out if isinstance(out, list) else [out]
        for i, text in enumerate(texts):
            print(f"# {i + 1}\n{text}" if len(texts) > 1 else text)
    elif args.no_stream:
        text, stats = model.generate_with_stats(args.prompt, **kwargs)
        print(text)
    else:
        stats = write_stream(model.stream(args.prompt, **kwargs))
    print(
        f"{stats.new_tokens} tokens on {', '.join(model.providers)}: prefill {stats.prompt_tokens} tokens in "
        f"{stats.prefill_ms:.1f} ms, decode {stats.decode_tokens_per_s:.1f} tokens/s"
        + (f", {100 * stats.acceptance_rate:.0f}% of {stats.draft_tokens} drafted tokens kept" if stats.rounds else ""),
        file=sys.stderr,
    )
    return 0
