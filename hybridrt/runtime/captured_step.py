"""A decode step captured as a CUDA graph: BoundStepper's steps with `capture` (the loader's
cuda_graph).

The step reads its ids and lengths from fixed device buffers, updated in place, and writes its
logits to a fixed device buffer; the step of each binding with each set of KV buffers is one
CUDA graph (onnxruntime's `gpu_graph_id`), captured on its first use and replayed after, for as
long as its buffers stay the same (a new batch or capacity takes a new CapturedStep). Prompts
and other calls run uncaptured. On the CPU provider the same fixed buffers run without
capture: the graph id only names the run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..graphs.compat import TOTAL_LENGTH
from .device import new_graph_id, run_options


class CapturedStep:
    """The fixed buffers and graph ids of one state batch's captured decode steps.

    host_logits [b, 1, V] and host_value (an OrtValue aliasing it): where a step's logits land
    on the CPU; on a device they are copied out of a fixed device buffer."""

    def __init__(self, session: Any, device: tuple[str, int], host_logits: np.ndarray, host_value: Any) -> None:
        import onnxruntime as ort

        self.session = session
        self.device = device
        self.on_host = device[0] == "cpu"
        self.host_logits, self.host_value = host_logits, host_value
        self.inputs: dict[str, Any] = {}  # feed name -> its fixed buffer (made on the first step)
        self.arrays: dict[str, np.ndarray] = {}  # the host arrays that host buffers alias
        self.out = (
            host_value
            if self.on_host
            else ort.OrtValue.ortvalue_from_shape_and_type(host_logits.shape, np.float32, *device)
        )
        self.graph_ids: dict[tuple[int, int], int] = {}  # (binding, KV buffers) -> graph id
        self.bound: set[int] = set()  # bindings whose inputs are these buffers (a prompt rebinds one)

    def run(self, binding: Any, which: int, kv_buffers: int, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """Binding `which`'s decode step with KV buffers `kv_buffers` (an identity) from fixed
        buffers: the feeds are copied into them, the graph runs (captured on first use, then
        replayed), and the logits [b, V] are copied out. The feeds' total_sequence_length is the
        KV capacity: a replay reads the value it was captured with, and the attention reads
        each row's length on the device."""
        import onnxruntime as ort

        for name, value in feeds.items():
            held = self.inputs.get(name)
            if held is None:  # the total stays on the host: GroupQueryAttention reads it there
                device = ("cpu", 0) if name == TOTAL_LENGTH or self.on_host else self.device
                kept = self.arrays[name] = value.copy()  # a host OrtValue aliases it
                self.inputs[name] = ort.OrtValue.ortvalue_from_numpy(kept, *device)
            else:
                held.update_inplace(value)
        if which not in self.bound:  # bound once per binding, until a prompt rebinds it
            for name, held in self.inputs.items():
                binding.bind_ortvalue_input(name, held)
            binding.bind_ortvalue_output("logits", self.out)
            self.bound.add(which)
        self.session.run_with_iobinding(binding, run_options(self._graph_id(which, kv_buffers)))
        if self.out is self.host_value:
            return self.host_logits[:, -1]
        return self.out.numpy()[:, -1]  # type: ignore[no-any-return]

    def _graph_id(self, which: int, kv_buffers: int) -> int:
        """The graph of binding `which` with these KV buffers (beam search swaps between two
        sets): its id, new ones taken from the session's count (every state batch of a session
        has its own buffers, so its own graphs); -1 (uncaptured) past device.MAX_GRAPHS."""
        found = self.graph_ids.get((which, kv_buffers))
        if found is None:
            found = self.graph_ids[which, kv_buffers] = new_graph_id(self.session)
        return found
