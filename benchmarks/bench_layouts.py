"""Weight layouts for the decode-step products, alone: ten layers of granite-h-1b's projections (in_proj,
out_proj, the MLP's two) at batch 1 in one graph, random weights in the chosen layout, timed with IO binding
(bench_matmul_share.step_ms). Run each layout in its own process, in turn:

    for r in 1 2; do for l in nbits-4-32-zp nbits-4-32-nz nbits-4-64-nz nbits-4-32-fzp dqmm; do
        python benchmarks/bench_layouts.py $l; done; done

LAYOUT: `nbits-BITS-BLOCK-ZP` (MatMulNBits at accuracy level 4; ZP `zp` packed uint8 zero points, `nz` none,
`fzp` float zero points as hqq writes them), `dqmm` (DynamicQuantizeMatMul, int8-dynamic's fused node) or
`float` (MatMul over float32 weights). `--rows M` times the products of an M-token prompt chunk instead of
one token (the runtime's prompt calls take 128; fewer layers and runs keep it short):

    for l in nbits-4-32-nz dqmm float; do python benchmarks/bench_layouts.py $l --rows 128 --layers 2 --runs 3; done
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import onnx
from bench_matmul_share import step_ms  # benchmarks/ is on the path when a script runs
from onnx import TensorProto, helper, numpy_helper

SHAPES = [(1536, 6448), (3072, 1536), (1536, 8192), (4096, 1536)]  # (K, N) of one granite-h-1b layer


def build(layout: str, layers: int, level: int, rng: np.random.Generator, rows: int = 1) -> tuple[onnx.ModelProto, int]:
    nodes, inits, outputs, nbytes = [], [], [], 0
    ks = sorted({k for k, _ in SHAPES})
    inputs = [helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, [1, rows, k]) for k in ks]
    for layer in range(layers):
        for j, (k, n) in enumerate(SHAPES):
            name, y = f"w{layer}_{j}", f"y{layer}_{j}"
            if layout == "float":
                weights = [numpy_helper.from_array(rng.standard_normal((k, n), dtype=np.float32) * 0.02, name)]
                node = helper.make_node("MatMul", [f"x{k}", name], [y])
            elif layout == "dqmm":
                weights = [
                    numpy_helper.from_array(rng.integers(-127, 128, (k, n), dtype=np.int8), name + "_q"),
                    numpy_helper.from_array(rng.random(n, dtype=np.float32) * 0.01 + 0.001, name + "_s"),
                    numpy_helper.from_array(np.zeros(n, np.int8), name + "_z"),
                ]
                node = helper.make_node(
                    "DynamicQuantizeMatMul", [f"x{k}", *(w.name for w in weights)], [y], domain="com.microsoft"
                )
            else:
                _, bits_s, block_s, zp = layout.split("-")
                bits, block = int(bits_s), int(block_s)
                kb = -(-k // block)
                weights = [
                    numpy_helper.from_array(
                        rng.integers(0, 256, (n, kb, block * bits // 8), dtype=np.uint8), name + "_q"
                    ),
                    numpy_helper.from_array(rng.random(n * kb, dtype=np.float32) * 0.01 + 0.001, name + "_s"),
                ]
                if zp == "zp":
                    packed = rng.integers(0, 256, n * -(-kb * bits // 8), dtype=np.uint8)
                    weights.append(numpy_helper.from_array(packed, name + "_z"))
                elif zp == "fzp":
                    weights.append(numpy_helper.from_array(rng.random(n * kb, dtype=np.float32) * 8, name + "_z"))
                node = helper.make_node(
                    "MatMulNBits",
                    [f"x{k}", *(w.name for w in weights)],
                    [y],
                    domain="com.microsoft",
                    K=k,
                    N=n,
                    bits=bits,
                    block_size=block,
                    accuracy_level=level,
                )
            nodes.append(node)
            inits += weights
            nbytes += sum(numpy_helper.to_array(w).nbytes for w in weights)
            outputs.append(helper.make_tensor_value_info(y, TensorProto.FLOAT, [1, rows, n]))
    graph = helper.make_graph(nodes, "layouts", inputs, outputs, inits)
    opsets = [helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets), nbytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("layout")
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--level", type=int, default=4, help="MatMulNBits accuracy level")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=20, help="runs per timing; five timings, the median reported")
    ap.add_argument("--rows", type=int, default=1, help="tokens per call: 1 for a decode step, 128 for a prompt chunk")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    model, nbytes = build(args.layout, args.layers, args.level, rng, args.rows)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.onnx"
        onnx.save(model, str(path), save_as_external_data=True, location="m.data")
        del model
        times = step_ms(path, args.threads, args.runs)
    median = sorted(times)[2]
    weights = args.layers * sum(k * n for k, n in SHAPES)
    print(
        f"{args.layout:16s} file {nbytes / 1e6:7.1f} MB ({nbytes * 8 / weights:.3f} bits/weight) | "
        f"{median:7.2f} ms a call of {args.rows} ({', '.join(f'{t:.2f}' for t in times)}), "
        f"{nbytes / median / 1e6:5.1f} GB/s of file bytes, {2 * args.rows * weights / median / 1e6:6.1f} GFLOP/s"
    )


if __name__ == "__main__":
    main()
