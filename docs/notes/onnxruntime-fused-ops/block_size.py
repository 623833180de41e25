"""MatMulNBits at M = 1 and M = 8 by block size, with and without zero points (notes section 7).

One MatMul quantized by onnxruntime's MatMulNBitsQuantizer (4 bits, accuracy level 4), 2
intra-op threads, best of three timings in microseconds. The weights stay in cache between
calls, so this times the kernel's arithmetic and per-block work, not the memory traffic
that bounds a whole decode step.
"""

import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer


def build(K, N, block, symmetric):
    w = np.random.default_rng(0).standard_normal((K, N)).astype(np.float32) * 0.05
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", K])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", N])
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x], [y], [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    cfg = DefaultWeightOnlyQuantConfig(block_size=block, is_symmetric=symmetric, bits=4, accuracy_level=4)
    q = MatMulNBitsQuantizer(m, algo_config=cfg)
    q.process()
    return q.model.model


def timing(model, M, K, reps):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((M, K)).astype(np.float32)
    for _ in range(200):
        s.run(None, {"x": x})
    best = 1e9
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            s.run(None, {"x": x})
        best = min(best, (time.perf_counter() - t0) / reps)
    return best * 1e6


for K, N in [(768, 3072), (1536, 768), (768, 32000)]:
    for block in (32, 64, 128):
        for symmetric in (False, True):
            m = build(K, N, block, symmetric)
            reps = 2000 if N < 10000 else 300
            r = [timing(m, M, K, reps) for M in (1, 8)]
            print(f"K={K} N={N} block={block} symmetric={symmetric}: M=1 {r[0]:.1f} us, M=8 {r[1]:.1f} us", flush=True)
