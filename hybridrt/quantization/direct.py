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

import shutil
import tempfile
from pathlib import Path
from typing import Any

from ..errors import QuantizationError
from . import rewrites
from .config import QuantConfig
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

        from .api import _quantize_vocab, _run

        selection = select_nodes(model.graph, self.cfg, self.layer_types)
        rewrites.give_private_weights(model.graph, selection.quantize)
        self.selection.quantize += selection.quantize
        self.selection.excluded |= selection.excluded
        self.selection.patterns = selection.patterns
        self.selection.vocab += selection.vocab
        if selection.quantize:
            named = _dim_params(model.graph)
            work = Path(tempfile.mkdtemp(prefix="hybridrt-quantize-"))
            try:
                model = _run(model, self.cfg, selection, None, work, False)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            _forget_new_dim_params(model.graph, named)
        if selection.vocab_nodes is not None and selection.vocab_nodes.names:
            self.vocab = _quantize_vocab(model.graph, self.cfg, selection)
            # The vocabulary's com.microsoft nodes need their domain imported: a standard-operator
            # fragment that no other quantizer touched imports none (int8-dynamic, fused_ops=False).
            if not any(o.domain == "com.microsoft" for o in model.opset_import):
                model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
        return model

    def finish(self, *args: Any) -> Any:
        """export.api calls it once the graph is written: see _finish_export."""
        return _finish_export(self, *args)


def export_quantized(src: Any, out: Any, mode: str, options: dict[str, Any] | None = None, **kwargs: Any) -> Any:
    """export.api.export with each layer quantized by `mode` as it is written; kwargs are
    export's (eval_text among them)."""
    from ..export.api import export

    return export(src, out, quantizer=FragmentQuantizer(mode, **(options or {})), **kwargs)


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
    against the float graph in `float_dir` when evaluation text was given."""
    from ..graphs.manifest import Manifest
    from ..runtime import load
    from .api import NO_REPORT, _gate, _manifest, _read_inputs
    from .calibration import head
    from .report import quality_report

    if not quantizer.selection.quantize and not quantizer.selection.vocab:
        raise QuantizationError("no node is left to quantize after the exclusions; check --exclude/--include")
    cfg = quantizer.cfg
    evaluation: dict[str, Any] = {"source": str(eval_text) if eval_text else None}
    manifest = _manifest(Manifest.from_dict(float_manifest.to_dict()), src, cfg, quantizer.selection, None, evaluation)
    assert manifest.quantization is not None
    manifest.quantization |= {"vocab": quantizer.vocab, "direct": True}
    manifest.record_files(out)
    manifest.write(out)
    graph_bytes = sum(p.stat().st_size for p in out.iterdir() if p.name.startswith(manifest.graph_file))
    if float_dir is not None and eval_text is not None:
        float_manifest.record_files(float_dir)
        float_manifest.write(float_dir)
        _, eval_texts = _read_inputs(cfg, [], eval_text)
        parent = load(float_dir, "cpu")
        held_out = head(parent.tokenizer, "\n\n".join(eval_texts), cfg.eval_tokens)
        evaluation["chars"] = len(held_out)
        say("measuring quality against the float model")
        report = quality_report(parent, load(out, "cpu"), held_out, cfg)
        _gate(report, cfg)
        float_bytes = sum(p.stat().st_size for p in float_dir.iterdir() if p.name.startswith(manifest.graph_file))
        del parent
        shutil.rmtree(float_dir)
        manifest.quantization["report"] = report
    else:
        load(out, "cpu")  # the quantized graph loads and matches its manifest
        why = NO_REPORT if eval_text is None else "no tokenizer"
        manifest.quantization["report_skipped"] = why if eval_text is not None else "no --eval-text given"
    manifest.quantization["size"] = {
        "parent_bytes": float_bytes,
        "bytes": graph_bytes,
        "ratio": graph_bytes / float_bytes,
    }
    return manifest
