"""Mamba2's scan as one LinearAttention node, two ways (notes, "One key per group"), 2 threads,
granite-h-350m's sizes (24 heads, one group, d_state 128, head_dim 64):

- key per head: k = dt_h B (Unsqueeze, Unsqueeze, Mul: [b, l, 24 x 128]), v = x;
- one key per group: k = B ([b, l, 128], the node shares it across the group's 24 kv heads),
  v = dt_h x (Reshape, Unsqueeze, Mul, Reshape: [b, l, 24 x 64]).

Each form is the glue and the node in one session; the two sessions run in turn, 15 rounds, and
the medians are printed, with the largest difference between their outputs and states.
"""
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

H, N, P = 24, 128, 64
rng = np.random.default_rng(0)
A = nh.from_array(-rng.random(H, dtype=np.float32), "A")  # the same decay rates in both sessions


def vi(name, shape):
    return h.make_tensor_value_info(name, T.FLOAT, shape)


def const(name, values):
    return h.make_node("Constant", [], [name], value=nh.from_array(np.array(values, np.int64)))


def session(shared):
    if shared:
        glue = [const("s4", [0, 0, H, -1]), const("a3", [3]), const("s3", [0, 0, -1]),
                h.make_node("Reshape", ["x", "s4"], ["x4"]), h.make_node("Unsqueeze", ["dt", "a3"], ["d4"]),
                h.make_node("Mul", ["x4", "d4"], ["v4"]), h.make_node("Reshape", ["v4", "s3"], ["v"])]
        k, v = "B", "v"
    else:
        glue = [const("a3", [3]), const("a2", [2]), const("s3", [0, 0, -1]),
                h.make_node("Unsqueeze", ["dt", "a3"], ["d4"]), h.make_node("Unsqueeze", ["B", "a2"], ["b4"]),
                h.make_node("Mul", ["d4", "b4"], ["k4"]), h.make_node("Reshape", ["k4", "s3"], ["k"])]
        k, v = "k", "x"
    glue.append(h.make_node("Mul", ["dt", "A"], ["g"]))
    node = h.make_node("LinearAttention", ["C", k, v, "s", "g"], ["y", "s1"], domain="com.microsoft",
                       update_rule="gated", q_num_heads=1, kv_num_heads=H, scale=1.0)
    ins = [vi("x", [1, "l", H * P]), vi("dt", [1, "l", H]), vi("B", [1, "l", N]), vi("C", [1, "l", N]),
           vi("s", [1, H, N, P])]
    graph = h.make_graph(glue + [node], "g", ins, [vi("y", None), vi("s1", None)], [A])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 20), h.make_opsetid("com.microsoft", 1)], ir_version=10)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")  # two sessions in turn
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


per_head, shared = session(False), session(True)
for l in (1, 128, 512):
    feeds = {"x": rng.standard_normal((1, l, H * P), dtype=np.float32),
             "dt": rng.random((1, l, H), dtype=np.float32) * 0.1,
             "B": rng.standard_normal((1, l, N), dtype=np.float32),
             "C": rng.standard_normal((1, l, N), dtype=np.float32),
             "s": rng.standard_normal((1, H, N, P), dtype=np.float32)}
    a, b = per_head.run(None, feeds), shared.run(None, feeds)
    diff = max(float(np.abs(x - y).max() / max(np.abs(x).max(), 1e-30)) for x, y in zip(a, b))
    n = 200 if l == 1 else max(4, 2048 // l)
    times = {"per_head": [], "shared": []}
    for _ in range(15):
        for name, s in (("per_head", per_head), ("shared", shared)):
            t = time.perf_counter()
            for _ in range(n):
                s.run(None, feeds)
            times[name].append((time.perf_counter() - t) / n * 1e6)
    m = {k: float(np.median(v)) for k, v in times.items()}
    print(f"l={l}: key per head {m['per_head']:.1f} us, one key per group {m['shared']:.1f} us "
          f"({m['shared'] / m['per_head']:.2f}x); largest difference / largest value {diff:.1e}")
