"""Build a seeded random-weight checkpoint from one of the shared benchmark configs.

python scripts/make_bench_checkpoint.py ../shared/bench/configs/jamba-125m.json -o build/jamba-125m
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", type=Path, help="a Hugging Face config.json")
    ap.add_argument("-o", "--output", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    config = AutoConfig.from_pretrained(args.config)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(args.output)
    n = sum(p.numel() for p in model.parameters())
    print(f"{args.output}: {config.model_type}, {n / 1e6:.1f} M parameters")


if __name__ == "__main__":
    main()
