"""Digests of every family's exported graphs, to show that a refactor changes no graph.

    python scripts/compare_graphs.py digest OUT.json [--families a,b]
    python scripts/compare_graphs.py compare BEFORE.json AFTER.json

`digest` builds each family's tiny checkpoint (tests/family_checkpoints.py, seeded) and writes
its graphs every way the package can: float32 with fused operators, the float graph quantized to
int4, int4 while exporting (`--quantize int4`), and the transformers.js and onnxruntime-genai
layouts where they take the family (a refusal is recorded as its error message). It records the
sha256 of every graph file (*.onnx and external data) and of each manifest with its
run-dependent fields (times, paths, versions) removed. With `--structure`, a graph's digest is
of its structure: nodes, values and constants renamed in order of first use, so two graphs that
differ only in the names the exporter gave intermediate values (`val_12`, `sym_size_int_3`)
digest alike. `compare` prints what differs and exits 1 if anything does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Manifest fields that depend on the run, not on the graph: timings, where files were, versions.
VOLATILE = ("seconds", "time", "path", "directory", "version", "created", "host", "machine", "source", "rss")


def _stable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if not any(w in k.lower() for w in VOLATILE)}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def structure(path: Path) -> str:
    """A digest of the graph at `path` in which every name but the graph's inputs and outputs
    is replaced by its order of first use (node names kept: they come from module scopes)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    keep = {v.name for v in graph.input} | {v.name for v in graph.output}
    names: dict[str, str] = {}

    def canonical(name: str) -> str:
        if not name or name in keep:
            return name
        return names.setdefault(name, f"v{len(names)}")

    for node in graph.node:
        node.input[:] = [canonical(i) for i in node.input]
        node.output[:] = [canonical(o) for o in node.output]
    for group in (graph.initializer, graph.value_info):
        for item in group:
            item.name = canonical(item.name)
    extra = sorted(t.SerializeToString() for t in [*graph.initializer, *graph.value_info])
    del graph.initializer[:], graph.value_info[:]
    h = hashlib.sha256(model.SerializeToString(deterministic=True))
    for item in extra:
        h.update(item)
    return h.hexdigest()


def _digests(directory: Path, by_structure: bool = False) -> dict[str, str]:
    out = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        name = str(path.relative_to(directory))
        if by_structure and path.suffix == ".onnx":
            out[name + " (structure)"] = structure(path)
        elif path.suffix in (".onnx", ".data", ".onnx_data") or ".onnx." in path.name:
            out[name] = hashlib.sha256(path.read_bytes()).hexdigest()
        elif path.name in ("hybridrt.json", "genai_config.json", "config.json"):
            stable = json.dumps(_stable(json.loads(path.read_text())), sort_keys=True)
            out[name + " (stable fields)"] = hashlib.sha256(stable.encode()).hexdigest()
    return out


QUICK = {"agreement_prompts": 2, "eval_tokens": 96, "eval_window": 64}


def _ways(ckpt: Path, onnx_dir: Path, text: Path) -> dict[str, Any]:
    """The other ways to write the family's graphs: name -> write(out)."""
    import hybridrt
    from hybridrt.quantization import quantize

    return {
        "int4": lambda out: quantize(onnx_dir, out, "int4", eval_text=text, **QUICK),
        "export-int4": lambda out: hybridrt.export_model(
            ckpt, out, validate=False, quantize="int4", quantize_options=QUICK, eval_text=text
        ),
        "transformers-js": lambda out: hybridrt.export_model(ckpt, out, validate=False, layout="transformers-js"),
        "onnxruntime-genai": lambda out: hybridrt.export_model(ckpt, out, validate=False, layout="onnxruntime-genai"),
    }


def digest(out: Path, families: list[str] | None, ways: list[str] | None = None, by_structure: bool = False) -> None:
    logging.disable(logging.WARNING)  # the exporter's and the optimizer's per-node lines
    sys.path.insert(0, str(ROOT / "tests"))
    from family_checkpoints import BUILDERS

    import hybridrt

    record: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        work = Path(tmp)
        text = work / "eval.txt"  # held-out text for the quality reports (their figures are not digested)
        text.write_text(" ".join(f"The {n}th line of a plain text, counted once." for n in range(400)))
        for name in families or sorted(BUILDERS):
            ckpt = BUILDERS[name](work / name / "ckpt", seed=0)
            onnx_dir = work / name / "onnx"
            hybridrt.export_model(ckpt, onnx_dir, validate=False)
            record[f"{name}/float32"] = _digests(onnx_dir, by_structure)
            for way, write in _ways(ckpt, onnx_dir, text).items():
                if ways is not None and way not in ways:
                    continue
                target = work / name / way
                try:
                    write(target)
                    record[f"{name}/{way}"] = _digests(target, by_structure)
                except Exception as e:  # a layout that does not take the family: its message
                    record[f"{name}/{way}"] = {"refused": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
            print(name, "done", flush=True)
    out.write_text(json.dumps(record, indent=1, sort_keys=True))


def compare(before: Path, after: Path) -> int:
    a, b = json.loads(before.read_text()), json.loads(after.read_text())
    differ = 0
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            differ += 1
            print(f"DIFFERS {key}: {a.get(key)} -> {b.get(key)}")
    print(f"{len(set(a) | set(b)) - differ} of {len(set(a) | set(b))} exports identical")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("digest")
    d.add_argument("out", type=Path)
    d.add_argument("--families", default=None)
    d.add_argument("--ways", default=None, help="comma-separated: int4, export-int4, transformers-js, ...")
    d.add_argument("--structure", action="store_true", help="digest graphs by structure (see above)")
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "digest":
        split = lambda v: v.split(",") if v else None  # noqa: E731
        digest(args.out, split(args.families), split(args.ways), args.structure)
        return 0
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
