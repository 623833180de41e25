"""The capture rewrite (graphs/compat.capture_inputs) on every family's fused export, on the
CPU provider: what onnxruntime placed on the CPU in a GPU run (the small integer arithmetic on
past_lengths: the attention's lengths, and the rotary positions) becomes graph inputs that the
runtime feeds, and the rewritten graph gives the original's tokens and logits."""

from __future__ import annotations

import exports
import numpy as np
import onnx
import pytest
from family_checkpoints import BUILDERS

import hybridrt
from hybridrt.graphs.compat import LENGTH_INPUTS, POSITION_IDS, capture_inputs
from hybridrt.graphs.edit import node_reads, walk
from hybridrt.graphs.feeds import PAST_LENGTHS


@pytest.mark.parametrize("family", sorted(BUILDERS))
def test_no_node_reads_past_lengths_after_the_rewrite(family: str) -> None:
    """Regression: graphs with rotary positions computed them from past_lengths in the graph
    (an Add, Unsqueeze and Range on the CPU in a GPU run), after the lengths had become inputs."""
    model = onnx.load(str(exports.family(BUILDERS[family]) / "model.onnx"))
    ops = {n.op_type for n in walk(model.graph)}
    rotary = "Cos" in ops  # the graph computes cos and sin of its positions
    added = capture_inputs(model)
    assert ("GroupQueryAttention" in ops) == (set(LENGTH_INPUTS.values()) <= set(added))
    assert rotary == (POSITION_IDS in added)
    assert not [n.name for n in walk(model.graph) if PAST_LENGTHS in node_reads(n)]
    assert not {n.op_type for n in walk(model.graph)} & {"Range", "ReduceMax", "Sub"}


@pytest.mark.parametrize("family", sorted(BUILDERS))
def test_the_rewritten_graph_gives_the_original_tokens_and_logits(family: str) -> None:
    directory = exports.family(BUILDERS[family])
    plain, fixed = hybridrt.load(directory, "cpu"), hybridrt.load(directory, "cpu", cuda_graph=True)
    prompts = np.random.default_rng(11).integers(3, 300, (2, 13))
    greedy = {"max_new_tokens": 8, "min_new_tokens": 8, "do_sample": False}
    assert fixed.generate(prompts.tolist(), **greedy) == plain.generate(prompts.tolist(), **greedy)
    a, b = plain.stepper(2, 64), fixed.stepper(2, 64)
    la, lb = a.forward(prompts, all_logits=True), b.forward(prompts, all_logits=True)
    np.testing.assert_allclose(lb, la, rtol=0, atol=1e-5)
    la, lb = la[:, -1], lb[:, -1]
    for _ in range(6):
        nxt = la.argmax(-1)[:, None]
        la, lb = a.forward(nxt), b.forward(nxt)
        np.testing.assert_allclose(lb, la, rtol=0, atol=1e-5)
        assert (lb.argmax(-1) == la.argmax(-1)).all()
