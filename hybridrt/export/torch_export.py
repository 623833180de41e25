"""TorchScript (`model.pt`) and torch.export (`model.pt2`) graphs with the ONNX state contract.

Both run the plain PyTorch path. TorchScript is traced: the scan's chunk arithmetic is
recorded from tensor sizes (aten::size), so the module runs at any length; LibTorch C++
apps load it with torch::jit::load. `.pt2` is the torch.export ExportedProgram, the route
to ExecuTorch and AOTInductor.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from .trace import GraphModule


def to_torchscript(module: GraphModule, args: tuple[torch.Tensor, ...], path: Path) -> None:
    # torch.jit.trace warns that TorchScript is deprecated; the user asked for TorchScript.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(module, args, check_trace=False, strict=False)
        traced = torch.jit.freeze(traced.eval())
        torch.jit.save(traced, str(path))


def to_pt2(program: torch.export.ExportedProgram, path: Path) -> None:
    torch.export.save(_without_size_asserts(program), str(path))


def _without_size_asserts(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """Drop the `size != 1` runtime asserts that size-oblivious tracing leaves behind.

    The trace is valid at size 1 (one-token decode, batch 1, empty past); the export
    parity check runs exactly those sizes. The asserts would reject them.
    """
    graph = program.graph_module.graph
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is torch.ops.aten._assert_scalar.default:
            graph.erase_node(node)
    graph.eliminate_dead_code()
    program.graph_module.recompile()
    return program


def load_torch_graph(path: Path):  # type: ignore[no-untyped-def]
    """A callable over the flat inputs, for validation (TorchScript or ExportedProgram)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if path.suffix == ".pt2":
            return torch.export.load(str(path)).module()
        return torch.jit.load(str(path))
