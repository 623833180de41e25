"""Fused graphs on onnxruntime 1.31 (onnxruntime-gpu's newest wheel, for CUDA).

The fused graphs' GroupQueryAttention takes a 17th input, `query_seqlens` (new tokens per
row), that onnxruntime 1.32 added; 1.31 refuses the node. hybridrt's graphs always give every
row the same number of new tokens (the contract's [b, l] input_ids), and its `total` input is
already the longest row, so 1.31's kernel without the input computes the same attention for
a prompt, a decode step, and a chunk after a past in a batch of one row (measured: a 300-token
prompt in chunks of 128 and a two-row batch, greedy equal to 1.32 with the input). What 1.31's
CPU kernel refuses (and on CUDA a float32 graph's attention runs on that kernel) is a call of
several tokens after a past for several rows at once ("batch_size must be 1 when
sequence_length > 1 and past context is given"): the loader marks such a model
(`Model.batched_chunks`), and prefill then runs prompts longer than one chunk a row at a
time. Speculative decoding of several rows (drafts verified after a past) stays refused there.

The loader first opens the file as it is; where 1.31 refuses it, `for_onnxruntime_131` rewrites
the graph's nodes (not its weights) with the onnx package, and the loader opens the session from
the rewritten bytes with the weights read from the model's directory. The rewrite is not valid
on 1.32, which reads the missing input differently.

CUDA graph capture (`for_graph_capture`): onnxruntime records a decode step once and replays it,
which needs every node on the GPU without a copy between devices. GroupQueryAttention reads its
`total_sequence_length` on the host, and the graphs compute it and `seqlens_k` (and on 1.32
`query_seqlens`) from past_lengths and the call's length, small integer arithmetic that
onnxruntime places on the CPU (measured on an H200: Add, Sub, Cast, ReduceMax, Squeeze), so it
copies them across each step and refuses to capture. The rewrite makes them graph inputs
(`length_feeds` gives their values) and drops the nodes that computed them. A replay reads the
total it was captured with, so the runtime feeds the KV buffers' capacity in captured steps
(the kernels read each row's own length from seqlens_k, on the device) and the longest row in
other calls (runtime.bound). The graphs with rotary positions compute them from past_lengths
too (past_lengths[:, None] + arange(l), int64, then cast for cos and sin): the rewrite makes
them the input `position_ids`, so that no node of the rewritten graph reads past_lengths.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..errors import GraphError
from .edit import prune, walk
from .feeds import PAST_LENGTHS

QUERY_SEQLENS = 16  # GroupQueryAttention's input index of query_seqlens (1.32)
# GroupQueryAttention's length inputs (index: the graph input for_graph_capture makes of it)
SEQLENS_K, TOTAL_LENGTH, QUERY_SEQLENS_INPUT = "seqlens_k", "total_sequence_length", "query_seqlens"
LENGTH_INPUTS = {5: SEQLENS_K, 6: TOTAL_LENGTH, QUERY_SEQLENS: QUERY_SEQLENS_INPUT}
# The rotary positions [b, l] int64, as a graph input of the capture rewrite (see the docstring).
POSITION_IDS, SEQ = "position_ids", ("batch", "seq")


def needs_query_seqlens(version: str) -> bool:
    """Whether this onnxruntime reads GroupQueryAttention's query_seqlens (1.32 and later)."""
    major, minor = (int(x) for x in version.split(".")[:2])
    return (major, minor) >= (1, 32)


def for_onnxruntime_131(graph: Path) -> bytes | None:
    """The graph's bytes without GroupQueryAttention's query_seqlens, or None when it has none
    to drop (its weights stay in the external data file beside it)."""
    model = load_graph(graph, "uses GroupQueryAttention's query_seqlens input, which onnxruntime 1.31 lacks")
    return model.SerializeToString() if drop_query_seqlens(model) else None


def for_graph_capture(graph: Path, query_seqlens: bool = True) -> tuple[bytes, tuple[str, ...]]:
    """The graph's bytes rewritten by `capture_inputs`, and the inputs it added."""
    model = load_graph(graph, "is rewritten for CUDA graph capture")
    added = capture_inputs(model, query_seqlens)
    return model.SerializeToString(), added


def capture_inputs(model: Any, query_seqlens: bool = True) -> tuple[str, ...]:
    """Make GroupQueryAttention's lengths and the rotary positions graph inputs, in place (see
    the module docstring), without query_seqlens unless `query_seqlens`; returns the inputs
    added (none for a graph without attention: its nodes unchanged)."""
    import onnx

    if not query_seqlens:
        drop_query_seqlens(model)
    added: list[str] = []
    for node in model.graph.node:
        if node.op_type != "GroupQueryAttention":
            continue
        for index, name in LENGTH_INPUTS.items():
            if index < len(node.input) and node.input[index]:
                node.input[index] = name
                if name not in added:
                    added.append(name)
    for name in added:
        shape = [] if name == TOTAL_LENGTH else ["batch"]
        model.graph.input.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.INT32, shape))
    if _positions_as_input(model.graph):
        added.append(POSITION_IDS)
        model.graph.input.append(onnx.helper.make_tensor_value_info(POSITION_IDS, onnx.TensorProto.INT64, SEQ))
    if added:
        prune(model.graph)
    return tuple(added)


def _positions_as_input(graph: Any) -> bool:
    """Read the rotary positions, past_lengths[:, None] + arange(l) [b, l] (the outer model's
    Add of an Unsqueeze of past_lengths and a Range), from the graph input POSITION_IDS instead;
    whether the graph computed them."""
    made = {o: n for n in graph.node for o in n.output}
    for node in graph.node:
        parts = sorted((made[i] for i in node.input if i in made), key=lambda n: n.op_type)
        if node.op_type != "Add" or [n.op_type for n in parts] != ["Range", "Unsqueeze"]:
            continue
        if parts[1].input[0] != PAST_LENGTHS:
            continue
        for reader in walk(graph):
            for i, name in enumerate(reader.input):
                if name == node.output[0]:
                    reader.input[i] = POSITION_IDS
        return True
    return False


def length_feeds(names: tuple[str, ...], after: np.ndarray, new: int, total: int) -> dict[str, np.ndarray]:
    """Values of the length inputs `names` for a call of `new` tokens a row that leaves the rows
    at `after` [b] tokens, with `total` as total_sequence_length (the longest row, or in a
    captured step the KV capacity)."""
    feeds: dict[str, np.ndarray] = {}
    for name in names:
        if name == POSITION_IDS:
            feeds[name] = (after - new)[:, None] + np.arange(new, dtype=np.int64)
        elif name == SEQLENS_K:
            feeds[name] = (after - 1).astype(np.int32)
        elif name == TOTAL_LENGTH:
            feeds[name] = np.array(total, dtype=np.int32)
        else:
            feeds[name] = np.full(len(after), new, dtype=np.int32)
    return feeds


def load_graph(graph: Path, why: str) -> Any:
    """The graph's ModelProto (weights in an external data file left there), for a rewrite
    that the loader runs: `why` says which, in the error when the onnx package is missing."""
    try:
        import onnx
    except ImportError:
        raise GraphError(
            f"{graph} {why}; install the onnx package (pip install onnx) so that hybridrt can rewrite the "
            "graph, upgrade onnxruntime to 1.32, or export with --plain-ops"
        ) from None
    return onnx.load(str(graph), load_external_data=False)


def drop_query_seqlens(model: Any) -> bool:
    """Drop GroupQueryAttention's query_seqlens (onnxruntime 1.31 lacks it), in place; returns
    whether the graph had one."""
    changed = False
    for node in walk(model.graph):
        if node.op_type == "GroupQueryAttention" and len(node.input) > QUERY_SEQLENS:
            del node.input[QUERY_SEQLENS:]
            while node.input and not node.input[-1]:
                del node.input[-1]
            changed = True
    return changed
