"""Build a seeded random-weight checkpoint from one of the shared benchmark configs, the way
released checkpoints are stored: bf16 (the config's dtype), sharded safetensors with an
index, the config.json copied verbatim, tensor names as transformers 4 saved them (Granite 4.0's
experts as `input_linear`/`output_linear`, which transformers 5 renames at load). Written one
shard at a time, so a 7 B model needs no more memory than one shard (2 GB).

python benchmarks/make_bench_checkpoint.py ../shared/bench/configs/granite-h-1b.json -o build/granite-h-1b
"""

from __future__ import annotations

import argparse
import json
import re
import zlib
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

SHARD_BYTES = 2 << 30
# transformers 5's tensor names -> the names released checkpoints (saved by transformers 4) have,
# per model_type: the reverse of transformers' own conversion_mapping renames at load.
RELEASED_NAMES = {
    "granitemoehybrid": [
        (r"block_sparse_moe\.experts\.gate_up_proj$", "block_sparse_moe.input_linear.weight"),
        (r"block_sparse_moe\.experts\.down_proj$", "block_sparse_moe.output_linear.weight"),
        (r"block_sparse_moe\.router\.weight$", "block_sparse_moe.router.layer.weight"),
    ],
}


def released_name(model_type: str, name: str) -> str:
    for pattern, repl in RELEASED_NAMES.get(model_type, []):
        name = re.sub(pattern, repl, name)
    return name


def value(name: str, shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """A plausible random tensor for a parameter of this name (norms near 1, decays and
    time steps in their usual ranges, projections at 0.02)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    if name.endswith("A_log"):
        t = torch.empty(shape).uniform_(1, 16, generator=g).log()
    elif name.endswith("dt_bias"):
        t = torch.empty(shape).uniform_(-4, -1, generator=g)
    elif name.endswith(".D"):
        t = torch.ones(shape)
    elif "norm" in name and len(shape) == 1:
        t = 1 + 0.1 * torch.randn(shape, generator=g)
    elif name.endswith("bias"):
        t = 0.02 * torch.randn(shape, generator=g)
    elif "conv" in name:
        t = 0.2 * torch.randn(shape, generator=g)
    else:
        t = 0.02 * torch.randn(shape, generator=g)
    return t.to(dtype)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", type=Path, help="a Hugging Face config.json")
    ap.add_argument("-o", "--output", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default=None, help="bfloat16, float16 or float32 (default: the config's)")
    args = ap.parse_args()
    raw = json.loads(args.config.read_text())
    config = AutoConfig.from_pretrained(args.config)
    dtype = getattr(torch, args.dtype or raw.get("dtype") or raw.get("torch_dtype") or "float32")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    shapes = {released_name(config.model_type, k): tuple(v.shape) for k, v in model.state_dict().items()}
    if getattr(config, "tie_word_embeddings", False):
        shapes.pop("lm_head.weight", None)
    args.output.mkdir(parents=True, exist_ok=True)
    shards: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        n = torch.Size(shape).numel() * dtype.itemsize
        if size and size + n > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    weight_map: dict[str, str] = {}
    total = 0
    for k, names in enumerate(shards):
        file = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {name: value(name, shapes[name], dtype, args.seed) for name in names}
        save_file(tensors, str(args.output / file), metadata={"format": "pt"})
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        weight_map |= {name: file for name in names}
        del tensors
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (args.output / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (args.output / "config.json").write_text(args.config.read_text())
    n = sum(torch.Size(s).numel() for s in shapes.values())
    print(
        f"{args.output}: {config.model_type}, {n / 1e6:.1f} M parameters, {total / 1e9:.2f} GB in {len(shards)} shards"
    )


if __name__ == "__main__":
    main()
