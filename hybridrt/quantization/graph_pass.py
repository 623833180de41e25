"""`quantize_graph`: quantization as a pass over one ONNX graph, model in, model and record out.

`quantize` (api.py: a float directory in, a quantized directory out) and quantization while
exporting (direct.py: each fragment of a streamed export as it is written) both run this pass;
neither reaches into the other. The pass runs the mode's quantizer (methods.py, onnxruntime's
quantizers, with rewrites.py's hybridrt rewrites around them) over the selected linear layers,
the experts as QMoE, then the embedding and LM head block-wise (vocab.py), and records what it
did to the vocabulary.

Both also describe the result the same way: the `quantization` record of the quantized
directory's manifest (quantized_manifest: what was done, from which parent, with which
calibration) and the graph's sizes against the parent's (graph_sizes).
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._version import __version__
from ..errors import QuantizationError
from ..graphs.manifest import Manifest
from . import methods, rewrites
from .modes import INT8_BLOCK, SEARCHED, WEIGHT_BITS, QuantConfig
from .moe import moe_nodes, quantize_moe
from .selection import NodeSelection
from .vocab import quantize_vocab

if TYPE_CHECKING:
    from .calibration import CalibrationReader


def quantize_graph(
    model: Any,
    config: QuantConfig,
    selection: NodeSelection,
    *,
    reader: CalibrationReader | None = None,
    work: Path | None = None,
    external: bool = False,
) -> tuple[Any, dict[str, Any]]:
    """`model` (an onnx.ModelProto) with `selection` quantized by `config`'s mode; returns the
    quantized model and its record ({"vocab": the vocabulary's record, or None when the graph
    holds no vocabulary node}). reader: calibration feeds (int8-static, GPTQ); work: where
    onnxruntime's quantizers write their intermediate graphs (a temporary directory when not
    given); external: the graph's weights are too large for one protobuf."""
    if selection.quantize:
        scratch = Path(tempfile.mkdtemp(prefix="hybridrt-quantize-")) if work is None else work
        try:
            model = _quantizers(model, config, selection, reader, scratch, external)
        finally:
            if work is None:
                shutil.rmtree(scratch, ignore_errors=True)
    vocab = None
    if selection.vocab_nodes is not None:
        bits = config.vocab_bits
        block = config.block_size if bits == 4 else INT8_BLOCK
        nodes, chosen = selection.vocab_nodes, set(selection.vocab)
        vocab = quantize_vocab(model.graph, nodes, chosen, bits, block, config.accuracy_level)
    return model, {"vocab": vocab}


def _quantizers(
    model: Any, cfg: QuantConfig, selection: NodeSelection, reader: CalibrationReader | None, tmp: Path, external: bool
) -> Any:
    """The mode's quantizer over the selected linear layers (the vocabulary comes after)."""
    experts = set(moe_nodes(model.graph)) & set(selection.quantize)
    if experts:  # onnxruntime's quantizers take 2-D weights only: the experts go to QMoE
        bits = 4 if cfg.mode == "int4" else 8
        block = cfg.block_size if cfg.mode in WEIGHT_BITS else INT8_BLOCK
        quantize_moe(
            model.graph, sorted(experts), bits, block, cfg.symmetric, cfg.accuracy_level, cfg.resolved_algo in SEARCHED
        )
        selection = dataclasses.replace(selection, quantize=[n for n in selection.quantize if n not in experts])
        if not selection.quantize:
            return model
    work = tmp / ".work"
    work.mkdir()
    try:
        if cfg.mode == "int8-static":
            assert reader is not None
            return _int8_static(model, cfg, selection, reader, work, external)
        if cfg.mode == "int8-dynamic":
            return methods.int8_dynamic(model, work, selection.quantize, external)
        bits, algo = WEIGHT_BITS[cfg.mode], cfg.resolved_algo or "rtn"
        if algo == "awq":  # the weights' input channels scaled, then their blocks searched as mse's
            from . import awq

            if reader is None:
                raise QuantizationError("AWQ calibrates on text: give --calibration FILE")
            outputs = {n.name: n.output[0] for n in model.graph.node}
            divisions = awq.scale_weights(model, selection.quantize, cfg.block_size, reader, work, external)
            model = methods.weight_only(model, bits, "mse", cfg.block_size, selection.quantize, None, True)
            awq.divide_inputs(model.graph, outputs, divisions)
        else:
            model = methods.weight_only(model, bits, algo, cfg.block_size, selection.quantize, reader, cfg.symmetric)
        rewrites.fold_biases(model.graph)
        return rewrites.set_accuracy_level(model, cfg.accuracy_level)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _int8_static(
    model: Any, cfg: QuantConfig, selection: NodeSelection, reader: CalibrationReader, work: Path, external: bool
) -> Any:
    """QDQ on selection.static; 8-bit block-wise weights on the float-activation MatMuls."""
    if selection.static:
        model = methods.int8_static(model, work, selection.static, reader, cfg.calib_method, external)
        rewrites.restore_float_inputs(model.graph, set(selection.static))
        rewrites.split_shared_quantizers(model.graph)
    if selection.float_activations:  # int8 weights, float activations (selection.py)
        nodes = list(selection.float_activations)
        model = methods.weight_only(model, 8, "rtn", INT8_BLOCK, nodes, None)
        rewrites.fold_biases(model.graph)
        model = rewrites.set_accuracy_level(model, cfg.accuracy_level)
    return model


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
