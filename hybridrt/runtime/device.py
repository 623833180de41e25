"""What BoundStepper's device path needs besides its buffers: Gather sessions, and CUDA graph ids.

`reorder` with the batch size kept (beam search off the host) gathers each state into a spare
buffer of the same shape, through a one-node Gather graph of the state's dtype, opened on the
model session's providers the first time a dtype needs it. A captured decode step runs under
RunOptions naming its CUDA graph (`gpu_graph_id`); ids are counted per session."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import GenerationError
from ..graphs.files import IR_VERSION

# Captured graphs a session keeps at most: each holds its own activations on the device, and
# onnxruntime frees none until the session closes; past this, steps run uncaptured.
MAX_GRAPHS = 64
_RUN_OPTIONS: dict[int, Any] = {}


def new_graph_id(session: Any) -> int:
    """The session's next CUDA graph id (every stepper of a session has its own buffers, so its
    own graphs), or -1 (uncaptured) once MAX_GRAPHS are taken."""
    taken = getattr(session, "_hybridrt_graphs", 0)
    if taken >= MAX_GRAPHS:
        return -1
    session._hybridrt_graphs = taken + 1
    return taken + 1


def run_options(graph_id: int) -> Any:
    """RunOptions naming the CUDA graph a run captures or replays (-1: none); kept per id."""
    found = _RUN_OPTIONS.get(graph_id)
    if found is None:
        import onnxruntime as ort

        found = _RUN_OPTIONS[graph_id] = ort.RunOptions()
        found.add_run_config_entry("gpu_graph_id", str(graph_id))
    return found


def empty_like(value: Any, dtype: Any, device: tuple[str, int]) -> Any:
    """An uninitialized OrtValue of value's shape, of `dtype`, on `device`."""
    import onnxruntime as ort

    return ort.OrtValue.ortvalue_from_shape_and_type(value.shape(), dtype, *device)


class Gathers:
    """One Gather session per dtype, made on first use."""

    def __init__(self) -> None:
        self.sessions: dict[str, Any] = {}

    def run(self, model_session: Any, dtype: Any, src: Any, index: np.ndarray, dst: Any) -> None:
        """dst[r] = src[index[r]] (OrtValues of `dtype` on the model session's device)."""
        import onnxruntime as ort

        dtype = np.dtype(dtype)
        if dtype.name not in self.sessions:
            providers = model_session.get_providers()
            # the Gather runs on varying rows: never captured
            options = {
                p: {k: v for k, v in o.items() if k != "enable_cuda_graph"}
                for p, o in model_session.get_provider_options().items()
            }
            self.sessions[dtype.name] = ort.InferenceSession(
                _gather_model(dtype), providers=providers, provider_options=[options.get(p, {}) for p in providers]
            )
        session = self.sessions[dtype.name]
        binding = session.io_binding()
        binding.bind_ortvalue_input("x", src)
        binding.bind_cpu_input("index", index)
        binding.bind_ortvalue_output("y", dst)
        session.run_with_iobinding(binding)


def _gather_model(dtype: np.dtype) -> bytes:
    """One Gather(axis=0) of `dtype`: x [n, ...] (any rank) and index int64 [b] -> y [b, ...]."""
    try:
        from onnx import TensorProto, helper
    except ImportError:
        raise GenerationError(
            "reordering states on a device (beam search) builds a one-node ONNX graph with the onnx "
            "package, which is not installed: pip install onnx"
        ) from None
    elem = helper.np_dtype_to_tensor_dtype(dtype)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["x", "index"], ["y"], axis=0)],
        "reorder",
        [
            helper.make_tensor_value_info("x", elem, None),
            helper.make_tensor_value_info("index", TensorProto.INT64, ["b"]),
        ],
        [helper.make_tensor_value_info("y", elem, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = IR_VERSION  # the exported graphs' (onnx writes a newer one)
    return bytes(model.SerializeToString())
