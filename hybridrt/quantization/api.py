"""`quantize(src, out, mode)`: float graph directory in, quantized graph directory out.

The output is an ordinary hybridrt directory (model.onnx, tokenizer, hybridrt.json) that
hybridrt.load and `hybridrt generate` run unchanged; its manifest's `quantization` records
the mode, the nodes kept float and the quality report against the float parent.

Writing is atomic, as for export (graphs.files.atomic_directory): `out` appears only once
the graph is written, reloaded, measured and within the gates. On any error nothing is
written.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import QuantizationError
from ..graphs.files import as_path, atomic_directory, copy_tokenizer, save_onnx
from ..graphs.manifest import Manifest, in_place_states, read_manifest
from ..runtime.input_checks import as_paths
from ..runtime.text import TOKENIZER
from . import rewrites
from .calibration import NO_REPORT, CalibrationReader, calibration_feeds, head, read_inputs, split_text
from .graph_pass import graph_sizes, quantize_graph, quantized_manifest
from .modes import QuantConfig
from .report import check_gates, quality_report
from .selection import NodeSelection, select_nodes
from .shared import Quantized, SharedWeights


def quantize(
    src: str | Path,
    out: str | Path,
    mode: str = "int8-static",
    *,
    calibration: Sequence[str | Path] = (),
    eval_text: str | Path | None = None,
    force: bool = False,
    progress: Callable[[str], None] | None = None,
    shared: SharedWeights | None = None,
    **options: Any,
) -> Manifest:
    """Quantize an exported ONNX directory; returns the new directory's manifest.

    calibration: text files (plain, or JSONL with a "text" field) for int8-static and GPTQ
      ranges; unless eval_text is given, the text after the calibration windows is the
      held-out text of the quality report.
    eval_text: a text file to measure the quality report on.
    options: QuantConfig fields (algo, block_size, calib_method, samples, seq_len,
      exclude, include, keep_float_default, max_ppl_ratio, ...); an unknown one is an error.
    shared: weights kept from an earlier call whose options differ only in the KV dtype are
      read back instead of quantized again, and this call's are kept (quantization.shared).
    """
    from ..runtime import load

    say = progress or (lambda msg: None)
    cfg = QuantConfig.from_kwargs(mode=mode, **options)
    src, out = as_path(src, "src", QuantizationError), as_path(out, "out", QuantizationError)
    calibration = as_paths(calibration, "calibration", QuantizationError)
    eval_text = None if eval_text is None else as_path(eval_text, "eval_text", QuantizationError)
    parent_manifest = _check_paths(src, out, force)
    has_tokenizer, texts, eval_texts = _texts(src, cfg, calibration, eval_text)
    _check_kv_attention(src, parent_manifest, cfg)
    t0 = time.perf_counter()
    parent = load(src, "cpu")
    reuse = shared.get(cfg) if shared is not None else None
    reader, held_out, windows, kv_peak = _readings(parent, cfg, texts, eval_texts, has_tokenizer, reuse is None, say)
    with atomic_directory(out, QuantizationError) as tmp:
        got = reuse or _quantized(src / parent_manifest.graph_file, cfg, reader, tmp, parent_manifest, say)
        if shared is not None and reuse is None:
            shared.keep(cfg, dataclasses.replace(got, name=out.name))
        evaluation = {"source": str(eval_text or "held-out calibration text"), "chars": len(held_out)}
        manifest = quantized_manifest(parent_manifest, src, cfg, got.selection, got.feeds, evaluation)
        manifest.quantization = (manifest.quantization or {}) | {"vocab": got.vocab}
        _kv_buffers(manifest, cfg, got.model, kv_peak, len(windows))
        rewrites.order_nodes(got.model.graph)
        manifest.in_place = in_place_states(got.model.graph, manifest.pasts)
        save_onnx(got.model, tmp / parent_manifest.graph_file, got.external)
        copy_tokenizer(src, tmp)
        manifest.record_files(tmp)
        manifest.quantization |= _report(parent, tmp, manifest, held_out, cfg, has_tokenizer, say)
        manifest.quantization |= {
            "size": graph_sizes(src, tmp, parent_manifest.graph_file),
            "seconds": round(time.perf_counter() - t0, 2),
        }
        manifest.write(tmp)
    say(f"wrote {out}")
    return manifest


def _texts(
    src: Path, cfg: QuantConfig, calibration: list[Path], eval_text: Path | None
) -> tuple[bool, list[str], list[str]]:
    """Whether the model has its tokenizer, then the calibration and evaluation texts (none
    without a tokenizer, where a mode that needs text is refused)."""
    if not (src / TOKENIZER).is_file():
        _check_without_tokenizer(src, cfg, calibration, eval_text)
        return False, [], []
    texts, eval_texts = read_inputs(cfg, calibration, eval_text)
    return True, texts, eval_texts


def _readings(
    parent: Any,
    cfg: QuantConfig,
    texts: list[str],
    eval_texts: list[str],
    has_tokenizer: bool,
    weights: bool,
    say: Callable[[str], None],
) -> tuple[CalibrationReader | None, str, list[Any], Any]:
    """What the float parent reads off the texts: the calibration reader (when the `weights` are
    quantized here), the held-out text, the calibration windows and the KV cache's peaks."""
    reader, held_out, windows = (
        _calibrate(parent, cfg, texts, eval_texts, say, weights) if has_tokenizer else (None, "", [])
    )
    kv_peak = None
    if cfg.kv_dtype == "int8":
        from . import kv_cache

        say(f"KV cache: calibrating int8 scales over {len(windows)} windows")
        kv_peak = kv_cache.calibrate(parent, windows)
    return reader, held_out, windows, kv_peak


def _quantized(
    graph_path: Path,
    cfg: QuantConfig,
    reader: CalibrationReader | None,
    tmp: Path,
    parent: Manifest,
    say: Callable[[str], None],
) -> Quantized:
    """The parent graph read and its selected weights quantized (or converted)."""
    model, external = _load_graph(graph_path)
    selection = _selection(model, cfg, parent)
    rewrites.give_private_weights(model.graph, selection.quantize)
    quantized, selection, vocab = _weights(model, cfg, selection, reader, tmp, external, parent, say)
    return Quantized(quantized, selection, vocab, external, len(reader) if reader else 0)


def _selection(model: Any, cfg: QuantConfig, manifest: Manifest) -> NodeSelection:
    """The nodes whose weights this mode quantizes (none for float16 and KV-only modes)."""
    if cfg.quantizes_weights and cfg.mode != "float16":
        return select_nodes(model.graph, cfg, manifest.layer_types)
    return NodeSelection([], {}, [])


def _weights(
    model: Any,
    cfg: QuantConfig,
    selection: NodeSelection,
    reader: CalibrationReader | None,
    tmp: Path,
    external: bool,
    parent: Manifest,
    say: Callable[[str], None],
) -> tuple[Any, NodeSelection, Any]:
    """The graph with its weights converted (float16) or quantized (the mode's pass), the
    selection of the nodes it changed, and the vocabulary's record."""
    if cfg.mode == "float16":
        from . import half

        say("converting the graph to float16")
        half_kv = [s.name for s in parent.pasts if s.is_kv] if cfg.kv_dtype == "float16" else []
        quantized, converted = half.float16(model, half_kv=half_kv)
        return quantized, dataclasses.replace(selection, quantize=converted), None
    if not cfg.quantizes_weights:
        return model, selection, None
    if not selection.quantize and not selection.vocab:
        raise QuantizationError("no node is left to quantize after the exclusions; check --exclude/--include")
    label = f"{cfg.mode} {cfg.resolved_algo}" if cfg.weight_only else cfg.mode
    say(f"quantizing {len(selection.quantize)} nodes ({label})")
    quantized, record = quantize_graph(model, cfg, selection, reader=reader, work=tmp, external=external)
    return quantized, selection, record["vocab"]


def _kv_buffers(manifest: Manifest, cfg: QuantConfig, quantized: Any, kv_peak: Any, windows: int) -> None:
    """The KV buffers in the dtype asked for: float16 in the manifest's specs, int8 with its
    scales in the graph (and their record in the manifest)."""
    if cfg.kv_dtype == "float16":
        manifest.inputs = [dataclasses.replace(s, dtype="float16") if s.is_kv else s for s in manifest.inputs]
        manifest.outputs = [dataclasses.replace(s, dtype="float16") if s.is_kv else s for s in manifest.outputs]
    if cfg.kv_dtype == "int8":
        from . import kv_cache

        assert manifest.quantization is not None
        scales = kv_cache.scales(manifest, kv_peak, quantized.graph)
        nodes = kv_cache.quantize_kv(quantized.graph, manifest, scales)
        manifest.quantization["kv_cache"] = kv_cache.record(manifest, scales, windows, nodes)


def _report(
    parent: Any,
    tmp: Path,
    manifest: Manifest,
    held_out: str,
    cfg: QuantConfig,
    has_tokenizer: bool,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """The quality report against the float model (its gates checked), or why there is none;
    either way the written graph loads and matches its manifest."""
    from ..runtime import load

    if not has_tokenizer:
        load(tmp, "cpu", manifest=manifest)
        say(f"quality report skipped: {NO_REPORT}")
        return {"report_skipped": NO_REPORT}
    say("measuring quality against the float model")
    report = quality_report(parent, load(tmp, "cpu", manifest=manifest), held_out, cfg)
    check_gates(report, cfg)
    return {"report": report}


def _check_paths(src: Path, out: Path, force: bool) -> Manifest:
    """The parent's manifest, once src is a float ONNX directory and out may be written."""
    manifest = _check_parent(src)
    if out.exists() and not force:
        raise QuantizationError(f"output directory {out} already exists; pass --force (force=True) to replace it")
    if out.resolve() == src.resolve():
        raise QuantizationError("the output directory is the model's own directory; choose another")
    return manifest


def _check_without_tokenizer(
    src: Path, cfg: QuantConfig, calibration: Sequence[str | Path], eval_text: str | Path | None
) -> None:
    """Weight-only and dynamic modes need no text: without a tokenizer they run and skip the
    quality report. What needs text (calibration, gates, an evaluation file) is an error."""
    label = f"{cfg.mode} {cfg.resolved_algo}" if cfg.weight_only else cfg.mode
    why = None
    if cfg.needs_calibration:
        why = f"{label} calibrates on text"
    elif cfg.kv_dtype == "int8":
        why = "the int8 KV cache's scales are calibrated on text"
    elif calibration or eval_text is not None:
        why = "calibration and evaluation text are read through it"
    elif cfg.max_ppl_ratio is not None or cfg.min_greedy_agreement is not None:
        why = "the quality gates (--max-ppl-ratio, --min-greedy-agreement) measure held-out text"
    if why:
        raise QuantizationError(
            f"{src} has no {TOKENIZER}, and {why}; copy the checkpoint's {TOKENIZER} into it, or use "
            "int4, int8-weight (rtn/hqq) or int8-dynamic without text options"
        )


def _calibrate(
    parent: Any, cfg: QuantConfig, texts: list[str], eval_texts: list[str], say: Callable[[str], None], weights: bool
) -> tuple[CalibrationReader | None, str, list[Any]]:
    """The calibration reader (modes that need one, when the `weights` are to be quantized here),
    the held-out text of the report and the calibration windows (token ids)."""
    held_out = head(parent.tokenizer, "\n\n".join(eval_texts), cfg.eval_tokens) if eval_texts else ""
    reader, windows = None, []
    if texts:
        split = split_text(parent.tokenizer, texts, cfg.samples, cfg.seq_len, 0 if eval_texts else cfg.eval_tokens)
        held_out, windows = held_out or split.held_out, split.windows
        if cfg.needs_calibration and weights:
            say(f"calibration: running the float model over {len(split.windows)} windows")
            reader = CalibrationReader(calibration_feeds(parent, split.windows, cfg.decode_steps))
    if len(parent.tokenizer.encode(held_out, add_special_tokens=False).ids) < 2:
        raise QuantizationError("no held-out text is left after calibration; pass --eval-text or lower --samples")
    return reader, held_out, windows


def _check_kv_attention(src: Path, manifest: Manifest, cfg: QuantConfig) -> None:
    """Before any work: with an int8 KV cache, the graph's attention can hold one."""
    if cfg.kv_dtype == "int8":
        from . import kv_cache

        kv_cache.check_attention(_bare_graph(src / manifest.graph_file), manifest)


def _bare_graph(path: Path) -> Any:
    """The graph's nodes and tensor declarations, without its weights."""
    import onnx

    return onnx.load(str(path), load_external_data=False).graph


def _load_graph(path: Path) -> tuple[Any, bool]:
    """The float graph with its weights, and whether they live in an external data file."""
    import onnx

    bare = onnx.load(str(path), load_external_data=False)
    external = any(t.data_location == onnx.TensorProto.EXTERNAL for t in bare.graph.initializer)
    return onnx.load(str(path)), external


def _check_parent(src: Path) -> Manifest:
    manifest = read_manifest(src)
    if manifest.format != "onnx":
        raise QuantizationError(
            f"{src} holds a {manifest.format} graph; quantization needs ONNX (export --format onnx)"
        )
    if manifest.quantization is not None:
        raise QuantizationError(
            f"{src} is already quantized ({manifest.quantization.get('mode')}); quantize its float parent instead"
        )
    return manifest
