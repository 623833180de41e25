"""Profile decode steps of exported models: kernel time per operator type and nodes per step.

    python benchmarks/profile_step.py build/bench/jamba-125m/int4 build/bench/llama-125m/int4 \
        --threads 2 --prompt-tokens 128 --new-tokens 100

For each directory: generates once with onnxruntime's profiler on, keeps the runs after the
prompt, and prints the mean wall time of a step (model_run), the kernel time summed per
operator type, and how many nodes the session really runs (after onnxruntime's own graph
optimizations, from a saved copy of the optimized graph; a Scan's body counted once).
`--prompt` profiles the prompt instead: two prompts of --prompt-tokens, one new token each, the
second prompt's calls kept (the runtime runs a prompt in calls of 128 tokens; "step" is then
one of those calls, and the kernel times are per call).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

import hybridrt


def profiled(directory: str, threads: int, work: Path) -> tuple[Any, Path]:
    """A Model whose session profiles every run and saves its optimized graph to `work`."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.enable_profiling = True
    opts.profile_file_prefix = str(work / "profile")
    opts.optimized_model_filepath = str(work / "optimized.onnx")
    model = hybridrt.load(directory, "cpu", threads=threads, verify=False, session_options=opts)
    return model, work / "optimized.onnx"


def _nodes(graph: Any) -> int:
    """Nodes of a one-token call: the graph's, a subgraph (a Scan's body) counted once."""
    return sum(1 + sum(_nodes(a.g) for a in n.attribute if a.type == a.GRAPH) for n in graph.node)


def summarize(trace: Path, steps: int) -> dict[str, Any]:
    """The last `steps` runs of the trace (steps <= 0: its second half): mean run time, kernel
    time per operator type per run, nodes per run."""
    events = json.loads(trace.read_text())
    runs = [e for e in events if e.get("name") == "model_run"]
    decode = runs[-steps:] if steps > 0 else runs[len(runs) // 2 :]
    start = decode[0]["ts"]
    kernels: dict[str, list[float]] = collections.defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= start:
            kernels[e["args"]["op_name"]].append(e["dur"])
    # A Scan's (If's, Loop's) own time includes its body's nodes, which are listed as well:
    # it is left out of the sum (and reported apart) so that kernel times add up.
    per_step = {op: sum(d) / len(decode) / 1000 for op, d in kernels.items()}
    counts = {op: len(d) // len(decode) for op, d in kernels.items()}
    control = {op: per_step.pop(op) for op in ("Scan", "If", "Loop") if op in per_step}
    return {
        "step_ms": float(np.mean([r["dur"] for r in decode]) / 1000),
        "kernel_ms": sum(per_step.values()),
        "control_flow_ms_with_bodies": control,
        "per_op_ms": dict(sorted(per_step.items(), key=lambda kv: -kv[1])),
        "per_op_nodes": counts,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=100)
    p.add_argument("--batch", type=int, default=1, help="prompts per call")
    p.add_argument("--prompt", action="store_true", help="profile the prompt's calls, not decode steps")
    p.add_argument("--top", type=int, default=14, help="operator types listed per model")
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args(argv)
    import onnx

    out = {}
    for directory in args.models:
        with tempfile.TemporaryDirectory() as tmp:
            model, optimized = profiled(directory, args.threads, Path(tmp))
            rng = np.random.default_rng(0)
            ids = rng.integers(3, model.manifest.vocab_size - 1, size=(args.batch, args.prompt_tokens)).tolist()
            prompt = ids if args.batch > 1 else ids[0]
            if args.prompt:  # two prompts with one new token each (their last call also makes it)
                for _ in range(2):
                    model.generate(prompt, max_new_tokens=1, min_new_tokens=1)
            else:
                model.generate(prompt, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens)
            trace = Path(model.inference_session.end_profiling())
            figures = summarize(trace, 0 if args.prompt else args.new_tokens - 1)
            graph = onnx.load(str(optimized), load_external_data=False)
            figures["graph_nodes"] = _nodes(graph.graph)
            figures["graph_ops"] = dict(collections.Counter(n.op_type for n in graph.graph.node).most_common())
        out[directory] = figures
        print(
            f"\n{directory}: {figures['step_ms']:.2f} ms per {'prompt call' if args.prompt else 'step'} (profiler on), "
            f"kernels {figures['kernel_ms']:.2f} ms, {figures['graph_nodes']} nodes after onnxruntime's optimizations"
        )
        for op, ms in list(figures["per_op_ms"].items())[: args.top]:
            share = ms / figures["kernel_ms"]
            print(f"  {op:36s} x{figures['per_op_nodes'][op]:<4d} {ms:6.3f} ms  {share:5.1%}")
        for op, ms in figures["control_flow_ms_with_bodies"].items():
            print(f"  {op:36s} {ms:6.3f} ms with its body's nodes (listed above)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
