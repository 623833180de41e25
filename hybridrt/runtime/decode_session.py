"""Captured decode steps of a graph with control flow: two sessions over one set of weights.

onnxruntime captures no session holding a control-flow node, and the Mamba1 graphs hold a Scan
per layer (graphs/step_graph.py). With cuda_graph the loader then opens the graph as it is,
uncaptured, for prompts and every other call, and the one-token graph (its Scans inlined, the
attention's lengths as inputs) for the decode steps that are captured. The states are the
same buffers in both (runtime.bound binds each session with its own IOBindings). The decode
session gets the loader's settings (threads, the shared pool, the log level) but not a caller's
session_options, which onnxruntime offers no way to copy.

Weights: on the CPU provider both sessions are given the same host arrays
(SessionOptions.add_initializer, which onnxruntime uses in place on the CPU: a 400 MB Gather
weight given to two sessions added nothing; add_external_initializers copied it into each),
and the decode session of a float graph does not pre-pack its MatMul weights, which would
copy them (a quantized graph's does: its kernels compute differently unpacked). What
onnxruntime's optimizers read from the graph itself stays in both graphs (graphs/step_graph.py,
detach_weights). jamba-125m (457 MB of float32 weights), CPU, one thread, RSS after load:
one session 668-695 MB; with cuda_graph and a second session over its own copy of the
weights 2,190-2,278 MB; shared as here 1,003 MB (the arrays, and the prompt session's pre-packed
copies); the decode session pre-packing too 1,459 MB; neither session pre-packing (pass
session_options with "session.disable_prepacking") 547 MB. Loading peaks at 1,460 MB (the
graph read in Python to be rewritten). The unpacked decode step took 31-34 ms against 23-28
pre-packed (a shared 2-core machine: rough).
On a GPU each session copies its weights to the device: add_initializer's host arrays are no
use in place there, so nothing is detached and the device holds the weights twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..graphs.step_graph import quantized_weights, split_for_capture
from .providers import CPU, ProviderSelection


@dataclass
class DecodeSession:
    """The session that runs captured decode steps, the inputs its rewrite added (lengths and
    positions, graphs/compat.py), and what must live as long as both sessions: the arrays they
    read in place and their OrtValues."""

    session: Any
    inputs: tuple[str, ...]
    weights: list[Any] = field(default_factory=list, repr=False)


def open_pair(
    ort: Any,
    model: Any,
    graph: Path,
    selection: ProviderSelection,
    options: tuple[Any, Any],
    query_seqlens: bool,
) -> tuple[Any, DecodeSession]:
    """The uncaptured session over graph file `graph` (its ModelProto `model`, consumed) and the
    captured DecodeSession, opened with options (for prompts, for steps) on `selection`."""
    share = selection.names[0] == CPU
    # onnxruntime's int4 and int8 kernels compute differently unpacked (jamba's int4 graph:
    # logits 2.7e-3 apart, a greedy token changed): a quantized graph's decode session pre-packs
    unpacked = share and not quantized_weights(model)
    prompts, steps, inputs, arrays = split_for_capture(model, graph, query_seqlens, share)
    del model  # its weights are in `arrays` now (or in the two graphs' bytes)
    values = {name: ort.OrtValue.ortvalue_from_numpy(array) for name, array in arrays.items()}
    for opts in options:
        opts.add_session_config_entry("session.model_external_initializers_file_folder_path", str(graph.parent))
        for name, value in values.items():
            opts.add_initializer(name, value)
    if unpacked:  # a pre-packed MatMul weight is a copy of it
        options[1].add_session_config_entry("session.disable_prepacking", "1")
    uncaptured = [(name, {k: v for k, v in o.items() if k != "enable_cuda_graph"}) for name, o in selection.providers]
    main = ort.InferenceSession(prompts, options[0], providers=uncaptured)
    step = ort.InferenceSession(steps, options[1], providers=selection.providers)
    return main, DecodeSession(step, inputs, [arrays, values])
