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
from ..config import HybridConfig
from ..errors import CheckpointError, ExportError, GraphError
from ..graphs.contract import GraphContract
from ..graphs.files import as_path, atomic_directory, copy_tokenizer
from ..graphs.manifest import GRAPH_FILES, Manifest
from ..models.decoder import HybridForCausalLM
from ..models.loading.checkpoint import load_model
from .trace import GraphModule, dynamic_shapes, example_inputs

FORMATS = tuple(GRAPH_FILES)
# Why a quantizing export without --eval-text checks no parity: it never holds the float graph.
DIRECT_PARITY = (
    "each layer was quantized as it was written, so no float graph exists to check against PyTorch; "
    "pass --eval-text to write one beside it, check its parity and measure the quantized graph against it"
)


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
    quantizer: Any = None,
    eval_text: str | Path | None = None,
) -> Manifest:
    """Export a Hugging Face checkpoint directory to `out`; returns the manifest.

    quantizer: a quantization.direct.FragmentQuantizer, which quantizes each layer as it is
    written (hybridrt.export_model's quantize=...; export depends on no quantization code);
    with eval_text the float graph is written beside for its quality report, then removed.

    fused_ops: in ONNX, run each Mamba recurrence as one onnxruntime `com.microsoft` node;
    False keeps standard ONNX operators only (a chunked scan), for other ONNX runtimes.
    fuse_norms: with fused_ops, also fuse each RMSNorm (and the residual Add before it) into
    onnxruntime's SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization (export.fuse).
    Other runtimes' layouts wrap this export (hybridrt.interop.layouts.export_layout).
    """
    say = progress or (lambda msg: None)
    if format not in FORMATS:
        raise ExportError(f"unknown format {format!r}; choose one of {', '.join(FORMATS)}")
    out = writable(out, force)
    from ..models.loading.checkpoint import resolve

    src = resolve(src)
    if quantizer is not None and format != "onnx":
        raise ExportError(f"--quantize needs --format onnx, not {format}")
    if eval_text is not None and quantizer is None:
        raise ExportError("--eval-text measures a --quantize export against float; add --quantize MODE")
    t0 = time.perf_counter()
    generation = _generation(src)
    with atomic_directory(out, ExportError) as tmp:
        if format == "onnx":
            direct = (quantizer, None if eval_text is None else Path(eval_text))
            manifest = _write_onnx(src, tmp, validate, say, fused_ops, fuse_norms, direct)
        else:
            say(f"loading {src}")
            model, hf = load_model(src)
            manifest = _write(model, hf, src, tmp, format, validate, say)
        manifest.generation = generation
        manifest.provenance["export_seconds"] = round(time.perf_counter() - t0, 2)
        manifest.provenance["export_peak_rss_mb"] = round(_peak_rss_mb(), 1)
        manifest.record_files(tmp)
        manifest.write(tmp)
    say(f"wrote {out}")
    return manifest


def writable(out: str | Path, force: bool) -> Path:
    """`out` as a path, refused if it exists unless `force` (before any work)."""
    out = as_path(out, "out", ExportError)
    if out.exists() and not force:
        raise ExportError(f"output directory {out} already exists; pass --force (force=True) to replace it")
    return out


def _write(
    model: HybridForCausalLM,
    hf: dict[str, Any],
    src: Path,
    tmp: Path,
    format: str,
    validate: bool,
    say: Callable[[str], None],
) -> Manifest:
    """TorchScript or pt2: the whole model traced at once (PyTorch users load it whole anyway)."""
    from . import parity as val
    from .torch_export import load_torch_graph

    contract = GraphContract.of(model.config)  # the one contract this export traces, describes and checks
    module = GraphModule(model, contract).eval()
    args = example_inputs(module)
    graph_path = tmp / GRAPH_FILES[format]
    say(f"tracing ({format})")
    with torch.no_grad():
        if format == "torchscript":
            from .torch_export import to_torchscript

            to_torchscript(module, args, graph_path)
        else:
            from .onnx_export import export_program
            from .torch_export import to_pt2

            try:
                program = export_program(module, args, dynamic_shapes(contract))
            except Exception as e:
                raise ExportError(f"torch.export failed for {model.config.model_type}: {e}") from e
            to_pt2(program, graph_path)
    copy_tokenizer(src, tmp)
    manifest = _manifest(model.config, contract, hf, src, format, sum(p.numel() for p in model.parameters()))
    manifest.provenance["fused_ops"] = False
    if validate:
        say("checking parity against PyTorch")
        runner = val.torch_runner(load_torch_graph(graph_path))
        _check_parity(manifest, val.measure_parity(model, runner, contract=contract), say)
    return manifest


def _write_onnx(
    src: Path,
    tmp: Path,
    validate: bool,
    say: Callable[[str], None],
    fused_ops: bool,
    fuse_norms: bool,
    direct: tuple[Any, Path | None] = (None, None),
) -> Manifest:
    """ONNX, one layer at a time from the memory-mapped checkpoint (export.streamed)."""
    from ..errors import QuantizationError
    from ..graphs.manifest import in_place_states
    from ..models.loading.checkpoint import open_weights
    from ..models.loading.weights import numel
    from . import parity as val
    from .onnx_export import checked_graph
    from .streamed import write_graph

    graph_path = tmp / GRAPH_FILES["onnx"]
    quantizer, eval_text = direct
    with open_weights(src) as weights:
        contract = GraphContract.of(weights.cfg)  # the one contract this export writes, describes and checks
        plan = _check_memory(weights, validate, quantizer is not None, eval_text is not None)
        if quantizer is not None:
            quantizer.bind(weights.cfg)
        float_dir = _float_dir(src, tmp) if quantizer is not None and eval_text is not None else None
        try:
            written = write_graph(
                weights,
                graph_path,
                contract,
                fused=fused_ops,
                fuse_norms=fused_ops and fuse_norms,
                layer_pass=quantizer,
                float_copy=None if float_dir is None else float_dir / GRAPH_FILES["onnx"],
                say=say,
            )
        except (CheckpointError, ExportError, QuantizationError):
            raise
        except Exception as e:
            raise ExportError(f"ONNX export failed for {weights.cfg.model_type}: {type(e).__name__}: {e}") from e
        graph = checked_graph(graph_path).graph  # read once: checked, then searched for states in place
        copy_tokenizer(src, tmp)
        n_params = sum(numel(s) for s in weights.shapes.values())
        manifest = _manifest(weights.cfg, contract, weights.hf, src, "onnx", n_params)
        manifest.in_place = in_place_states(graph, manifest.pasts)
        _record(manifest, written, fused_ops, plan)
        if validate and quantizer is not None and float_dir is None:
            manifest.parity = {"skipped": DIRECT_PARITY}
            say(f"parity check skipped: {DIRECT_PARITY}")
        elif validate:  # the float graph: the export's own, or the copy written beside a quantized one
            checked = graph_path if float_dir is None else float_dir / GRAPH_FILES["onnx"]
            say("checking parity against PyTorch, one layer at a time")
            report = val.measure_parity_streamed(weights, checked, contract=contract)
            _check_parity(manifest, report, say)
        if quantizer is not None:  # its record and quality report; the parity above becomes its parent's
            manifest = quantizer.finish(manifest, src, tmp, float_dir, eval_text, weights.nbytes(), say)
    return manifest


def _float_dir(src: Path, tmp: Path) -> Path:
    """Where an export quantized as it is written also writes its float graph (the reference of
    its quality report), with the tokenizer that report reads."""
    float_dir = tmp / ".float"
    float_dir.mkdir()
    copy_tokenizer(src, float_dir)
    return float_dir


def _record(manifest: Manifest, written: Any, fused_ops: bool, plan: dict[str, int]) -> None:
    """The writing's provenance (export.streamed.Written): operators, norm fusions, templates,
    times, trace cache and memory plan."""
    p = manifest.provenance
    p["fused_ops"] = fused_ops
    p["fused_norms"] = False if written.fusion is None else written.fusion | written.passes
    p["templates"] = written.templates
    p["trace_seconds"] = round(written.trace_seconds, 2)
    if written.trace_cache is not None:
        p["trace_cache"] = written.trace_cache
    p["write_seconds"] = round(written.write_seconds, 2)
    p["memory_plan_mb"] = {k: round(v / 1e6) for k, v in plan.items()}


def _check_memory(weights: Any, validate: bool, quantized: bool, report: bool) -> dict[str, int]:
    """Refuse, before any work, an export this machine's memory cannot hold."""
    from .streamed import available_memory, memory_plan

    plan = memory_plan(weights, validate or report, quantized and not report)
    free = available_memory()
    if free is not None and plan["peak_bytes"] > free:
        gb = 1e9
        stage = (
            "checking parity (the float graph in onnxruntime)"
            if plan["check_bytes"] > plan["write_bytes"]
            else ("writing its largest layer")
        )
        hint = (
            "; pass --no-validate to skip the parity check, or --quantize int4 to export straight to 4 bits"
            if plan["check_bytes"] > plan["write_bytes"]
            else ""
        )
        raise ExportError(
            f"exporting {weights.src} needs about {plan['peak_bytes'] / gb:.1f} GB while {stage}, and "
            f"{free / gb:.1f} GB is available{hint}"
        )
    return plan


def _check_parity(manifest: Manifest, report: dict[str, Any], say: Callable[[str], None]) -> None:
    manifest.parity = report
    if not report["passed"]:
        raise ExportError(
            f"exported graph does not match PyTorch: max |Δlogits| {report['max_abs_logits']:.3g}, "
            f"max |Δstate| {report['max_abs_state']:.3g} (tolerance {report['tolerance']:g})"
        )
    say(f"parity: max |Δlogits| {report['max_abs_logits']:.2e}, max |Δstate| {report['max_abs_state']:.2e}")


def _manifest(
    cfg: HybridConfig, contract: GraphContract, hf: dict[str, Any], src: Path, format: str, parameters: int
) -> Manifest:
    import onnx
    import onnxscript

    provenance: dict[str, Any] = {
        "source": str(src.resolve()),
        "source_architectures": hf.get("architectures"),
        "hybridrt": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "parameters": parameters,
    }
    if format == "onnx":
        from .onnx_export import OPSET

        provenance |= {"onnx": onnx.__version__, "onnxscript": onnxscript.__version__, "opset": OPSET}
    return Manifest(
        format=format,
        architecture=cfg.model_type,
        layer_types=list(cfg.layer_types),
        config=cfg.to_dict(),
        inputs=list(contract.inputs),
        outputs=list(contract.outputs),
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
    from ..graphs.manifest import read_generation_config

    try:
        return read_generation_config(src)
    except GraphError as e:
        raise CheckpointError(str(e)) from None


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
