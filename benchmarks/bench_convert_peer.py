"""llama.cpp's side of the export benchmark: GGUF conversion and Q4_0 quantization of the bench checkpoints.

python benchmarks/bench_convert_peer.py /work/bench/granite-h-350m /work/bench/granite-h-1b \\
    --llama /work/peers/src/llama_cpp_python-0.3.36/vendor/llama.cpp \\
    --quantize-bin /work/peers/llama.cpp-build/bin/llama-quantize \\
    --work /work/peers/convert -o build/convert-llama.cpp.json

For each checkpoint (bf16 sharded safetensors, never modified) a copy WORK/<name>/hf is made with
symlinked weights, the checkpoint's config and index, and the shared 32,000-piece sentencepiece
tokenizer of benchmarks/prepare_peers.py (trained into WORK/tokenizer unless --tokenizer names one).
The converter wants a sentencepiece `tokenizer.model` for Granite-4.0-H; a checkpoint whose
vocabulary is larger (granite-h-1b: 100,352) gets the same tokenizer, and the converter fills the
rows past 32,000 with [PAD<i>] tokens, so the GGUF keeps the checkpoint's embedding shape.

Then, one after another, each under `/usr/bin/time -v` in its own process:
`convert_hf_to_gguf.py --outtype OUTTYPE` (f32 and bf16 by default; the converter reads the copy's
config.json as written, since transformers' AutoConfig renames `layer_types`) and
`llama-quantize IN OUT Q4_0 THREADS` from the --quantize-from output. Reports wall time, peak RSS
(the child's maximum resident set) and output size; prints a Markdown table and writes the JSON.
The GGUF files are deleted afterwards unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from prepare_peers import CONVERT, TOKENIZER_FILES, train_tokenizer

TIME = "/usr/bin/time"

Row = dict[str, Any]


def hf_copy(src: Path, dest: Path, tokenizer: Path) -> Path:
    """WORK/<name>/hf: symlinks to the weights, copies of the JSON files, the shared tokenizer."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        target = dest / f.name
        if f.suffix == ".safetensors":
            if not target.exists():
                target.symlink_to(f.resolve())
        elif f.suffix == ".json":
            shutil.copyfile(f, target)
    for name in TOKENIZER_FILES:
        if (tokenizer / name).exists():
            shutil.copyfile(tokenizer / name, dest / name)
    return dest


def timed(cmd: list[str], log: Path) -> Row:
    """Run `cmd` under /usr/bin/time -v; wall seconds, peak RSS MB, and the error's last line if it failed."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with log.open("w") as f:
        done = subprocess.run([TIME, "-v", *cmd], stdout=f, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    text = log.read_text(errors="replace")
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    cpu = [re.search(rf"{k} time \(seconds\): ([\d.]+)", text) for k in ("User", "System")]
    row: Row = {
        "seconds": round(wall, 1),
        "peak_rss_mb": round(int(rss.group(1)) / 1024) if rss else None,
        "cpu_seconds": round(sum(float(m.group(1)) for m in cpu if m), 1),
        "ok": done.returncode == 0,
    }
    if done.returncode != 0:
        lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("\t")]
        row["error"] = (lines[-1] if lines else f"exit status {done.returncode}")[:300]
    return row


def parameters(src: Path) -> int:
    """Element count of the checkpoint's tensors, read from the safetensors headers."""
    total = 0
    for f in sorted(src.glob("*.safetensors")):
        with f.open("rb") as fh:
            header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
        for name, info in header.items():
            if name != "__metadata__":
                n = 1
                for d in info["shape"]:
                    n *= d
                total += n
    return total


def bench(src: Path, args: argparse.Namespace, tokenizer: Path) -> list[Row]:
    hf = hf_copy(src, args.work / src.name / "hf", tokenizer)
    out = args.work / src.name
    logs = args.work / "logs"
    base: Row = {
        "checkpoint": src.name,
        "parameters": parameters(src),
        "vocab_size": json.loads((src / "config.json").read_text())["vocab_size"],
        "checkpoint_bytes": sum(f.stat().st_size for f in src.glob("*.safetensors")),
    }
    rows: list[Row] = []
    made: dict[str, Path] = {}
    for outtype in args.outtypes:
        path = out / f"{outtype}.gguf"
        path.unlink(missing_ok=True)
        cmd = [sys.executable, "-c", CONVERT, str(args.llama), "True", str(hf)]
        cmd += ["--outtype", outtype, "--outfile", str(path)]
        row = base | {"step": f"convert {outtype}"} | timed(cmd, logs / f"{src.name}-convert-{outtype}.log")
        if row["ok"]:
            row["output_bytes"] = path.stat().st_size
            made[outtype] = path
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    for quant in args.quants:
        source = made.get(args.quantize_from)
        step = f"quantize {args.quantize_from} -> {quant}"
        if source is None:
            rows.append(base | {"step": step, "ok": False, "error": f"no {args.quantize_from}.gguf"})
            continue
        path = out / f"{quant.lower()}.gguf"
        path.unlink(missing_ok=True)
        cmd = [str(args.quantize_bin), str(source), str(path), quant, str(args.threads)]
        row = base | {"step": step} | timed(cmd, logs / f"{src.name}-{quant.lower()}.log")
        if row["ok"]:
            row["output_bytes"] = path.stat().st_size
            made[quant] = path
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    if not args.keep:
        for path in made.values():
            path.unlink(missing_ok=True)
    return rows


def llama_version(llama: Path, quantize_bin: Path) -> dict[str, str]:
    """The vendored llama.cpp commit and the build's own version line."""
    info: dict[str, str] = {}
    commit = subprocess.run(["git", "-C", str(llama), "rev-parse", "HEAD"], capture_output=True, text=True)
    if commit.returncode == 0:
        info["commit"] = commit.stdout.strip()
    server = quantize_bin.parent / "llama-server"
    if server.exists():
        done = subprocess.run([str(server), "--version"], capture_output=True, text=True)
        info["build"] = " ".join((done.stdout + done.stderr).split())[:200]
    return info


def table(rows: list[Row]) -> str:
    lines = [
        "| checkpoint | parameters | vocab | step | wall s | CPU s | peak RSS MB | output MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        size = f"{r['parameters'] / 1e9:.2f} B"
        if not r["ok"]:
            lines.append(
                f"| {r['checkpoint']} | {size} | {r['vocab_size']} | {r['step']} | failed: {r['error']} | | | |"
            )
            continue
        lines.append(
            f"| {r['checkpoint']} | {size} | {r['vocab_size']} | {r['step']} | {r['seconds']} | {r['cpu_seconds']} "
            f"| {r['peak_rss_mb']} | {r['output_bytes'] / 1e6:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoints", nargs="+", type=Path)
    ap.add_argument("--llama", type=Path, required=True, help="llama.cpp source folder (holds convert_hf_to_gguf.py)")
    ap.add_argument("--quantize-bin", type=Path, required=True, help="the built llama-quantize")
    ap.add_argument("--work", type=Path, default=Path("build/convert-peer"))
    ap.add_argument("--tokenizer", type=Path, help="folder with tokenizer.model/tokenizer.json (default: trained)")
    ap.add_argument("--outtypes", nargs="+", default=["f32", "bf16"])
    ap.add_argument("--quants", nargs="*", default=["Q4_0"])
    ap.add_argument("--quantize-from", default="f32", help="which converter output llama-quantize reads")
    ap.add_argument("--threads", type=int, default=2, help="llama-quantize threads")
    ap.add_argument("--keep", action="store_true", help="keep the GGUF files")
    ap.add_argument("-o", "--output", type=Path)
    args = ap.parse_args()
    args.work = args.work.resolve()
    tokenizer = args.tokenizer or train_tokenizer(args.work / "tokenizer")
    rows = [row for src in args.checkpoints for row in bench(src.resolve(), args, tokenizer)]
    print(table(rows))
    if args.output:
        doc = {
            "llama.cpp": llama_version(args.llama, args.quantize_bin),
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
            "rows": rows,
        }
        args.output.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
