"""The `quantization` record of a quantized directory's manifest: what was done, from which
parent, with which calibration, and the graph's sizes against the parent's."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .._version import __version__
from ..graphs.manifest import Manifest
from .modes import WEIGHT_BITS, QuantConfig
from .selection import NodeSelection


def quantized_manifest(
    parent: Manifest,
    src: Path,
    cfg: QuantConfig,
    selection: NodeSelection,
    feeds: int,
    evaluation: dict[str, Any],
) -> Manifest:
    import onnxruntime

    manifest = Manifest.from_dict(parent.to_dict())
    manifest.parity = {}  # the parent's export parity describes the float graph, kept below
    manifest.quantization = {
        "mode": cfg.mode,
        "kv_dtype": cfg.kv_dtype,
        "algo": cfg.resolved_algo,
        "block_size": cfg.block_size if cfg.weight_only else None,
        "symmetric": cfg.symmetric if cfg.weight_only else None,
        "calib_method": cfg.calib_method if cfg.mode == "int8-static" else None,
        "weight_bits": WEIGHT_BITS[cfg.mode],
        "quantized_nodes": selection.quantize + selection.vocab,
        "float_activations": selection.float_activations if cfg.mode == "int8-static" else None,
        "excluded": selection.excluded,
        "keep_float_patterns": selection.patterns,
        "include_patterns": list(cfg.include),
        "calibration": {
            "feeds": feeds,
            "samples": cfg.samples,
            "seq_len": cfg.seq_len,
            "decode_steps": cfg.decode_steps,
        },
        "eval_text": evaluation,
        "parent": {"path": str(src.resolve()), "files": parent.files, "parity": parent.parity},
        "onnxruntime": onnxruntime.__version__,
        "hybridrt": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "report": None,
    }
    return manifest


def graph_sizes(src: Path, out: Path, graph_file: str) -> dict[str, Any]:
    def graph_bytes(d: Path) -> int:
        return sum(p.stat().st_size for p in d.iterdir() if p.name.startswith(graph_file))

    parent, quantized = graph_bytes(src), graph_bytes(out)
    return {"parent_bytes": parent, "bytes": quantized, "ratio": quantized / parent}
