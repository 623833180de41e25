"""Benchmark the runtime on the standard workload, beside transformers eager on the same checkpoint.

    python benchmarks/bench_runtime.py build/jamba-125m-onnx build/jamba-125m [--threads 2] [--json out.json]

Workload (shared/bench/README.md): batch 1, a 128-token prompt, 128 new tokens, greedy;
prefill ms, decode tokens/s and peak RSS, plus batch 8 aggregate decode tokens/s. The
runtime runs twice, with IO binding and with plain session.run, for their ratio. The
runtime part runs before torch is imported, so the peak RSS it reports is the runtime's.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

import hybridrt
from hybridrt.graphs.manifest import read_manifest


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def prompts(vocab: int, batch: int, length: int, seed: int = 0) -> list[list[int]]:
    """Random ids above the usual special-token range, so no EOS or BOS sneaks in."""
    return np.random.default_rng(seed).integers(3, vocab, (batch, length)).tolist()


def timed(model: Any, rows: list[list[int]], new: int) -> tuple[float, float, list[list[int]]]:
    out, s = model.generate_with_stats(rows, max_new_tokens=new, min_new_tokens=new)
    return s.prefill_ms, s.decode_tokens_per_s, out


def runtime_part(args: argparse.Namespace) -> dict[str, Any]:
    model = hybridrt.load(args.onnx_dir, args.provider, threads=args.threads)
    vocab = model.manifest.vocab_size
    workloads = {
        "": prompts(vocab, 1, args.prompt_tokens),
        f"_batch{args.batch}": prompts(vocab, args.batch, args.prompt_tokens, seed=1),
    }
    model.generate(workloads[""], max_new_tokens=4)  # warm up: first-run allocations, thread pool start
    runs: dict[str, list[tuple[float, float, list[list[int]]]]] = {}
    for _ in range(args.repeats):  # interleaved, so drift in machine load hits both paths alike
        for binding in (True, False):
            model.io_binding = binding
            for suffix, rows in workloads.items():
                name = ("io_binding" if binding else "plain") + suffix
                runs.setdefault(name, []).append(timed(model, rows, args.new_tokens))
    result: dict[str, Any] = {"providers": model.providers}
    for name, r in runs.items():
        result[name] = {
            "prefill_ms": statistics.median(x[0] for x in r),
            "decode_tokens_per_s": statistics.median(x[1] for x in r),
            "tokens": r[-1][2],
        }
    result["binding_vs_plain_decode"] = (
        result["io_binding"]["decode_tokens_per_s"] / result["plain"]["decode_tokens_per_s"]
    )
    result["peak_rss_mb"] = peak_rss_mb()
    return result


def transformers_part(args: argparse.Namespace, vocab: int) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    if args.threads:
        torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.hf_dir, dtype=torch.float32).eval()
    ids = torch.tensor(prompts(vocab, 1, args.prompt_tokens))
    mask = torch.ones_like(ids)
    kw = {"do_sample": False, "max_new_tokens": args.new_tokens, "min_new_tokens": args.new_tokens}
    runs, out = [], None
    with torch.no_grad():
        model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=4)  # warm up
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            model(ids, attention_mask=mask, use_cache=True)
            prefill = time.perf_counter() - t0
            t0 = time.perf_counter()
            out = model.generate(ids, attention_mask=mask, **kw)
            total = time.perf_counter() - t0
            runs.append((prefill * 1e3, (args.new_tokens - 1) / max(total - prefill, 1e-9)))
    assert out is not None
    return {
        "prefill_ms": statistics.median(r[0] for r in runs),
        "decode_tokens_per_s": statistics.median(r[1] for r in runs),
        "tokens": out[:, args.prompt_tokens :].tolist(),
        "peak_rss_mb": peak_rss_mb(),
    }


def report(rt: dict[str, Any], hf: dict[str, Any] | None, args: argparse.Namespace) -> str:
    b = args.batch
    lines = [
        f"model {args.onnx_dir} on {', '.join(rt['providers'])}, threads {args.threads or 'default'}",
        f"workload: batch 1, {args.prompt_tokens}-token prompt, {args.new_tokens} new tokens, greedy",
        f"{'':<26}{'prefill ms':>12}{'decode tok/s':>14}{f'batch {b} tok/s':>16}",
    ]
    for name in ("io_binding", "plain"):
        r, rb = rt[name], rt[f"{name}_batch{b}"]
        label = f"hybridrt ({name.replace('_', ' ')})"
        lines.append(
            f"{label:<26}{r['prefill_ms']:>12.1f}{r['decode_tokens_per_s']:>14.1f}{rb['decode_tokens_per_s']:>16.1f}"
        )
    if hf:
        lines.append(f"{'transformers eager':<26}{hf['prefill_ms']:>12.1f}{hf['decode_tokens_per_s']:>14.1f}{'-':>16}")
    lines.append(f"IO binding / plain decode speed: {rt['binding_vs_plain_decode']:.2f}x")
    lines.append(
        f"peak RSS: runtime {rt['peak_rss_mb']:.0f} MB" + (f", with torch {hf['peak_rss_mb']:.0f} MB" if hf else "")
    )
    if hf:
        same = hf["tokens"] == rt["io_binding"]["tokens"]
        speed = rt["io_binding"]["decode_tokens_per_s"] / hf["decode_tokens_per_s"]
        lines.append(f"decode speed vs transformers: {speed:.2f}x; greedy tokens identical: {'yes' if same else 'NO'}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("onnx_dir", type=Path, help="exported directory (hybridrt.json + model.onnx)")
    ap.add_argument("hf_dir", type=Path, nargs="?", help="the checkpoint it came from (omit to skip transformers)")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, help="intra-op threads for both ONNX Runtime and torch")
    ap.add_argument("--provider", default="auto")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    rt = runtime_part(args)
    hf = transformers_part(args, read_manifest(args.onnx_dir).vocab_size) if args.hf_dir else None
    print(report(rt, hf, args))
    if args.json:
        figures = {"runtime": rt, "transformers": hf, "args": {k: str(v) for k, v in vars(args).items()}}
        args.json.write_text(json.dumps(_figures_only(figures), indent=2) + "\n")


def _figures_only(d: Any) -> Any:
    """The results without the generated token lists."""
    if isinstance(d, dict):
        return {k: _figures_only(v) for k, v in d.items() if k != "tokens"}
    return d


if __name__ == "__main__":
    main()
