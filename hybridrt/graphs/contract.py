"""The graph contract, declared once as data and read by export, runtime, quantization, tests.

One graph serves prompt and decode. Inputs: `input_ids` int64 [batch, seq],
`attention_mask` int64 [batch, past_len + seq] (1 = token, 0 = left padding),
`position_ids` int64 [batch, seq] when the model uses rotary positions, then one `past.*`
tensor per state. Outputs: `logits` float32 [batch, seq, vocab] for every position of the
call, then one `present.*` per state, in the same order as the pasts.

States by mixer kind (layer index i), as `hybridrt.kinds.LAYER_KINDS` declares them:
  attention  past.{i}.key / past.{i}.value   [batch, kv_heads, past_len, head_dim]  grows per token
  mamba      past.{i}.conv [batch, d_inner, d_conv-1], past.{i}.ssm [batch, d_inner, d_state]
  mamba2     past.{i}.conv [batch, conv_dim, d_conv-1], past.{i}.ssm [batch, heads, head_dim, d_state]
             (conv_dim = d_inner + 2 groups d_state: x, B and C share one conv)
  conv       past.{i}.conv [batch, hidden, conv_kernel-1]  (LFM2's short conv)
  (docs/adding-an-architecture.md lists every kind.)
A fresh sequence starts from zeros and a past of length 0.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..config import HybridConfig
from ..kinds import LENGTH, layer_kind

Dim = str | int


@dataclass(frozen=True)
class TensorSpec:
    """name, symbolic dims (str) or fixed sizes (int), dtype name, and what it is."""

    name: str
    dims: tuple[Dim, ...]
    dtype: str
    kind: str
    layer: int | None = None

    @property
    def grows(self) -> bool:
        """KV tensors grow by one row per token; SSM and conv states keep their size."""
        return "past_len" in self.dims or "total_len" in self.dims

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"dims": list(self.dims)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TensorSpec:
        return cls(d["name"], tuple(d["dims"]), d["dtype"], d["kind"], d.get("layer"))


def _layer_states(cfg: HybridConfig, i: int, kind: str, prefix: str, length: str) -> list[TensorSpec]:
    """The states `kinds.LAYER_KINDS[kind]` declares, as tensors of layer i."""
    return [
        TensorSpec(
            f"{prefix}.{i}.{s.name}",
            ("batch", *(length if d == LENGTH else d for d in s.dims(cfg))),
            s.dtype,
            s.name,
            i,
        )
        for s in layer_kind(kind).states
    ]


def past_specs(cfg: HybridConfig) -> list[TensorSpec]:
    return [s for i, k in enumerate(cfg.layer_types) for s in _layer_states(cfg, i, k, "past", "past_len")]


def present_specs(cfg: HybridConfig) -> list[TensorSpec]:
    return [s for i, k in enumerate(cfg.layer_types) for s in _layer_states(cfg, i, k, "present", "total_len")]


def input_specs(cfg: HybridConfig) -> list[TensorSpec]:
    specs = [
        TensorSpec("input_ids", ("batch", "seq"), "int64", "input_ids"),
        TensorSpec("attention_mask", ("batch", "total_len"), "int64", "attention_mask"),
    ]
    if cfg.uses_positions:
        specs.append(TensorSpec("position_ids", ("batch", "seq"), "int64", "position_ids"))
    return specs + past_specs(cfg)


def output_specs(cfg: HybridConfig) -> list[TensorSpec]:
    return [TensorSpec("logits", ("batch", "seq", cfg.vocab_size), "float32", "logits")] + present_specs(cfg)


def present_name(past_name: str) -> str:
    return "present." + past_name.removeprefix("past.")


def state_bytes_per_sequence(spec: TensorSpec, dtype_bytes: int = 4) -> int:
    """Bytes of one sequence's state; for growing KV tensors, bytes per token."""
    n = dtype_bytes
    for d in spec.dims:
        if isinstance(d, int):
            n *= d
    return n
