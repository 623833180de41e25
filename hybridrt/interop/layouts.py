"""Export layouts: the directory and graph interface other runtimes expect.

`hybridrt` (the default) is the project's own directory: model.onnx + hybridrt.json, the
contract of graphs.contract. `transformers-js` is the directory transformers.js
(npm `@huggingface/transformers`, on onnxruntime-node or onnxruntime-web) loads as a
causal LM:

    config.json               the language model's config, layer_types in transformers.js's
                              names (interop.tjs_names), "transformers.js_config":
                              {"use_external_data_format": true, "dtype": the file's dtype}
    generation_config.json    the checkpoint's, or bos/eos/pad from config.json
    tokenizer.json, tokenizer_config.json, ...
    onnx/model{suffix}.onnx   weights in onnx/model{suffix}.onnx_data; the suffix is the one
                              transformers.js's dtype picks (DTYPES): "" float32, "_q4" for
                              --quantize int4, "_quantized" (q8) for int8-dynamic, "_int8" for
                              int8-weight

Its graph is hybridrt's graph with standard ONNX operators (onnxruntime-node 1.30, the one
transformers.js 4.x pins, refuses the fused graph: its GroupQueryAttention takes 16 inputs),
quantized as `--quantize` quantizes hybridrt's own (MatMulNBits; DynamicQuantizeLinear +
MatMulInteger), with transformers.js's interface around it (interop.tjs_graph).
"""

from __future__ import annotations

import functools
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ExportError
from ..graphs.contract import GraphContract
from ..graphs.files import atomic_directory, copy_tokenizer
from ..graphs.manifest import GRAPH_FILES, Manifest
from .files import write_around
from .tjs_graph import adapt_graph
from .tjs_names import FAMILIES, TOKEN_FIELDS

DEFAULT_LAYOUT = "hybridrt"
TRANSFORMERS_JS = "transformers-js"
LAYOUTS = (DEFAULT_LAYOUT, TRANSFORMERS_JS, "onnxruntime-genai")

# hybridrt quantization mode -> transformers.js dtype -> file name suffix (utils/dtypes.js
# DEFAULT_DTYPE_SUFFIX_MAPPING); the dtype a `from_pretrained(..., { dtype })` call names.
DTYPES = {None: "fp32", "int4": "q4", "int8-dynamic": "q8", "int8-weight": "int8"}
SUFFIXES = {"fp32": "", "q4": "_q4", "q8": "_quantized", "int8": "_int8"}


def export_layout(
    layout: str,
    src: str | Path,
    out: str | Path,
    export: Callable[..., Manifest],
    *,
    format: str = "onnx",
    force: bool = False,
    validate: bool = True,
    progress: Callable[[str], None] | None = None,
    quantized: bool = False,
) -> Manifest:
    """`layout`'s directory at `out`, around the graph `export` (hybridrt.export.export, with
    its quantizer bound when `quantized`: quantized while exporting) writes of `src`; returns
    the manifest of that inner graph."""
    from ..export.api import writable
    from ..models.loading.checkpoint import resolve
    from .genai import GENAI, write_layout

    out = writable(out, force)
    src = resolve(src)
    check_layout(layout, src, format, quantized)
    say = progress or (lambda m: None)
    if layout == TRANSFORMERS_JS:  # hybridrt's graph with standard operators, its weights moved
        options: dict[str, Any] = {"fused_ops": False, "fuse_norms": False}
        write, runtime = functools.partial(_write, src, move=True), "transformers.js"
    else:
        options, write, runtime = {}, functools.partial(write_layout, move=True), GENAI

    def export_inner(inner: Path) -> Manifest:
        return export(src, inner, validate=validate, progress=say, **options)

    return write_around(out, force, export_inner, write, say, runtime)


def check_layout(layout: str, src: Path, format: str, quantized: bool) -> None:
    """Refuse, before any work, a layout this export cannot write."""
    if layout not in LAYOUTS:
        raise ExportError(f"unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    if layout == DEFAULT_LAYOUT:
        return
    if format != "onnx":
        raise ExportError(f"layout {layout} needs --format onnx, not {format}")
    if layout == TRANSFORMERS_JS:
        _check_transformers_js(src, quantized)
    elif layout == "onnxruntime-genai":
        from .genai import check_genai

        check_genai(src, quantized)


def _check_transformers_js(src: Path, quantized: bool) -> None:
    """Every direct quantization mode has its transformers.js dtype (DTYPES); the model type
    must be one whose cache names interop.tjs_names knows."""
    model_type = _hf_config(src).get("model_type")
    if model_type not in FAMILIES:
        raise ExportError(
            f"layout {TRANSFORMERS_JS} (runtime transformers.js) does not support model_type {model_type!r}: "
            "transformers.js 4.3.1 has no causal LM with its states for it; "
            f"supported: {', '.join(sorted(FAMILIES))}"
        )


def convert_transformers_js(src: str | Path, graph_dir: str | Path, out: str | Path) -> Path:
    """transformers.js's directory at `out` around `graph_dir`, an existing hybridrt export of
    the checkpoint `src` with standard operators (export's fused_ops=False), float or
    quantized; its weights are copied, so transformers.js and hybridrt's runtime run one graph."""
    from ..graphs.manifest import read_manifest

    src, graph_dir, out = Path(src), Path(graph_dir), Path(out)
    _check_transformers_js(src, False)
    manifest = read_manifest(graph_dir)
    if manifest.format != "onnx" or manifest.provenance.get("fused_ops"):
        raise ExportError(
            f"{graph_dir} holds a fused or non-ONNX graph, which onnxruntime-node 1.30 (transformers.js's) "
            "cannot run; export it with standard operators (--plain-ops, fused_ops=False)"
        )
    with atomic_directory(out, ExportError) as tmp:
        _write(src, graph_dir, manifest, tmp, move=False)
    return out


def _write(src: Path, graph_dir: Path, manifest: Manifest, tmp: Path, *, move: bool) -> None:
    """The layout's files in `tmp` around the graph in `graph_dir` (its weights moved or copied)."""
    hf = _hf_config(src)
    family = FAMILIES[hf["model_type"]]
    dtype = DTYPES[(manifest.quantization or {}).get("mode")]
    (tmp / "onnx").mkdir()
    contract = GraphContract(tuple(manifest.inputs), tuple(manifest.outputs))
    parts = {p.name: family.parts(p, hf.get("text_config") or hf) for p in contract.pasts}
    dest = tmp / "onnx" / f"model{SUFFIXES[dtype]}.onnx"
    adapt_graph(graph_dir / GRAPH_FILES["onnx"], dest, contract, parts, move=move)
    copy_tokenizer(src, tmp)
    layer_types = family.layer_types(list(manifest.layer_types), list(manifest.config["ffn_types"]))
    _write_configs(src, tmp, family.config(hf, layer_types), dtype)


def _write_configs(src: Path, tmp: Path, config: dict[str, Any], dtype: str) -> None:
    """config.json as transformers.js reads it (interop.tjs_names), naming the file's dtype and
    its external data, generation_config.json, and a tokenizer_config.json where the checkpoint
    has none (transformers.js's tokenizer loads both)."""
    tjs = dict(config.get("transformers.js_config") or {})
    tjs |= {"use_external_data_format": True, "dtype": dtype}
    config["transformers.js_config"] = tjs
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = src / "generation_config.json"
    if generation.is_file():
        shutil.copy2(generation, tmp / "generation_config.json")
    else:
        fields = {k: config[k] for k in TOKEN_FIELDS if k in config}
        (tmp / "generation_config.json").write_text(json.dumps(fields, indent=2) + "\n")
    if (tmp / "tokenizer.json").is_file() and not (tmp / "tokenizer_config.json").is_file():
        (tmp / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}) + "\n")


def _hf_config(src: Path) -> dict[str, Any]:
    try:
        config: dict[str, Any] = json.loads((src / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ExportError(f"cannot read {src / 'config.json'}: {e}") from None
    return config
