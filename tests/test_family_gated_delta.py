"""Gated DeltaNet (Qwen3-Next, Qwen3.5): the chunked plain-op scan against the per-token
recurrence and transformers' rule, padding as the identity step, the onnxruntime
`LinearAttention` gated_delta node against the plain ops, and a plain-op model export."""

from __future__ import annotations

import exports
import numpy as np
import pytest
import torch

from hybridrt.models.recurrences.delta_scan import gated_delta_scan

TOL = 1e-4
B, H, K, V = 2, 4, 8, 12


def _inputs(length: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(B, length, H, K, generator=gen), dim=-1) * K**-0.5
    k = torch.nn.functional.normalize(torch.randn(B, length, H, K, generator=gen) + 0.5, dim=-1)
    v = torch.randn(B, length, H, V, generator=gen)
    g = -torch.rand(B, length, H, generator=gen) * 2
    beta = torch.rand(B, length, H, generator=gen)
    s0 = torch.randn(B, H, K, V, generator=gen)
    return q, k, v, g, beta, s0


@pytest.mark.parametrize("length", [2, 16, 17, 64, 300])
def test_chunked_scan_equals_step_by_step(length: int) -> None:
    q, k, v, g, beta, s0 = _inputs(length, length)
    out, last = gated_delta_scan(q, k, v, g, beta, s0, 16, 512)
    s, steps = s0, []
    for t in range(length):
        o, s = gated_delta_scan(
            q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], g[:, t : t + 1], beta[:, t : t + 1], s, 16, 512
        )
        steps.append(o)
    assert (torch.cat(steps, dim=1) - out).abs().max().item() <= TOL
    assert (s - last).abs().max().item() <= TOL


@pytest.mark.parametrize("length", [1, 7, 64, 300])
def test_scan_matches_transformers_rule(length: int) -> None:
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_recurrent_gated_delta_rule

    q, k, v, g, beta, s0 = _inputs(length, 10 + length)
    ref, ref_state = torch_recurrent_gated_delta_rule(
        q * K**0.5, k, v, g=g, beta=beta, initial_state=s0, output_final_state=True
    )
    out, last = gated_delta_scan(q, k, v, g, beta, s0, 16, 512)
    assert (out - ref).abs().max().item() <= TOL
    assert (last - ref_state).abs().max().item() <= TOL


def test_padding_step_leaves_state_unchanged() -> None:
    q, k, v, g, beta, s0 = _inputs(20, 3)
    g, beta = g.clone(), beta.clone()
    g[:, :5], beta[:, :5] = 0.0, 0.0
    _, alone = gated_delta_scan(q[:, 5:], k[:, 5:], v[:, 5:], g[:, 5:], beta[:, 5:], s0, 16, 512)
    _, padded = gated_delta_scan(q, k, v, g, beta, s0, 16, 512)
    assert (alone - padded).abs().max().item() <= 1e-5


def _linear_attention_session(rule: str):  # type: ignore[no-untyped-def]
    import onnxruntime as ort
    from onnx import TensorProto, helper

    names = ["q", "k", "v", "s", "g", "beta"]
    node = helper.make_node(
        "LinearAttention",
        names,
        ["o", "s2"],
        domain="com.microsoft",
        update_rule=rule,
        q_num_heads=H,
        kv_num_heads=H,
        scale=1.0,
    )
    graph = helper.make_graph(
        [node],
        "la",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ["o", "s2"]],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)]
    )
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("length", [1, 7, 64, 300])
def test_onnxruntime_gated_delta_node_equals_plain_ops(length: int) -> None:
    """onnxruntime's CPU LinearAttention "gated_delta" rule is the same recurrence, state [b, H, K, V]."""
    q, k, v, g, beta, s0 = _inputs(length, 20 + length)
    sess = _linear_attention_session("gated_delta")
    feeds = {
        "q": q.reshape(B, length, -1).numpy(),
        "k": k.reshape(B, length, -1).numpy(),
        "v": v.reshape(B, length, -1).numpy(),
        "s": s0.numpy(),
        "g": g.numpy(),
        "beta": beta.numpy(),
    }
    o, s = sess.run(None, feeds)
    out, last = gated_delta_scan(q, k, v, g, beta, s0, 16, 512)
    assert np.abs(o.reshape(B, length, H, V) - out.numpy()).max() <= TOL
    assert np.abs(s - last.numpy()).max() <= TOL


@pytest.mark.parametrize("fused", [True, False])
def test_export_routes_gated_delta_through_linear_attention(fused: bool) -> None:
    """fused_ops: one LinearAttention gated_delta node per Gated DeltaNet layer; otherwise plain
    ONNX ops only. Both pass parity at every length."""
    import onnx
    from family_checkpoints import make_qwen3_next

    from hybridrt.graphs.manifest import read_manifest

    out = exports.export(make_qwen3_next, fused_ops=fused, validate=True)
    manifest = read_manifest(out)
    graph = onnx.load(str(out / "model.onnx"))
    rules = [
        a.s.decode()
        for n in graph.graph.node
        if n.op_type == "LinearAttention"
        for a in n.attribute
        if a.name == "update_rule"
    ]
    if fused:
        assert rules == ["gated_delta", "gated_delta"]
    else:
        assert rules == [] and {n.domain for n in graph.graph.node} <= {"", "ai.onnx"}
    assert manifest.parity["passed"] is True and manifest.parity["max_abs_logits"] <= TOL
    assert [c["seq"] for c in manifest.parity["prompt"]] == [1, 7, 64, 300, 17]


@pytest.mark.parametrize("size", [1, 12, 16, 64])
def test_blockwise_inverse_equals_forward_substitution(size: int) -> None:
    """The prompt graph inverts the chunk's unit lower-triangular system blockwise (log2 L
    steps); it gives forward substitution's inverse (L - 1 row steps, transformers' way) to
    float32 rounding, and is no further than it from the float64 inverse."""
    from hybridrt.models.recurrences.delta_scan import unit_lower_inverse

    g = torch.Generator().manual_seed(size)
    k = torch.nn.functional.normalize(torch.randn(2, 3, 4, size, 8, generator=g), dim=-1)
    beta = torch.rand(2, 3, 4, size, 1, generator=g)
    decay = torch.rand(2, 3, 4, size, size, generator=g)
    n = torch.tril(torch.matmul(k * beta, k.transpose(-1, -2)) * decay, -1)
    rows = [torch.eye(size)[:1].expand(2, 3, 4, 1, size)]
    for i in range(1, size):
        rows.append(torch.eye(size)[i : i + 1] - torch.matmul(n[..., i : i + 1, :i], torch.cat(rows, dim=-2)))
    substituted = torch.cat(rows, dim=-2)
    exact = torch.linalg.inv(torch.eye(size, dtype=torch.float64) + n.double())
    blockwise = unit_lower_inverse(n)
    assert (blockwise - substituted).abs().max().item() <= 1e-6
    assert (blockwise.double() - exact).abs().max().item() <= max(
        1e-7, 1.5 * (substituted.double() - exact).abs().max().item()
    )
