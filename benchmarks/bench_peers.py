"""The standard workload on the shared bench configs, hybridrt beside its peers, in one run.

python benchmarks/bench_peers.py --configs ../shared/bench/configs --work build/bench --out docs/bench

For each config (jamba-125m, granite-h-125m, llama-125m): a seeded random-weight checkpoint,
its hybridrt export (float) and quantizations (MODES), then, each in its own
process (so peak RSS is its own): decode tokens/s after a 128-token prompt (batch 1, 128
greedy tokens), prefill ms at 128 and 1,900 tokens, decode tokens/s after the 1,900-token
prompt, batch-8 aggregate decode tokens/s, peak RSS, and the nodes of one decode step (the
session-optimized graph, a Scan's body counted once). Peers where installed: PyTorch eager (transformers generate),
onnxruntime-genai (llama only; `pip install onnxruntime-genai`) and llama.cpp through
llama-cpp-python (GGUF from its converter; see ../shared/bench/README.md); a peer that is
not installed is listed as such. Figures go to OUT/bench.json, OUT/bench.md and OUT/bench.png.
`--llama-bench PATH` measures the GGUF files with llama.cpp's own `llama-bench` binary instead
(prefill as its pp test, decode as its tg test at a depth of 128 and of the long prompt);
`--long N` sets the long prompt (1,900 by default; 2,048 for the realistic configs:
`--configs ../shared/bench/configs --models granite-h-350m granite-h-1b --modes float int8-dynamic int4`).
Run on a quiet machine: 2 threads everywhere (`--threads`). `--rounds N` then measures decode
alone for hybridrt's int8 and int4 modes and the peers' files in turn, N rounds, and adds the
medians to bench.md (alternated.json): the speed of this shared machine drifts over minutes,
so ratios between runtimes are fair only when their runs interleave (`--skip-table` runs the
rounds alone on an earlier table, or with none). `--measure prefill` makes the rounds time
prompts of 128 and --long tokens instead, with each hybridrt entry's speed over llama.cpp's at
the same bits (q4_0 or q8_0) round by round; `--measure context` times decode after 128 and
after --long tokens, the ratio of the two taken within each process (what a long KV cache costs
a step). `--dirs NAME:LABEL=DIR` adds hybridrt directories to the rounds: an export whose
manifest predates a runtime change beside one that has it, say. Each entry there also gets the
weight bytes one decode step reads (every weight but an embedding table that only a lookup
reads) and the rate at which it reads them (MB x tokens/s): decode at batch 1 streams the
weights once per token, so that rate shows how well a runtime uses the memory bandwidth apart
from how many bytes its format stores.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

MODES = ("float", "int8-dynamic", "int8-weight", "int4", "int4-vocab4", "int4-sym-vocab4")
# How each quantized mode is made: `export --quantize`'s mode and options.
QUANTIZE = {
    "int8-dynamic": ("int8-dynamic", {}),
    "int8-weight": ("int8-weight", {}),
    "int4": ("int4", {}),
    "int4-vocab4": ("int4", {"vocab_bits": 4}),  # embedding/LM head in 4 bits too, as onnxruntime-genai's int4
    # and blocks without zero points: onnxruntime-genai's int4 layout (llama.cpp's q4_0 blocks too)
    "int4-sym-vocab4": ("int4", {"vocab_bits": 4, "symmetric": True}),
}
SHORT, NEW, BATCH = 128, 128, 8
# The long prompt (--long; children read it from the environment the parent sets).
LONG = int(os.environ.get("HYBRIDRT_BENCH_LONG", "1900"))


def _prompt(vocab: int, n: int, rows: int = 1, seed: int = 0) -> list[list[int]]:
    import numpy as np

    return np.random.default_rng(seed).integers(3, vocab, (rows, n)).tolist()


def prepare(config: Path, work: Path, modes: list[str] | tuple[str, ...] = MODES) -> dict[str, Path]:
    """Checkpoint, export and quantizations of one config (reused when present)."""
    name = config.stem
    ckpt = work / name / "hf"
    if not (ckpt / "config.json").exists():
        subprocess.run(
            [sys.executable, "benchmarks/make_bench_checkpoint.py", str(config), "-o", str(ckpt)], check=True
        )
    dirs = {"float": work / name / "float"}
    if not (dirs["float"] / "hybridrt.json").exists():
        import hybridrt

        hybridrt.export_model(ckpt, dirs["float"])
    for mode in [m for m in modes if m != "float"]:
        dirs[mode] = work / name / mode
        if not (dirs[mode] / "hybridrt.json").exists():
            import hybridrt

            # Straight from the checkpoint, a layer at a time (`export --quantize`): quantizing the
            # float graph holds it whole, which a 1.46 B model's does not fit in 24 GB.
            how, options = QUANTIZE[mode]
            hybridrt.export_model(ckpt, dirs[mode], quantize=how, quantize_options=options)
    return dirs | {"hf": ckpt}


def _peak_rss_mb() -> float:
    """This process's peak resident memory: VmHWM (ru_maxrss carries the parent's peak over exec)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure_hybridrt(directory: str, threads: int) -> dict[str, Any]:
    """Runs in a child process: the workload on one exported directory."""
    import onnxruntime as ort

    import hybridrt

    model = hybridrt.load(directory, threads=threads)
    vocab = model.manifest.vocab_size
    greedy = {"do_sample": False, "max_new_tokens": NEW, "min_new_tokens": NEW}
    model.generate(_prompt(vocab, 16), max_new_tokens=4, min_new_tokens=4, do_sample=False)  # warm-up
    out: dict[str, Any] = {}
    runs = [model.generate_with_stats(_prompt(vocab, SHORT, seed=s), **greedy)[1] for s in range(3)]
    out["decode_tok_s"] = statistics.median(r.decode_tokens_per_s for r in runs)
    out["prefill_128_ms"] = statistics.median(r.prefill_ms for r in runs)
    long = [model.generate_with_stats(_prompt(vocab, LONG, seed=s), **greedy)[1] for s in range(2)]
    out[f"prefill_{LONG}_ms"] = statistics.median(r.prefill_ms for r in long)
    out[f"decode_{LONG}_tok_s"] = statistics.median(r.decode_tokens_per_s for r in long)
    batch = model.generate_with_stats(_prompt(vocab, SHORT, BATCH), **greedy)[1]
    out["batch8_tok_s"] = batch.decode_tokens_per_s
    out["peak_rss_mb"] = _peak_rss_mb()
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.optimized_model_filepath = os.path.join(directory, ".optimized.onnx")
    ort.InferenceSession(os.path.join(directory, model.manifest.graph_file), opts, providers=["CPUExecutionProvider"])
    import onnx

    out["decode_nodes"] = _nodes(onnx.load(opts.optimized_model_filepath, load_external_data=False).graph)
    os.unlink(opts.optimized_model_filepath)
    return out


def _nodes(graph: Any) -> int:
    """Nodes a one-token call runs: the graph's, with each subgraph (a Scan's body) counted once."""
    return sum(1 + sum(_nodes(a.g) for a in n.attribute if a.type == a.GRAPH) for n in graph.node)


def measure_torch(checkpoint: str, threads: int) -> dict[str, Any]:
    """Runs in a child process: transformers generate, PyTorch eager, fp32."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    vocab = model.config.vocab_size
    kw = {"do_sample": False, "max_new_tokens": NEW, "min_new_tokens": NEW}
    out: dict[str, Any] = {}
    with torch.no_grad():
        ids = torch.tensor(_prompt(vocab, SHORT))
        model.generate(ids[:, :8], max_new_tokens=2)
        t0 = time.perf_counter()
        model(ids)
        out["prefill_128_ms"] = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        model.generate(ids, **kw)
        total = time.perf_counter() - t0
        out["decode_tok_s"] = NEW / max(total - out["prefill_128_ms"] / 1e3, 1e-9)
    out["peak_rss_mb"] = _peak_rss_mb()
    return out


def measure_genai(directory: str, threads: int) -> dict[str, Any]:
    """Runs in a child process: onnxruntime-genai's generator on its own export."""
    import onnxruntime_genai as og

    model = og.Model(directory)
    out: dict[str, Any] = {}
    ids = _prompt(32000, SHORT)[0]
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=SHORT + NEW, min_length=SHORT + NEW)
    gen = og.Generator(model, params)
    t0 = time.perf_counter()
    gen.append_tokens(ids)
    out["prefill_128_ms"] = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    n = 0
    while not gen.is_done():
        gen.generate_next_token()
        n += 1
    out["decode_tok_s"] = n / (time.perf_counter() - t0)
    out["peak_rss_mb"] = _peak_rss_mb()
    return out


def measure_llama_cpp(gguf: str, threads: int) -> dict[str, Any]:
    """Runs in a child process: llama.cpp through llama-cpp-python, greedy, batch 1."""
    import llama_cpp

    llm = llama_cpp.Llama(gguf, n_ctx=SHORT + NEW + LONG, n_threads=threads, n_batch=512, verbose=False)
    vocab = llm.n_vocab()
    out: dict[str, Any] = {}
    for label, n in (("128", SHORT), (str(LONG), LONG)):
        llm.reset()
        ids = _prompt(vocab, n)[0]
        t0 = time.perf_counter()
        llm.eval(ids)
        out[f"prefill_{label}_ms"] = (time.perf_counter() - t0) * 1e3
        out["decode_tok_s" if label == "128" else f"decode_{LONG}_tok_s"] = _llama_greedy_rate(llm, vocab)
    out["peak_rss_mb"] = _peak_rss_mb()
    return out


def _llama_bench(gguf: str, threads: int, *tests: list[str]) -> list[dict[str, Any]]:
    """llama.cpp's own benchmark (`llama-bench`, HYBRIDRT_LLAMA_BENCH names the binary), 3
    repetitions after its warm-up, one run per test; its JSON entries."""
    binary = os.environ["HYBRIDRT_LLAMA_BENCH"]
    env = os.environ | {"LD_LIBRARY_PATH": str(Path(binary).parent)}
    entries = []
    for test in tests:
        cmd = [binary, "-m", gguf, "-t", str(threads), "-r", "3", "-o", "json", *test]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
        entries += json.loads(done.stdout)
    return entries


def measure_llama_bench(gguf: str, threads: int) -> dict[str, Any]:
    """Runs in a child process: the workload's figures from llama-bench: prefill of SHORT and
    LONG tokens (pp), decode of NEW tokens after SHORT and after LONG tokens (tg at depth)."""
    tests = [["-p", f"{SHORT},{LONG}", "-n", "0"], ["-p", "0", "-n", str(NEW), "-d", f"{SHORT},{LONG}"]]
    out: dict[str, Any] = {}
    for e in _llama_bench(gguf, threads, *tests):
        if e["n_gen"] == 0:
            out[f"prefill_{e['n_prompt']}_ms"] = e["avg_ns"] / 1e6
        else:
            out["decode_tok_s" if e["n_depth"] == SHORT else f"decode_{LONG}_tok_s"] = e["avg_ts"]
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return out


def measure_llama_bench_decode(gguf: str, threads: int) -> dict[str, Any]:
    """Runs in a child process: llama-bench's decode of NEW tokens after SHORT, as measure_hybridrt_decode."""
    (entry,) = _llama_bench(gguf, threads, ["-p", "0", "-n", str(NEW), "-d", str(SHORT)])
    return {"decode_tok_s": entry["avg_ts"]}


# The decode-only measurements first run one whole generation (prompt and NEW tokens) that
# they do not time: the first generation of a process runs 5-15% slower than the next
# (allocations, page faults), and a short warm-up leaves that in the timed runs.
WARM_SEED = 99
Decoder = Callable[[int, int], float]  # decode(prompt tokens, seed) -> tokens/s of NEW greedy tokens


def _hybridrt_decoder(directory: str, threads: int) -> Decoder:
    """decode(n, seed): tokens/s of NEW greedy tokens after an n-token prompt, on one loaded model."""
    import hybridrt

    model = hybridrt.load(directory, threads=threads)
    vocab = model.manifest.vocab_size
    greedy = {"do_sample": False, "max_new_tokens": NEW, "min_new_tokens": NEW}

    def decode(n: int, seed: int) -> float:
        return model.generate_with_stats(_prompt(vocab, n, seed=seed)[0], **greedy)[1].decode_tokens_per_s

    return decode


def _llama_greedy_rate(llm: Any, vocab: int) -> float:
    """Tokens/s of NEW greedy tokens after what llm has evaluated."""
    import llama_cpp
    import numpy as np

    t0 = time.perf_counter()
    for _ in range(NEW):
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(llm.ctx), shape=(vocab,))
        llm.eval([int(logits.argmax())])
    return NEW / (time.perf_counter() - t0)


def _llama_decoder(gguf: str, threads: int, n_ctx: int) -> Decoder:
    """decode(n, seed) for llama.cpp, as _hybridrt_decoder."""
    import llama_cpp

    llm = llama_cpp.Llama(gguf, n_ctx=n_ctx, n_threads=threads, n_batch=512, verbose=False)
    vocab = llm.n_vocab()

    def decode(n: int, seed: int) -> float:
        llm.reset()
        llm.eval(_prompt(vocab, n, seed=seed)[0])
        return _llama_greedy_rate(llm, vocab)

    return decode


def measure_hybridrt_decode(directory: str, threads: int) -> dict[str, Any]:
    """Runs in a child process: decode tokens/s alone (the median of three 128-token prompts)."""
    return _decode_rounds(_hybridrt_decoder(directory, threads))


def measure_llama_cpp_decode(gguf: str, threads: int) -> dict[str, Any]:
    """Runs in a child process: llama.cpp decode tokens/s alone, as measure_hybridrt_decode."""
    return _decode_rounds(_llama_decoder(gguf, threads, SHORT + NEW))


def _decode_rounds(decode: Decoder) -> dict[str, Any]:
    decode(SHORT, WARM_SEED)
    return {"decode_tok_s": statistics.median(decode(SHORT, s) for s in range(3))}


def measure_hybridrt_prefill(directory: str, threads: int) -> dict[str, Any]:
    """Runs in a child process: prompt ms alone (the prompt's calls and its first token's logits),
    after one untimed prompt: the median of three SHORT prompts and of two LONG ones."""
    import hybridrt

    model = hybridrt.load(directory, threads=threads)
    vocab = model.manifest.vocab_size

    def prefill(n: int, seed: int) -> float:
        ids = _prompt(vocab, n, seed=seed)[0]
        return model.generate_with_stats(ids, max_new_tokens=1, min_new_tokens=1, do_sample=False)[1].prefill_ms

    return _prefill_rounds(prefill)


def measure_llama_cpp_prefill(gguf: str, threads: int) -> dict[str, Any]:
    """Runs in a child process: llama.cpp's prompt ms alone, as measure_hybridrt_prefill (its
    eval of the prompt, which leaves the last token's logits)."""
    import llama_cpp

    llm = llama_cpp.Llama(gguf, n_ctx=LONG + 8, n_threads=threads, n_batch=512, verbose=False)
    vocab = llm.n_vocab()

    def prefill(n: int, seed: int) -> float:
        llm.reset()
        ids = _prompt(vocab, n, seed=seed)[0]
        t0 = time.perf_counter()
        llm.eval(ids)
        return (time.perf_counter() - t0) * 1e3

    return _prefill_rounds(prefill)


def measure_llama_bench_prefill(gguf: str, threads: int) -> dict[str, Any]:
    """Runs in a child process: llama-bench's pp tests of SHORT and LONG tokens."""
    entries = _llama_bench(gguf, threads, ["-p", f"{SHORT},{LONG}", "-n", "0"])
    return {f"prefill_{e['n_prompt']}_ms": e["avg_ns"] / 1e6 for e in entries}


def measure_hybridrt_context(directory: str, threads: int) -> dict[str, Any]:
    """Runs in a child process: decode tokens/s after a SHORT prompt and after a LONG one (the
    median of two each, after one untimed generation): what a longer KV cache costs a step."""
    return _context_rounds(_hybridrt_decoder(directory, threads))


def measure_llama_cpp_context(gguf: str, threads: int) -> dict[str, Any]:
    """Runs in a child process: llama.cpp's decode tokens/s after SHORT and LONG prompts, as
    measure_hybridrt_context (its default KV cache, f16)."""
    return _context_rounds(_llama_decoder(gguf, threads, LONG + NEW + 8))


def _context_rounds(decode: Decoder) -> dict[str, Any]:
    decode(SHORT, WARM_SEED)
    out = {"decode_tok_s": statistics.median(decode(SHORT, s) for s in range(2))}
    out[f"decode_{LONG}_tok_s"] = statistics.median(decode(LONG, s) for s in range(2))
    out["long_over_short"] = out[f"decode_{LONG}_tok_s"] / out["decode_tok_s"]
    return out


def _prefill_rounds(prefill: Any) -> dict[str, Any]:
    """One untimed SHORT prompt, then the median of three SHORT prompts and of two LONG ones."""
    prefill(SHORT, WARM_SEED)
    return {f"prefill_{n}_ms": statistics.median(prefill(n, s) for s in range(k)) for n, k in ((SHORT, 3), (LONG, 2))}


def measure_genai_decode(directory: str, threads: int) -> dict[str, Any]:
    """Runs in a child process: onnxruntime-genai decode tokens/s alone, as measure_hybridrt_decode."""
    import onnxruntime_genai as og

    model = og.Model(directory)
    rates = []
    for seed in (WARM_SEED, 0, 1, 2):
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=SHORT + NEW, min_length=SHORT + NEW)
        gen = og.Generator(model, params)
        gen.append_tokens(_prompt(32000, SHORT, seed=seed)[0])
        t0, n = time.perf_counter(), 0
        while not gen.is_done():
            gen.generate_next_token()
            n += 1
        rates.append(n / (time.perf_counter() - t0))
    return {"decode_tok_s": statistics.median(rates[1:])}


EMBEDDING_OPS = {"Gather", "GatherBlockQuantized"}


def onnx_weight_bytes(model_path: str) -> int:
    """Bytes of the weights one decode step of an ONNX graph reads: every initializer and
    constant (a Scan's body too), but those only an embedding lookup reads (it reads one row)."""
    import onnx

    def size(t: Any) -> int:
        ext = {e.key: e.value for e in t.external_data}
        if "length" in ext:
            return int(ext["length"])
        return len(t.raw_data) or int(onnx.numpy_helper.to_array(t).nbytes)

    def walk(graph: Any) -> tuple[dict[str, int], dict[str, set[str]]]:
        sizes = {t.name: size(t) for t in graph.initializer}
        readers: dict[str, set[str]] = {}
        for node in graph.node:
            for name in node.input:
                readers.setdefault(name, set()).add(node.op_type)
            for a in node.attribute:
                if a.type == a.TENSOR and node.op_type == "Constant":
                    sizes[node.output[0]] = size(a.t)
                if a.type == a.GRAPH:
                    inner_sizes, inner_readers = walk(a.g)
                    sizes |= inner_sizes
                    for k, v in inner_readers.items():
                        readers.setdefault(k, set()).update(v)
        return sizes, readers

    sizes, readers = walk(onnx.load(model_path, load_external_data=False).graph)
    return sum(n for name, n in sizes.items() if not readers.get(name) or readers[name] - EMBEDDING_OPS)


def gguf_weight_bytes(path: str) -> int:
    """Bytes of the weights one llama.cpp decode step reads: every tensor of the GGUF file but
    `token_embd.weight` when an `output.weight` head is stored apart (the lookup reads one row)."""
    import struct

    with open(path, "rb") as f:
        data = f.read(16 << 20)  # the header (metadata and tensor infos) is far smaller
        end = f.seek(0, 2)
    at = 0

    def take(fmt: str) -> Any:
        nonlocal at
        (v,) = struct.unpack_from("<" + fmt, data, at)
        at += struct.calcsize("<" + fmt)
        return v

    def string() -> str:
        nonlocal at
        n = take("Q")
        at += n
        return data[at - n : at].decode("utf-8", "replace")

    scalars = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(kind: int) -> Any:
        if kind == 8:
            return string()
        if kind == 9:
            inner, n = take("I"), take("Q")
            return [value(inner) for _ in range(n)]
        return take(scalars[kind])

    if data[:4] != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file")
    at = 4
    _version, n_tensors, n_kv = take("I"), take("Q"), take("Q")
    meta = {}
    for _ in range(n_kv):
        key = string()
        meta[key] = value(take("I"))
    infos = []
    for _ in range(n_tensors):
        name = string()
        dims = [take("Q") for _ in range(take("I"))]
        _kind, offset = take("I"), take("Q")
        infos.append((offset, name, dims))
    align = int(meta.get("general.alignment", 32))
    start = -(-at // align) * align
    infos.sort()
    sizes = {
        name: (infos[i + 1][0] if i + 1 < len(infos) else end - start) - offset
        for i, (offset, name, _) in enumerate(infos)
    }
    untied = "output.weight" in sizes
    return sum(n for name, n in sizes.items() if not (untied and name == "token_embd.weight"))


def weight_bytes(kind: str, path: str) -> int | None:
    """Weight bytes per decode step of an entry of the alternated rounds (None: unknown kind)."""
    if kind in ("llama_cpp", "llama_bench"):
        return gguf_weight_bytes(path)
    if kind == "genai":
        return onnx_weight_bytes(os.path.join(path, "model.onnx"))
    if kind == "hybridrt":
        manifest = json.loads(Path(path, "hybridrt.json").read_text())
        return onnx_weight_bytes(os.path.join(path, manifest.get("graph_file", "model.onnx")))
    return None


def alternate(entries: list[tuple[str, str, str, str]], rounds: int, threads: int) -> list[dict[str, Any]]:
    """Decode tokens/s of (model, runtime, mode, kind:path) entries measured in turn, `rounds`
    times over, each in its own process: on a shared machine whose speed drifts over minutes,
    ratios between runtimes are only fair when their runs interleave. Medians over rounds."""
    seen: dict[tuple[str, str, str], list[float]] = {}
    for _ in range(rounds):
        for model, runtime, mode, spec in entries:
            kind, path = spec.split(":", 1)
            rate = child(f"{kind}_decode", path, threads).get("decode_tok_s")
            if rate is not None:
                seen.setdefault((model, runtime, mode), []).append(rate)
    specs = {(m, r, mode): spec for m, r, mode, spec in entries}
    rows = []
    for key, v in seen.items():
        row = {"model": key[0], "runtime": key[1], "mode": key[2], "decode_tok_s": statistics.median(v), "runs": v}
        size = weight_bytes(*specs[key].split(":", 1))
        if size is not None:
            row["weights_mb"] = size / 1e6
            row["read_gb_s"] = size * row["decode_tok_s"] / 1e9
        rows.append(row)
    return rows


def _rounds(
    entries: list[tuple[str, str, str, str]], rounds: int, threads: int, measure: str, keys: list[str]
) -> dict[tuple[str, str, str], list[dict[str, float]]]:
    """`keys` of each entry's `measure_{kind}_{measure}`, the entries in turn `rounds` times over,
    each in its own process; an entry that fails is reported on stderr and left out."""
    seen: dict[tuple[str, str, str], list[dict[str, float]]] = {}
    for _ in range(rounds):
        for model, runtime, mode, spec in entries:
            kind, path = spec.split(":", 1)
            got = child(f"{kind}_{measure}", path, threads)
            if all(k in got for k in keys):
                seen.setdefault((model, runtime, mode), []).append({k: got[k] for k in keys})
            else:
                print(f"{model} {runtime} {mode}: {got.get('error', got)}", file=sys.stderr, flush=True)
    return seen


def alternate_prefill(entries: list[tuple[str, str, str, str]], rounds: int, threads: int) -> list[dict[str, Any]]:
    """Prompt ms at SHORT and LONG tokens of the entries, measured in turn as `alternate` does,
    and each entry's speed over its llama.cpp partner's round by round (the GGUF entry of the
    same model whose mode `partner` names: q4_0 for 4-bit modes, q8_0 for 8-bit)."""
    keys = [f"prefill_{SHORT}_ms", f"prefill_{LONG}_ms"]
    seen = _rounds(entries, rounds, threads, "prefill", keys)
    rows = []
    for (model, runtime, mode), runs in seen.items():
        row: dict[str, Any] = {"model": model, "runtime": runtime, "mode": mode, "runs": runs}
        for k in keys:
            row[k] = statistics.median(r[k] for r in runs)
        peer = seen.get((model, "llama.cpp", partner(mode))) if runtime != "llama.cpp" else None
        if peer and len(peer) == len(runs):
            for k in keys:  # speed ratio: the peer's ms over ours, per round
                row[k.replace("_ms", "_speed")] = [p[k] / r[k] for p, r in zip(peer, runs, strict=True)]
        rows.append(row)
    return rows


def alternate_context(entries: list[tuple[str, str, str, str]], rounds: int, threads: int) -> list[dict[str, Any]]:
    """Decode tokens/s after SHORT and after LONG prompts of the entries, in turn as `alternate`
    does; each round's LONG / SHORT ratio is taken within one process, medians over rounds."""
    keys = ["decode_tok_s", f"decode_{LONG}_tok_s", "long_over_short"]
    return [
        {"model": m, "runtime": r, "mode": mode, "runs": runs}
        | {k: statistics.median(x[k] for x in runs) for k in keys}
        for (m, r, mode), runs in _rounds(entries, rounds, threads, "context", keys).items()
    ]


def _markdown(head: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(cells) + " |" for cells in body])


def context_table(rows: list[dict[str, Any]]) -> str:
    head = ["model", "runtime", "mode", f"decode tok/s after {SHORT} (rounds)", f"after {LONG} (rounds)"]
    body = []
    for r in rows:
        cells = [r["model"], r["runtime"], r["mode"]]
        for k in ("decode_tok_s", f"decode_{LONG}_tok_s"):
            cells.append(f"{r[k]:.1f} ({', '.join(f'{x[k]:.1f}' for x in r['runs'])})")
        ratios = ", ".join(f"{x['long_over_short']:.2f}" for x in r["runs"])
        body.append([*cells, f"{r['long_over_short']:.2f} ({ratios})"])
    return _markdown([*head, f"{LONG} / {SHORT} (median; rounds)"], body)


def partner(mode: str) -> str:
    """The llama.cpp format at the bits of a hybridrt mode."""
    return "q8_0" if mode.startswith("int8") else "q4_0"


def prefill_table(rows: list[dict[str, Any]]) -> str:
    head = ["model", "runtime", "mode", f"prefill {SHORT} ms (median; rounds)", f"prefill {LONG} ms (median; rounds)"]
    body = []
    for r in rows:
        cells = [r["model"], r["runtime"], r["mode"]]
        for n in (SHORT, LONG):
            runs = ", ".join(f"{x[f'prefill_{n}_ms']:,.0f}" for x in r["runs"])
            cells.append(f"{r[f'prefill_{n}_ms']:,.0f} ({runs})")
        for n in (SHORT, LONG):
            ratios = r.get(f"prefill_{n}_speed")
            cells.append(
                f"{statistics.median(ratios):.2f}x ({', '.join(f'{x:.2f}' for x in ratios)})" if ratios else ""
            )
        body.append(cells)
    return _markdown([*head, f"speed / llama.cpp at {SHORT} (rounds)", f"at {LONG} (rounds)"], body)


def alternated_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model | runtime | mode | decode tok/s (median) | rounds | weights read per token | read rate |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        runs = ", ".join(f"{v:.1f}" for v in r["runs"])
        size = f"{r['weights_mb']:.1f} MB" if "weights_mb" in r else ""
        rate = f"{r['read_gb_s']:.1f} GB/s" if "read_gb_s" in r else ""
        lines.append(
            f"| {r['model']} | {r['runtime']} | {r['mode']} | {r['decode_tok_s']:.1f} | {runs} | {size} | {rate} |"
        )
    return "\n".join(lines)


def child(kind: str, path: str, threads: int) -> dict[str, Any]:
    """One measurement in a fresh process (its own peak RSS); errors come back as text."""
    code = (
        "import json, sys; sys.path.insert(0, 'benchmarks'); import bench_peers as b; "
        f"print('RESULT' + json.dumps(b.measure_{kind}({path!r}, {threads})))"
    )
    env = os.environ | {"OMP_NUM_THREADS": str(threads)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT"):
            return dict(json.loads(line[6:]))
    return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1][:200]}


def installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def table(rows: list[dict[str, Any]]) -> str:
    cols = [
        ("decode_tok_s", "decode tok/s"),
        (f"decode_{LONG}_tok_s", f"decode @{LONG}"),
        ("prefill_128_ms", "prefill 128 ms"),
        (f"prefill_{LONG}_ms", f"prefill {LONG} ms"),
        ("batch8_tok_s", "batch 8 tok/s"),
        ("peak_rss_mb", "peak RSS MB"),
        ("decode_nodes", "nodes/step"),
    ]
    lines = ["| model | runtime | mode | " + " | ".join(c[1] for c in cols) + " |", "|---" * (len(cols) + 3) + "|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['runtime']} | {r['mode']} | {r['error']} |" + " |" * (len(cols) - 1))
            continue
        cells = [f"{r[k]:.1f}" if isinstance(r.get(k), float) else str(r.get(k, "")) for k, _ in cols]
        lines.append(f"| {r['model']} | {r['runtime']} | {r['mode']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if "decode_tok_s" in r]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    labels = [f"{r['model']}\n{r['runtime']} {r['mode']}" for r in ok]
    ax.bar(range(len(ok)), [r["decode_tok_s"] for r in ok], label="128-token context")
    ax.bar(
        range(len(ok)),
        [r.get(f"decode_{LONG}_tok_s", 0) for r in ok],
        width=0.4,
        label=f"{LONG:,}-token context",
        alpha=0.8,
    )
    ax.set_xticks(range(len(ok)), labels, rotation=70, fontsize=7)
    ax.set_ylabel("decode tokens/s (batch 1, 2 threads)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    global LONG
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", type=Path, default=Path("../shared/bench/configs"))
    ap.add_argument("--models", nargs="*", default=["jamba-125m", "granite-h-125m", "llama-125m"])
    ap.add_argument("--work", type=Path, default=Path("build/bench"))
    ap.add_argument("--out", type=Path, default=Path("build/bench"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--modes", nargs="*", default=list(MODES))
    ap.add_argument("--gguf", nargs="*", default=[], help="NAME=PATH.gguf for llama.cpp (q8_0, q4_0 files)")
    ap.add_argument(
        "--llama-bench",
        type=Path,
        help="llama.cpp's llama-bench binary: measure the GGUF files with it instead of llama-cpp-python",
    )
    ap.add_argument("--long", type=int, default=LONG, help="tokens of the long prompt (prefill, decode after it)")
    ap.add_argument("--genai", nargs="*", default=[], help="NAME=DIR of onnxruntime-genai exports")
    ap.add_argument(
        "--dirs",
        nargs="*",
        default=[],
        help="NAME:LABEL=DIR: more hybridrt directories for the rounds (another export of a model, or one "
        "whose manifest predates a runtime change), labelled LABEL",
    )
    ap.add_argument("--no-torch", action="store_true", help="skip PyTorch eager")
    ap.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="then decode alone, hybridrt's int8/int4 modes and the peers' files in turn, this many rounds",
    )
    ap.add_argument("--skip-table", action="store_true", help="only the alternated rounds (reads OUT/bench.json)")
    ap.add_argument(
        "--measure",
        choices=("decode", "prefill", "context"),
        default="decode",
        help="what the rounds measure: decode tokens/s; prompt ms at 128 and --long tokens; or decode "
        "tokens/s after 128 and after --long tokens (what the KV cache's length costs)",
    )
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    LONG = args.long
    os.environ["HYBRIDRT_BENCH_LONG"] = str(args.long)
    if args.llama_bench:
        os.environ["HYBRIDRT_LLAMA_BENCH"] = str(args.llama_bench.resolve())
    gguf_kind = "llama_bench" if args.llama_bench else "llama_cpp"
    if args.skip_table:
        table_file = args.out / "bench.json"
        rows = json.loads(table_file.read_text()) if table_file.exists() else []
    else:
        rows = run_table(args)
    if args.rounds:
        entries = []
        for name in args.models:
            for mode in [m for m in ("int8-dynamic", "int8-weight", "int4", "int4-sym-vocab4") if m in args.modes]:
                if (args.work / name / mode / "hybridrt.json").exists():
                    entries.append((name, "hybridrt", mode, f"hybridrt:{args.work / name / mode}"))
            for spec in args.dirs:
                label, path = spec.split("=", 1)
                if label.startswith(f"{name}:"):
                    entries.append((name, "hybridrt", label.split(":", 1)[1], f"hybridrt:{path}"))
            for spec in args.gguf:
                label, path = spec.split("=", 1)
                if label.startswith(f"{name}:"):
                    entries.append((name, "llama.cpp", label.split(":", 1)[1], f"{gguf_kind}:{path}"))
            for spec in args.genai:
                label, path = spec.split("=", 1)
                if label.startswith(f"{name}:") and installed("onnxruntime_genai"):
                    entries.append((name, "onnxruntime-genai", label.split(":", 1)[1], f"genai:{path}"))
        head = table(rows) + "\n\n" if rows else ""
        if args.measure == "prefill":
            alternated = alternate_prefill(entries, args.rounds, args.threads)
            (args.out / "alternated_prefill.json").write_text(json.dumps(alternated, indent=2))
            text = f"Prompts alone, {args.rounds} rounds in turn (each entry in its own process):\n\n"
            body = prefill_table(alternated)
        elif args.measure == "context":
            alternated = alternate_context(entries, args.rounds, args.threads)
            (args.out / "alternated_context.json").write_text(json.dumps(alternated, indent=2))
            text = (
                f"Decode after {SHORT} and {LONG} tokens, {args.rounds} rounds in turn (each in its own process):\n\n"
            )
            body = context_table(alternated)
        else:
            alternated = alternate(entries, args.rounds, args.threads)
            (args.out / "alternated.json").write_text(json.dumps(alternated, indent=2))
            text = f"Decode alone, {args.rounds} rounds in turn (each entry in its own process):\n\n"
            body = alternated_table(alternated)
        (args.out / "bench.md").write_text(head + text + body + "\n")
        print(body)


def run_table(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for name in args.models:
        dirs = prepare(args.configs / f"{name}.json", args.work, args.modes)
        for mode in args.modes:
            r = child("hybridrt", str(dirs[mode]), args.threads)
            rows.append({"model": name, "runtime": "hybridrt", "mode": mode} | r)
            print(json.dumps(rows[-1]), flush=True)
        if not args.no_torch:
            rows.append(
                {"model": name, "runtime": "pytorch eager", "mode": "fp32"}
                | child("torch", str(dirs["hf"]), args.threads)
            )
            print(json.dumps(rows[-1]), flush=True)
    peers = (
        (args.gguf, "llama_cpp", "llama.cpp", "llama-cpp-python"),
        (args.genai, "onnxruntime_genai", "onnxruntime-genai", "onnxruntime-genai"),
    )
    for specs, module, runtime, package in peers:
        for spec in specs:
            label, path = spec.split("=", 1)
            model, mode = label.rsplit(":", 1) if ":" in label else (label, Path(path).stem)
            kind = "llama_cpp" if module == "llama_cpp" else "genai"
            if kind == "llama_cpp" and args.llama_bench:
                r = child("llama_bench", path, args.threads)
            elif installed(module):
                r = child(kind, path, args.threads)
            else:
                r = {"error": f"{package} not installed"}
            rows.append({"model": model, "runtime": runtime, "mode": mode} | r)
            print(json.dumps(rows[-1]), flush=True)
    (args.out / "bench.json").write_text(json.dumps(rows, indent=2))
    (args.out / "bench.md").write_text(table(rows) + "\n")
    plot(rows, args.out / "bench.png")
    print(table(rows))
    return rows


if __name__ == "__main__":
    main()
