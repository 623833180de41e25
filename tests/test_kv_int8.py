"""`hybridrt quantize --kv-dtype int8`: GroupQueryAttention's int8 KV buffers with calibrated
per-channel scales (hybridrt.quantization.kv_cache)."""

from __future__ import annotations

import json
from pathlib import Path

import exports
import numpy as np
import onnx
import pytest
from checkpoints import make_llama

import hybridrt
from hybridrt.cli import main
from hybridrt.deploy.triton import TritonOptions, plan
from hybridrt.graphs.contract import state_bytes_per_sequence
from hybridrt.graphs.manifest import read_manifest
from hybridrt.quantization import QuantizationError, quantize
from hybridrt.quantization.kv_cache import pair_rotary

SMALL = exports.QUICK
PROMPT = list(range(5, 29))


def _prefill(directory: Path, capacity: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """Logits of PROMPT and a copy of every KV buffer after it."""
    stepper = hybridrt.load(directory).stepper(1, capacity)
    logits = stepper.forward(np.array([PROMPT])).copy()
    return logits, [x.copy() for x in stepper._kv_host]


def _scales(directory: Path) -> list[np.ndarray]:
    """The k_scale and v_scale of every GroupQueryAttention, in the order of the KV buffers."""
    graph = onnx.load(str(directory / "model.onnx")).graph
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
    by_past = {}
    for node in graph.node:
        if node.op_type == "GroupQueryAttention":
            by_past[node.input[3]], by_past[node.input[4]] = inits[node.input[12]], inits[node.input[13]]
    return [by_past[s.name] for s in read_manifest(directory).pasts if s.is_kv]


def test_the_graph_and_manifest_declare_int8_buffers(llama_kv8: Path) -> None:
    manifest = read_manifest(llama_kv8)
    kv = [s for s in manifest.pasts if s.is_kv]
    assert kv and all(s.dtype == "int8" for s in kv)
    assert all(s.dtype == "int8" for s in manifest.presents if s.kind in ("key", "value"))
    graph = onnx.load(str(llama_kv8 / "model.onnx")).graph
    types = {i.name: i.type.tensor_type.elem_type for i in [*graph.input, *graph.output]}
    assert all(types[s.name] == onnx.TensorProto.INT8 for s in kv)
    nodes = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    for node in nodes:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["k_quant_type"] == attrs["v_quant_type"] == b"PER_CHANNEL" and attrs["kv_cache_bit_width"] == 8
    record = manifest.quantization["kv_cache"]
    assert record["dtype"] == "int8" and record["layers"] == sorted({s.layer for s in kv})
    assert manifest.quantization["mode"] == "none" and manifest.quantization["quantized_nodes"] == []
    # a quarter of float32's bytes per position, for the memory limit and `inspect`
    parent = read_manifest(Path(manifest.quantization["parent"]["path"]))
    for ours, theirs in zip(kv, [s for s in parent.pasts if s.is_kv]):
        assert state_bytes_per_sequence(ours) * 4 == state_bytes_per_sequence(theirs)


def test_buffers_hold_the_float_keys_and_values_rounded_to_their_scales(llama_onnx: Path, llama_kv8: Path) -> None:
    """What the int8 buffers hold is the float graph's keys and values divided by their channel's
    scale and rounded: exactly so in the first attention layer (the same inputs reach it), within
    a few of the 255 steps in the later ones, whose inputs passed through int8 attention before (a
    scale of another layer or channel would be off by tens of steps, or saturate)."""
    capacity = len(PROMPT) + 4
    float_logits, float_kv = _prefill(llama_onnx, capacity)
    logits, kv = _prefill(llama_kv8, capacity)
    n = len(PROMPT)
    for i, (x, q, scale) in enumerate(zip(float_kv, kv, _scales(llama_kv8))):
        assert q.dtype == np.int8 and scale.shape == (1, x.shape[1], 1, x.shape[3])
        expected = np.clip(np.round(x[:, :, :n] / scale), -128, 127)
        err = np.abs(q[:, :, :n].astype(np.float64) - expected)
        assert err.max() <= (0 if i < 2 else 4), f"buffer {i}: {err.max()} steps from the float values rounded"
        assert err.mean() < 0.5
        assert np.abs(q[:, :, :n]).max() > 48, "scales so wide that the buffer uses few of its 255 levels"
        np.testing.assert_array_equal(q[:, :, n:], 0)
    assert np.abs(logits - float_logits).max() < 0.05 * np.abs(float_logits).max()


def test_rotary_pairs_share_their_length() -> None:
    """Both channels of a rotary pair get the pair's largest length (what either channel reaches
    at some angle); channels past the rotary dims keep their own peak."""
    peak = np.array([[3.0, 0.0, 4.0, 1.0, 7.0]], np.float32)  # rd 4: pairs (0, 2) and (1, 3)
    np.testing.assert_allclose(pair_rotary(peak, 4), [[5.0, 1.0, 5.0, 1.0, 7.0]])
    np.testing.assert_allclose(pair_rotary(peak, 4, interleaved=True), [[3.0, 3.0, 4.1231055, 4.1231055, 7.0]])
    np.testing.assert_array_equal(pair_rotary(peak, 0), peak)


def test_batched_rows_generate_as_one_at_a_time(llama_kv8: Path) -> None:
    """Each row's int8 buffer is its own: a batch of prompts of different lengths gives each
    prompt the tokens it gets alone."""
    model = hybridrt.load(llama_kv8)
    prompts = [PROMPT, PROMPT[:7], [9, 8, 7, 6, 5, 4, 3, 2, 1, 40, 41]]
    alone = [model.generate([p], max_new_tokens=10, do_sample=False)[0] for p in prompts]
    assert model.generate(prompts, max_new_tokens=10, do_sample=False) == alone


def test_default_model_stays_within_a_perplexity_ratio_of_1_01(
    default_onnx: Path, text_file: Path, tmp_path: Path
) -> None:
    """On the trained default model (one attention layer in four), with scales calibrated on
    4,096 tokens, an int8 KV cache scores held-out text within 1% of the float cache's perplexity."""
    out = tmp_path / "kv8"
    options = SMALL | {"samples": 32, "seq_len": 128, "eval_window": 192}
    manifest = quantize(default_onnx, out, "none", calibration=[text_file], kv_dtype="int8", **options)
    report = manifest.quantization["report"]
    assert report["ppl_ratio"] <= 1.01 and report["mean_kl"] < 1e-3, report


def test_int4_weights_and_an_int8_cache_in_one_run(llama_onnx: Path, text_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "q"
    code = main(
        ["quantize", str(llama_onnx), "-o", str(out), "--mode", "int4", "--kv-dtype", "int8"]
        + ["--calibration", str(text_file), "--samples", "3", "--seq-len", "32", "--eval-tokens", "192"]
    )
    assert code == 0
    manifest = json.loads((out / "hybridrt.json").read_text())
    assert manifest["quantization"]["mode"] == "int4" and manifest["quantization"]["kv_dtype"] == "int8"
    ops = {n.op_type for n in onnx.load(str(out / "model.onnx")).graph.node}
    assert "MatMulNBits" in ops
    assert len(hybridrt.load(out).generate(PROMPT, max_new_tokens=8, do_sample=False)) == 8


def test_triton_states_follow_the_cache_dtype(llama_kv8: Path) -> None:
    p = plan(read_manifest(llama_kv8), TritonOptions())
    kinds = {s.input_name: s.data_type for s in p.states}
    assert kinds and all(kinds[s.name] == "TYPE_INT8" for s in read_manifest(llama_kv8).pasts if s.is_kv)


def test_int8_cache_needs_calibration_text(llama_onnx: Path, text_file: Path, tmp_path: Path) -> None:
    with pytest.raises(QuantizationError, match="--calibration"):
        quantize(llama_onnx, tmp_path / "a", "int4", eval_text=text_file, kv_dtype="int8", **SMALL)
    with pytest.raises(QuantizationError, match="quantizes nothing"):
        quantize(llama_onnx, tmp_path / "b", "none", calibration=[text_file], **SMALL)
    with pytest.raises(QuantizationError, match="unknown KV dtype"):
        quantize(llama_onnx, tmp_path / "c", "int4", calibration=[text_file], kv_dtype="bfloat16", **SMALL)
    with pytest.raises(QuantizationError, match="goes with --mode float16"):
        quantize(llama_onnx, tmp_path / "c", "int4", calibration=[text_file], kv_dtype="float16", **SMALL)
    assert not any((tmp_path / d).exists() for d in "abc")


def test_plain_operator_attention_is_refused_by_layer(text_file: Path, tmp_path: Path) -> None:
    """A graph whose attention is plain operators (--plain-ops) has no quantized cache to use:
    refused, naming the layer, with nothing written."""
    plain = exports.export(make_llama, fused_ops=False, validate=False)
    with pytest.raises(QuantizationError, match="layer 0's attention is not one GroupQueryAttention"):
        quantize(plain, tmp_path / "out", "none", calibration=[text_file], kv_dtype="int8", **SMALL)
    assert not (tmp_path / "out").exists()


def test_direct_export_refuses_an_int8_cache(llama_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(QuantizationError, match="hybridrt quantize --kv-dtype int8"):
        hybridrt.export_model(llama_dir, tmp_path / "out", quantize="int4", quantize_options={"kv_dtype": "int8"})
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("family", ["granitemoehybrid_dense", "bamba", "zamba2"])
def test_families_keep_their_perplexity_with_an_int8_cache(exported: Path, text_file: Path, tmp_path: Path) -> None:
    """Attention without positions (Granite 4.0 H dense), rotary on half of each head (Bamba) and
    rotary inside the node over shared attention blocks (Zamba2) all take an int8 cache; the
    tiny random models score held-out text within 1% of their float cache."""
    manifest = quantize(exported, tmp_path / "kv8", "none", calibration=[text_file], kv_dtype="int8", **SMALL)
    record, report = manifest.quantization["kv_cache"], manifest.quantization["report"]
    assert record["layers"] and report["ppl_ratio"] <= 1.01, report
    rotary = hybridrt.load(exported).manifest.config["rope_theta"] is not None
    assert ("rotary pairs joined" in record["scales"]) == rotary


@pytest.mark.parametrize("family", ["mamba2"])
def test_a_model_without_attention_is_refused_before_any_work(exported: Path, text_file: Path, tmp_path: Path) -> None:
    with pytest.raises(QuantizationError, match="no attention layer.*keep --kv-dtype float32"):
        quantize(exported, tmp_path / "out", "none", calibration=[text_file], kv_dtype="int8", **SMALL)
    assert not (tmp_path / "out").exists()


def test_onnxruntime_genai_layout_refuses_an_int8_cache(llama_kv8: Path, tmp_path: Path) -> None:
    from hybridrt.errors import ExportError
    from hybridrt.interop.genai import convert

    with pytest.raises(ExportError, match="int8"):
        convert(llama_kv8, tmp_path / "genai")
    assert not (tmp_path / "genai").exists()
