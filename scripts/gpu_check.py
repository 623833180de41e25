"""hybridrt on a CUDA GPU, in one run: every family's graphs (from scripts/gpu_prepare.py) on the
CUDA provider against transformers' float32 reference and greedy tokens, where their nodes run,
transformers' greedy tokens on the same GPU; then the bench configs' speed beside PyTorch eager
(transformers generate, same checkpoint, same GPU). Writes gpu.json into --out after each part,
so a run cut short still reports what it finished.

python scripts/gpu_check.py --work gpuwork --out OUT --configs gpuwork/configs/granite-h-350m.json ...

Each speed measurement runs in its own process. --budget bounds the run (seconds): a part that
would start after it is skipped and says so. --provider cpu runs the same code on the CPU (to
try the script where there is no GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_peers import _prompt  # noqa: E402  (the bench's prompts: seeded random ids)

START = time.perf_counter()
SHORT, LONG, NEW = 128, 2048, 64
BATCHES = (16, 64)
# fused operators: float32; float16 with float32 attention; float16 with float16 attention and KV
VARIANTS = ("fused", "fused16", "fused16kv")


def ort_provider(name: str, graph: bool = False) -> Any:
    """The provider request: CUDA with TF32 off (float32 products in float32, as PyTorch's
    reference here), and with `graph` decode steps captured as CUDA graphs; or the name as given."""
    if name != "cuda":
        return name
    return ("cuda", {"use_tf32": "0", "enable_cuda_graph": "1" if graph else "0"})


def load_model(directory: Any, provider: str, graph: bool = False, **kw: Any) -> Any:
    import hybridrt

    return hybridrt.load(directory, ort_provider(provider, graph), cuda_graph=graph, **kw)


def import_onnxruntime() -> Any:
    """onnxruntime-gpu after torch, whose import loads the CUDA libraries both use."""
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    import onnxruntime as ort

    if hasattr(ort, "preload_dlls"):
        try:
            ort.preload_dlls()
        except Exception:
            pass
    return ort


def elapsed() -> float:
    return time.perf_counter() - START


def save(out: Path, results: dict[str, Any]) -> None:
    (out / "gpu.json").write_text(json.dumps(results, indent=1, default=str))


def environment(provider: str) -> dict[str, Any]:
    import torch

    ort = import_onnxruntime()

    env: dict[str, Any] = {
        "onnxruntime": ort.__version__,
        "providers": ort.get_available_providers(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
    }
    if provider == "cuda" and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
        y = torch.empty_like(x)
        for _ in range(3):
            y.copy_(x)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            y.copy_(x)
        stop.record()
        torch.cuda.synchronize()
        seconds = start.elapsed_time(stop) / 1e3
        # A copy reads and writes each byte: bytes moved per second, the roofline's bandwidth.
        env["copy_bandwidth_gb_s"] = round(2 * 20 * x.numel() / seconds / 1e9, 1)
        del x, y
        torch.cuda.empty_cache()
    return env


def placement(directory: Path, provider: str, ids: np.ndarray) -> dict[str, Any]:
    """Nodes per execution provider in one prefill and one decode step (onnxruntime's profile)."""
    ort = import_onnxruntime()

    import hybridrt

    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(directory / ".profile")
    model = hybridrt.load(directory, ort_provider(provider), session_options=options)
    model.generate(ids.tolist(), max_new_tokens=2, min_new_tokens=2, do_sample=False)
    path = Path(model.inference_session.end_profiling())
    events = json.loads(path.read_text())
    path.unlink()
    nodes: dict[str, set[tuple[str, str]]] = {}
    for e in events:
        args = e.get("args", {})
        if e.get("cat") == "Node" and "provider" in args:
            nodes.setdefault(args["provider"], set()).add((e["name"].removesuffix("_kernel_time"), args["op_name"]))
    counts = {p: len(v) for p, v in nodes.items()}
    off = sorted({op for p, v in nodes.items() if p != "CUDAExecutionProvider" for _, op in v})
    return {"nodes": counts, "ops_off_gpu": off}


def families(
    work: Path,
    provider: str,
    results: dict[str, Any],
    out: Path,
    budget: float,
    variants: list[str],
    with_transformers: bool = True,
) -> None:
    import_onnxruntime()
    import hybridrt

    table = results.setdefault("families", {})
    for family in sorted(p.name for p in (work / "families").iterdir() if (p / "ref.npz").exists()):
        if elapsed() > budget:
            table[family] = {"skipped": "budget"}
            continue
        ref = np.load(work / "families" / family / "ref.npz")
        ids, scale = ref["ids"], float(np.abs(ref["logits"]).max())
        row: dict[str, Any] = {}
        for variant in variants:
            directory = work / "families" / family / variant
            try:
                model = hybridrt.load(directory, ort_provider(provider))
                stepper = model.stepper(1, 64)
                logits = stepper.forward(ids, all_logits=True)
                new = len(ref["greedy"])  # as transformers' reference: EOS held back until then
                greedy = model.generate(ids.tolist(), max_new_tokens=new, min_new_tokens=new, do_sample=False)[0]
                err = float(np.abs(logits - ref["logits"]).max())
                same = [int(a == b) for a, b in zip(greedy, ref["greedy"].tolist())]
                row[variant] = {
                    "max_abs_err": err,
                    "rel_err": err / scale,
                    "greedy_equal": all(same) and len(same) == len(ref["greedy"]),
                    "greedy_agreement": sum(same) / len(ref["greedy"]),
                    "stepper": type(stepper).__name__,
                    "states_on_host": getattr(stepper, "on_host", None),
                    "kv_on_host": getattr(stepper, "kv_on_host", None),
                }
                if variant in ("fused", "fused16kv"):
                    row[variant]["placement"] = placement(directory, provider, ids)
                if variant == "fused16kv" or (variant == "fused" and not any(s.is_kv for s in model.manifest.pasts)):
                    row[variant]["graph"] = captured(directory, provider, ids, new, greedy)
            except Exception as exc:  # a family that fails is reported, the run goes on
                row[variant] = {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}
        if not with_transformers:
            table[family] = row
            print(family, json.dumps(row)[:400], flush=True)
            save(out, results)
            continue
        row["transformers_gpu"] = transformers_greedy(work / "families" / family / "hf", ids, ref, provider)
        ort_greedy = row.get("fused", {})
        row["transformers_gpu"]["equal_to_onnx_cuda"] = ort_greedy.get("greedy_equal") and row["transformers_gpu"].get(
            "equal_to_cpu_reference"
        )
        table[family] = row
        print(family, json.dumps(row)[:300], flush=True)
        save(out, results)


def captured(directory: Path, provider: str, ids: np.ndarray, new: int, greedy: list[int]) -> dict[str, Any]:
    """The same graph with its decode steps captured as CUDA graphs: greedy tokens against the
    uncaptured session's, the logits of a few steps, beams and a speculative round on it, and
    the decode speed of both (this tiny graph: launches, not bytes). A graph with Scans (Mamba1)
    runs its captured steps on a second session over its one-token graph (decode_session)."""
    try:
        model = load_model(directory, provider, graph=True)
        kw = {"max_new_tokens": new, "min_new_tokens": new, "do_sample": False}
        tokens = model.generate(ids.tolist(), **kw)[0]
        plain = load_model(directory, provider)
        beams = model.generate(ids.tolist(), num_beams=3, **kw)[0] == plain.generate(ids.tolist(), num_beams=3, **kw)[0]
        spec = model.generate(ids.tolist(), assistant_model=model, **kw)[0] == tokens
        steps = model.decode_session.session if model.decode_session else model.inference_session
        return {
            "greedy_equal_uncaptured": tokens == greedy,
            "beams_equal_uncaptured": beams,
            "speculative_equal_greedy": spec,
            "decode_session": model.decode_session is not None,
            "graphs": getattr(steps, "_hybridrt_graphs", 0),
            "step_max_abs_diff": step_difference(plain, model, ids),
            "decode_tok_s": step_speed(model, ids),
            "decode_tok_s_uncaptured": step_speed(plain, ids),
        }
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}


def step_difference(plain: Any, model: Any, ids: np.ndarray, steps: int = 8) -> float:
    """The largest difference of the logits of `steps` greedy decode steps after the prompt ids,
    captured (model) against uncaptured (plain)."""
    a, b = plain.stepper(1, 64), model.stepper(1, 64)
    la, lb = a.forward(ids), b.forward(ids)
    worst = float(np.abs(la - lb).max())
    for _ in range(steps):
        nxt = la.argmax(-1)[:, None]
        la, lb = a.forward(nxt), b.forward(nxt)
        worst = max(worst, float(np.abs(la - lb).max()))
    return worst


def step_speed(model: Any, ids: np.ndarray, steps: int = 32) -> float:
    """Decode steps a second after the prompt ids, one row; the first two steps (which capture
    the two bindings' graphs) are not timed."""
    stepper = model.stepper(1, ids.shape[1] + steps + 3)
    logits = stepper.forward(ids)
    for _ in range(2):
        logits = stepper.forward(logits.argmax(-1)[:, None])
    t0 = time.perf_counter()
    for _ in range(steps):
        logits = stepper.forward(logits.argmax(-1)[:, None])
    return steps / (time.perf_counter() - t0)


def device_paths(work: Path, provider: str, families: list[str]) -> dict[str, Any]:
    """Beam search and speculative decoding with states on the device (float32 graph), against
    the same graph on the CPU provider."""
    out: dict[str, Any] = {}
    for family in families:
        try:
            directory = work / "families" / family / "fused"
            ids = np.load(work / "families" / family / "ref.npz")["ids"].tolist()
            gpu, cpu = load_model(directory, provider), load_model(directory, "cpu")
            kw = {"max_new_tokens": 12, "min_new_tokens": 12, "do_sample": False}
            out[family] = {
                "beams_equal_cpu": gpu.generate(ids, num_beams=3, **kw) == cpu.generate(ids, num_beams=3, **kw),
                "speculative_equal_cpu_greedy": gpu.generate(ids, assistant_model=gpu, **kw) == cpu.generate(ids, **kw),
            }
        except Exception as exc:
            out[family] = {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}
    return out


def transformers_greedy(checkpoint: Path, ids: np.ndarray, ref: Any, provider: str) -> dict[str, Any]:
    """transformers' greedy tokens on the GPU (float32, TF32 off) against its own CPU reference."""
    try:
        import torch
        from transformers import AutoModelForCausalLM

        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        device = "cuda" if provider == "cuda" else "cpu"
        model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).to(device).eval()
        new = len(ref["greedy"])
        with torch.no_grad():
            x = torch.tensor(ids, device=device)
            logits = model(x).logits.float().cpu().numpy()
            out = model.generate(x, do_sample=False, max_new_tokens=new, min_new_tokens=new, pad_token_id=0)
        tokens = out[0, ids.shape[1] :].cpu().tolist()
        return {
            "max_abs_err_vs_cpu": float(np.abs(logits - ref["logits"]).max()),
            "equal_to_cpu_reference": tokens == ref["greedy"].tolist(),
        }
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}


def measure_hybridrt(directory: str, provider: str) -> dict[str, Any]:
    """Child process: prefill and decode on one exported directory (provider "cuda+graph":
    decode steps captured as CUDA graphs)."""
    import_onnxruntime()

    t0 = time.perf_counter()
    graph = provider.endswith("+graph")
    model = load_model(directory, provider.removesuffix("+graph"), graph=graph)
    out: dict[str, Any] = {"load_s": time.perf_counter() - t0}
    vocab = model.manifest.vocab_size
    greedy = {"do_sample": False, "max_new_tokens": NEW, "min_new_tokens": NEW}
    model.generate(_prompt(vocab, 16), max_new_tokens=4, min_new_tokens=4, do_sample=False)  # warm-up
    runs = [model.generate_with_stats(_prompt(vocab, SHORT, seed=s), **greedy)[1] for s in range(3)]
    out["decode_tok_s"] = statistics.median(r.decode_tokens_per_s for r in runs)
    out["prefill_128_ms"] = statistics.median(r.prefill_ms for r in runs)
    long = [model.generate_with_stats(_prompt(vocab, LONG, seed=s), **greedy)[1] for s in range(2)]
    out[f"prefill_{LONG}_ms"] = statistics.median(r.prefill_ms for r in long)
    out[f"decode_after_{LONG}_tok_s"] = statistics.median(r.decode_tokens_per_s for r in long)
    for b in BATCHES:
        stats = model.generate_with_stats(_prompt(vocab, SHORT, b), **greedy)[1]
        out[f"batch{b}_tok_s"] = stats.decode_tokens_per_s
    return out


def measure_torch(checkpoint: str, dtype: str) -> dict[str, Any]:
    """Child process: transformers generate, PyTorch eager on the GPU (TF32 off)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=getattr(torch, dtype)).to("cuda").eval()
    out: dict[str, Any] = {"load_s": time.perf_counter() - t0}
    vocab = model.config.vocab_size
    kw = {"do_sample": False, "max_new_tokens": NEW, "min_new_tokens": NEW, "pad_token_id": 0}

    def timed(fn: Any) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t

    with torch.no_grad():
        model.generate(torch.tensor(_prompt(vocab, 16), device="cuda"), max_new_tokens=4, pad_token_id=0)
        ids = torch.tensor(_prompt(vocab, SHORT), device="cuda")
        prefill = statistics.median(timed(lambda: model(ids)) for _ in range(3))
        total = statistics.median(timed(lambda: model.generate(ids, **kw)) for _ in range(2))
        out["prefill_128_ms"] = prefill * 1e3
        out["decode_tok_s"] = NEW / max(total - prefill, 1e-9)
        long = torch.tensor(_prompt(vocab, LONG), device="cuda")
        out[f"prefill_{LONG}_ms"] = timed(lambda: model(long)) * 1e3
        for b in BATCHES:
            rows = torch.tensor(_prompt(vocab, SHORT, b), device="cuda")
            first = timed(lambda rows=rows: model(rows))
            total = timed(lambda rows=rows: model.generate(rows, **kw))
            out[f"batch{b}_tok_s"] = b * NEW / max(total - first, 1e-9)
    out["peak_gpu_gb"] = torch.cuda.max_memory_allocated() / 1e9
    return out


def child(kind: str, path: str, arg: str, timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", kind, path, arg]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=max(timeout, 10))
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            return dict(json.loads(line))
    return {"error": f"exit {done.returncode}: {done.stderr[-800:]}"}


def bench(
    config: Path,
    work: Path,
    provider: str,
    results: dict[str, Any],
    out: Path,
    budget: float,
    labels: list[str],
    serve_seconds: float = 240,
) -> None:
    from bench_peers import onnx_weight_bytes

    import hybridrt
    from hybridrt.quantization import quantize

    name = config.stem
    row: dict[str, Any] = results.setdefault("bench", {}).setdefault(name, {})
    base = work / "bench" / name
    ckpt, f32, f16, f16kv = base / "hf", base / "f32", base / "f16", base / "f16kv"
    t0 = time.perf_counter()
    if not (ckpt / "config.json").exists():
        script = ROOT / "benchmarks" / "make_bench_checkpoint.py"
        subprocess.run([sys.executable, str(script), str(config), "-o", str(ckpt)], check=True)
    row["checkpoint_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    if not (f32 / "hybridrt.json").exists():
        hybridrt.export_model(ckpt, f32, validate=False)  # fused operators (graphs/compat.py on 1.31)
    row["export_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    if "hybridrt_f16" in labels and not (f16 / "hybridrt.json").exists():
        quantize(f32, f16, "float16")
    row["float16_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    if any(label.startswith("hybridrt_f16kv") for label in labels) and not (f16kv / "hybridrt.json").exists():
        quantize(f32, f16kv, "float16", kv_dtype="float16")
    row["float16kv_s"] = time.perf_counter() - t0
    save(out, results)
    for label, directory in (("f16", f16), ("f32", f32), ("f16kv", f16kv)):
        if (directory / "model.onnx").exists():
            row[f"weights_bytes_{label}"] = onnx_weight_bytes(str(directory / "model.onnx"))
    runs = [
        ("hybridrt_f16kv_graph", "hybridrt", str(f16kv), provider + "+graph"),
        ("hybridrt_f16kv", "hybridrt", str(f16kv), provider),
        ("hybridrt_f16", "hybridrt", str(f16), provider),
        ("torch_bf16", "torch", str(ckpt), "bfloat16"),
        ("hybridrt_f32", "hybridrt", str(f32), provider),
        ("torch_f32", "torch", str(ckpt), "float32"),
        ("torch_f16", "torch", str(ckpt), "float16"),
    ]
    order = {label: k for k, label in enumerate(labels)}  # in the order asked
    for label, kind, path, arg in sorted([r for r in runs if r[0] in labels], key=lambda r: order[r[0]]):
        left = budget - elapsed()
        if left < 20:
            row[label] = {"skipped": "budget"}
            continue
        row[label] = child(kind, path, arg, left)
        print(name, label, json.dumps(row[label]), flush=True)
        save(out, results)
    left = budget - elapsed()
    if "serve" in labels and left > 60:
        served = f16kv if (f16kv / "hybridrt.json").exists() else f32
        row["serve"] = serve(served, provider, out / f"serve-{name}", min(left - 30, serve_seconds))
        row["serve"]["graph"] = served.name
        print(name, "serve", json.dumps(row["serve"])[:400], flush=True)
        save(out, results)
    bandwidth = results.get("environment", {}).get("copy_bandwidth_gb_s")
    for label in ("f16", "f32", "f16kv", "f16kv_graph"):
        tok_s = row.get(f"hybridrt_{label}", {}).get("decode_tok_s")
        weights = row.get(f"weights_bytes_{label.removesuffix('_graph')}")
        if bandwidth and tok_s and weights:
            row[f"roofline_tok_s_{label}"] = bandwidth * 1e9 / weights
            row[f"roofline_share_{label}"] = tok_s / row[f"roofline_tok_s_{label}"]
    save(out, results)


def word_tokenizer(vocab: int, directory: Path) -> None:
    """A word-level tokenizer of `vocab` tokens ("t0", "t1", ...): the server answers in text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.save(str(directory / "tokenizer.json"))


def serve(directory: Path, provider: str, out: Path, seconds: float) -> dict[str, Any]:
    """`hybridrt serve --provider PROVIDER` under 1, 16 and 64 streaming clients
    (benchmarks/load_test.py: 128-token prompts, 64 tokens each, a third of `seconds` a level)."""
    if not (directory / "tokenizer.json").exists():  # random bench checkpoints come without one
        word_tokenizer(json.loads((directory / "hybridrt.json").read_text())["vocab_size"], directory)
    cmd = [sys.executable, str(ROOT / "benchmarks" / "load_test.py"), str(directory), "--levels", "1,16,64"]
    cmd += ["--seconds", f"{max(seconds / 3 - 10, 10):.0f}", "--prompt-tokens", "128", "--max-tokens", "64"]
    cmd += ["--slots", "64", "--provider", provider, "--out", str(out)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {seconds + 120:.0f} s"}
    report = out / "report.json"
    if done.returncode or not report.exists():
        return {"error": f"exit {done.returncode}: {done.stderr[-800:]}"}
    levels = json.loads(report.read_text())["levels"]
    keep = ("clients", "tokens_per_s", "requests_per_s", "ttft_ms", "inter_token_ms", "errors")
    return {"levels": [{k: r.get(k) for k in keep} for r in levels]}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, path, arg = sys.argv[2:5]
        result = measure_hybridrt(path, arg) if kind == "hybridrt" else measure_torch(path, arg)
        print(json.dumps(result), flush=True)
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True, help="scripts/gpu_prepare.py's output")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--configs", type=Path, nargs="*", default=[], help="bench config.json files")
    ap.add_argument("--provider", default="cuda")
    ap.add_argument("--budget", type=float, default=420.0, help="seconds")
    ap.add_argument("--skip-families", action="store_true")
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), help="family graphs to run")
    ap.add_argument("--no-transformers", action="store_true", help="skip transformers' greedy on the GPU")
    ap.add_argument("--device-paths", nargs="*", default=[], help="families whose beams and speculative run GPU vs CPU")
    ap.add_argument("--bench-work", type=Path, help="where the bench checkpoints and graphs are (default --work)")
    ap.add_argument("--serve-seconds", type=float, default=240.0)
    ap.add_argument(
        "--runs",
        nargs="*",
        default=[
            "hybridrt_f16kv_graph",
            "hybridrt_f16kv",
            "hybridrt_f16",
            "torch_bf16",
            "hybridrt_f32",
            "torch_f32",
            "torch_f16",
        ],
        help="speed measurements, in order (hybridrt_f16kv_graph: decode steps captured as CUDA graphs; "
        "also serve: the server under 1/16/64 clients)",
    )
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"command": " ".join(sys.argv)}
    results["environment"] = environment(args.provider)
    print(json.dumps(results["environment"]), flush=True)
    save(args.out, results)
    if not args.skip_families:
        families(args.work, args.provider, results, args.out, args.budget, args.variants, not args.no_transformers)
    if args.device_paths:
        results["device_paths"] = device_paths(args.work, args.provider, args.device_paths)
        print("device paths", json.dumps(results["device_paths"]), flush=True)
        save(args.out, results)
    for config in args.configs:
        try:
            bench(
                config,
                args.bench_work or args.work,
                args.provider,
                results,
                args.out,
                args.budget,
                args.runs,
                args.serve_seconds,
            )
        except Exception as exc:
            results.setdefault("bench", {}).setdefault(config.stem, {})["error"] = f"{type(exc).__name__}: {exc}"[:800]
            save(args.out, results)
    results["seconds"] = elapsed()
    save(args.out, results)
    print(f"done in {elapsed():.0f} s", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
