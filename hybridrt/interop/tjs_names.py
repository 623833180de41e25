"""transformers.js's names for each family's states, and its config.json, as data.

transformers.js 4.3.1 (npm `@huggingface/transformers`) finds a causal LM's cache tensors by
name: configs.js `getCacheNames` lists them from config.json's model_type and layer_types,
modeling_utils.js `getPastKeyValues` renames each call's presents to the next call's pasts, and
`addPastKeyValues` starts a sequence with zeros of the shapes the graph declares (`batch_size`
resolved, every other symbolic dimension 0). So the names and config.json must be
transformers.js's; what a state holds, and in which layout, is the graph's own. Per layer i:

  key / value  past_key_values.{i}.key / .value   -> present.{i}.key / .value
  conv         past_conv.{i}                      -> present_conv.{i}
               OLMo Hybrid: past_conv.{i}.query / .key / .value (one conv per q, k and v:
               hybridrt's one conv state over q, k and v, split by channels)
  ssm          past_ssm.{i}                       -> present_ssm.{i}        (Mamba2)
               past_recurrent.{i}                 -> present_recurrent.{i}  (Gated DeltaNet)

`FAMILIES` maps each model_type the layout writes to its `TjsFamily`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ExportError
from ..graphs.contract import TensorSpec

KV_PAST, KV_PRESENT = "past_key_values.{i}.{state}", "present.{i}.{state}"
TOKEN_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id")


@dataclass(frozen=True)
class Part:
    """One transformers.js tensor of a hybridrt state: its names, and the channels (axis 1) of
    the state it holds; (0, None) for the whole state."""

    past: str
    present: str
    start: int = 0
    stop: int | None = None


@dataclass(frozen=True)
class TjsFamily:
    """How transformers.js names one family's states and reads its config.json.

    stems: hybridrt state name (key, value, conv, ssm) -> transformers.js's cache stem.
    layer_names: config.json layer_types entry by hybridrt mixer kind, else by FFN kind
    (Nemotron-H's layers without a mixer); None: write no layer_types (Falcon-H1: with none,
    getCacheNames gives every layer both its Mamba and its attention caches).
    conv_parts: the conv state's parts, in channel order, with their sizes from the language
    model's config (OLMo Hybrid).
    text_type, architecture: the language model's model_type and the architecture written
    (None: the checkpoint's); wrapper: the model_type config.json names with the language
    model under text_config (Qwen3.5 MoE: transformers.js has no causal LM for its text type).
    """

    stems: dict[str, str]
    layer_names: dict[str, str] | None
    conv_parts: Callable[[dict[str, Any]], tuple[tuple[str, int], ...]] | None = None
    text_type: str | None = None
    architecture: str | None = None
    wrapper: str | None = None

    def parts(self, spec: TensorSpec, text: dict[str, Any]) -> list[Part]:
        """The transformers.js tensors of the state `spec` (one, or the conv's parts)."""
        if spec.kind not in self.stems:
            raise ExportError(f"transformers.js has no cache name for a {spec.kind!r} state ({spec.name})")
        i, stem = spec.layer, self.stems[spec.kind]
        if spec.kind in ("key", "value"):
            return [Part(KV_PAST.format(i=i, state=stem), KV_PRESENT.format(i=i, state=stem))]
        if spec.kind != "conv" or self.conv_parts is None:
            return [Part(f"past_{stem}.{i}", f"present_{stem}.{i}")]
        parts, start = [], 0
        for name, size in self.conv_parts(text):
            parts.append(Part(f"past_{stem}.{i}.{name}", f"present_{stem}.{i}.{name}", start, start + size))
            start += size
        if start != spec.dims[1]:
            raise ExportError(f"{spec.name} has {spec.dims[1]} channels; q, k and v make {start}")
        return parts

    def layer_types(self, kinds: list[str], ffns: list[str]) -> list[str] | None:
        """config.json's layer_types for hybridrt's mixer and FFN kinds, layer by layer."""
        if self.layer_names is None:
            return None
        names = self.layer_names
        missing = [k for k, f in zip(kinds, ffns, strict=True) if k not in names and f not in names]
        if missing:
            raise ExportError(f"transformers.js has no layer type for hybridrt's {missing[0]!r} layers")
        return [names.get(k) or names[f] for k, f in zip(kinds, ffns, strict=True)]

    def config(self, hf: dict[str, Any], layer_types: list[str] | None) -> dict[str, Any]:
        """config.json for transformers.js: the language model's config (a multimodal
        checkpoint's text_config) with layer_types in its names, under `wrapper` if set."""
        text = dict(hf.get("text_config") or hf)
        text |= {k: hf[k] for k in TOKEN_FIELDS if k in hf and k not in text}
        if self.text_type is not None:
            text["model_type"] = self.text_type
        if layer_types is None:
            text.pop("layer_types", None)
            text.pop("layers_block_type", None)
        else:
            text["layer_types"] = layer_types
        if self.wrapper is None:
            config = text
        else:
            config = {"model_type": self.wrapper, "text_config": text} | {k: text[k] for k in TOKEN_FIELDS if k in text}
        if self.architecture is not None:
            config["architectures"] = [self.architecture]
        return config


def _olmo_conv(text: dict[str, Any]) -> tuple[tuple[str, int], ...]:
    """OLMo Hybrid's q, k and v convs (its q_conv1d, k_conv1d, v_conv1d), as hybridrt merges them."""
    qk = text["linear_num_key_heads"] * text["linear_key_head_dim"]
    v = text["linear_num_value_heads"] * text["linear_value_head_dim"]
    return (("query", qk), ("key", qk), ("value", v))


_KV = {"key": "key", "value": "value"}
# LFM2 and LFM2-MoE: short conv + attention ("conv" / "full_attention").
SHORT_CONV = TjsFamily(_KV | {"conv": "conv"}, {"conv": "conv", "attention": "full_attention"})
# Granite 4.0 H, Nemotron-H: Mamba2 + attention ("mamba" / "attention"; transformers writes
# "linear_attention" / "full_attention", with which getCacheNames finds no cache); Nemotron-H's
# MLP and MoE layers carry no state.
MAMBA2 = _KV | {"conv": "conv", "ssm": "ssm"}
MAMBA2_ATTENTION = TjsFamily(
    MAMBA2, {"mamba2": "mamba", "attention": "attention", "relu2_mlp": "mlp", "nemotron_moe": "moe"}
)
# Gated DeltaNet + attention ("linear_attention" / "full_attention").
GATED_DELTA = _KV | {"conv": "conv", "ssm": "recurrent"}
GDN_NAMES = {"gated_delta": "linear_attention", "attention": "full_attention", "post_norm_attention": "full_attention"}

FAMILIES: dict[str, TjsFamily] = {
    "llama": TjsFamily(_KV, None),  # attention only: getCacheNames counts num_hidden_layers
    "lfm2": SHORT_CONV,
    "lfm2_moe": SHORT_CONV,
    "granitemoehybrid": MAMBA2_ATTENTION,
    "nemotron_h": MAMBA2_ATTENTION,
    # attention beside Mamba2 in every layer: no layer_types, so each layer gets all four caches
    "falcon_h1": TjsFamily(MAMBA2, None),
    "qwen3_next": TjsFamily(GATED_DELTA, GDN_NAMES),
    "olmo_hybrid": TjsFamily(GATED_DELTA, GDN_NAMES, conv_parts=_olmo_conv),
    # The multimodal checkpoint's language model alone, as the text checkpoint (a
    # Qwen3_5ForConditionalGeneration config makes transformers.js load embed_tokens and
    # decoder_model_merged sessions instead of onnx/model.onnx).
    "qwen3_5_text": TjsFamily(GATED_DELTA, GDN_NAMES, text_type="qwen3_5_text", architecture="Qwen3_5ForCausalLM"),
    "qwen3_5_moe_text": TjsFamily(
        GATED_DELTA,
        GDN_NAMES,
        text_type="qwen3_5_moe_text",
        architecture="Qwen3_5MoeForCausalLM",
        wrapper="qwen3_5_moe",
    ),
}
FAMILIES["qwen3_5"] = FAMILIES["qwen3_5_text"]
FAMILIES["qwen3_5_moe"] = FAMILIES["qwen3_5_moe_text"]
