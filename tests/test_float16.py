"""`hybridrt quantize --mode float16`: float16 weights and products for GPUs, with the states,
attention, scans and norms kept float32 and the graph's inputs and outputs unchanged, so the
runtime, the state batch and the server read it as they read the float graph."""

from __future__ import annotations

from pathlib import Path

import exports
import numpy as np
import onnx
import pytest
from onnx import TensorProto

import hybridrt
from hybridrt.cli import main
from hybridrt.graphs.manifest import read_manifest
from hybridrt.quantization import QuantizationError, quantize
from hybridrt.quantization.half import FLOAT32_OPS

SMALL = exports.REPORT


@pytest.fixture(scope="module", params=["jamba", "llama"])
def pair(request: pytest.FixtureRequest, text_file: Path) -> tuple[Path, Path]:
    """(float directory, its float16 conversion): jamba has Mamba1 scans, conv states and
    attention; llama attention only."""
    src = request.getfixturevalue(f"{request.param}_onnx")
    return src, exports.quantized(src, "float16", eval_text=text_file, **SMALL)


def _types(graph: onnx.GraphProto) -> dict[str, int]:
    return {v.name: v.type.tensor_type.elem_type for v in (*graph.input, *graph.output)}


def test_weights_are_float16_and_the_contract_is_unchanged(pair: tuple[Path, Path]) -> None:
    src, out = pair
    parent, half = onnx.load(str(src / "model.onnx")), onnx.load(str(out / "model.onnx"))
    assert _types(half.graph) == _types(parent.graph)  # states, logits: float32 as before
    matmul_weights = {n.input[1] for n in half.graph.node if n.op_type == "MatMul"}
    kinds = {t.name: t.data_type for t in half.graph.initializer}
    assert {kinds[w] for w in matmul_weights if w in kinds} == {TensorProto.FLOAT16}
    kept = [n for n in half.graph.node if n.op_type in FLOAT32_OPS]
    assert kept  # every hybrid and attention graph has some: norms, attention, scans
    produced = {o: n for n in half.graph.node for o in n.output}
    for node in kept:  # each reads float32: a graph input, a float32 weight, or a cast back to float
        for name in filter(None, node.input):
            source = produced.get(name)
            if source is not None and source.op_type == "Cast":
                assert next(a.i for a in source.attribute if a.name == "to") != TensorProto.FLOAT16, node.name
                # ...but never a float32 tensor rounded through float16 and back
                before = produced.get(source.input[0])
                assert before is None or before.op_type != "Cast", (node.name, name)
            elif name in kinds:
                assert kinds[name] != TensorProto.FLOAT16, (node.name, name)
    # The states are read and written by their own float32 operators, as in the float graph:
    # nothing rounds them through float16, and the same ones are written in place.
    readers = {i: n.op_type for n in half.graph.node for i in n.input}
    parent_readers = {i: n.op_type for n in parent.graph.node for i in n.input}
    pasts = [i.name for i in half.graph.input if i.name.startswith("past.")]
    assert pasts and all(readers[p] == parent_readers[p] != "Cast" for p in pasts)
    assert all(produced[o.name].op_type != "Cast" for o in half.graph.output if o.name.startswith("present."))
    assert read_manifest(out).in_place == read_manifest(src).in_place
    q = read_manifest(out).quantization
    assert q is not None and q["mode"] == "float16" and q["weight_bits"] == 16
    assert set(q["quantized_nodes"]) >= {n.name for n in half.graph.node if n.op_type == "MatMul"}
    assert 0.45 < q["size"]["ratio"] < 0.7  # tiny models: the norms and rotary tables are a tenth of the bytes


def test_close_to_float_and_the_same_greedy_tokens(pair: tuple[Path, Path]) -> None:
    src, out = pair
    report = read_manifest(out).quantization["report"]  # type: ignore[index]
    assert abs(report["ppl_ratio"] - 1) < 1e-3 and report["mean_kl"] < 1e-5
    assert report["greedy_agreement"] == 1.0
    prompt = np.random.default_rng(0).integers(3, 320, (2, 40))
    a, b = hybridrt.load(src), hybridrt.load(out)
    logits_a = a.stepper(2, 64).forward(prompt, all_logits=True)
    logits_b = b.stepper(2, 64).forward(prompt, all_logits=True)
    assert logits_b.dtype == np.float32
    scale = float(np.abs(logits_a).max())
    assert 0 < float(np.abs(logits_a - logits_b).max()) < 5e-3 * scale  # float16's error, not zero, not more
    greedy = {"max_new_tokens": 16, "do_sample": False}
    assert a.generate(prompt.tolist(), **greedy) == b.generate(prompt.tolist(), **greedy)


def test_float16_refuses_an_int8_kv_cache(jamba_onnx: Path, tmp_path: Path, text_file: Path) -> None:
    with pytest.raises(QuantizationError, match="does not combine with float16"):
        quantize(jamba_onnx, tmp_path / "q", "float16", kv_dtype="int8", calibration=[text_file])
    assert not (tmp_path / "q").exists()


def test_cli_float16(jamba_onnx: Path, tmp_path: Path, text_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "half"
    argv = ["quantize", str(jamba_onnx), "-o", str(out), "--mode", "float16", "--eval-text", str(text_file)]
    assert main([*argv, "--eval-tokens", "128", "--agreement-prompts", "2"]) == 0
    said = capsys.readouterr().out
    assert "float16" in said and "perplexity ratio" in said
    assert hybridrt.load(out).generate([5, 6, 7], max_new_tokens=4, do_sample=False)


def test_float16_attention_keeps_its_kv_buffers_in_float16(jamba_onnx: Path, tmp_path: Path, text_file: Path) -> None:
    """--kv-dtype float16: GroupQueryAttention in float16 (onnxruntime's CUDA kernel takes
    float16 and bfloat16 only), its past/present buffers float16 graph inputs and outputs that
    it reads and writes itself (no cast beside them), the other states float32 as before."""
    out = tmp_path / "half-kv"
    quantize(jamba_onnx, out, "float16", kv_dtype="float16", eval_text=text_file, **SMALL)
    parent, half = onnx.load(str(jamba_onnx / "model.onnx")), onnx.load(str(out / "model.onnx"))
    manifest, parent_manifest = read_manifest(out), read_manifest(jamba_onnx)
    kv = {s.name for s in manifest.pasts if s.is_kv}
    assert kv and {s.dtype for s in manifest.pasts if s.is_kv} == {"float16"}
    assert {s.dtype for s in manifest.pasts if not s.is_kv} == {"float32"}
    types, parent_types = _types(half.graph), _types(parent.graph)
    for name, kind in types.items():
        bare = name.removeprefix("present.").removeprefix("past.")
        if f"past.{bare}" in kv:
            assert kind == TensorProto.FLOAT16, name
        else:
            assert kind == parent_types[name], name
    attention = [n for n in half.graph.node if n.op_type == "GroupQueryAttention"]
    assert attention
    for node in attention:  # reads and writes the graph's own KV buffers, in place
        assert node.input[3].startswith("past.") and node.output[1] == node.input[3].replace("past.", "present.")
    assert not [
        n
        for n in half.graph.node
        if n.op_type == "Cast" and ({*n.input, *n.output} & (kv | {"present." + k[5:] for k in kv}))
    ]
    assert manifest.in_place == parent_manifest.in_place
    report = manifest.quantization["report"]  # type: ignore[index]
    assert abs(report["ppl_ratio"] - 1) < 1e-3 and report["mean_kl"] < 1e-5 and report["greedy_agreement"] == 1.0
    prompt = np.random.default_rng(1).integers(3, 320, (2, 30)).tolist()
    greedy = {"max_new_tokens": 16, "do_sample": False}
    assert hybridrt.load(out).generate(prompt, **greedy) == hybridrt.load(jamba_onnx).generate(prompt, **greedy)
