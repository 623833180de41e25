"""The standard-operator graph that the transformers.js and onnxruntime-genai layouts carry
(`fused_ops=False, fuse_norms=False`: no com.microsoft scan) keeps the fused layout's 1e-4
against the PyTorch reference at prompts of 1, 37, 300 and 2,048 tokens and over decode steps,
on the Gated DeltaNet families with wide weights (every 2-D weight but the embedding at
0.6/sqrt(fan_in)), where its chunked prompt graph loses precision first.
benchmarks/check_long_parity.py --standard-ops --wide 0.6 runs every family the same way."""

from __future__ import annotations

import exports
import onnx
import pytest
from family_checkpoints import make_wide

from hybridrt.export.parity import TOLERANCE, measure_parity, ort_runner
from hybridrt.models.loading.checkpoint import load_model

LENGTHS = (1, 37, 300, 2048)


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5", "qwen3_5_moe"])
def test_the_layouts_graph_stays_within_tolerance_at_2048_tokens_with_wide_weights(family: str) -> None:
    ckpt = exports.checkpoint(make_wide, family=family)
    out = exports.export(ckpt, fused_ops=False, fuse_norms=False)
    graph = onnx.load(str(out / "model.onnx"), load_external_data=False).graph
    assert not {"LinearAttention", "CausalConvWithState"} & {n.op_type for n in graph.node}
    model, _ = load_model(ckpt)
    report = measure_parity(model, ort_runner(out / "model.onnx", model), LENGTHS, decode_steps=16)
    assert [c["seq"] for c in report["prompt"]][: len(LENGTHS)] == list(LENGTHS)
    assert report["decode"]["steps"] == 16
    worst = {c["seq"]: c["max_abs_logits"] for c in report["prompt"]}
    assert report["passed"] and report["max_abs_logits"] <= TOLERANCE, (worst, report["decode"])
