"""Export wall time and peak memory against model size: each export in its own process.

python benchmarks/bench_export.py build/granite-h-350m build/granite-h-1b --modes float int4 -o docs/bench/export.json

Each checkpoint (made by benchmarks/make_bench_checkpoint.py from ../shared/bench/configs) is
exported once per mode (`float`: `hybridrt export` with its parity check; otherwise
`hybridrt export --quantize MODE`), one after another in child processes, so each peak RSS is
that export's alone (the ru_maxrss its manifest records). Prints a Markdown table and writes the JSON.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_one(src: Path, mode: str, work: Path) -> dict[str, object]:
    out = work / f"{src.name}-{mode}"
    cmd = ["hybridrt", "export", str(src), "-o", str(out), "--force"]
    if mode != "float":
        cmd += ["--quantize", mode]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    row: dict[str, object] = {
        "checkpoint": src.name,
        "mode": mode,
        "seconds": round(wall, 1),
        "ok": done.returncode == 0,
    }
    if done.returncode != 0:
        row["error"] = (done.stderr.strip().splitlines() or ["?"])[-1]
        return row
    manifest = json.loads((out / "hybridrt.json").read_text())
    prov = manifest["provenance"]
    row |= {
        "parameters": prov["parameters"],
        "checkpoint_bytes": sum(f.stat().st_size for f in src.glob("*.safetensors")),
        "graph_bytes": sum(f["bytes"] for f in manifest["files"].values()),
        "peak_rss_mb": prov["export_peak_rss_mb"],  # the export process's own ru_maxrss
        "trace_seconds": prov.get("trace_seconds"),
        "write_seconds": prov.get("write_seconds"),
        "templates": len(prov.get("templates") or []),
        "layers": len(manifest["layer_types"]),
    }
    if manifest.get("parity"):
        row["parity_max_abs_logits"] = manifest["parity"]["max_abs_logits"]
    shutil.rmtree(out, ignore_errors=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoints", nargs="+", type=Path)
    ap.add_argument("--modes", nargs="+", default=["float", "int4"])
    ap.add_argument("-o", "--output", type=Path)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as work:
        for src in args.checkpoints:
            for mode in args.modes:
                row = run_one(src, mode, Path(work))
                print(json.dumps(row), file=sys.stderr)
                rows.append(row)
    print(
        "| checkpoint | parameters | layers (templates) | mode | wall s | trace s | write s | peak RSS MB | graph MB |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        r = dict(r)
        if not r["ok"]:
            print(f"| {r['checkpoint']} | | | {r['mode']} | failed: {r['error']} | | | | |")
            continue
        size = f"{float(str(r['parameters'])) / 1e9:.2f} B"
        graph = f"{float(str(r['graph_bytes'])) / 1e6:.0f}"
        print(
            f"| {r['checkpoint']} | {size} | {r['layers']} ({r['templates']}) | {r['mode']} | {r['seconds']} "
            f"| {r['trace_seconds']} | {r['write_seconds']} | {r['peak_rss_mb']} | {graph} |"
        )
    if args.output:
        args.output.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
