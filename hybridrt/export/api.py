"""`export(src, out)`: checkpoint directory in, self-describing graph directory out.

Writing is atomic (graphs.files.atomic_directory): `out` appears only once the graph is
written, validated and described.
"""

from __future__ import annotations

import platform
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .._version import __version__
from ..errors import CheckpointError, ExportError, GraphError
from ..graphs.contract import input_specs, output_specs
from ..graphs.files import atomic_directory, copy_tokenizer
from ..graphs.manifest import GRAPH_FILES, Manifest
from ..models.checkpoint import load_model
from ..models.model import HybridForCausalLM
from ..runtime.validate import as_path
from .trace import GraphModule, dynamic_shapes, example_inputs

FORMATS = tuple(GRAPH_FILES)


def export(
    src: str | Path,
    out: str | Path,
    *,
    format: str = "onnx",
    force: bool = False,
    validate: bool = True,
    fused_ops: bool = True,
    fuse_norms: bool = True,
    progress: Callable[[str], None] | None = None,
) -> Manifest:
    """Export a Hugging Face checkpoint directory to `out`; returns the manifest.

    fused_ops: in ONNX, run each Mamba recurrence as one onnxruntime `com.microsoft` node;
    False keeps standard ONNX operators only (a chunked scan), for other ONNX runtimes.
    fuse_norms: with fused_ops, also fuse each RMSNorm (and the residual Add before it) into
    onnxruntime's SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization (export.fuse).
    """
    say = progress or (lambda msg: None)
    if format not in FORMATS:
        raise ExportError(f"unknown format {format!r}; choose one of {', '.join(FORMATS)}")
    out = as_path(out, "out", ExportError)
    if out.exists() and not force:
        raise ExportError(f"output directory {out} already exists; pass --force (force=True) to replace it")
    src = Path(src)
    t0 = time.perf_counter()
    generation = _generation(src)
    say(f"loading {src}")
    model, hf = load_model(src)
    with atomic_directory(out, ExportError) as tmp:
        manifest = _write(model, hf, src, tmp, format, validate, say, fused_ops, fuse_norms)
        manifest.generation = generation
        manifest.provenance["export_seconds"] = round(time.perf_counter() - t0, 2)
        manifest.provenance["export_peak_rss_mb"] = round(_peak_rss_mb(), 1)
        manifest.record_files(tmp)
        manifest.write(tmp)
    say(f"wrote {out}")
    return manifest


def _write(
    model: HybridForCausalLM,
    hf: dict[str, Any],
    src: Path,
    tmp: Path,
    format: str,
    validate: bool,
    say: Callable[[str], None],
    fused_ops: bool = True,
    fuse_norms: bool = True,
) -> Manifest:
    from . import validate as val

    module = GraphModule(model).eval()
    args = example_inputs(model)
    graph_path = tmp / GRAPH_FILES[format]
    norm_fusion = None
    say(f"tracing ({format})")
    with torch.no_grad():
        if format == "torchscript":
            from .torch_export import to_torchscript

            to_torchscript(module, args, graph_path)
        else:
            from .onnx_export import export_program

            try:
                program = export_program(module, args, dynamic_shapes(model), fused=format == "onnx" and fused_ops)
            except Exception as e:
                raise ExportError(f"torch.export failed for {model.config.model_type}: {e}") from e
            if format == "pt2":
                from .torch_export import to_pt2

                to_pt2(program, graph_path)
            else:
                from .onnx_export import to_onnx

                _, norm_fusion = to_onnx(program, module, graph_path, fuse_norms=fused_ops and fuse_norms)
    copy_tokenizer(src, tmp)
    manifest = _manifest(model, hf, src, format)
    manifest.provenance["fused_ops"] = format == "onnx" and fused_ops
    if format == "onnx":
        # False, or what export.fuse did: fused-op counts and the norms left unfused
        manifest.provenance["fused_norms"] = norm_fusion or False
    if validate:
        say("checking parity against PyTorch")
        if format == "onnx":
            runner = val.ort_runner(graph_path, model)
        else:
            from .torch_export import load_torch_graph

            runner = val.torch_runner(load_torch_graph(graph_path))
        report = val.measure_parity(model, runner)
        manifest.parity = report
        if not report["passed"]:
            raise ExportError(
                f"exported graph does not match PyTorch: max |Δlogits| {report['max_abs_logits']:.3g}, "
                f"max |Δstate| {report['max_abs_state']:.3g} (tolerance {report['tolerance']:g})"
            )
        say(f"parity: max |Δlogits| {report['max_abs_logits']:.2e}, max |Δstate| {report['max_abs_state']:.2e}")
    return manifest


def _manifest(model: HybridForCausalLM, hf: dict[str, Any], src: Path, format: str) -> Manifest:
    import onnx
    import onnxscript

    cfg = model.config
    provenance: dict[str, Any] = {
        "source": str(src.resolve()),
        "source_architectures": hf.get("architectures"),
        "hybridrt": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    if format == "onnx":
        from .onnx_export import OPSET

        provenance |= {"onnx": onnx.__version__, "onnxscript": onnxscript.__version__, "opset": OPSET}
    return Manifest(
        format=format,
        architecture=cfg.model_type,
        layer_types=list(cfg.layer_types),
        config=cfg.to_dict(),
        inputs=input_specs(cfg),
        outputs=output_specs(cfg),
        special_tokens={
            "bos_token_id": cfg.bos_token_id,
            "eos_token_id": list(cfg.eos_token_id),
            "pad_token_id": cfg.pad_token_id,
        },
        max_length=cfg.max_position_embeddings,
        vocab_size=cfg.vocab_size,
        provenance=provenance,
    )


def _generation(src: Path) -> dict[str, Any] | None:
    """The checkpoint's recommended generation settings (generation_config.json), checked
    before any work is done."""
    from ..graphs.generation import read_generation_config

    try:
        return read_generation_config(src)
    except GraphError as e:
        raise CheckpointError(str(e)) from None


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
