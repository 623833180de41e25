"""Which fixed-size states a graph may read and write in one buffer (the manifest's `in_place`).

A decode step reads each conv and SSM state once and writes its successor. Bound to two
buffers, the step reads one and writes the other, and onnxruntime's LinearAttention first
copies the whole past state into the present one before updating it: on granite-h-350m that
copy alone moves 22 MB a token. Bound to one buffer, the copy is a no-op and the state stays in
cache between its passes (`docs/notes/onnxruntime-fused-ops.md`, "States in place").

That is only correct where the node that reads `past.X` is the node that writes `present.X`,
nothing else reads `past.X`, and the kernel reads the past before it overwrites it. The CPU
kernels of these two onnxruntime operators do (their decode and prompt paths, measured against
two buffers in tests/test_in_place.py); any other producer (a Scan, plain Concat/Slice) keeps
two buffers. The runtime binds in place on the CPU only, and only for a stepper that does not
rewind (`Model.stepper(ring=1)`, the default).

Torch-free and onnx-free: it reads a GraphProto's fields.
"""

from __future__ import annotations

from typing import Any

from .contract import TensorSpec, present_name
from .edit import subgraph_reads

MS_DOMAIN = "com.microsoft"
# op type -> (input index of the past state, output index of the present state)
IN_PLACE_OPS = {"LinearAttention": (3, 1), "CausalConvWithState": (3, 1)}


def in_place_states(graph: Any, pasts: list[TensorSpec]) -> list[str]:
    """The fixed-size pasts of `graph` that one node reads and writes and nothing else reads."""
    readers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    nested = subgraph_reads(graph)
    out = []
    for spec in pasts:
        if spec.is_kv or spec.name in nested:
            continue
        nodes = readers.get(spec.name, [])
        if len(nodes) != 1 or nodes[0].domain != MS_DOMAIN or nodes[0].op_type not in IN_PLACE_OPS:
            continue
        node = nodes[0]
        past_at, present_at = IN_PLACE_OPS[node.op_type]
        inputs, outputs = list(node.input), list(node.output)
        if inputs.count(spec.name) != 1 or inputs.index(spec.name) != past_at:
            continue
        if len(outputs) > present_at and outputs[present_at] == present_name(spec.name):
            out.append(spec.name)
    return out
