"""`hybridrt quantize`: every mode gives a directory that loads, generates and carries a
quality report; calibration feeds cover decode steps with real states; errors write nothing."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import exports
import numpy as np
import onnx
import pytest
from checkpoints import TEXT
from onnx import TensorProto, numpy_helper

import hybridrt
from hybridrt.cli import main
from hybridrt.graphs.manifest import read_manifest
from hybridrt.quantization import QuantizationError, quantize
from hybridrt.quantization.calibration import CalibrationReader, calibration_feeds, split_text

SMALL = exports.QUICK
REPORT = ("nll_delta", "ppl_ratio", "mean_kl", "greedy_agreement", "tokens", "prompts")
PROMPT = [5, 6, 7, 8]


def _greedy(directory: Path) -> list[int]:
    out = hybridrt.load(directory).generate(PROMPT, max_new_tokens=12, do_sample=False)
    assert isinstance(out, list)
    return [int(t) for t in out]


MODES = [
    ("int8-static", None, "QuantizeLinear"),
    ("int8-dynamic", None, "MatMulInteger"),
    ("int4", "mse", "MatMulNBits"),
    ("int4", "rtn", "MatMulNBits"),
    ("int4", "hqq", "MatMulNBits"),
    ("int4", "gptq", "MatMulNBits"),
    ("int4", "awq", "MatMulNBits"),
    ("int8-weight", "rtn", "MatMulNBits"),
]


@pytest.fixture(scope="module", params=MODES, ids=lambda m: f"{m[0]}-{m[1]}" if m[1] else m[0])
def quantized(request: pytest.FixtureRequest, jamba_onnx: Path, text_file: Path) -> tuple[Path, str, str | None, str]:
    """(directory, mode, algo, the operator the mode writes): each mode quantized once."""
    mode, algo, op_type = request.param
    out = exports.quantized(jamba_onnx, mode, calibration=[text_file], **SMALL | ({"algo": algo} if algo else {}))
    return out, mode, algo, op_type


def test_mode_writes_its_operators_and_keeps_the_fused_scan(quantized: tuple[Path, str, str | None, str]) -> None:
    out, _, _, op_type = quantized
    graph = onnx.load(str(out / "model.onnx"))
    assert graph.ir_version <= 10
    op_types = {n.op_type for n in graph.graph.node}
    assert op_type in op_types
    scans = [n for n in graph.graph.node if n.op_type == "Scan"]
    assert len(scans) == 2  # the Mamba scans stay float Scans: nothing quantized inside them
    for scan in scans:
        body = next(a.g for a in scan.attribute if a.name == "body")
        assert sorted(n.op_type for n in body.node) == ["Add", "Exp", "MatMul", "Mul", "Mul", "Mul"]


def test_float_consumers_of_a_quantized_activation_read_the_float_tensor(
    quantized: tuple[Path, str, str | None, str],
) -> None:
    """Regression: QDQ handed x_proj's dequantized input to the scan (dt * x) and the D skip too."""
    graph = onnx.load(str(quantized[0] / "model.onnx"))
    producer = {o: n.op_type for n in graph.graph.node for o in n.output}
    for node in graph.graph.node:
        if node.op_type not in ("MatMul", "QuantizeLinear", "DequantizeLinear"):
            assert all(producer.get(i) != "DequantizeLinear" for i in node.input), node.name


def test_quantized_model_loads_and_generates_deterministically(quantized: tuple[Path, str, str | None, str]) -> None:
    first = _greedy(quantized[0])
    assert first == _greedy(quantized[0]) and len(first) == 12


def test_report_records_the_mode_and_stays_close_to_float(quantized: tuple[Path, str, str | None, str]) -> None:
    out, mode, algo, _ = quantized
    q = read_manifest(out).quantization
    assert q is not None and q["mode"] == mode and q["algo"] == algo
    report = q["report"]
    assert all(math.isfinite(report[k]) for k in REPORT)
    # On the tiny model every mode stays close to float: same perplexity within 1%, tiny KL,
    # and far more greedy agreement than chance (1/320 per token).
    assert abs(report["ppl_ratio"] - 1) < 0.01 and report["mean_kl"] < 1e-3
    assert report["greedy_agreement"] > 0.1
    assert q["size"]["ratio"] < 1


def test_embedding_and_lm_head_are_stored_block_wise(quantized: tuple[Path, str, str | None, str]) -> None:
    """The embedding and the (untied) LM head are stored block-wise; no float table is left."""
    out = quantized[0]
    q = read_manifest(out).quantization
    assert q is not None
    vocab = q["vocab"]
    assert vocab["embedding"] == "GatherBlockQuantized" and vocab["lm_head"] == "MatMulNBits"
    assert vocab["bits"] == 8 and not vocab["tied"]
    assert vocab["bytes"] < vocab["parent_bytes"] / 3
    graph = onnx.load(str(out / "model.onnx"))
    op_types = {n.op_type for n in graph.graph.node}
    assert {"GatherBlockQuantized", "MatMulNBits"} <= op_types and "Gather" not in _ops_on_weights(graph)


def test_symmetric_blocks_have_no_zero_points(jamba_onnx: Path, text_file: Path, tmp_path: Path) -> None:
    """int4's default (mse: searched scales) and --symmetric store each 4-bit block as a scale
    alone (llama.cpp q4_0's and onnxruntime-genai's layout, for which the MatMulNBits kernels skip
    the zero points), record it, and stay close to float; --algo rtn keeps a zero point per block."""
    runs = {}
    cases = (("rtn", {"algo": "rtn"}, False), ("rtn", {"algo": "rtn", "symmetric": True}, True), ("mse", {}, True))
    for algo, options, symmetric in cases:
        out = tmp_path / f"{algo}{int(symmetric)}"
        manifest = quantize(jamba_onnx, out, "int4", eval_text=text_file, **options, **SMALL)  # type: ignore[arg-type]
        q = manifest.quantization
        assert q is not None and q["symmetric"] is symmetric and q["algo"] == algo
        graph = onnx.load(str(out / "model.onnx"))
        layers = [n for n in graph.graph.node if n.op_type == "MatMulNBits" and "lm_head" not in n.name]
        runs[out.name] = ({len(n.input) for n in layers}, q["report"], _weights(graph, layers))
        assert len(_greedy(out)) == 12
    # A, B, scales (and zero points); the searched blocks share the layout, not the numbers
    assert runs["rtn0"][0] == {4} and runs["rtn1"][0] == runs["mse1"][0] == {3}
    assert runs["mse1"][2].keys() == runs["rtn1"][2].keys() and runs["mse1"][2] != runs["rtn1"][2]
    for name in ("rtn1", "mse1"):
        report = runs[name][1]
        assert abs(report["ppl_ratio"] - 1) < 0.01 and report["mean_kl"] < 1e-3


def _weights(graph: onnx.ModelProto, nodes: list[onnx.NodeProto]) -> dict[str, bytes]:
    inits = {t.name: t for t in graph.graph.initializer}
    return {i: numpy_helper.to_array(inits[i]).tobytes() for n in nodes for i in n.input[1:] if i in inits}


def _ops_on_weights(model: onnx.ModelProto) -> set[str]:
    """Op types of the nodes that read a float initializer of two or more dimensions."""
    floats = {t.name for t in model.graph.initializer if t.data_type == TensorProto.FLOAT and len(t.dims) >= 2}
    return {n.op_type for n in model.graph.node if floats & set(n.input)}


def test_int8_static_runs_every_quantized_matmul_as_integer(llama_onnx: Path, text_file: Path, tmp_path: Path) -> None:
    """onnxruntime's CPU fusion turns each DQ(activation), DQ(weight) -> MatMul into
    MatMulIntegerToFloat, but not where one QuantizeLinear feeds several MatMuls (q/k/v,
    gate/up): those would dequantize their weights at every call. Each MatMul gets its own
    pair, so after session optimization no float MatMul reads a dequantized weight."""
    import onnxruntime as ort

    for floats in ((), None):  # every MatMul static; the default float-activation list
        out = tmp_path / f"q{floats}"
        quantize(llama_onnx, out, "int8-static", calibration=[text_file], float_activations=floats, **SMALL)
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
        ort.InferenceSession(str(out / "model.onnx"), options, providers=["CPUExecutionProvider"])
        ops = [n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node]
        q = read_manifest(out).quantization
        assert q is not None
        weight_only = q["float_activations"]
        assert set(weight_only) == (
            set() if floats == () else {f"/model/layers.{i}/ffn/down_proj/MatMul" for i in (0, 1)}
        )
        # All but the embedding, the LM head and the float-activation MatMuls run as integer.
        assert ops.count("MatMulIntegerToFloat") == len(q["quantized_nodes"]) - 2 - len(weight_only)
        assert ops.count("MatMulNBits") == 1 + len(weight_only) and "DequantizeLinear" not in ops


def test_llama_int8_static(llama_onnx: Path, text_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "q"
    quantize(llama_onnx, out, "int8-static", calibration=[text_file], calib_method="percentile", **SMALL)
    assert _greedy(out) == _greedy(out)
    report = read_manifest(out).quantization["report"]  # type: ignore[index]
    assert all(math.isfinite(report[k]) for k in REPORT)
    assert abs(report["ppl_ratio"] - 1) < 0.01


def test_calibration_feeds_cover_decode_with_real_states(jamba_onnx: Path, llama_onnx: Path) -> None:
    for directory in (jamba_onnx, llama_onnx):
        model = hybridrt.load(directory)
        windows = split_text(model.tokenizer, [TEXT * 4], samples=2, seq_len=24, eval_tokens=64).windows
        feeds = calibration_feeds(model, windows, decode_steps=3)
        assert len(CalibrationReader(feeds)) == len(feeds) == 2 * (2 + 3)
        names = [s.name for s in model.manifest.inputs]
        assert all(sorted(f) == sorted(names) for f in feeds)
        steps = [f for f in feeds if f["input_ids"].shape == (1, 1)]
        assert len(steps) == 6
        for f in steps:
            past = int(f["past_lengths"][0])
            assert past >= 12
            assert f["logit_positions"].tolist() == [0]  # every position of the one-token call
            for s in model.manifest.pasts:
                if s.is_kv:  # a buffer for the whole window, holding the tokens seen so far
                    assert f[s.name].shape[2] == 24
                    assert np.abs(f[s.name][:, :, :past]).max() > 0 and not f[s.name][:, :, past:].any(), s.name
                else:
                    assert np.abs(f[s.name]).max() > 0, s.name
        prompt = feeds[0]
        assert all(not np.any(prompt[s.name]) for s in model.manifest.pasts)


def test_cli_quantize_then_generate(
    jamba_onnx: Path, text_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "q"
    args = ["quantize", str(jamba_onnx), "-o", str(out), "--mode", "int8-dynamic", "--eval-text", str(text_file)]
    assert main([*args, "--agreement-prompts", "2", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["mode"] == "int8-dynamic" and record["eval_text"]["source"] == str(text_file)
    assert main(["generate", str(out), "def", "--max-new-tokens", "4", "--no-stream"]) == 0
    assert main(["inspect", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "quantization int8-dynamic," in shown and "perplexity ratio" in shown
    assert "vocabulary GatherBlockQuantized + MatMulNBits, 8-bit blocks of 32" in shown
    assert main([*args]) == 2  # exists, no --force
    assert "already exists" in capsys.readouterr().err


def test_weight_only_zero_points_are_packed_except_hqqs(quantized: tuple[Path, str, str | None, str]) -> None:
    """hqq's zero points are float, which onnxruntime's CPU MatMulNBits has no int8 kernel for (what
    `quantize --algo hqq` says); every other mode's MatMulNBits packs them as uint8 or has none."""
    out, _, algo, _ = quantized
    graph = onnx.load(str(out / "model.onnx"))
    dtypes = {i.name: i.data_type for i in graph.graph.initializer}
    zero_points = {
        dtypes[n.input[3]] for n in graph.graph.node if n.op_type == "MatMulNBits" and len(n.input) > 3 and n.input[3]
    }
    if algo == "hqq":
        assert zero_points == {TensorProto.FLOAT}
    else:  # uint8, or none (symmetric blocks: the vocabulary, and the 8-bit modes' heads)
        assert zero_points <= {TensorProto.UINT8}


def test_cli_hqq_says_it_is_slow_on_the_cpu(
    jamba_onnx: Path, text_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["quantize", str(jamba_onnx), "-o", str(tmp_path / "q"), "--mode", "int4", "--algo", "hqq"]
    assert main([*args, "--eval-text", str(text_file), "--agreement-prompts", "2", "--eval-tokens", "128"]) == 0
    assert "no int8 kernel" in capsys.readouterr().out


def test_cli_gate_fails_and_writes_nothing(
    jamba_onnx: Path, text_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "q"
    args = ["quantize", str(jamba_onnx), "-o", str(out), "--mode", "int4", "--calibration", str(text_file)]
    assert main([*args, "--samples", "2", "--seq-len", "32", "--agreement-prompts", "2", "--max-ppl-ratio", "0.5"]) == 2
    assert "quality gate failed" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_errors_write_nothing(jamba_onnx: Path, text_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "q"
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    cases = [
        ({"mode": "int8-static"}, "needs calibration text"),
        ({"mode": "int8-static", "calibration": [empty]}, "hold no text"),
        ({"mode": "int8-static", "calibration": [tmp_path / "missing.txt"]}, "not found"),
        ({"mode": "int3"}, "unknown mode"),
        ({"mode": "int8-weight", "algo": "hqq", "calibration": [text_file]}, "unknown algorithm"),
        ({"mode": "int8-weight", "algo": "awq", "calibration": [text_file]}, "unknown algorithm"),
        ({"mode": "int4", "algo": "awq", "eval_text": text_file}, "calibration"),
        ({"mode": "int8-weight", "algo": "mse", "eval_text": text_file}, "unknown algorithm"),
        ({"mode": "int8-dynamic"}, "needs held-out text"),
        ({"mode": "int8-dynamic", "symmetric": True, "eval_text": text_file}, "weight-only modes"),
        ({"mode": "int4", "algo": "hqq", "symmetric": True, "eval_text": text_file}, "float zero points"),
    ]
    for kwargs, message in cases:
        with pytest.raises(QuantizationError, match=message):
            quantize(jamba_onnx, out, **kwargs)  # type: ignore[arg-type]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"content": "no text field"}\n')
    with pytest.raises(QuantizationError, match='"text"'):
        quantize(jamba_onnx, out, "int8-static", calibration=[bad])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "empty.jsonl"]


@pytest.mark.parametrize("mode", ["int4", "int8-dynamic", "int8-weight"])
def test_quantize_without_tokenizer_skips_the_report(
    jamba_onnx: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: str
) -> None:
    """Regression: a directory without tokenizer.json could not be quantized in any mode."""
    src = Path(shutil.copytree(jamba_onnx, tmp_path / "src"))
    (src / "tokenizer.json").unlink()
    data = json.loads((src / "hybridrt.json").read_text())
    data["files"].pop("tokenizer.json")
    (src / "hybridrt.json").write_text(json.dumps(data))
    out = tmp_path / "q"
    assert main(["quantize", str(src), "-o", str(out), "--mode", mode]) == 0
    captured = capsys.readouterr()
    assert "no quality report" in captured.out and "tokenizer.json" in captured.out
    assert "\r" not in captured.err and " " * 20 not in captured.err  # plain progress lines in a log
    q = read_manifest(out).quantization
    assert q is not None and q["report"] is None and "tokenizer.json" in q["report_skipped"]
    assert len(_greedy(out)) == 12
    # What needs text is an error that names the tokenizer, and writes nothing.
    gated = ["quantize", str(src), "-o", str(tmp_path / "g"), "--mode", mode, "--max-ppl-ratio", "2"]
    assert main(gated) == 2
    assert "no tokenizer.json" in capsys.readouterr().err and not (tmp_path / "g").exists()


def test_quantized_model_is_not_quantized_again(jamba_onnx: Path, text_file: Path, tmp_path: Path) -> None:
    first = tmp_path / "q"
    quantize(jamba_onnx, first, "int8-weight", eval_text=text_file, agreement_prompts=1, eval_tokens=64)
    with pytest.raises(QuantizationError, match="already quantized"):
        quantize(first, tmp_path / "qq", "int4", eval_text=text_file)
    assert not (tmp_path / "qq").exists()


def test_external_data_stays_external(jamba_onnx: Path, text_file: Path, tmp_path: Path) -> None:
    parent = exports.external_copy(jamba_onnx, tmp_path / "external")
    for mode, options in (("int8-static", {}), ("int4", {"algo": "awq"})):  # awq probes a copy on disk
        out = tmp_path / f"q-{mode}"
        quantize(parent, out, mode, calibration=[text_file], **SMALL | options)  # type: ignore[arg-type]
        assert (out / "model.onnx.data").is_file() and "model.onnx.data" in read_manifest(out).files
        assert _greedy(out) == _greedy(out)


def test_tied_model_end_to_end(text_file: Path, tmp_path: Path) -> None:
    """A tied checkpoint exported and quantized: one 4-bit table, a fifth of the float bytes."""
    from checkpoints import make_llama

    parent = exports.export(exports.checkpoint(make_llama, tie_word_embeddings=True), validate=True)
    # The float graph reads the one table transposed (no Transpose that a session would fold
    # into a second, transposed copy of the table).
    graph = onnx.load(parent / "model.onnx", load_external_data=False).graph
    head = next(n for n in graph.node if n.name == "/lm_head/MatMul")
    assert (head.op_type, head.input[1]) == ("FusedMatMul", "model.embed_tokens.weight")
    assert not any(n.op_type == "Transpose" and "model.embed_tokens.weight" in n.input for n in graph.node)
    out = tmp_path / "q"
    quantize(parent, out, "int4", calibration=[text_file], vocab_bits=4, **SMALL)
    q = read_manifest(out).quantization
    assert q is not None and q["vocab"]["tied"] and q["vocab"]["shared"]
    assert q["vocab"]["bytes"] < q["vocab"]["parent_bytes"] / 5
    assert _greedy(out) == _greedy(out)
    assert abs(q["report"]["ppl_ratio"] - 1) < 0.02


def test_bench_compares_float_and_quantized(
    jamba_onnx: Path, text_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "q"
    quantize(jamba_onnx, out, "int4", eval_text=text_file, agreement_prompts=1, eval_tokens=64)
    args = ["bench", str(jamba_onnx), str(out), "--prompt-tokens", "9", "--new-tokens", "5", "--repeats", "2"]
    assert main([*args, "--batch", "2", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["quantization"] for r in rows] == ["float", "int4 mse"]
    assert rows[0]["greedy_same_as_first"] and rows[1]["graph_bytes"] < rows[0]["graph_bytes"]
    assert all(r["prefill_ms"] > 0 and r["decode_tokens_per_s"] > 0 for r in rows)
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "batch 1, 9-token prompt, 5 new tokens" in lines[0] and len(lines) == 4
    assert lines[2].split()[1:4] == ["float", f"{rows[0]['graph_bytes'] / 1e6:.1f}", "1.00x"]
    assert main([*args, "--repeats", "0"]) == 2
    assert "--repeats must be >= 1" in capsys.readouterr().err


def test_awq_scales_the_channels_that_matter_and_divides_the_inputs_back(
    jamba_onnx: Path, text_file: Path, tmp_path: Path
) -> None:
    """--algo awq: on activations with a few large channels, the searched channel scales leave
    less output error than plain rounding (alpha 0), and never more; the written graph divides
    each quantized node's input by its scales (one Mul) and stays close to the float model."""
    from hybridrt.quantization import awq

    rng = np.random.default_rng(0)
    weight = rng.normal(size=(128, 64)).astype(np.float32)
    magnitude = np.where(np.arange(128) % 16 == 0, 30.0, 1.0).astype(np.float32)  # outlier channels
    x = rng.normal(size=(256, 128)).astype(np.float32) * magnitude
    s, alpha = awq.channel_scales(weight, np.abs(x).mean(0), x, 32)
    plain = np.square(x @ weight - x @ awq.rtn_blocks(weight, 32)).sum()
    scaled = np.square(x @ weight - (x / s) @ awq.rtn_blocks(weight * s[:, None], 32)).sum()
    assert alpha > 0 and scaled < 0.8 * plain
    even = rng.normal(size=(256, 128)).astype(np.float32)  # nothing to favour: no worse than alpha 0
    s, _ = awq.channel_scales(weight, np.abs(even).mean(0), even, 32)
    plain = np.square(even @ weight - even @ awq.rtn_blocks(weight, 32)).sum()
    assert np.square(even @ weight - (even / s) @ awq.rtn_blocks(weight * s[:, None], 32)).sum() <= plain

    out = exports.quantized(jamba_onnx, "int4", calibration=[text_file], algo="awq", **SMALL)
    graph = onnx.load(str(out / "model.onnx"))
    producers = {o: n for n in graph.graph.node for o in n.output}
    quantized = read_manifest(out).quantization
    assert quantized is not None and quantized["algo"] == "awq" and quantized["symmetric"] is True
    nodes = [n for n in graph.graph.node if n.op_type == "MatMulNBits" and n.name.startswith("/model/layers")]
    assert nodes and all(producers[n.input[0]].op_type == "Mul" for n in nodes)
    assert all(awq.SUFFIX in producers[n.input[0]].name for n in nodes)
    assert quantized["report"]["mean_kl"] < 1e-3
