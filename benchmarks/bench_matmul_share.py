"""How much of a decode step the weights' matrix products take: the MatMulNBits nodes of an
exported 4-bit graph run alone (same weights, same shapes, batch 1, each node reading its own
[1, 1, K] input), timed with IO binding. Compare the time with the whole step (`hybridrt bench`):
the difference is every other node (scans, convs, norms, the glue between them) and the time
between nodes.

    python benchmarks/bench_matmul_share.py out/granite-h-350m-int4 --threads 2
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper


def matmuls_only(model_dir: Path, out: Path) -> tuple[list[onnx.ValueInfoProto], int]:
    """Write a graph of model_dir's MatMulNBits nodes alone; returns its inputs and weight bytes."""
    m = onnx.load(str(model_dir / "model.onnx"), load_external_data=True)
    inits = {i.name: i for i in m.graph.initializer}
    nodes, inputs, outputs, used = [], [], [], []
    for k, n in enumerate(x for x in m.graph.node if x.op_type == "MatMulNBits"):
        attrs = {a.name: a.i for a in n.attribute if a.name in ("K", "N")}
        node = helper.make_node("MatMulNBits", [f"x{k}", *n.input[1:]], [f"y{k}"], domain="com.microsoft", name=n.name)
        node.attribute.extend(n.attribute)
        nodes.append(node)
        inputs.append(helper.make_tensor_value_info(f"x{k}", onnx.TensorProto.FLOAT, [1, 1, attrs["K"]]))
        outputs.append(helper.make_tensor_value_info(f"y{k}", onnx.TensorProto.FLOAT, [1, 1, attrs["N"]]))
        used += [i for i in n.input[1:] if i in inits]
    weights = [inits[i] for i in dict.fromkeys(used)]
    graph = helper.make_graph(nodes, "matmuls", inputs, outputs, weights)
    model = helper.make_model(graph, opset_imports=list(m.opset_import))
    model.ir_version = m.ir_version
    onnx.save(model, str(out), save_as_external_data=True, location=out.name + ".data")
    nbytes = sum(int(np.prod(w.dims)) * (1 if w.data_type == onnx.TensorProto.UINT8 else 4) for w in weights)
    return inputs, nbytes


def step_ms(path: Path, threads: int, runs: int) -> list[float]:
    """Five timings (ms per run, `runs` runs each) of the graph at path, its inputs random and
    bound once with IO binding, after 20 untimed runs."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    binding = session.io_binding()
    rng = np.random.default_rng(0)
    for i in session.get_inputs():
        binding.bind_cpu_input(i.name, rng.random(i.shape, dtype=np.float32))
    for o in session.get_outputs():
        binding.bind_output(o.name, "cpu")
    for _ in range(20):
        session.run_with_iobinding(binding)
    times = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(runs):
            session.run_with_iobinding(binding)
        times.append((time.perf_counter() - t) / runs * 1e3)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path, help="an exported int4 directory")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=50, help="runs per timing; five timings, the median reported")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "matmuls.onnx"
        inputs, nbytes = matmuls_only(args.model, path)
        times = step_ms(path, args.threads, args.runs)
    median = sorted(times)[2]
    print(
        f"{len(inputs)} MatMulNBits, {nbytes / 1e6:.1f} MB of weights: {median:.2f} ms per step "
        f"({', '.join(f'{t:.2f}' for t in times)}), {nbytes / median / 1e6:.1f} GB/s"
    )


if __name__ == "__main__":
    main()
