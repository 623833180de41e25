"""Mamba1 scan formulations on onnxruntime's CPU provider (jamba-125m sizes: d_inner 1536,
d_state 16), one graph each, 2 intra-op threads, milliseconds per call:

- LinearAttention: d_inner heads of d_state keys and one value, B and C tiled to every head,
  the state transposed to the node's [b, H, n, 1] (graph contract 2's formulation);
- Scan: an onnxruntime Scan over the tokens whose body is the step on the [b, n, H] state
  (contract 3, export.projections.expand_selective_scans);
- step: the one-token step as plain nodes (what the Scan body runs once).
"""

import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

rng = np.random.default_rng(0)
b, H, n = 1, 1536, 16
I = lambda *v: np.array(v, np.int64)  # noqa: E731


def session(nodes, inits, inputs, outputs):
    vis = [h.make_tensor_value_info(name, TP.FLOAT, None) for name in inputs]
    g = h.make_graph(nodes, "g", vis, [onnx.ValueInfoProto(name=o) for o in outputs], [nh.from_array(v, k) for k, v in inits.items()])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 20), h.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.log_severity_level = 2, 3
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def timed(s, feeds, calls):
    s.run(None, feeds)
    t0 = time.perf_counter()
    for _ in range(calls):
        out = s.run(None, feeds)
    return (time.perf_counter() - t0) / calls * 1e3, out


A = -np.exp(rng.standard_normal((n, H)).astype(np.float32) * 0.5)  # [n, H]
la = [
    h.make_node("Unsqueeze", ["dt", "ax3"], ["dtu"]),
    h.make_node("Transpose", ["A"], ["Ah"], perm=[1, 0]),
    h.make_node("Mul", ["dtu", "Ah"], ["ld"]),
    h.make_node("Reshape", ["ld", "packed"], ["g"]),
    h.make_node("Tile", ["C", "heads"], ["q"]),
    h.make_node("Tile", ["B", "heads"], ["k"]),
    h.make_node("Transpose", ["h0"], ["h0t"], perm=[0, 2, 1]),
    h.make_node("Unsqueeze", ["h0t", "ax3"], ["past"]),
    h.make_node("LinearAttention", ["q", "k", "xdt", "past", "g"], ["y", "st4"], domain="com.microsoft",
                update_rule="gated", q_num_heads=H, kv_num_heads=H, scale=1.0),
    h.make_node("Squeeze", ["st4", "ax3"], ["st"]),
    h.make_node("Transpose", ["st"], ["h1"], perm=[0, 2, 1]),
]
sizes = {"h_in": ["b", "n", "H"], "dt_i": ["b", 1, "H"], "x_i": ["b", 1, "H"], "B_i": ["b", "n", 1], "C_i": ["b", 1, "n"]}
body = h.make_graph(
    [
        h.make_node("Mul", ["dt_i", "A"], ["ld"]),
        h.make_node("Exp", ["ld"], ["a"]),
        h.make_node("Mul", ["a", "h_in"], ["kept"]),
        h.make_node("Mul", ["B_i", "x_i"], ["u"]),
        h.make_node("Add", ["kept", "u"], ["h_out"]),
        h.make_node("MatMul", ["C_i", "h_out"], ["y_i"]),
    ],
    "body",
    [h.make_tensor_value_info(k, TP.FLOAT, v) for k, v in sizes.items()],
    [h.make_tensor_value_info("h_out", TP.FLOAT, ["b", "n", "H"]), h.make_tensor_value_info("y_i", TP.FLOAT, ["b", 1, "H"])],
    [nh.from_array(A, "A")],  # a constant of the body, as export.fuse writes it
)
scan = [
    h.make_node("Unsqueeze", ["dt", "ax2"], ["dt4"]),
    h.make_node("Unsqueeze", ["xdt", "ax2"], ["x4"]),
    h.make_node("Unsqueeze", ["B", "ax3"], ["B4"]),
    h.make_node("Unsqueeze", ["C", "ax2"], ["C4"]),
    h.make_node("Scan", ["h0", "dt4", "x4", "B4", "C4"], ["h1", "y4"], num_scan_inputs=4, body=body,
                scan_input_axes=[1, 1, 1, 1], scan_output_axes=[1]),
    h.make_node("Reshape", ["y4", "packed"], ["y"]),
]
step = [
    h.make_node("Mul", ["dt", "A"], ["ld"]),
    h.make_node("Exp", ["ld"], ["a"]),
    h.make_node("Mul", ["a", "h0"], ["kept"]),
    h.make_node("Reshape", ["B", "col"], ["Bc"]),
    h.make_node("Mul", ["Bc", "xdt"], ["u"]),
    h.make_node("Add", ["kept", "u"], ["h1"]),
    h.make_node("MatMul", ["C", "h1"], ["y"]),
]
consts = dict(A=A, ax2=I(2), ax3=I(3), packed=I(0, 0, -1), heads=I(1, 1, H), col=I(0, -1, 1))
names = ["dt", "xdt", "B", "C", "h0"]
for T in (1, 128, 1900):
    feeds = dict(
        dt=np.abs(rng.standard_normal((b, T, H))).astype(np.float32) * 0.1,
        xdt=rng.standard_normal((b, T, H)).astype(np.float32),
        B=rng.standard_normal((b, T, n)).astype(np.float32),
        C=rng.standard_normal((b, T, n)).astype(np.float32),
        h0=rng.standard_normal((b, n, H)).astype(np.float32),
    )
    calls = {1: 2000, 128: 10, 1900: 3}[T]
    results = {}
    for name, nodes in [("LinearAttention", la), ("Scan", scan)] + ([("step", step)] if T == 1 else []):
        used = {k: v for k, v in consts.items() if any(k in nd.input for nd in nodes)}
        results[name] = timed(session(nodes, used, names, ["y", "h1"]), feeds, calls)
    ref_y, ref_h = results["LinearAttention"][1]
    line = ", ".join(
        f"{k} {ms:.3f} ms (|dy| {np.abs(y - ref_y).max():.1e}, |dh| {np.abs(s - ref_h).max():.1e})"
        for k, (ms, (y, s)) in results.items()
    )
    print(f"T={T}: {line}")
