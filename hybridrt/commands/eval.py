"""`hybridrt eval MODEL --text FILE [--window N --stride N] [--json]`: perplexity and bits
per byte, computed by the runtime from the ONNX directory (torch-free)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import GenerationError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="negative log-likelihood, perplexity and bits per byte over a text file")
    p.add_argument("model", help="exported directory, or 'default'")
    p.add_argument("--text", required=True, type=Path, help="UTF-8 text file")
    p.add_argument("--window", type=int, help="tokens per window (default: min(max length, 1024))")
    p.add_argument("--stride", type=int, help="tokens between window starts (default: window / 2)")
    p.add_argument("--provider", default="auto", help="execution provider: auto, cpu, cuda, ...")
    p.add_argument("--threads", type=int, help="CPU intra-op threads")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def read_text(path: Path) -> str:
    from ..runtime.input_checks import read_utf8

    if path.is_dir():
        raise GenerationError(f"--text {path} is a directory; give a UTF-8 text file")
    text = read_utf8(path, "text file", hint="; convert it first")
    if not text.strip():
        raise GenerationError(f"{path} is empty; nothing to evaluate")
    return text


def run(args: argparse.Namespace) -> int:
    from ..runtime import load
    from ..runtime.evaluate import eval_settings, evaluate
    from ..runtime.text import need_tokenizer
    from .common import Ticker, model_dir

    text = read_text(args.text)
    model = load(model_dir(args.model), args.provider, threads=args.threads)
    window, stride = eval_settings(model, args.window, args.stride)  # errors before any progress output
    n = len(need_tokenizer(model.tokenizer).encode(text, add_special_tokens=False).ids)
    if sys.stderr.isatty():
        from tqdm import tqdm

        with tqdm(total=max(n - 1, 0), unit="tok", desc="eval", file=sys.stderr) as bar:
            result = evaluate(model, text, window, stride, progress=bar.update)
    else:  # a log: plain lines, no carriage returns
        with Ticker() as say:
            say(f"eval: scoring {max(n - 1, 0)} tokens (window {window}, stride {stride})")
            result = evaluate(model, text, window, stride)
    result |= {"model": str(model.path), "text": str(args.text)}
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{args.text}: {result['tokens']} tokens, {result['bytes']} bytes | NLL {result['nll_per_token']:.4f} "
            f"nats/token | perplexity {result['perplexity']:.3f} | {result['bits_per_byte']:.4f} bits/byte "
            f"(window {result['window']}, stride {result['stride']})"
        )
    return 0
