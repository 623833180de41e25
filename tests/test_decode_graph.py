"""The one-token decode graph (graphs/step_graph.py) and the second session that runs captured
decode steps of a graph with Scans (runtime/decode_session.py), on the CPU provider.

onnxruntime refused to capture every Mamba1 graph on a GPU: its selective scan is an ONNX Scan
(control flow). Captured steps of such a graph run on a graph whose Scans are inlined for one
token, in a session that reads the same weights and state buffers as the session of prompts.
"""

from __future__ import annotations

from pathlib import Path

import exports
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from family_checkpoints import BUILDERS

import hybridrt
from hybridrt.graphs.step_graph import control_flow, split_for_capture

GREEDY = {"max_new_tokens": 10, "min_new_tokens": 10, "do_sample": False}
SCAN_FAMILIES = ["mamba", "falcon_mamba", "jamba"]


def _prompts(rows: int, n: int) -> list[list[int]]:
    return np.random.default_rng(5).integers(3, 300, (rows, n)).tolist()


@pytest.mark.parametrize("family", SCAN_FAMILIES)
def test_the_one_token_graph_has_no_control_flow(family: str) -> None:
    graph = exports.family(BUILDERS[family]) / "model.onnx"
    original = onnx.load(str(graph))
    assert control_flow(original)  # each Mamba1 layer's Scan
    prompts, steps, _, _ = split_for_capture(original, graph, query_seqlens=True, share=False)
    step = onnx.load_from_string(steps)
    assert control_flow(step) == []
    ids = next(i for i in step.graph.input if i.name == "input_ids")
    assert ids.type.tensor_type.shape.dim[1].dim_value == 1  # one token: any other length is refused
    assert control_flow(onnx.load_from_string(prompts))  # prompts keep the parallel Scan
    session = ort.InferenceSession(steps, providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].shape[1] == 1


@pytest.mark.parametrize("family", SCAN_FAMILIES)
def test_captured_steps_through_the_one_token_graph_match(family: str) -> None:
    directory = exports.family(BUILDERS[family])
    plain, fixed = hybridrt.load(directory, "cpu"), hybridrt.load(directory, "cpu", cuda_graph=True)
    assert fixed.decode_session is not None and plain.decode_session is None
    prompts = _prompts(2, 17)
    assert fixed.generate(prompts, **GREEDY) == plain.generate(prompts, **GREEDY)
    a, b = plain.stepper(2, 64), fixed.stepper(2, 64)
    la, lb = a.forward(np.array(prompts)), b.forward(np.array(prompts))
    np.testing.assert_array_equal(la, lb)  # the prompt: the same session, the same graph
    for _ in range(8):
        nxt = la.argmax(-1)[:, None]
        la, lb = a.forward(nxt), b.forward(nxt)
        np.testing.assert_allclose(lb, la, rtol=0, atol=1e-5)
        assert (lb.argmax(-1) == la.argmax(-1)).all()
    assert b._captured is not None and b._captured.session is fixed.decode_session.session
    assert len(b._captured.graph_ids) == 2  # the steps ran there, one graph per binding


def test_both_sessions_read_one_copy_of_the_weights(jamba_onnx: Path) -> None:
    """On the CPU both sessions read the weights from the arrays they were given: the graphs
    they were opened from hold no weights of their own (a session that read one would fail)."""
    graph = jamba_onnx / "model.onnx"
    prompts, steps, _, arrays = split_for_capture(onnx.load(str(graph)), graph, query_seqlens=True, share=True)
    assert "model.embed_tokens.weight" in arrays and "lm_head.weight" in arrays
    for data in (prompts, steps):
        held = {t.name for t in onnx.load_from_string(data).graph.initializer if t.raw_data}
        assert not held & set(arrays)
    options = ort.SessionOptions()
    options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(jamba_onnx))
    with pytest.raises(Exception, match="model.embed_tokens.weight|external data"):
        ort.InferenceSession(prompts, options, providers=["CPUExecutionProvider"])  # not given the arrays
    model = hybridrt.load(jamba_onnx, "cpu", cuda_graph=True)
    assert model.decode_session is not None
    shared = model.decode_session.weights[0]
    assert set(shared) == set(arrays)
    for name, array in arrays.items():
        np.testing.assert_array_equal(shared[name], array)


def test_weights_in_an_external_data_file(jamba_onnx: Path, tmp_path: Path) -> None:
    """A graph whose weights are in a data file beside it (every shipped size) shares them as a
    read-only map of that file."""
    directory = exports.external_copy(jamba_onnx, tmp_path / "external")
    plain, fixed = hybridrt.load(directory, "cpu"), hybridrt.load(directory, "cpu", cuda_graph=True)
    assert fixed.decode_session is not None
    assert all(isinstance(a, np.memmap) for a in fixed.decode_session.weights[0].values())
    prompts = _prompts(1, 11)
    assert fixed.generate(prompts, **GREEDY) == plain.generate(prompts, **GREEDY)


def test_a_quantized_graph_s_captured_steps_match(jamba_int4: Path) -> None:
    """Regression: weights that onnxruntime's constant folding reads at load (the int4 graph's
    scales, reshaped) were detached and the session failed to open; and unpacked, the int4
    kernels of the decode session computed other logits (2.7e-3 apart, a greedy token changed)."""
    plain, fixed = hybridrt.load(jamba_int4, "cpu"), hybridrt.load(jamba_int4, "cpu", cuda_graph=True)
    assert fixed.decode_session is not None and fixed.decode_session.weights[0]
    prompts = _prompts(2, 15)
    assert fixed.generate(prompts, **GREEDY) == plain.generate(prompts, **GREEDY)
    a, b = plain.stepper(2, 64), fixed.stepper(2, 64)
    la, lb = a.forward(np.array(prompts)), b.forward(np.array(prompts))
    for _ in range(6):
        nxt = la.argmax(-1)[:, None]
        la, lb = a.forward(nxt), b.forward(nxt)
        np.testing.assert_allclose(lb, la, rtol=0, atol=1e-5)
