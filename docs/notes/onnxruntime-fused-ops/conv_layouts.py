"""The depthwise causal conv of a prompt and of a token on onnxruntime's CPU provider: a chain of
28 convs of granite-h-350m's width (1,792 channels, kernel 4, SiLU), channels-last activations
between them, 2 intra-op threads, memory patterns off (as hybridrt's loader opens CPU sessions),
milliseconds per call of the whole chain:

- ccws: Transpose, CausalConvWithState (activation silu), Transpose;
- ccws-none: the same with activation none and SiLU as Sigmoid and Mul after the node (what the
  exporter writes: onnxruntime fuses the two into its vectorized QuickGelu);
- conv: a grouped Conv over [b, C, 1, k-1+l] (state, then tokens), SiLU as Sigmoid and Mul,
  which onnxruntime's NCHWc transformer runs on blocked channels on x86;
- if-each: an If on the call's length per conv (models/ops/causal_conv.py), each with its own
  condition: several tokens the conv above (its weight held by the branch), one token
  CausalConvWithState (activation none) then Sigmoid and Mul;
- if-shared: the same Ifs reading one condition (graphs.step_graph.share_length_condition).

Every form gives the same outputs and states as ccws (checked within 1e-5 below).
"""

import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

C, K, N = 1792, 4, 28
rng = np.random.default_rng(0)
WEIGHTS = [(rng.standard_normal((C, 1, K)) * 0.3).astype(np.float32) for _ in range(N)]
BIASES = [(rng.standard_normal(C) * 0.1).astype(np.float32) for _ in range(N)]


def vi(name, shape=None):
    return h.make_tensor_value_info(name, TP.FLOAT, shape)


def i64(name, v):
    return nh.from_array(np.array(v, np.int64), name)


def conv_nodes(p, x, s, y, so):
    return [
        h.make_node("Transpose", [s], [p + "st"], perm=[0, 2, 1]),
        h.make_node("Concat", [p + "st", x], [p + "xp"], axis=1),
        h.make_node("Unsqueeze", [p + "xp", p + "ax1"], [p + "xp4"]),
        h.make_node("Transpose", [p + "xp4"], [p + "xn"], perm=[0, 3, 1, 2]),
        h.make_node("Conv", [p + "xn", p + "w4", p + "b"], [p + "yn"], group=C, kernel_shape=[1, K]),
        h.make_node("Transpose", [p + "yn"], [p + "y4"], perm=[0, 2, 3, 1]),
        h.make_node("Squeeze", [p + "y4", p + "ax1"], [p + "y0"]),
        h.make_node("Sigmoid", [p + "y0"], [p + "sg"]),
        h.make_node("Mul", [p + "y0", p + "sg"], [y]),
        h.make_node("Slice", [p + "xp", p + "keep", p + "end", p + "ax1"], [p + "last"]),
        h.make_node("Transpose", [p + "last"], [so], perm=[0, 2, 1]),
    ]


def conv_constants(p, w, b):
    return [
        nh.from_array(w.reshape(C, 1, 1, K), p + "w4"),
        nh.from_array(b, p + "b"),
        i64(p + "ax1", [1]),
        i64(p + "keep", [-(K - 1)]),
        i64(p + "end", [np.iinfo(np.int64).max]),
    ]


def build(kind):
    nodes, inits = [], [i64("one", [1])]
    inputs, outputs = [vi("x0", [1, "l", C])], [vi(f"x{N}")]
    for i in range(N):
        x, y, s, so, p = f"x{i}", f"x{i + 1}", f"s{i}", f"so{i}", f"/c{i}/"
        w, b = WEIGHTS[i], BIASES[i]
        inputs.append(vi(s, [1, C, K - 1]))
        outputs.append(vi(so))
        if kind in ("ccws", "ccws-none"):
            inits += [nh.from_array(w, p + "w"), nh.from_array(b, p + "b")]
            fused = kind == "ccws"
            nodes += [
                h.make_node("Transpose", [x], [p + "xt"], perm=[0, 2, 1]),
                h.make_node(
                    "CausalConvWithState", [p + "xt", p + "w", p + "b", s], [p + "yt" if fused else p + "z", so],
                    domain="com.microsoft", activation="silu" if fused else "none",
                ),
            ]
            if not fused:
                nodes += [
                    h.make_node("Sigmoid", [p + "z"], [p + "sg"]),
                    h.make_node("Mul", [p + "z", p + "sg"], [p + "yt"]),
                ]
            nodes.append(h.make_node("Transpose", [p + "yt"], [y], perm=[0, 2, 1]))
            continue
        if kind == "conv":
            inits += conv_constants(p, w, b)
            nodes += conv_nodes(p, x, s, y, so)
            continue
        prompt = h.make_graph(conv_nodes(p, x, s, p + "ya", p + "sa"), "prompt", [], [vi(p + "ya"), vi(p + "sa")])
        prompt.initializer.extend(conv_constants(p, w, b))
        step = h.make_graph(
            [
                h.make_node("Transpose", [x], [p + "xt"], perm=[0, 2, 1]),
                h.make_node(
                    "CausalConvWithState", [p + "xt", p + "we", p + "be", s], [p + "yt", p + "sb"],
                    domain="com.microsoft", activation="none",
                ),
                h.make_node("Transpose", [p + "yt"], [p + "z"], perm=[0, 2, 1]),
                h.make_node("Sigmoid", [p + "z"], [p + "sg"]),
                h.make_node("Mul", [p + "z", p + "sg"], [p + "yb"]),
            ],
            "step", [], [vi(p + "yb"), vi(p + "sb")],
            initializer=[nh.from_array(w, p + "we"), nh.from_array(b, p + "be")],
        )
        cond = p + "several" if kind == "if-each" else "several"
        if kind == "if-each" or i == 0:
            src = x if kind == "if-each" else "x0"
            nodes += [
                h.make_node("Shape", [src], [cond + "/len"], start=1, end=2),
                h.make_node("Greater", [cond + "/len", "one"], [cond + "/gt"]),
                h.make_node("Squeeze", [cond + "/gt"], [cond]),
            ]
        nodes.append(h.make_node("If", [cond], [y, so], then_branch=prompt, else_branch=step))
    graph = h.make_graph(nodes, "chain", inputs, outputs, initializer=inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 20), h.make_opsetid("com.microsoft", 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.enable_mem_pattern = False
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


sessions = {k: build(k) for k in ("ccws", "ccws-none", "conv", "if-each", "if-shared")}
for length in (1, 225):
    feeds = {"x0": rng.standard_normal((1, length, C)).astype(np.float32)}
    feeds |= {f"s{i}": rng.standard_normal((1, C, K - 1)).astype(np.float32) for i in range(N)}
    want = sessions["ccws"].run(None, feeds)
    for name, session in sessions.items():
        got = session.run(None, feeds)
        err = max(float(np.abs(a - b).max() / max(1.0, np.abs(b).max())) for a, b in zip(got, want))
        assert err < 1e-5, (name, length, err)
    times = {k: [] for k in sessions}
    n = 300 if length == 1 else 5
    for _ in range(9):
        for name, session in sessions.items():
            t0 = time.perf_counter()
            for _ in range(n):
                session.run(None, feeds)
            times[name].append((time.perf_counter() - t0) / n * 1e3)
    print(f"{length} tokens:", {k: round(float(np.median(v)), 3) for k, v in times.items()}, "ms")
