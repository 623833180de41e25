"""An int8 KV cache: GroupQueryAttention's own quantized buffers, scaled per channel.

Glossary: h_kv key/value heads, hd head dim, C KV capacity, rd rotary dims.

onnxruntime's GroupQueryAttention keeps its past/present buffers in int8 when
`k_quant_type`/`v_quant_type` is PER_CHANNEL and `kv_cache_bit_width` 8: a new key k [h_kv, hd]
is stored as clip(round(k / k_scale), -128, 127) with k_scale [1, h_kv, 1, hd], and attention
reads the stored values times the scale, for a prompt and a decode step alike (on the CPU, as
checked against numpy; tests/test_kv_int8.py checks the stored values against the float graph's;
onnxruntime documents that its CUDA kernel reads the float keys and values of a first prompt
instead). The buffers take a quarter of float32's bytes, so a server
holds four times the context per slot; on x86 the CPU kernel dequantizes as it reads, so a
decode step over 1,900 cached tokens was only 1.03-1.46x faster than with float32 and a long
prompt 1.3-1.8x slower (llama-125m; docs/quantization.md).

The scales are calibrated: the float parent runs each calibration window as a prompt, and
every channel's largest |value| among the positions it wrote, with a quarter more room, sets its
scale (1.25 max / 127). The room is measured: a value past the calibrated range is clipped, and
clipping costs far more than the coarser steps (on the default model with 96 calibration tokens,
perplexity ratio 1.044 without room, 1.006 with it; with 4,096 tokens mean KL 4.0e-5 without,
3.2e-5 with).
Rotary embedding turns each pair of channels (j, j + rd/2) by a position-dependent angle, so a
window of a few hundred tokens does not show how large one channel of a pair gets later on;
the pair's length does not change with the angle, so both channels of a pair get a bound of
that length (from the two channels' peaks): no rotated key is clipped at a later position.

A float16 buffer (GroupQueryAttention takes it with float32 activations) is not offered: on the
CPU it ran 15x slower than float32 at 128 tokens seen and 4x at 1,900 (docs/quantization.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..config import HybridConfig
from ..errors import QuantizationError
from ..graphs.contract import TensorSpec, present_name
from ..graphs.manifest import Manifest

QMAX = 127.0
HEADROOM = 1.25  # scale = HEADROOM * calibrated max / QMAX (see the module docstring)


def kv_pairs(manifest: Manifest) -> list[tuple[TensorSpec, TensorSpec]]:
    """(key, value) past specs of every attention layer, in layer order."""
    kv = [s for s in manifest.pasts if s.is_kv and s.layer is not None]
    keys = {int(s.layer or 0): s for s in kv if s.kind == "key"}
    values = {int(s.layer or 0): s for s in kv if s.kind == "value"}
    return [(keys[i], values[i]) for i in sorted(keys) if i in values]


def calibrate(model: Any, windows: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """Largest |value| per channel of every KV buffer: past name -> [h_kv, hd], over the
    positions each window wrote when `model` (a runtime Model of the float graph) ran it as a
    prompt from fresh states."""
    from ..graphs.feeds import zero_states
    from .calibration import FeedMaker

    manifest = model.manifest
    maker = FeedMaker(model.inference_session, manifest)
    kv = [s.name for pair in kv_pairs(manifest) for s in pair]
    peak: dict[str, np.ndarray] = {}
    for ids in windows:
        states = maker.advance(maker.feed(ids, zero_states(manifest.pasts, 1, len(ids)), 0))
        for name in kv:
            x = np.abs(states[name][0, :, : len(ids)]).max(axis=1)  # [h_kv, hd]
            peak[name] = np.maximum(peak[name], x) if name in peak else x
    return peak


def pair_rotary(peak: np.ndarray, rd: int, interleaved: bool = False) -> np.ndarray:
    """peak [h_kv, hd] of rotated keys -> both channels of each rotary pair get sqrt(a^2 + b^2) of
    their peaks, a bound of the pair's length and so of either channel at any angle; channels
    past rd are unchanged."""
    if rd < 2 or rd > peak.shape[-1]:
        return peak
    out = peak.copy()
    if interleaved:
        a, b = out[:, 0:rd:2], out[:, 1:rd:2]
    else:
        a, b = out[:, : rd // 2], out[:, rd // 2 : rd]
    length = np.sqrt(a.astype(np.float64) ** 2 + b.astype(np.float64) ** 2).astype(np.float32)
    a[...], b[...] = length, length
    return out


def scales(manifest: Manifest, peak: dict[str, np.ndarray], graph: Any) -> dict[str, np.ndarray]:
    """past name -> scale [1, h_kv, 1, hd] (float32): HEADROOM peak / 127, rotary pairs joined
    for the keys of a model with rotary embedding; a channel that never left zero gets a scale
    of 1."""
    cfg = HybridConfig.from_dict(manifest.config)
    interleaved = {_node_past(n, 3): _attr(n, "rotary_interleaved", 0) == 1 for n in _attention_nodes(graph)}
    out = {}
    for key, value in kv_pairs(manifest):
        k = peak[key.name]
        if cfg.uses_positions:
            k = pair_rotary(k, cfg.rotary_dim, interleaved.get(key.name, False))
        for spec, x in ((key, k), (value, peak[value.name])):
            s = np.where(x > 0, HEADROOM * x / QMAX, 1.0).astype(np.float32)
            out[spec.name] = s.reshape(1, s.shape[0], 1, s.shape[1])
    return out


def _attention_nodes(graph: Any) -> list[Any]:
    return [n for n in graph.node if n.op_type == "GroupQueryAttention" and n.domain == "com.microsoft"]


def _node_past(node: Any, index: int) -> str:
    return node.input[index] if len(node.input) > index else ""


def _attr(node: Any, name: str, default: Any) -> Any:
    from onnx import helper

    a = next((a for a in node.attribute if a.name == name), None)
    value = default if a is None else helper.get_attribute_value(a)
    return value.decode() if isinstance(value, bytes) else value


def check_attention(graph: Any, manifest: Manifest) -> None:
    """Every KV buffer is read by one GroupQueryAttention node with a float32 buffer, or a typed
    error naming the layer (plain-operator attention has no quantized cache)."""
    if not kv_pairs(manifest):
        raise QuantizationError(
            "the model has no attention layer, so there is no KV cache to quantize; keep --kv-dtype float32"
        )
    read = {_node_past(n, i): n for n in _attention_nodes(graph) for i in (3, 4)}
    for key, value in kv_pairs(manifest):
        for spec in (key, value):
            node = read.get(spec.name)
            if node is None:
                raise QuantizationError(
                    f"layer {spec.layer}'s attention is not one GroupQueryAttention node (exported with "
                    "--plain-ops, or a head size onnxruntime's kernel does not take), so its KV cache cannot be "
                    "int8; re-export without --plain-ops, or keep --kv-dtype float32"
                )
            if _attr(node, "k_quant_type", "NONE") != "NONE":
                raise QuantizationError(f"layer {spec.layer}'s KV cache is already quantized")


def quantize_kv(graph: Any, manifest: Manifest, kv_scales: dict[str, np.ndarray]) -> list[str]:
    """Rewrite the graph and the manifest's specs for int8 KV buffers, in place: each
    GroupQueryAttention reads and writes int8 with its layer's scales (initializers named after
    the KV buffer: past.{i}.key.scale), the KV inputs and outputs become int8. Returns the nodes
    rewritten."""
    from onnx import TensorProto, helper, numpy_helper

    check_attention(graph, manifest)
    taken = {t.name for t in graph.initializer} | {o for n in graph.node for o in n.output}
    rewritten = []
    for node in _attention_nodes(graph):
        key, value = _node_past(node, 3), _node_past(node, 4)
        if key not in kv_scales or value not in kv_scales:
            continue
        names = []
        for past in (key, value):
            name = f"{past}.scale"  # one per KV buffer: unique as the graph's inputs are
            if name in taken:
                raise QuantizationError(f"the graph already has a tensor named {name}; re-export it")
            graph.initializer.append(numpy_helper.from_array(kv_scales[past], name))
            names.append(name)
        inputs = list(node.input) + [""] * max(0, 17 - len(node.input))
        inputs[12], inputs[13] = names
        del node.input[:]
        node.input.extend(_trim(inputs))
        for a in [a for a in node.attribute if a.name in ("k_quant_type", "v_quant_type", "kv_cache_bit_width")]:
            node.attribute.remove(a)
        node.attribute.extend(
            [
                helper.make_attribute("k_quant_type", "PER_CHANNEL"),
                helper.make_attribute("v_quant_type", "PER_CHANNEL"),
                helper.make_attribute("kv_cache_bit_width", 8),
            ]
        )
        rewritten.append(node.name)
    tensors = set(kv_scales) | {present_name(n) for n in kv_scales}
    for info in [*graph.input, *graph.output, *graph.value_info]:
        if info.name in tensors:
            info.type.tensor_type.elem_type = TensorProto.INT8
    manifest.inputs = [_as_int8(s, tensors) for s in manifest.inputs]
    manifest.outputs = [_as_int8(s, tensors) for s in manifest.outputs]
    return rewritten


def _trim(inputs: list[str]) -> list[str]:
    while inputs and not inputs[-1]:
        inputs.pop()
    return inputs


def _as_int8(spec: TensorSpec, names: set[str]) -> TensorSpec:
    if spec.name not in names:
        return spec
    return TensorSpec(spec.name, spec.dims, "int8", spec.kind, spec.layer)


def record(manifest: Manifest, kv_scales: dict[str, np.ndarray], windows: int, nodes: list[str]) -> dict[str, Any]:
    """The manifest's account of the KV cache: dtype, scales, and what they were calibrated on."""
    layers = sorted({int(s.layer or 0) for pair in kv_pairs(manifest) for s in pair if s.name in kv_scales})
    rotary = "; rotary pairs joined" if HybridConfig.from_dict(manifest.config).uses_positions else ""
    return {
        "dtype": "int8",
        "scales": f"per channel (kv head x head dim), {HEADROOM:g} x calibrated max |value| / 127{rotary}",
        "calibration_windows": windows,
        "layers": layers,
        "nodes": nodes,
    }
