"""`hybridrt quantize`: every mode gives a directory that loads, generates and carries a
quality report; calibration feeds cover decode steps with real states; errors write nothing."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from checkpoints import TEXT
from onnx import TensorProto, helper, numpy_helper

import hybridrt
from hybridrt.cli import main
from hybridrt.graphs.manifest import read_manifest
from hybridrt.quantization import QuantConfig, QuantizationError, quantize
from hybridrt.quantization.calibration import CalibrationReader, calibration_feeds, split_text
from hybridrt.quantization.selection import give_private_weights, select_nodes

SMALL = {"samples": 3, "seq_len": 32, "decode_steps": 2, "agreement_prompts": 4, "eval_tokens": 192, "eval_window": 128}
REPORT = ("nll_delta", "ppl_ratio", "mean_kl", "greedy_agreement", "tokens", "prompts")
PROMPT = [5, 6, 7, 8]


@pytest.fixture(scope="module")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("calibration") / "code.txt"
    path.write_text(TEXT * 8, encoding="utf-8")
    return path


def _greedy(directory: Path) -> list[int]:
    out = hybridrt.load(directory).generate(PROMPT, max_new_tokens=12, do_sample=False)
    assert isinstance(out, list)
    return [int(t) for t in out]


@pytest.mark.parametrize(
    "mode, algo, op_type",
    [
        ("int8-static", None, "QuantizeLinear"),
        ("int8-dynamic", None, "MatMulInteger"),
        ("int4", "rtn", "MatMulNBits"),
        ("int4", "hqq", "MatMulNBits"),
        ("int4", "gptq", "MatMulNBits"),
        ("int8-weight", "rtn", "MatMulNBits"),
    ],
)
def test_mode_loads_generates_and_reports(
    jamba_onnx: Path, text_file: Path, tmp_path: Path, mode: str, algo: str | None, op_type: str
) -> None:
    out = tmp_path / "q"
    options = SMALL | ({"algo": algo} if algo else {})
    quantize(jamba_onnx, out, mode, calibration=[text_file], **options)
    graph = onnx.load(str(out / "model.onnx"))
    assert graph.ir_version <= 10
    op_types = {n.op_type for n in graph.graph.node}
    assert op_type in op_types
    assert "LinearAttention" in op_types  # the SSM scan stays the fused float op
    # Regression: QDQ handed x_proj's dequantized input to the scan (dt * x) and the D skip too.
    producer = {o: n.op_type for n in graph.graph.node for o in n.output}
    for node in graph.graph.node:
        if node.op_type not in ("MatMul", "QuantizeLinear", "DequantizeLinear"):
            assert all(producer.get(i) != "DequantizeLinear" for i in node.input), node.name
    first = _greedy(out)
    assert first == _greedy(out) and len(first) == 12
    q = read_manifest(out).quantization
    assert q is not None and q["mode"] == mode and q["algo"] == algo
    report = q["report"]
    assert all(math.isfinite(report[k]) for k in REPORT)
    # On the tiny model every mode stays close to float: same perplexity within 1%, tiny KL,
    # and far more greedy agreement than chance (1/320 per token).
    assert abs(report["ppl_ratio"] - 1) < 0.01 and report["mean_kl"] < 1e-3
    assert report["greedy_agreement"] > 0.1
    assert q["size"]["ratio"] < 1
    # The embedding and the (untied) LM head are stored block-wise; no float table is left.
    vocab = q["vocab"]
    assert vocab["embedding"] == "GatherBlockQuantized" and vocab["lm_head"] == "MatMulNBits"
    assert vocab["bits"] == 8 and not vocab["tied"]
    assert vocab["bytes"] < vocab["parent_bytes"] / 3
    assert {"GatherBlockQuantized", "MatMulNBits"} <= op_types and "Gather" not in _ops_on_weights(graph)


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
            past = f["attention_mask"].shape[1] - 1
            assert past >= 12
            for s in model.manifest.pasts:
                if s.kind in ("ssm", "conv"):
                    assert np.abs(f[s.name]).max() > 0, s.name
                else:
                    assert f[s.name].shape[2] == past
            if "position_ids" in f:
                assert f["position_ids"].tolist() == [[past]]
        prompt = feeds[0]
        assert all(not np.any(prompt[s.name]) for s in model.manifest.pasts)


def test_default_exclusions_and_overrides(jamba_onnx: Path) -> None:
    graph = onnx.load(str(jamba_onnx / "model.onnx")).graph
    default = select_nodes(graph, QuantConfig())
    kept = set(default.excluded)
    assert {"/model/layers.0/mixer/dt_proj/MatMul", "/model/layers.1/ffn/router/MatMul"} <= kept
    assert "/model/layers.1/mixer/MatMul" in kept  # attention over the KV cache: no constant weight
    assert "/model/layers.0/mixer/in_proj/MatMul" in default.quantize
    assert default.vocab == ["/model/embed_tokens/Gather", "/lm_head/MatMul"]
    assert not set(default.vocab) & set(default.quantize)
    forced = select_nodes(
        graph, QuantConfig(include=("*/dt_proj/*",), exclude=("*/in_proj/*", "/lm_head/*", "*/embed_tokens/*"))
    )
    assert "/model/layers.0/mixer/dt_proj/MatMul" in forced.quantize
    assert "/model/layers.0/mixer/in_proj/MatMul" in forced.excluded
    assert forced.vocab == [] and {"/lm_head/MatMul", "/model/embed_tokens/Gather"} <= set(forced.excluded)
    # int8-static keeps the inputs of out_proj and down_proj float (their weights still int8).
    static = select_nodes(graph, QuantConfig(mode="int8-static"))
    assert "/model/layers.0/mixer/out_proj/MatMul" in static.float_activations
    assert "/model/layers.0/mixer/out_proj/MatMul" not in static.static
    assert "/model/layers.0/mixer/in_proj/MatMul" in static.static
    assert select_nodes(graph, QuantConfig(mode="int4")).float_activations == {}  # weight-only anyway
    only = select_nodes(graph, QuantConfig(mode="int8-static", float_activations=("*/in_proj/*",)))
    assert set(only.float_activations) == {n for n in only.quantize if "/in_proj/" in n}
    bare = select_nodes(graph, QuantConfig(keep_float_default=False))
    assert "/model/layers.0/mixer/dt_proj/MatMul" in bare.quantize
    assert "/model/layers.1/mixer/MatMul" in bare.excluded  # the state rules hold regardless


def test_tied_lm_head_gets_a_private_weight() -> None:
    """A weight tied to the embedding reaches lm_head through a Transpose, which every
    onnxruntime quantizer skips as a non-constant weight."""
    emb = np.arange(12, dtype=np.float32).reshape(4, 3)
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["emb", "ids"], ["h"], name="/model/embed_tokens/Gather"),
            helper.make_node("Transpose", ["emb"], ["embT"], name="/lm_head/Transpose", perm=[1, 0]),
            helper.make_node("MatMul", ["h", "embT"], ["logits"], name="/lm_head/MatMul"),
        ],
        "tied",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 2])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 2, 4])],
        [numpy_helper.from_array(emb, "emb")],
    )
    assert give_private_weights(graph, ["/lm_head/MatMul"]) == ["/lm_head/MatMul"]
    matmul = next(n for n in graph.node if n.op_type == "MatMul")
    weight = next(t for t in graph.initializer if t.name == matmul.input[1])
    np.testing.assert_array_equal(numpy_helper.to_array(weight), emb.T)
    assert [n.op_type for n in graph.node] == ["Gather", "MatMul"]


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
        ({"mode": "int4", "algo": "awq", "calibration": [text_file]}, "unknown algorithm"),
        ({"mode": "int8-dynamic"}, "needs held-out text"),
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
    parent = tmp_path / "external"
    shutil.copytree(jamba_onnx, parent)
    model = onnx.load(str(parent / "model.onnx"))
    onnx.save_model(model, str(parent / "model.onnx"), save_as_external_data=True, location="model.onnx.data")
    manifest = read_manifest(parent)
    manifest.record_files(parent)
    manifest.write(parent)
    out = tmp_path / "q"
    quantize(parent, out, "int8-static", calibration=[text_file], **SMALL)
    assert (out / "model.onnx.data").is_file() and "model.onnx.data" in read_manifest(out).files
    assert _greedy(out) == _greedy(out)


def _tied_graph(vocab: int = 64, hidden: int = 32) -> tuple[onnx.GraphProto, np.ndarray]:
    table = np.random.default_rng(0).standard_normal((vocab, hidden)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["emb", "input_ids"], ["h"], name="/model/embed_tokens/Gather"),
            helper.make_node("Transpose", ["emb"], ["embT"], name="/lm_head/Transpose", perm=[1, 0]),
            helper.make_node("MatMul", ["h", "embT"], ["logits"], name="/lm_head/MatMul"),
        ],
        "tied",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", vocab])],
        [numpy_helper.from_array(table, "emb")],
    )
    return graph, table


def _run_graph(graph: onnx.GraphProto, ids: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 10
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"input_ids": ids})[0]


def _dequantize(packed: np.ndarray, scales: np.ndarray, bits: int) -> np.ndarray:
    """[vocab, k_blocks, blob] symmetric blocks (zero point 2^(bits-1)) -> [vocab, hidden]."""
    if bits == 4:
        values = np.stack([packed & 15, packed >> 4], axis=-1).reshape(*packed.shape[:2], -1)
    else:
        values = packed
    return ((values.astype(np.float32) - 2 ** (bits - 1)) * scales[..., None]).reshape(packed.shape[0], -1)


@pytest.mark.parametrize("bits", [4, 8])
def test_tied_embedding_and_lm_head_share_one_quantized_table(bits: int) -> None:
    from hybridrt.quantization.vocab import find_vocab_nodes, quantize_vocab

    graph, table = _tied_graph()
    ids = np.array([[0, 5, 63], [7, 7, 1]], dtype=np.int64)
    nodes = find_vocab_nodes(graph)
    assert nodes.tied and nodes.gather == "/model/embed_tokens/Gather" and nodes.head == "/lm_head/MatMul"
    record = quantize_vocab(graph, nodes, set(nodes.names), bits, 32, accuracy_level=0)
    assert record["shared"] and record["embedding"] == "GatherBlockQuantized" and record["lm_head"] == "MatMulNBits"
    gbq = next(n for n in graph.node if n.op_type == "GatherBlockQuantized")
    head = next(n for n in graph.node if n.op_type == "MatMulNBits")
    assert gbq.input[0] == head.input[1]  # one tensor for both
    assert not any(t.data_type == TensorProto.FLOAT and t.name == "emb" for t in graph.initializer)
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    dequantized = _dequantize(inits[head.input[1]], inits[head.input[2]], bits)
    assert record["bytes"] < record["parent_bytes"] / (3 if bits == 8 else 5)
    # The graph computes exactly with the dequantized table, and that table is the float one
    # up to one step per block (scale = the block's largest |w| / 2^(bits-1); the largest
    # value of the other sign may clip by one step, every other value rounds to half a step).
    expected = np.einsum("bsh,vh->bsv", dequantized[ids], dequantized)
    np.testing.assert_allclose(_run_graph(graph, ids), expected, rtol=1e-4, atol=1e-4)
    step = np.abs(table).reshape(64, -1, 32).max(-1, keepdims=True) / 2 ** (bits - 1)
    error = np.abs(dequantized - table).reshape(64, -1, 32)
    assert np.all(error <= step * 1.0001) and np.mean(error <= step / 2 + 1e-6) > 0.99


def test_lm_head_alone_keeps_the_float_embedding() -> None:
    from hybridrt.quantization.vocab import find_vocab_nodes, quantize_vocab

    graph, table = _tied_graph()
    ids = np.array([[3, 4]], dtype=np.int64)
    float_logits = _run_graph(graph, ids)
    nodes = find_vocab_nodes(graph)
    record = quantize_vocab(graph, nodes, {"/lm_head/MatMul"}, 8, 32, accuracy_level=0)
    assert record["embedding"] is None and record["lm_head"] == "MatMulNBits" and not record["shared"]
    assert [n.op_type for n in graph.node] == ["Gather", "MatMulNBits"]
    assert record["bytes"] > table.nbytes  # the float table stays for the Gather
    # 8-bit blocks: each logit within 1% of the largest one (measured: 0.3%).
    assert np.abs(_run_graph(graph, ids) - float_logits).max() <= 0.01 * np.abs(float_logits).max()


def test_tied_model_end_to_end(text_file: Path, tmp_path: Path) -> None:
    """A tied checkpoint exported and quantized: one 4-bit table, a fifth of the float bytes."""
    from checkpoints import make_llama

    from hybridrt.export import export

    src = make_llama(tmp_path / "ckpt", tie_word_embeddings=True)
    export(src, tmp_path / "onnx")
    out = tmp_path / "q"
    quantize(tmp_path / "onnx", out, "int4", calibration=[text_file], vocab_bits=4, **SMALL)
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
    assert [r["quantization"] for r in rows] == ["float", "int4 rtn"]
    assert rows[0]["greedy_same_as_first"] and rows[1]["graph_bytes"] < rows[0]["graph_bytes"]
    assert all(r["prefill_ms"] > 0 and r["decode_tokens_per_s"] > 0 for r in rows)
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "batch 1, 9-token prompt, 5 new tokens" in lines[0] and len(lines) == 4
    assert lines[2].split()[1:4] == ["float", f"{rows[0]['graph_bytes'] / 1e6:.1f}", "1.00x"]
    assert main([*args, "--repeats", "0"]) == 2
    assert "--repeats must be >= 1" in capsys.readouterr().err


def test_scaled_untied_head_is_found() -> None:
    """Granite divides the logits by logits_scaling: the head MatMul does not write `logits`."""
    from hybridrt.quantization.vocab import find_vocab_nodes

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["emb", "input_ids"], ["h"], name="/model/embed_tokens/Gather"),
            helper.make_node("MatMul", ["h", "head"], ["raw"], name="/lm_head/MatMul"),
            helper.make_node("Div", ["raw", "scale"], ["logits"], name="/Div"),
        ],
        "scaled",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", 64])],
        [
            numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), "emb"),
            numpy_helper.from_array(rng.standard_normal((32, 64)).astype(np.float32), "head"),
            numpy_helper.from_array(np.array(8.0, np.float32), "scale"),
        ],
    )
    nodes = find_vocab_nodes(graph)
    assert (nodes.gather, nodes.table, nodes.head, nodes.head_weight, nodes.tied) == (
        "/model/embed_tokens/Gather",
        "emb",
        "/lm_head/MatMul",
        "head",
        False,
    )
