"""The graph contract, declared once as data and read by export, runtime, quantization, tests.

Schema version 3. One graph serves prompt and decode. Every row of a call feeds the same
number of new tokens (no padding inside a call); rows may have seen different numbers of
tokens before it.

Inputs:
  input_ids        int64 [batch, seq]       the new tokens
  past_lengths     int64 [batch]            tokens each row's states have seen (only for
                                            models with attention: the KV write position and
                                            the rotary positions past_lengths + 0..seq-1)
  logit_positions  int64 [n_logits]         which positions of the call get logits: [seq-1]
                                            for generation, 0..seq-1 for evaluation
  past.*           one tensor per state
Outputs: `logits` float32 [batch, n_logits, vocab], then one `present.*` per state, in the
order of the pasts.

States by mixer kind (layer index i), as `hybridrt.kinds.LAYER_KINDS` declares them:
  attention  past.{i}.key / past.{i}.value   [batch, kv_heads, capacity, head_dim]
             a fixed-size buffer: the call writes positions past_lengths .. past_lengths+seq-1
             and reads 0 .. past_lengths+seq-1; the runtime binds one buffer as past and present
  mamba      past.{i}.conv [batch, d_inner, d_conv-1], past.{i}.ssm [batch, d_state, d_inner]
             (channels innermost: the one-token step of export.projections.expand_selective_scans
             broadcasts along them; schema 2 had [batch, d_inner, d_state])
  mamba2     past.{i}.conv [batch, conv_dim, d_conv-1], past.{i}.ssm [batch, heads, d_state, head_dim]
             (conv_dim = d_inner + 2 groups d_state: x, B and C share one conv)
  conv       past.{i}.conv [batch, hidden, conv_kernel-1]  (LFM2's short conv)
  (docs/adding-an-architecture.md lists every kind.)
A fresh sequence starts from zeros and past_lengths 0; `capacity` is the runtime's choice
(at least the tokens a row will hold, at most the model's max length). A fixed-size state
that the manifest lists under `in_place` (graphs.manifest.in_place_states) may be bound as past and present
in one buffer too.

`GraphContract.of(cfg)` holds one model's contract; an export builds it once and hands it to
tracing, the graph writer, the manifest and the parity check.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from ..config import HybridConfig
from ..errors import GraphError
from ..kinds import CAPACITY, layer_kind

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
    def is_kv(self) -> bool:
        """KV buffers have a `capacity` axis sized by the runtime; SSM and conv states a fixed size."""
        return CAPACITY in self.dims

    @property
    def kv_axis(self) -> int | None:
        return self.dims.index(CAPACITY) if CAPACITY in self.dims else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"dims": list(self.dims)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TensorSpec:
        return cls(d["name"], tuple(d["dims"]), d["dtype"], d["kind"], d.get("layer"))


def _layer_states(cfg: HybridConfig, i: int, kind: str, prefix: str) -> list[TensorSpec]:
    """The states `kinds.LAYER_KINDS[kind]` declares, as tensors of layer i."""
    return [
        TensorSpec(
            f"{prefix}.{i}.{s.name}",
            ("batch", *s.dims(cfg)),
            s.dtype,
            s.name,
            i,
        )
        for s in layer_kind(kind).states
    ]


def past_specs(cfg: HybridConfig) -> list[TensorSpec]:
    return [s for i, k in enumerate(cfg.layer_types) for s in _layer_states(cfg, i, k, "past")]


def present_specs(cfg: HybridConfig) -> list[TensorSpec]:
    return [s for i, k in enumerate(cfg.layer_types) for s in _layer_states(cfg, i, k, "present")]


def input_specs(cfg: HybridConfig) -> list[TensorSpec]:
    specs = [TensorSpec("input_ids", ("batch", "seq"), "int64", "input_ids")]
    if cfg.has_attention:
        specs.append(TensorSpec("past_lengths", ("batch",), "int64", "past_lengths"))
    specs.append(TensorSpec("logit_positions", ("n_logits",), "int64", "logit_positions"))
    return specs + past_specs(cfg)


def output_specs(cfg: HybridConfig) -> list[TensorSpec]:
    return [TensorSpec("logits", ("batch", "n_logits", cfg.vocab_size), "float32", "logits")] + present_specs(cfg)


@dataclass(frozen=True)
class GraphContract:
    """One model's graph contract, built once from its config (`GraphContract.of`) and handed
    to everything that traces, writes, checks or feeds the graph: the inputs and outputs in
    graph order, with the pasts and presents among them. Zero or random states for it come
    from `models.state.zero_tensors` (torch) or `graphs.feeds.zero_states` (numpy)."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @classmethod
    def of(cls, cfg: HybridConfig) -> GraphContract:
        return cls(tuple(input_specs(cfg)), tuple(output_specs(cfg)))

    @property
    def pasts(self) -> tuple[TensorSpec, ...]:
        return tuple(s for s in self.inputs if s.name.startswith("past."))

    @property
    def presents(self) -> tuple[TensorSpec, ...]:
        return tuple(s for s in self.outputs if s.name.startswith("present."))

    @property
    def input_names(self) -> list[str]:
        return [s.name for s in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [s.name for s in self.outputs]

    @property
    def takes_lengths(self) -> bool:
        """Whether the graph takes past_lengths (a model with attention)."""
        return any(s.name == "past_lengths" for s in self.inputs)

    @property
    def head_inputs(self) -> tuple[TensorSpec, ...]:
        """The inputs before the pasts: input_ids, [past_lengths,] logit_positions."""
        return tuple(s for s in self.inputs if not s.name.startswith("past."))

    def layer_pasts(self, layer: int) -> tuple[TensorSpec, ...]:
        return tuple(s for s in self.pasts if s.layer == layer)

    def layer_presents(self, layer: int) -> tuple[TensorSpec, ...]:
        return tuple(s for s in self.presents if s.layer == layer)

    def state_metadata(self) -> dict[str, str]:
        """The state description every layout writes into the ONNX model's metadata_props
        (the proposed inference-metadata convention: state pairs, not names): which input
        pairs with which output, its kind, layer, dims, dtype and reset value."""
        states = [
            {
                "input": past.name,
                "output": present.name,
                "kind": past.kind,
                "layer": past.layer,
                "dims": list(past.dims),
                "dtype": past.dtype,
                "reset": "zeros; positions past each row's past_lengths are not read" if past.is_kv else "zeros",
            }
            for past, present in zip(self.pasts, self.presents)
        ]
        return {"hybridrt.layout": "hybridrt", "hybridrt.states": json.dumps(states)}

    @property
    def kv(self) -> list[bool]:
        """Per past, whether it is a KV buffer (a capacity axis)."""
        return [s.is_kv for s in self.pasts]


def present_name(past_name: str) -> str:
    return "present." + past_name.removeprefix("past.")


# Bytes per element of the dtypes a state may have (an int8 KV cache: quantization.kv_cache).
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1}


def state_bytes_per_sequence(spec: TensorSpec) -> int:
    """Bytes of one sequence's state; for KV buffers, bytes per position of capacity."""
    if spec.dtype not in DTYPE_BYTES:
        raise GraphError(
            f"state {spec.name} has dtype {spec.dtype!r}, which this hybridrt does not know "
            f"({', '.join(DTYPE_BYTES)}); upgrade hybridrt or re-export the model"
        )
    n = DTYPE_BYTES[spec.dtype]
    for d in spec.dims:
        if isinstance(d, int):
            n *= d
    return n
