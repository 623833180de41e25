"""Decode steps for CUDA graph capture (load(..., cuda_graph=True)), on the CPU provider.

The capture itself needs a GPU (onnxruntime-gpu; docs/gpu.md gives what ran there). What runs
here is everything the captured session depends on: the graph rewritten with attention's
lengths as inputs (graphs/compat.for_graph_capture), the total fed as the KV capacity in steps
(what a replay reads) and as the longest row elsewhere, the step's inputs and logits in fixed
buffers updated in place, one graph id per binding and KV set, and beams, speculative rounds,
joins and leaves on top of them: the same tokens as the uncaptured session, every time.
"""

from __future__ import annotations

from pathlib import Path

import exports
import numpy as np
import onnx
import pytest

import hybridrt
from hybridrt.errors import ProviderError
from hybridrt.graphs.compat import LENGTH_INPUTS, POSITION_IDS, TOTAL_LENGTH, for_graph_capture, length_feeds
from hybridrt.runtime.device import MAX_GRAPHS
from hybridrt.runtime.loader import _capture
from hybridrt.runtime.model import Model
from hybridrt.runtime.providers import ProviderSelection

GREEDY = {"max_new_tokens": 12, "min_new_tokens": 12, "do_sample": False}


@pytest.fixture(scope="module")
def half_kv(jamba_onnx: Path, text_file: Path) -> Path:
    """jamba (Mamba1 scans, conv states, attention) with attention and its KV in float16."""
    small = {"agreement_prompts": 2, "eval_tokens": 128, "eval_window": 128}
    return exports.quantized(jamba_onnx, "float16", kv_dtype="float16", eval_text=text_file, **small)


def _prompts(rows: int = 2, n: int = 20) -> list[list[int]]:
    return np.random.default_rng(3).integers(3, 300, (rows, n)).tolist()


def _same_logits(plain: np.ndarray, captured: np.ndarray, model: Model) -> None:
    """The same session and graph give the same bits; a second session over the one-token graph
    (runtime/decode_session.py: its Scans inlined, its MatMul weights not pre-packed) the same
    logits to 1e-5."""
    if model.decode_session is None:
        np.testing.assert_array_equal(plain, captured)
    else:
        np.testing.assert_allclose(captured, plain, rtol=0, atol=1e-5)


def test_the_rewrite_makes_the_lengths_inputs_and_drops_their_arithmetic(llama_onnx: Path) -> None:
    graph = llama_onnx / "model.onnx"
    before = onnx.load(str(graph), load_external_data=False)
    data, names = for_graph_capture(graph)
    after = onnx.load_from_string(data)
    # seqlens_k, total, query_seqlens (onnxruntime 1.32), and the rotary positions
    assert names == (*LENGTH_INPUTS.values(), POSITION_IDS)
    inputs = {i.name: i for i in after.graph.input}
    assert inputs[TOTAL_LENGTH].type.tensor_type.shape.dim == []  # a scalar, read on the host
    for node in (n for n in after.graph.node if n.op_type == "GroupQueryAttention"):
        assert [node.input[i] for i in LENGTH_INPUTS] == list(LENGTH_INPUTS.values())
    # what computed the lengths (ReduceMax of the rows' lengths, among others) is gone
    assert [n for n in before.graph.node if n.op_type == "ReduceMax"]
    assert not [n for n in after.graph.node if n.op_type == "ReduceMax"]
    assert len(after.graph.node) < len(before.graph.node)
    assert {t.name for t in after.graph.initializer} == {t.name for t in before.graph.initializer}
    # without query_seqlens (onnxruntime 1.31's GroupQueryAttention)
    _, names = for_graph_capture(graph, query_seqlens=False)
    assert "query_seqlens" not in names


@pytest.fixture
def family() -> str:
    return "mamba2"


def test_a_graph_without_attention_is_unchanged(exported: Path) -> None:
    graph = exported / "model.onnx"
    data, names = for_graph_capture(graph)
    assert names == ()
    assert onnx.load_from_string(data).graph == onnx.load(str(graph), load_external_data=False).graph


def test_length_feeds() -> None:
    after = np.array([7, 4])
    feeds = length_feeds((*LENGTH_INPUTS.values(), POSITION_IDS), after, 3, 64)
    assert feeds["seqlens_k"].tolist() == [6, 3] and feeds["seqlens_k"].dtype == np.int32
    assert int(feeds[TOTAL_LENGTH]) == 64 and feeds[TOTAL_LENGTH].shape == ()
    assert feeds["query_seqlens"].tolist() == [3, 3]
    assert feeds[POSITION_IDS].tolist() == [[4, 5, 6], [1, 2, 3]] and feeds[POSITION_IDS].dtype == np.int64


@pytest.mark.parametrize("which", ["float32", "float16-kv", "llama"])
def test_captured_steps_give_the_uncaptured_tokens_and_logits(
    which: str, jamba_onnx: Path, half_kv: Path, llama_onnx: Path
) -> None:
    """jamba's steps run on a second session (its Scans inlined, runtime/decode_session.py),
    llama's on the one session, rewritten."""
    directory = {"float32": jamba_onnx, "float16-kv": half_kv, "llama": llama_onnx}[which]
    plain, fixed = hybridrt.load(directory, "cpu"), hybridrt.load(directory, "cpu", cuda_graph=True)
    assert fixed.cuda_graph and not plain.cuda_graph
    steps = fixed.decode_session
    assert (steps is None) == (which == "llama")
    assert set(LENGTH_INPUTS.values()) <= set(steps.inputs if steps else fixed.length_inputs)
    prompts = _prompts()
    assert fixed.generate(prompts, **GREEDY) == plain.generate(prompts, **GREEDY)
    a, b = plain.stepper(2, 64), fixed.stepper(2, 64)
    ids = np.array(prompts)
    la, lb = a.forward(ids), b.forward(ids)
    for _ in range(6):  # the total fed is the capacity (64) in steps, the longest row elsewhere
        nxt = la.argmax(-1)[:, None]
        la, lb = a.forward(nxt), b.forward(nxt)
        _same_logits(la, lb, fixed)
    # every step after the first re-used the two bindings' graphs (one id each)
    assert len(set(b._captured.graph_ids.values())) == 2 and all(i > 0 for i in b._captured.graph_ids.values())


def test_beams_speculative_and_rows_that_join_and_leave(half_kv: Path) -> None:
    plain, fixed = hybridrt.load(half_kv, "cpu"), hybridrt.load(half_kv, "cpu", cuda_graph=True)
    prompt = _prompts(1)
    beams = {"num_beams": 3, **GREEDY}
    assert fixed.generate(prompt, **beams) == plain.generate(prompt, **beams)
    assert fixed.generate(prompt, assistant_model=fixed, **GREEDY) == plain.generate(prompt, **GREEDY)
    # a state batch whose rows leave and join: new buffers, new graphs, the same logits
    a, b = plain.stepper(2, 64), fixed.stepper(2, 64)
    ids = np.array(_prompts(2, 12))
    la, lb = a.forward(ids), b.forward(ids)
    for step in range(6):
        nxt = la.argmax(-1)[:, None]
        la, lb = a.forward(nxt), b.forward(nxt)
        _same_logits(la, lb, fixed)
        if step == 1:  # row 0 leaves
            a.reorder([1])
            b.reorder([1])
            la, lb = la[[1]], lb[[1]]
        if step == 3:  # a new row joins after its own prompt
            joining = np.array(_prompts(1, 9))
            ja, jb = plain.stepper(1, 64), fixed.stepper(1, 64)
            first_a, first_b = ja.forward(joining), jb.forward(joining)
            a.extend(ja)
            b.extend(jb)
            la, lb = np.concatenate([la, first_a]), np.concatenate([lb, first_b])
    assert len(b._captured.graph_ids) == 2  # the last buffers' two bindings


def test_graph_ids_are_per_session_and_bounded(jamba_onnx: Path) -> None:
    model = hybridrt.load(jamba_onnx, "cpu", cuda_graph=True)
    first, second = model.stepper(1, 32), model.stepper(1, 32)
    ids = np.array(_prompts(1, 8))
    for stepper in (first, second):
        stepper.forward(ids)
        stepper.forward(ids[:, :1])
        stepper.forward(ids[:, :1])
    assert set(first._captured.graph_ids.values()).isdisjoint(second._captured.graph_ids.values())  # buffers differ
    first._captured.session._hybridrt_graphs = MAX_GRAPHS  # the stepping session's graphs are used up
    third = model.stepper(1, 32)
    third.forward(ids)
    third.forward(ids[:, :1])
    assert set(third._captured.graph_ids.values()) == {-1}  # runs uncaptured, still right


def test_capture_is_asked_through_the_cuda_provider_option_or_the_argument() -> None:
    asked = ProviderSelection([("CUDAExecutionProvider", {"enable_cuda_graph": "1"}), ("CPUExecutionProvider", {})])
    assert _capture(asked, None)
    plain = ProviderSelection([("CUDAExecutionProvider", {}), ("CPUExecutionProvider", {})])
    assert not _capture(plain, None)
    assert _capture(plain, True) and plain.providers[0][1]["enable_cuda_graph"] == "1"
    assert not _capture(asked, False) and asked.providers[0][1]["enable_cuda_graph"] == "0"
    with pytest.raises(ProviderError, match="cuda_graph must be"):
        _capture(plain, "yes")  # type: ignore[arg-type]


def test_capture_needs_io_binding(jamba_onnx: Path) -> None:
    with pytest.raises(ProviderError, match="needs io_binding"):
        hybridrt.load(jamba_onnx, "cpu", cuda_graph=True, io_binding=False)
