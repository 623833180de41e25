"""A toy layer kind and family defined outside the package, registered the way a third
party would (tests/test_kinds.py): an exponential moving average of a projection,
h_t = a * h_{t-1} + (1 - a) * W x_t, with a per-channel learned decay a."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from hybridrt.config import HybridConfig
from hybridrt.kinds import StateDecl
from hybridrt.models.context import MixerContext
from hybridrt.models.recurrences.scan import linear_scan

EMA_STATE = StateDecl("ema", lambda c: (c.hidden_size,))


class EmaMixer(nn.Module):
    """x [b, l, d], ctx, ema [b, d] -> (y [b, l, d], ema')."""

    def __init__(self, cfg: HybridConfig, layer: int = 0, shared: nn.ModuleDict | None = None) -> None:
        super().__init__()
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)
        self.decay_logit = nn.Parameter(torch.zeros(cfg.hidden_size))
        self.chunk, self.max_len = cfg.scan_chunk, cfg.max_position_embeddings

    def forward(self, x: torch.Tensor, ctx: MixerContext, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = torch.sigmoid(self.decay_logit).expand_as(x)
        u = (1 - a) * self.proj(x)
        h, last = linear_scan(a, u, state, self.chunk, self.max_len)
        return h, last


def translate(hf: dict[str, Any]) -> HybridConfig:
    n = hf["num_hidden_layers"]
    return HybridConfig(
        model_type="toy_ema",
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        layer_types=tuple("attention" if i % 2 else "ema" for i in range(n)),
        ffn_types=("mlp",) * n,
        intermediate_size=2 * hf["hidden_size"],
        num_attention_heads=2,
        num_key_value_heads=2,
        rope_theta=10000.0,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=(2,),
        pad_token_id=0,
    )


def make_toy(directory: Path) -> Path:
    """A checkpoint directory (config.json + model.safetensors) for the toy family."""
    from hybridrt.models.decoder import HybridForCausalLM

    hf = {"model_type": "toy_ema", "vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 4}
    torch.manual_seed(0)
    model = HybridForCausalLM(translate(hf))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(hf))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(directory / "model.safetensors"))
    return directory
