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
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import GraphError

QUERY_SEQLENS = 16  # GroupQueryAttention's input index of query_seqlens (1.32)


def needs_query_seqlens(version: str) -> bool:
    """Whether this onnxruntime reads GroupQueryAttention's query_seqlens (1.32 and later)."""
    major, minor = (int(x) for x in version.split(".")[:2])
    return (major, minor) >= (1, 32)


def for_onnxruntime_131(graph: Path) -> bytes | None:
    """The graph's bytes without GroupQueryAttention's query_seqlens, or None when it has none
    to drop (its weights stay in the external data file beside it)."""
    try:
        import onnx
    except ImportError:
        raise GraphError(
            f"{graph} uses GroupQueryAttention's query_seqlens input, which onnxruntime 1.31 lacks; "
            "install the onnx package (pip install onnx) so that hybridrt can rewrite the graph for it, "
            "upgrade onnxruntime to 1.32, or export with --plain-ops"
        ) from None
    model = onnx.load(str(graph), load_external_data=False)
    changed = False
    for node in _nodes(model.graph):
        if node.op_type == "GroupQueryAttention" and len(node.input) > QUERY_SEQLENS:
            del node.input[QUERY_SEQLENS:]
            while node.input and not node.input[-1]:
                del node.input[-1]
            changed = True
    return model.SerializeToString() if changed else None


def _nodes(graph: Any) -> Any:
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == attr.GRAPH:
                yield from _nodes(attr.g)
