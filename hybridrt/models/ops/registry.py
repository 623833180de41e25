"""What export needs of each fused op, registered by the op's own module, and the switch that
routes a model's calls through the custom ops.

A module whose forward calls one of these ops subclasses `UsesFusedOps` and passes its
`fused` to the call. `fused` is False (the PyTorch reference: eager runs, training,
TorchScript and pt2 graphs, which LibTorch and ExecuTorch then load without hybridrt) except
while the model is exported to ONNX (`fused_ops`), where each call becomes its custom op and
torch.onnx translates that into an onnxruntime operator.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import onnx
import torch
from torch import nn

# The domain of export-time placeholders that an op's `expand` replaces before the graph is saved.
SCAN_DOMAIN = "hybridrt.export"

# A shape rule: rule(helper, node) fills in the node's output value infos (helper: onnxruntime's
# SymbolicShapeInferenceHelper, export.fuse).
ShapeRule = Callable[[Any, onnx.NodeProto], None]
R = TypeVar("R")


@dataclass(frozen=True)
class FusedOp:
    """One fused op's export side.

    name: the custom op is torch.ops.hybridrt.<name>.
    translation: builds the onnxscript function for torch.onnx's custom_translation_table
        (onnxscript is imported only when a graph is exported).
    shapes: ONNX op type -> ShapeRule, for the nodes of its translation that onnxruntime's
        symbolic shape inference does not know (it stops at them, and the RMSNorm fusion then
        matches nothing after them).
    expand: replaces the op's placeholder nodes in an exported graph, in place, and returns
        how many; None where the translation is already the final graph.
    """

    name: str
    translation: Callable[[], Callable[..., Any]]
    shapes: Mapping[str, ShapeRule] = field(default_factory=dict)
    expand: Callable[[onnx.ModelProto], int] | None = None


FUSED_OPS: dict[str, FusedOp] = {}


def register(op: FusedOp) -> FusedOp:
    FUSED_OPS[op.name] = op
    return op


def custom_op(name: str, reference: Callable[..., Any], like: int | tuple[int, ...]) -> Any:
    """torch.ops.hybridrt.<name>: `reference` (its signature and annotations are the op's schema)
    as a custom op that export traces as one node. Its outputs are made contiguous (a custom op
    returns no view of its inputs); its fake outputs are empty tensors like the inputs at the
    positions `like` (an int: one output, a tuple: one per output)."""

    def call(*args: Any) -> Any:
        out = reference(*args)
        return out.contiguous() if isinstance(like, int) else tuple(t.contiguous() for t in out)

    functools.update_wrapper(call, reference)
    op = torch.library.custom_op(f"hybridrt::{name}", mutates_args=())(call)

    @op.register_fake
    def _(*args: Any) -> Any:
        return torch.empty_like(args[like]) if isinstance(like, int) else tuple(torch.empty_like(args[i]) for i in like)

    return op


def fusable(name: str, reference: Callable[..., R], like: int | tuple[int, ...]) -> Callable[..., R]:
    """The function a mixer calls, `f(*args, fused=False)`: `reference` itself, or with `fused`
    its custom op torch.ops.hybridrt.<name> (custom_op; `like` as there). It keeps the
    reference's name and docstring."""
    op = custom_op(name, reference, like)

    def call(*args: Any, fused: bool = False) -> R:
        return op(*args) if fused else reference(*args)  # type: ignore[no-any-return]

    functools.update_wrapper(call, reference)
    return call


def onnx_translations() -> dict[object, object]:
    """custom_translation_table entries for torch.onnx.export: every fused op's, softplus, and
    the few operators of torch.export's program that torch.onnx has no translation for."""
    table: dict[object, object] = {torch.ops.aten.softplus.default: _softplus_translation()}
    table |= _program_translations()
    for name in sorted(FUSED_OPS):
        table[getattr(torch.ops.hybridrt, name).default] = FUSED_OPS[name].translation()
    return table


def shape_rules() -> dict[str, ShapeRule]:
    """ONNX op type -> ShapeRule, over every fused op."""
    return {op_type: rule for op in FUSED_OPS.values() for op_type, rule in op.shapes.items()}


def expand_placeholders(model: onnx.ModelProto) -> int:
    """Every fused op's placeholders in `model` replaced (FusedOp.expand), in place; the count."""
    return sum(op.expand(model) for op in FUSED_OPS.values() if op.expand is not None)


def _softplus_translation() -> Callable[..., Any]:
    from onnxscript import opset20

    op: Any = opset20  # onnxscript's stubs do not type python constants as tensors

    def softplus_onnx(x, beta=1.0, threshold=20.0):  # type: ignore[no-untyped-def]
        # onnxruntime's Softplus is stable for large inputs and within 1e-9 of torch's
        # thresholded one, so the Greater/Where of torch's decomposition are not needed.
        if beta == 1.0:
            return op.Softplus(x)
        return op.Div(op.Softplus(op.Mul(x, beta)), beta)

    return softplus_onnx


class UsesFusedOps:
    """Base of the modules that call the fused ops: `fused` is what they pass to each call."""

    fused: bool = False


def set_fused(module: nn.Module, fused: bool) -> None:
    """Set `fused` on every UsesFusedOps module within `module` (itself included)."""
    for m in module.modules():
        if isinstance(m, UsesFusedOps):
            m.fused = fused


@contextlib.contextmanager
def fused_ops(module: nn.Module, fused: bool = True) -> Iterator[None]:
    """Within this block, the modules of `module` call the custom ops if `fused` (for ONNX
    export); each module's previous setting is restored afterwards."""
    previous = [(m, m.fused) for m in module.modules() if isinstance(m, UsesFusedOps)]
    set_fused(module, fused)
    try:
        yield
    finally:
        for m, was in previous:
            m.fused = was


def _program_translations() -> dict[object, object]:
    """Translations of the operators of a traced program (torch.export's, before any
    decomposition) that onnxscript's torch library lacks: with them, every operator of the
    models' programs translates as traced, and the exporter's decomposition pass, a second
    trace that costs twice the first, can be skipped (export/onnx_export.py). Each is what
    torch's decomposition of the operator translates to."""
    import numpy as np
    import onnx_ir as ir
    from onnxscript import opset20
    from onnxscript.function_libs.torch_lib.ops import core as ops_core

    op: Any = opset20

    def to_dtype(x, dtype, non_blocking=False, copy=False, memory_format=None):  # type: ignore[no-untyped-def]
        return ops_core.aten__to_copy(x, dtype=dtype)  # what to() decomposes into

    def square(x):  # type: ignore[no-untyped-def]
        return op.Mul(x, x)  # torch's reference square

    def or_tensor(a, b):  # type: ignore[no-untyped-def]
        return op.Or(a, b) if a.dtype == ir.DataType.BOOL else op.BitwiseOr(a, b)

    def eye(n, dtype=None, layout=None, device=None, pin_memory=None):  # type: ignore[no-untyped-def]
        # n is a Python int here (the models' eyes are of static sizes): one constant, as
        # torch's decomposition becomes once the exporter folds it.
        numpy_type = np.float32 if dtype in (None, -1) else ir.DataType(dtype).numpy()
        return op.Constant(value=ir.tensor(np.eye(n, dtype=numpy_type)))

    def chunk(x, chunks, dim=0):  # type: ignore[no-untyped-def]
        # Decomposed, chunk is a split on the dimension counted from the front: spell it so.
        rank = x.shape.rank() if x.shape is not None else None
        return ops_core.aten_chunk(x, chunks, dim + rank if dim < 0 and rank is not None else dim)

    aten = torch.ops.aten
    table: dict[object, object] = {aten.to.dtype: to_dtype, aten.square.default: square, aten.eye.default: eye}
    table[aten.chunk.default] = chunk
    table[aten.__or__.Tensor] = or_tensor
    # A reshape is a view after decomposition, whose translation lets a 0 in the shape mean an
    # empty dimension (allowzero) rather than "as in the input": keep that meaning.
    table[aten.reshape.default] = ops_core.aten_view
    return table
