"""Greedy decoding through Triton Inference Server's sequence batcher, with tritonclient.

    hybridrt triton MODEL -o repo                    # writes repo/NAME (see docs/deployment.md)
    tritonserver --model-repository repo
    pip install 'tritonclient[grpc]' tokenizers
    python examples/triton_client.py --repo repo --model NAME "def fibonacci(n):"

Triton holds every state of a sequence (implicit state), so each request carries only the new
tokens and the sequence's id: the prompt with sequence_start, then one token per step, and
sequence_end on the last step, which frees the sequence's batch slot. The tokenizer and the
special tokens come from REPO/NAME/hybridrt/, which `hybridrt triton` writes. Needs numpy,
tokenizers and tritonclient (not hybridrt).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

# One request: the step's non-state inputs by name, the sequence id, start, end -> logits.
Infer = Callable[[dict[str, np.ndarray], int, bool, bool], np.ndarray]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prompt")
    p.add_argument("--repo", required=True, type=Path, help="the model repository `hybridrt triton` wrote")
    p.add_argument("--model", required=True, help="the model's name in the repository")
    p.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    p.add_argument("--url", help="server address (default: localhost:8001 for grpc, localhost:8000 for http)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--sequence-id", type=int, help="Triton correlation id (default: random)")
    args = p.parse_args(argv)
    if args.max_new_tokens < 1:
        p.error("--max-new-tokens must be >= 1")
    args.url = args.url or ("localhost:8001" if args.protocol == "grpc" else "localhost:8000")
    args.sequence_id = args.sequence_id or random.randrange(1, 2**63)
    return args


def step_feeds(config: dict[str, Any], tokens: list[int], past: int) -> dict[str, np.ndarray]:
    """The non-state inputs of one step (batch 1) for the inputs config.pbtxt lists: `tokens`
    follow `past` tokens the sequence's states have seen."""
    seq = len(tokens)
    values = {
        "input_ids": np.array([tokens], np.int64),
        "attention_mask": np.ones((1, past + seq), np.int64),  # graphs with growing KV
        "position_ids": np.arange(past, past + seq, dtype=np.int64)[None],
        "past_lengths": np.array([past], np.int64),  # graphs with fixed-size KV
        "logit_positions": np.array([seq - 1], np.int64),  # logits of the last position only
    }
    feeds = {}
    for spec in config["input"]:
        name = spec["name"]
        if name not in values:
            raise SystemExit(f"the model has an input {name!r} this client does not know")
        value = values[name]
        if "reshape" in spec and int(config.get("max_batch_size", 0)) > 0:
            value = value.reshape(1, *[int(d) for d in spec["dims"]])  # a [batch] input is sent as [batch, 1]
        feeds[name] = value
    return feeds


def generate(
    infer: Infer, config: dict[str, Any], prompt: list[int], max_new_tokens: int, eos: set[int], sequence_id: int
) -> list[int]:
    """Greedy tokens after `prompt`: one request for the prompt, then one per token."""
    out: list[int] = []
    step, past = list(prompt), 0
    for i in range(max_new_tokens):
        last = i == max_new_tokens - 1
        logits = infer(step_feeds(config, step, past), sequence_id, past == 0, last)
        token = int(np.argmax(logits[0, -1]))
        out.append(token)
        past, step = past + len(step), [token]
        if token in eos:
            if not last:  # end the sequence so that Triton frees its slot now, not after the idle timeout
                infer(step_feeds(config, step, past), sequence_id, False, True)
            break
    return out


def triton(protocol: str, url: str, model: str) -> tuple[Infer, dict[str, Any]]:
    """An Infer over tritonclient, and the model's config as Triton reports it."""
    if protocol == "grpc":
        import tritonclient.grpc as client_module

        client: Any = client_module.InferenceServerClient(url)
        config = client.get_model_config(model, as_json=True)["config"]
    else:
        import tritonclient.http as client_module

        client = client_module.InferenceServerClient(url)
        config = client.get_model_config(model)
    from tritonclient.utils import np_to_triton_dtype

    def infer(feeds: dict[str, np.ndarray], sequence_id: int, start: bool, end: bool) -> np.ndarray:
        inputs = []
        for name, value in feeds.items():
            tensor = client_module.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
        result = client.infer(
            model,
            inputs,
            outputs=[client_module.InferRequestedOutput("logits")],
            sequence_id=sequence_id,
            sequence_start=start,
            sequence_end=end,
        )
        return result.as_numpy("logits")

    return infer, config


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from tokenizers import Tokenizer

    meta = args.repo / args.model / "hybridrt"
    manifest = json.loads((meta / "hybridrt.json").read_text())
    tokenizer = Tokenizer.from_file(str(meta / "tokenizer.json"))
    special = manifest.get("special_tokens", {})
    prompt = tokenizer.encode(args.prompt).ids
    bos = special.get("bos_token_id")
    if (manifest.get("generation") or {}).get("add_bos_token") and isinstance(bos, int) and prompt[:1] != [bos]:
        prompt.insert(0, bos)
    eos = special.get("eos_token_id")
    eos_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    infer, config = triton(args.protocol, args.url, args.model)
    tokens = generate(infer, config, prompt, args.max_new_tokens, eos_ids, args.sequence_id)
    print(args.prompt + tokenizer.decode(tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main())
