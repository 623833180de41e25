"""Single nodes behind the 32-layer decode step (notes section 7, "Fewer nodes per layer"), 2 threads,
granite-h-350m's Mamba2 sizes (24 heads, d_state 128, head_dim 64) and llama-125m's attention.

1. LinearAttention "gated": C tiled to every head vs one query head (q_num_heads 1 < kv_num_heads 24).
2. The key dt_h * B: Unsqueeze, Unsqueeze, Mul vs one Einsum.
3. GatedDeltaNet "gated" (token-major, V-major state) vs LinearAttention for the same recurrence.
4. GroupQueryAttention at 1,900 tokens seen: float32 vs int8 KV buffer (per channel / per tensor scales).
5. QMoE of Granite-4.0-H-Tiny's shape (64 experts of 512, 6 routed, 4-bit blocks of 32) at accuracy 4 / 0.
"""
import sys, time
from pathlib import Path
import numpy as np, onnxruntime as ort
from onnx import helper as h, numpy_helper as nh, TensorProto as T

rng = np.random.default_rng(0)
vi = lambda n, s, t=T.FLOAT: h.make_tensor_value_info(n, t, s)
OPS = [h.make_opsetid("", 20), h.make_opsetid("com.microsoft", 1)]
def sess(nodes, ins, outs, inits=()):
    so = ort.SessionOptions(); so.intra_op_num_threads = 2; so.log_severity_level = 3
    m = h.make_model(h.make_graph(nodes, "g", ins, outs, list(inits)), opset_imports=OPS)
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
def timed(s, feeds, n):
    for _ in range(10): s.run(None, feeds)
    t = time.perf_counter()
    for _ in range(n): s.run(None, feeds)
    return (time.perf_counter() - t) / n * 1e6

H, N, P = 24, 128, 64
def la(hq):
    node = h.make_node("LinearAttention", ["q", "k", "v", "s", "d"], ["y", "s1"], domain="com.microsoft",
                       update_rule="gated", q_num_heads=hq, kv_num_heads=H, scale=1.0)
    return sess([node], [vi("q", [1, "l", hq * N]), vi("k", [1, "l", H * N]), vi("v", [1, "l", H * P]),
                         vi("s", [1, H, N, P]), vi("d", [1, "l", H])], [vi("y", None), vi("s1", None)])
def gdn():
    node = h.make_node("GatedDeltaNet", ["q", "k", "v", "", "d", "", "s"], ["y", "s1"], domain="com.microsoft",
                       update_rule="gated", scale=1.0)
    return sess([node], [vi("q", [1, "l", 1, N]), vi("k", [1, "l", 1, N]), vi("v", [1, "l", H, P]),
                         vi("s", [1, H, P, N]), vi("d", [1, "l", H])], [vi("y", None), vi("s1", None)])
for l in (1, 128):
    q = rng.standard_normal((1, l, N), dtype=np.float32); B = rng.standard_normal((1, l, N), dtype=np.float32)
    x = rng.standard_normal((1, l, H * P), dtype=np.float32); dt = rng.random((1, l, H), dtype=np.float32)
    s0 = rng.standard_normal((1, H, N, P), dtype=np.float32)
    k = (dt[..., None] * B[:, :, None, :]).reshape(1, l, H * N)
    one = {"q": q, "k": k, "v": x, "s": s0, "d": -dt}
    tiled = one | {"q": np.tile(q, (1, 1, H))}
    gfeeds = {"q": q.reshape(1, l, 1, N), "k": B.reshape(1, l, 1, N), "v": (x.reshape(1, l, H, P) * dt[..., None]),
              "s": np.ascontiguousarray(s0.transpose(0, 1, 3, 2)), "d": -dt}
    n = 300 if l == 1 else 30
    print(f"LinearAttention l={l}: C tiled {timed(la(H), tiled, n):.1f} us, one query head {timed(la(1), one, n):.1f} us, "
          f"GatedDeltaNet {timed(gdn(), gfeeds, n):.1f} us")

shape = [h.make_node("Constant", [], ["a3"], value=nh.from_array(np.array([3], np.int64))),
         h.make_node("Constant", [], ["a2"], value=nh.from_array(np.array([2], np.int64))),
         h.make_node("Constant", [], ["shp"], value=nh.from_array(np.array([0, 0, -1], np.int64)))]
mul = sess(shape + [h.make_node("Unsqueeze", ["dt", "a3"], ["d4"]), h.make_node("Unsqueeze", ["B", "a2"], ["b4"]),
                    h.make_node("Mul", ["d4", "b4"], ["k4"]), h.make_node("Reshape", ["k4", "shp"], ["k"])],
           [vi("dt", ["b", "l", H]), vi("B", ["b", "l", N])], [vi("k", None)])
ein = sess(shape + [h.make_node("Einsum", ["dt", "B"], ["k4"], equation="blh,bln->blhn"), h.make_node("Reshape", ["k4", "shp"], ["k"])],
           [vi("dt", ["b", "l", H]), vi("B", ["b", "l", N])], [vi("k", None)])
for l in (1, 128, 2048):
    f = {"dt": rng.random((1, l, H), dtype=np.float32), "B": rng.standard_normal((1, l, N), dtype=np.float32)}
    n = 2000 if l == 1 else 100 if l == 128 else 10
    print(f"key dt*B l={l}: Unsqueeze+Unsqueeze+Mul {timed(mul, f, n):.1f} us, Einsum {timed(ein, f, n):.1f} us")

QH, KVH, D, CAP = 12, 4, 64, 2048
def gqa(quant):
    ct = T.INT8 if quant else T.FLOAT
    ins, inits, attrs = ["q", "k", "v", "pk", "pv", "sl", "tl"], [], dict(num_heads=QH, kv_num_heads=KVH)
    if quant:
        ins += ["", "", "", "", "", "ks", "vs"]
        attrs |= dict(k_quant_type=quant, v_quant_type=quant, kv_cache_bit_width=8)
        shp = [1] if quant == "PER_TENSOR" else [1, KVH, 1, D]
        inits = [nh.from_array(np.full(shp, 0.05, np.float32), n) for n in ("ks", "vs")]
    s = sess([h.make_node("GroupQueryAttention", ins, ["o", "pko", "pvo"], domain="com.microsoft", **attrs)],
             [vi("q", [1, 1, QH * D]), vi("k", [1, 1, KVH * D]), vi("v", [1, 1, KVH * D]), vi("pk", [1, KVH, CAP, D], ct),
              vi("pv", [1, KVH, CAP, D], ct), vi("sl", [1], T.INT32), vi("tl", [], T.INT32)],
             [vi("o", None), vi("pko", None, ct), vi("pvo", None, ct)], inits)
    cache = lambda: ort.OrtValue.ortvalue_from_numpy(rng.integers(-100, 100, (1, KVH, CAP, D)).astype(np.int8) if quant
                                                     else rng.standard_normal((1, KVH, CAP, D), dtype=np.float32))
    pk, pv, b = cache(), cache(), s.io_binding()
    for name, v in {"q": (1, 1, QH * D), "k": (1, 1, KVH * D), "v": (1, 1, KVH * D)}.items():
        b.bind_cpu_input(name, rng.standard_normal(v, dtype=np.float32))
    b.bind_cpu_input("sl", np.array([1899], np.int32)); b.bind_cpu_input("tl", np.array(1900, np.int32))
    b.bind_ortvalue_input("pk", pk); b.bind_ortvalue_input("pv", pv)
    b.bind_ortvalue_output("pko", pk); b.bind_ortvalue_output("pvo", pv); b.bind_output("o")
    for _ in range(20): s.run_with_iobinding(b)
    t = time.perf_counter()
    for _ in range(300): s.run_with_iobinding(b)
    return (time.perf_counter() - t) / 300 * 1e6
print("GroupQueryAttention, 1,900 tokens seen: float32 %.1f us, int8 per channel %.1f us, int8 per tensor %.1f us"
      % (gqa(None), gqa("PER_CHANNEL"), gqa("PER_TENSOR")))

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from hybridrt.quantization.moe import _quantize_experts
E, DM, I = 64, 1536, 512
fc1 = (rng.standard_normal((E, 2 * I, DM)) * 0.02).astype(np.float32)
fc2 = (rng.standard_normal((E, DM, I)) * 0.02).astype(np.float32)
(q1, s1, z1), (q2, s2, z2) = _quantize_experts(fc1, 4, 32, False), _quantize_experts(fc2, 4, 32, False)
inits = [nh.from_array(a, n) for a, n in ((q1, "w1"), (s1, "s1"), (q2, "w2"), (s2, "s2"), (z1, "z1"), (z2, "z2"))]
x, routes = rng.standard_normal((1, DM), dtype=np.float32), [rng.standard_normal((1, E), dtype=np.float32) for _ in range(50)]
for acc in (4, 0):
    node = h.make_node("QMoE", ["x", "r", "w1", "s1", "", "w2", "s2", "", "", "", "", "z1", "z2"], ["y"], domain="com.microsoft",
                       expert_weight_bits=4, block_size=32, accuracy_level=acc, k=6, normalize_routing_weights=0,
                       activation_type="swiglu", swiglu_fusion=1, activation_alpha=1.0, activation_beta=0.0)
    s = sess([node], [vi("x", [1, DM]), vi("r", [1, E])], [vi("y", None)], inits)
    for r in routes[:10]: s.run(None, {"x": x, "r": r})
    t = time.perf_counter()
    for i in range(200): s.run(None, {"x": x, "r": routes[i % 50]})
    print(f"QMoE 6 of 64 experts, accuracy level {acc}: {(time.perf_counter() - t) / 200 * 1e6:.0f} us")
