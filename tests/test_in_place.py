"""States read and written in one buffer (graphs.manifest.in_place_states, the manifest's `in_place`, and
BoundStepper with ring=1): which states a graph allows, that onnxruntime's kernels give the
same values in one buffer as in two, and that steppers in place continue exactly as those with
two sets through prompts, decode steps, joins, leaves and a change to a rewinding stepper."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import hybridrt
from hybridrt.errors import GenerationError, GraphError
from hybridrt.graphs.contract import TensorSpec
from hybridrt.graphs.inspect import describe
from hybridrt.graphs.manifest import in_place_states
from hybridrt.runtime.bound import BoundStepper
from hybridrt.runtime.decode import prefill

MS = "com.microsoft"


def _session(node: onnx.NodeProto, inputs: list, outputs: list, inits: list | None = None) -> ort.InferenceSession:
    graph = helper.make_graph([node], "g", inputs, outputs, inits or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _run(session: ort.InferenceSession, feeds: dict, past: np.ndarray, present: np.ndarray) -> np.ndarray:
    """One call with the state bound as `past` and `present` (the same array: in place)."""
    binding = session.io_binding()
    for name, x in feeds.items():
        binding.bind_cpu_input(name, x)
    value = ort.OrtValue.ortvalue_from_numpy(past)
    binding.bind_ortvalue_input("s", value)
    binding.bind_ortvalue_output("p", value if present is past else ort.OrtValue.ortvalue_from_numpy(present))
    binding.bind_output("y", "cpu")
    session.run_with_iobinding(binding)
    return np.asarray(binding.get_outputs()[0].numpy())


def _compare(session: ort.InferenceSession, feeds_of, state_shape: tuple[int, ...], lengths: list[int]) -> None:
    """Calls of `lengths` tokens: one buffer against two alternating ones, outputs and states bit for bit."""
    rng = np.random.default_rng(0)
    a, b = np.zeros(state_shape, np.float32), np.zeros(state_shape, np.float32)
    one = np.zeros(state_shape, np.float32)
    for call, n in enumerate(lengths):
        feeds = feeds_of(rng, n)
        src, dst = (a, b) if call % 2 == 0 else (b, a)
        want = _run(session, feeds, src, dst)
        got = _run(session, feeds, one, one)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(one, dst)


def test_linear_attention_in_one_buffer_equals_two() -> None:
    """Mamba2's scan (one query head for every kv head, a decay per head) and the gated delta
    rule, batch 2, over prompts and decode steps."""
    heads, dk, dv = 4, 16, 8
    for rule, q_heads in (("gated", 1), ("gated_delta", heads)):
        extra = ["b"] if rule == "gated_delta" else []
        node = helper.make_node(
            "LinearAttention",
            ["q", "k", "v", "s", "g", *extra],
            ["y", "p"],
            domain=MS,
            q_num_heads=q_heads,
            kv_num_heads=heads,
            update_rule=rule,
            scale=1.0,
        )
        inputs = [
            helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, "t", w])
            for n, w in (("q", q_heads * dk), ("k", heads * dk), ("v", heads * dv), ("g", heads))
        ]
        inputs += [helper.make_tensor_value_info("s", TensorProto.FLOAT, [2, heads, dk, dv])]
        inputs += [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, "t", heads])] if extra else []
        outputs = [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("p", TensorProto.FLOAT, [2, heads, dk, dv]),
        ]
        session = _session(node, inputs, outputs)

        def feeds(rng: np.random.Generator, n: int, q_heads: int = q_heads, extra: list = extra) -> dict:
            out = {
                "q": rng.standard_normal((2, n, q_heads * dk), np.float32),
                "k": rng.standard_normal((2, n, heads * dk), np.float32) * 0.2,
                "v": rng.standard_normal((2, n, heads * dv), np.float32),
                "g": -np.abs(rng.standard_normal((2, n, heads), np.float32)) * 0.1,
            }
            if extra:
                out["b"] = rng.uniform(0, 1, (2, n, heads)).astype(np.float32)
            return out

        _compare(session, feeds, (2, heads, dk, dv), [5, 1, 1, 3, 1, 64, 1])


@pytest.mark.parametrize("kernel", [2, 4, 7])
def test_causal_conv_in_one_buffer_equals_two(kernel: int) -> None:
    """The decode path shifts the state left in place; the prompt path reads it first."""
    channels = 24
    node = helper.make_node("CausalConvWithState", ["x", "w", "", "s"], ["y", "p"], domain=MS, activation="silu")
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, channels, "t"]),
        helper.make_tensor_value_info("s", TensorProto.FLOAT, [2, channels, kernel - 1]),
    ]
    outputs = [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, channels, "t"]),
        helper.make_tensor_value_info("p", TensorProto.FLOAT, [2, channels, kernel - 1]),
    ]
    weight = np.random.default_rng(1).standard_normal((channels, 1, kernel)).astype(np.float32)
    session = _session(node, inputs, outputs, [onnx.numpy_helper.from_array(weight, "w")])

    def feeds(rng: np.random.Generator, n: int) -> dict:
        return {"x": rng.standard_normal((2, channels, n), np.float32)}

    _compare(session, feeds, (2, channels, kernel - 1), [5, 1, 1, 2, 1, 1, 9, 1])


def _spec(name: str, dims: tuple) -> TensorSpec:
    return TensorSpec(name, dims, "float32", name.rsplit(".", 1)[-1], 0)


def test_only_a_state_whose_one_reader_writes_it_is_in_place() -> None:
    conv = _spec("past.0.conv", ("batch", 8, 3))
    ssm = _spec("past.0.ssm", ("batch", 2, 4, 4))
    other = _spec("past.1.conv", ("batch", 8, 3))
    nodes = [
        helper.make_node("CausalConvWithState", ["x", "w", "", "past.0.conv"], ["y", "present.0.conv"], domain=MS),
        helper.make_node("LinearAttention", ["q", "k", "v", "past.0.ssm", "g"], ["o", "present.0.ssm"], domain=MS),
        # A second reader (a Shape) of layer 1's conv state: it must keep two buffers.
        helper.make_node("CausalConvWithState", ["x", "w", "", "past.1.conv"], ["z", "present.1.conv"], domain=MS),
        helper.make_node("Shape", ["past.1.conv"], ["shape"]),
    ]
    graph = helper.make_graph(nodes, "g", [], [])
    assert in_place_states(graph, [conv, ssm, other]) == ["past.0.conv", "past.0.ssm"]
    # Written by another op (plain Concat/Slice or a Scan), or under another name: two buffers.
    plain = helper.make_graph(
        [
            helper.make_node("Concat", ["past.0.conv", "x"], ["cat"], axis=2),
            helper.make_node("Slice", ["cat", "a", "b", "c"], ["present.0.conv"]),
            helper.make_node("LinearAttention", ["q", "k", "v", "past.0.ssm", "g"], ["o", "present.9.ssm"], domain=MS),
        ],
        "g",
        [],
        [],
    )
    assert in_place_states(plain, [conv, ssm]) == []


def test_manifest_in_place_names_a_fixed_state(jamba_onnx: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "model"
    shutil.copytree(jamba_onnx, copy)
    data = json.loads((copy / "hybridrt.json").read_text())
    assert data["in_place"] and all(".conv" in n for n in data["in_place"])  # Mamba1's SSM is a Scan's
    fixed = sum(1 for s in data["inputs"] if s["name"].startswith("past.") and s["kind"] in ("conv", "ssm"))
    assert f"in place: {len(data['in_place'])} of {fixed} fixed-size states" in describe(copy)
    data["in_place"] = ["past.1.key"]
    (copy / "hybridrt.json").write_text(json.dumps(data))
    with pytest.raises(GraphError, match="past.1.key.*not a fixed-size state"):
        hybridrt.load(copy)


def _ids(rng: np.random.Generator, rows: int, n: int) -> np.ndarray:
    return rng.integers(3, 300, (rows, n)).astype(np.int64)


def test_stepper_in_place_equals_two_sets(jamba_onnx: Path) -> None:
    """Prompt chunks, decode steps, a join, a reorder (beam search's) and a leave: the same
    logits bit for bit; the in-place stepper's conv states are one buffer in both sets."""
    model = hybridrt.load(jamba_onnx)
    fast, slow = model.stepper(2, 32), model.stepper(2, 32, ring=2)
    assert isinstance(fast, BoundStepper) and isinstance(slow, BoundStepper)
    shared = [a is b for a, b in zip(*fast._fixed_pool)]
    assert shared == [s.name in model.manifest.in_place for s in fast.fixed] and any(shared)
    assert not any(a is b for a, b in zip(*slow._fixed_pool))
    rng = np.random.default_rng(3)
    calls = [_ids(rng, 2, 6), _ids(rng, 2, 3), *[_ids(rng, 2, 1) for _ in range(4)]]
    for ids in calls:
        np.testing.assert_array_equal(fast.forward(ids), slow.forward(ids))
    for stepper in (fast, slow):
        other = model.stepper(1, 32, ring=stepper.ring)
        prefill(other, [[5, 6, 7, 8]])
        stepper.extend(other)
        stepper.reorder([2, 0, 0, 1])
    for _ in range(3):
        ids = _ids(rng, 4, 1)
        np.testing.assert_array_equal(fast.forward(ids), slow.forward(ids))
    for stepper in (fast, slow):
        stepper.reorder([1])
    ids = _ids(rng, 1, 1)
    np.testing.assert_array_equal(fast.forward(ids), slow.forward(ids))


def test_an_in_place_stepper_does_not_rewind_but_becomes_one_that_does(jamba_onnx: Path) -> None:
    model = hybridrt.load(jamba_onnx)
    stepper = model.stepper(1, 16)
    stepper.forward(np.asarray([[5, 17, 99]]))
    mark = stepper.checkpoint()
    stepper.forward(np.asarray([[4]]))
    with pytest.raises(GenerationError, match="keeps 1 sets.*ring > 1"):
        stepper.rewind(mark)
    rewinding = stepper.rewinding(1)
    assert rewinding is not stepper and rewinding.ring == 2 and rewinding.rewinding(1) is rewinding
    with pytest.raises(GenerationError, match="reorder"):
        rewinding.rewind(mark)  # the other stepper's mark names its buffers
    mark = rewinding.checkpoint()
    want = stepper.forward(np.asarray([[8]])).copy()  # the first stepper goes on with its own buffers
    rewinding.forward(np.asarray([[1]]))
    rewinding.rewind(mark)
    np.testing.assert_array_equal(rewinding.forward(np.asarray([[8]])), want)


def test_chat_turns_in_place_then_with_a_draft(jamba_onnx: Path, jamba_int4: Path) -> None:
    """A session's first turn without a draft runs in place; a later turn with one needs
    rewinds, and gets them, with the tokens of plain decoding."""
    target, assistant = hybridrt.load(jamba_onnx), hybridrt.load(jamba_int4)
    plain, spec = target.session(), target.session()
    for i, turn in enumerate(["def add(a, b):", " return", "\nclass"]):
        expected = plain.generate(turn, max_new_tokens=10, eos_token_id=[])
        draft = assistant if i else None
        assert spec.generate(turn, assistant_model=draft, max_new_tokens=10, eos_token_id=[]) == expected
        assert spec.history == plain.history
