"""A candidate's bytes before it is built (quantize --auto's budget): its weights estimated from
the source graph's quantizable matrices at the mode's bits, and the states and KV buffers of the
sequences it must hold (from the manifest's state sizes)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..graphs.manifest import Manifest
from .modes import QuantConfig


def estimate_weights(src: Path, manifest: Manifest, options: dict[str, Any]) -> int:
    """Bytes of the candidate's graph before it is built: the source graph's bytes with its
    quantizable matrices (the selection's linear layers and vocabulary) at the mode's bits,
    scales and zero points included."""
    import onnx

    from .selection import select_nodes
    from .vocab import find_vocab_nodes

    parent = sum(p.stat().st_size for p in src.iterdir() if p.name.startswith(manifest.graph_file))
    if not options:
        return parent
    graph = onnx.load(str(src / manifest.graph_file), load_external_data=False).graph
    cfg = QuantConfig.from_kwargs(**options)
    selection = select_nodes(graph, cfg, manifest.layer_types)
    sizes = {t.name: _elements(t.dims) for t in graph.initializer}
    matrices = {n.input[1] for n in graph.node if n.name in selection.quantize and len(n.input) > 1}
    vocab = find_vocab_nodes(graph)
    tables = {t for t in (vocab.table, vocab.head_weight) if t in sizes}
    linear = sum(sizes.get(m, 0) for m in matrices - tables)
    table = sum(sizes[t] for t in tables)
    block = cfg.block_size
    per = {
        "int4": 0.5 + 4 / block + (0 if cfg.symmetric else 0.5 / block),
        "int8-weight": 1 + 4 / block + (0 if cfg.symmetric else 1 / block),
        "int8-dynamic": 1.0,
        "int8-static": 1.0,
    }.get(cfg.mode, 4.0)
    vocab_per = cfg.vocab_bits / 8 + 4 / 128
    return int(parent - 4 * (linear + table) + per * linear + vocab_per * table)


def _elements(dims: Sequence[int]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def state_bytes(manifest: Manifest, options: dict[str, Any], context: int, batch: int) -> int:
    """States and KV buffers of `batch` sequences of `context` tokens (KV at the candidate's dtype)."""
    from ..graphs.contract import state_bytes_per_sequence

    kv_scale = {"int8": 0.25, "float16": 0.5}.get(options.get("kv_dtype", "float32"), 1.0)
    total = 0.0
    for spec in manifest.pasts:
        n = state_bytes_per_sequence(spec)
        total += n * context * kv_scale if spec.is_kv else n
    return int(total * batch)
