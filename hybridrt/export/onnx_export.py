"""ONNX export with torch.onnx's dynamo exporter (torch.export + onnxscript).

Why this exporter: torch.export traces shapes symbolically (SymInt arithmetic such as the
scan's chunk count stays in the graph, with no per-length specialization), it is the
exporter torch maintains (the TorchScript-based one is deprecated), and its
custom_translation_table is the route to onnxruntime's com.microsoft fused operators.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import tempfile
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import onnx
import torch
import torch.fx.experimental._config

from ..models.ops import fused_ops, onnx_translations

OPSET = 20
EXTERNAL_DATA_THRESHOLD = 1 << 30  # bytes of parameters above which weights go to model.onnx.data


def _quiet_exporter_logs() -> None:
    # torch.onnx logs a warning per missing optional package (torchvision ops) on every export.
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)


def uncached_fake_tensors() -> contextlib.AbstractContextManager[None]:
    """torch's fake-tensor cache off while tracing: a hit rebuilds the output's symbolic sizes
    expression by expression, which costs more than running the operator's meta function when
    sizes are nested floors of the sequence length (a chunked scan's). Measured: a Falcon-H1
    layer with standard operators traces in 19.1 s instead of 24.4 s, a fused Granite-4.0-H one
    in 7.5 s instead of 8.2 s; the graph is the same but for the numbering of size values."""
    import torch._dynamo.config

    return cast(contextlib.AbstractContextManager[None], torch._dynamo.config.patch(fake_tensor_cache_enabled=False))


def export_program(
    module: torch.nn.Module, args: tuple[torch.Tensor, ...], dyn: tuple[object, ...], fused: bool = False
) -> torch.export.ExportedProgram:
    """torch.export of the graph module; `fused` routes mixers through the custom ops that
    become onnxruntime fused operators (ONNX only)."""
    # backed_size_oblivious: sizes seen as 0 or 1 at run time (empty KV past, one-token
    # decode, batch 1) must not be specialized away from the example sizes.
    _quiet_exporter_logs()
    oblivious = torch.fx.experimental._config.patch(backed_size_oblivious=True)  # type: ignore[attr-defined]
    with warnings.catch_warnings(), oblivious, fused_ops(module, fused), uncached_fake_tensors():
        warnings.simplefilter("ignore")
        return torch.export.export(
            module, args, dynamic_shapes=dyn, strict=False, prefer_deferred_runtime_asserts_over_guards=True
        )


def program_to_onnx(
    program: torch.export.ExportedProgram, input_names: list[str], output_names: list[str]
) -> onnx.ModelProto:
    """torch.onnx's dynamo exporter at OPSET, with the fused ops' translations."""
    with warnings.catch_warnings(), uncached_fake_tensors():  # torch.onnx traces the program again
        warnings.simplefilter("ignore")
        common: dict[str, Any] = {
            "input_names": input_names,
            "output_names": output_names,
            "opset_version": OPSET,
            "optimize": True,
            "verbose": False,
        }
        registry = _registry()
        if registry is not None:
            with _decomposition_skipped(program, registry):
                onnx_program = _entry_point()(program, registry=registry, **common)
        else:
            table = onnx_translations()
            onnx_program = torch.onnx.export(program, dynamo=True, custom_translation_table=table, **common)  # type: ignore[arg-type]
    assert onnx_program is not None
    return onnx_program.model_proto


def _registry() -> Any:
    """The exporter's operator registry with the fused ops' translations, built once per process
    and set of fused ops. torch.onnx.export builds it anew on every call (0.4-0.75 s here, a
    quarter of a small layer's export); the exporter's own entry point takes a built one. None
    where that entry point is not the one this torch was checked against: then torch.onnx.export
    builds it as usual (tests/test_export.py checks that both give the same graph)."""
    return None if _entry_point() is None else _built_registry(_fused_op_set())


@functools.cache
def _entry_point() -> Any:
    """torch.onnx's exporter entry point that takes a registry, if it has the signature checked."""
    import inspect

    try:
        from torch.onnx._internal.exporter import _core, _registration
    except ImportError:
        return None
    if not hasattr(_registration.ONNXRegistry, "from_torchlib"):
        return None
    params = inspect.signature(_core.export).parameters
    if not {"registry", "input_names", "output_names", "opset_version", "optimize"} <= params.keys():
        return None
    return _core.export


def _fused_op_set() -> tuple[tuple[str, int], ...]:
    from ..models.ops.registry import FUSED_OPS

    return tuple(sorted((name, id(op)) for name, op in FUSED_OPS.items()))


@functools.cache
def _built_registry(ops: tuple[tuple[str, int], ...]) -> Any:
    from torch.onnx._internal.exporter import _registration

    _quiet_exporter_logs()
    registry = _registration.ONNXRegistry.from_torchlib(opset_version=OPSET)
    for op, function in onnx_translations().items():
        registry.register_op(op, function, is_complex=False)  # type: ignore[arg-type]
    return registry


# Operators a program may hold that the exporter removes before translating (assertions on sizes).
_ASSERTIONS = (
    "aten._assert_scalar.default",
    "aten._assert_tensor_metadata.default",
    "aten.sym_constrain_range_for_size.default",
)
_PATCHED = threading.Lock()  # held by each export translated through the registry (see below)


def untranslated(program: torch.export.ExportedProgram, registry: Any) -> str | None:
    """The first operator of `program` (submodules included) that needs the exporter's
    decomposition: one without a translation in `registry`, or one that mutates its inputs.
    None where every operator translates as traced."""
    for module in program.graph_module.modules():
        for node in cast(torch.fx.GraphModule, module).graph.nodes:
            if node.op != "call_function" or str(node.target) in _ASSERTIONS:
                continue
            schema = getattr(node.target, "_schema", None)  # None for Python's operators on sizes
            if (schema is not None and schema.is_mutable) or not registry.is_registered(node.target):
                return str(node.target)
    return None


@contextlib.contextmanager
def _decomposition_skipped(program: torch.export.ExportedProgram, registry: Any) -> Iterator[None]:
    """The exporter's decomposition pass skipped for a program whose every operator translates
    as traced (models/ops/registry.py adds the few translations that make the models' programs
    so).

    That pass traces the whole program again (run_decompositions: functionalization and
    symbolic sizes, operator by operator) only to lower operators without a translation, and
    costs about twice torch.export's own trace: measured, a fused Granite-4.0-H model's
    templates export in 3.1 s instead of 5.6 s, a standard-operator Qwen3-Next one's in 11.4 s
    instead of 24.0 s, to the same graph (tests/test_export.py compares every Jamba template
    with torch.onnx.export's). Any other program is decomposed as usual."""
    from torch.onnx._internal.exporter import _fx_passes

    decompose = getattr(_fx_passes, "decompose_with_registry", None)
    needs = "the exporter's pass" if decompose is None else untranslated(program, registry)
    passes: Any = _fx_passes
    # Every export takes the lock, not only those that swap the pass: an export in another
    # thread must never run while the pass is swapped for one that needs it.
    with _PATCHED:
        if needs is not None:
            logging.getLogger(__name__).debug("decomposing the traced program for %s", needs)
            yield
            return
        passes.decompose_with_registry = lambda exported_program, registry: exported_program
        try:
            yield
        finally:
            passes.decompose_with_registry = decompose


def checked_graph(path: str | Path) -> onnx.ModelProto:
    """onnx's checker on a saved graph; returns the graph it read (weights left in their files).
    SimplifiedLayerNormalization is an onnxruntime operator in the default domain, which the
    checker rejects as unknown: a graph with one is checked as a copy where those nodes sit in
    onnxruntime's domain (the graph returned has them there too)."""
    from .fuse import FUSED_NORM_OPS

    path = Path(path)
    graph = onnx.load(str(path), load_external_data=False)
    if not any(n.op_type in FUSED_NORM_OPS and n.domain in ("", "ai.onnx") for n in graph.graph.node):
        onnx.checker.check_model(str(path))
        return graph
    for node in graph.graph.node:
        if node.op_type in FUSED_NORM_OPS:
            node.domain = "com.microsoft"
    if not any(t.data_location == onnx.TensorProto.EXTERNAL for t in graph.graph.initializer):
        onnx.checker.check_model(graph)
        return graph
    # External data paths are relative to the graph file: check the copy beside it.
    fd, name = tempfile.mkstemp(suffix=".onnx", dir=path.parent)
    os.close(fd)
    try:
        onnx.save_model(graph, name)
        onnx.checker.check_model(name)
    finally:
        os.unlink(name)
    return graph


def _name_dims(model: onnx.ModelProto, dims: dict[str, tuple[object, ...]]) -> None:
    """Symbolic dims get the contract's names (batch, seq, n_logits, capacity)."""
    for value in list(model.graph.input) + list(model.graph.output):
        spec = dims[value.name]
        for dim, want in zip(value.type.tensor_type.shape.dim, spec):
            if isinstance(want, str):
                dim.Clear()
                dim.dim_param = want


def _name_nodes(model: onnx.ModelProto, root: str = "model.") -> None:
    """Deterministic hierarchical names such as /model/layers.3/mixer/in_proj/MatMul; `root`
    is the traced module's attribute that holds the model (stripped from the scopes)."""
    pattern = re.compile(rf"^(?:{re.escape(root)})?(.+?):")
    seen: dict[str, int] = {}
    for node in model.graph.node:
        meta = {p.key: p.value for p in node.metadata_props}
        path = ""
        for part in meta.get("namespace", "").split("/")[:-1]:
            m = pattern.match(part.strip())
            if m and m.group(1).startswith(("model.", "lm_head")):
                path = m.group(1)
        parts: list[str] = []
        for part in path.split(".") if path else []:
            if part.isdigit() and parts:
                parts[-1] += "." + part
            else:
                parts.append(part)
        scope = "/".join(parts)
        base = f"/{scope}/{node.op_type}" if scope else f"/{node.op_type}"
        count = seen.get(base, 0)
        seen[base] = count + 1
        node.name = base if count == 0 else f"{base}_{count}"
        # The exporter's per-node records (stack traces with this machine's paths, FX node
        # text, class hierarchy) served the naming above; kept, they would add ~1.2 kB per
        # node (3.5% of the default model's file, 12% of its int8 graph) and differ by machine.
        del node.metadata_props[:]
