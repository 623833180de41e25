"""Quantize while exporting (`hybridrt export SRC -o OUT --quantize MODE`): each fragment of
the streamed export (one layer, or the outer graph with the vocabulary) goes through the
mode's quantizer as soon as its weights are bound, before it is written. A model whose float
graph would not fit in memory exports straight to 4 or 8 bits, the way onnxruntime-genai's
builder makes its int4 graphs tensor by tensor.

The selection rules, the quantizers and the vocabulary rewrite are those of `quantize`
(quantization.api), applied to one fragment at a time; the manifest records the same fields.
Modes that calibrate on text (int8-static, GPTQ) need the whole float model's activations and
stay with `hybridrt quantize`.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

from ..errors import QuantizationError
from . import rewrites
from .graph_pass import quantize_graph
from .modes import QuantConfig
from .selection import NodeSelection, select_nodes

DIRECT_MODES = ("int4", "int8-weight", "int8-dynamic")


class FragmentQuantizer:
    """export.streamed's LayerPass for one quantization mode; collects the selection of every
    fragment for the manifest."""

    def __init__(self, mode: str, **options: Any) -> None:
        if mode not in DIRECT_MODES:
            raise QuantizationError(
                f"export --quantize takes {', '.join(DIRECT_MODES)}; {mode} calibrates on text: "
                "export the float graph, then run `hybridrt quantize`"
            )
        self.cfg = QuantConfig.from_kwargs(mode=mode, **options)
        if self.cfg.needs_calibration:
            raise QuantizationError(
                f"{mode} {self.cfg.resolved_algo} calibrates on text: export the float graph, then `hybridrt quantize`"
            )
        if self.cfg.kv_dtype != "float32":
            raise QuantizationError(
                "an int8 KV cache's scales are calibrated on text: export, then `hybridrt quantize --kv-dtype int8`"
            )
        self.layer_types: list[str] = []
        self.selection = NodeSelection([], {}, [], [])
        self.vocab: dict[str, Any] | None = None

    def bind(self, cfg: Any) -> None:
        """The model's config, once export has read it (the kinds' keep-float rules)."""
        self.layer_types = list(cfg.layer_types)

    def __call__(self, model: Any, index: int) -> Any:
        import onnx

        selection = select_nodes(model.graph, self.cfg, self.layer_types)
        rewrites.give_private_weights(model.graph, selection.quantize)
        self.selection.quantize += selection.quantize
        self.selection.excluded |= selection.excluded
        self.selection.patterns = selection.patterns
        self.selection.vocab += selection.vocab
        has_vocab = selection.vocab_nodes is not None and bool(selection.vocab_nodes.names)
        if not has_vocab:
            selection = dataclasses.replace(selection, vocab_nodes=None)  # a layer: no vocabulary to record
        named = _dim_params(model.graph)
        model, record = quantize_graph(model, self.cfg, selection)
        if selection.quantize:
            _forget_new_dim_params(model.graph, named)
        if has_vocab:
            self.vocab = record["vocab"]
            # The vocabulary's com.microsoft nodes need their domain imported: a standard-operator
            # fragment that no other quantizer touched imports none (int8-dynamic, fused_ops=False).
            if not any(o.domain == "com.microsoft" for o in model.opset_import):
                model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
        return model

    def finish(self, *args: Any) -> Any:
        """export.api calls it once the graph is written: see _finish_export."""
        return _finish_export(self, *args)


def _dim_params(graph: Any) -> set[str]:
    return {d.dim_param for v in graph.value_info for d in v.type.tensor_type.shape.dim if d.dim_param}


def _forget_new_dim_params(graph: Any, named: set[str]) -> None:
    """Unname the symbolic dimensions the quantizer's shape inference invented (unk__0, ...).
    Each fragment numbers its own from 0, and onnxruntime's memory planner takes two values
    with the same name in one graph for the same size: a buffer of one layer's attention
    would be reused for another's of a different shape."""
    for v in graph.value_info:
        for d in v.type.tensor_type.shape.dim:
            if d.dim_param and d.dim_param not in named:
                d.ClearField("dim_param")


def _finish_export(
    quantizer: FragmentQuantizer,
    float_manifest: Any,
    src: Path,
    out: Path,
    float_dir: Path | None,
    eval_text: Path | None,
    float_bytes: int,
    say: Any,
) -> Any:
    """The quantized directory's manifest, as `quantize` writes it, and its quality report
    against the float graph in `float_dir` when evaluation text was given. Export writes the
    manifest returned (once, with its own fields); this only measures."""
    from ..graphs.manifest import Manifest
    from ..runtime import load
    from .calibration import NO_REPORT, head, read_inputs
    from .graph_pass import quantized_manifest
    from .report import check_gates, quality_report

    if not quantizer.selection.quantize and not quantizer.selection.vocab:
        raise QuantizationError("no node is left to quantize after the exclusions; check --exclude/--include")
    cfg = quantizer.cfg
    evaluation: dict[str, Any] = {"source": str(eval_text) if eval_text else None}
    described = Manifest.from_dict(float_manifest.to_dict())
    manifest = quantized_manifest(described, src, cfg, quantizer.selection, 0, evaluation)
    assert manifest.quantization is not None
    manifest.quantization |= {"vocab": quantizer.vocab, "direct": True}
    manifest.record_files(out)
    graph_bytes = sum(p.stat().st_size for p in out.iterdir() if p.name.startswith(manifest.graph_file))
    if float_dir is not None and eval_text is not None:
        float_manifest.record_files(float_dir)
        _, eval_texts = read_inputs(cfg, [], eval_text)
        parent = load(float_dir, "cpu", manifest=float_manifest)
        held_out = head(parent.tokenizer, "\n\n".join(eval_texts), cfg.eval_tokens)
        evaluation["chars"] = len(held_out)
        say("measuring quality against the float model")
        report = quality_report(parent, load(out, "cpu", manifest=manifest), held_out, cfg)
        check_gates(report, cfg)
        float_bytes = sum(p.stat().st_size for p in float_dir.iterdir() if p.name.startswith(manifest.graph_file))
        del parent
        shutil.rmtree(float_dir)
        manifest.quantization["report"] = report
    else:
        load(out, "cpu", manifest=manifest)  # the quantized graph loads and matches its manifest
        why = NO_REPORT if eval_text is None else "no tokenizer"
        manifest.quantization["report_skipped"] = why if eval_text is not None else "no --eval-text given"
    manifest.quantization["size"] = {
        "parent_bytes": float_bytes,
        "bytes": graph_bytes,
        "ratio": graph_bytes / float_bytes,
    }
    return manifest
