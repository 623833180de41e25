"""Export's memory plan: what the streamed export will hold at its peak, against what the
machine has, checked before any work."""

from __future__ import annotations

import re
from pathlib import Path

from ..models.loading.weights import Weights, numel

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def memory_plan(weights: Weights, validate: bool, quantized: bool) -> dict[str, int]:
    """Bytes the streamed export will hold at its peak, by stage: writing holds the largest
    fragment's float32 weights about three times (read, derived, serialized); the parity check
    holds the float graph in an onnxruntime session beside one reference layer."""
    layer: dict[int, int] = {}
    outer = 0
    for name, shape in weights.shapes.items():
        n = 4 * numel(shape)
        m = _LAYER.match(name)
        if m:
            layer[int(m.group(1))] = layer.get(int(m.group(1)), 0) + n
        else:
            outer += n
    largest = max([outer, *layer.values()])
    plan = {"float32_bytes": weights.nbytes(), "largest_fragment_bytes": largest, "overhead_bytes": OVERHEAD}
    plan["write_bytes"] = OVERHEAD + 3 * largest
    plan["check_bytes"] = OVERHEAD + weights.nbytes() + 2 * largest if validate and not quantized else 0
    plan["peak_bytes"] = max(plan["write_bytes"], plan["check_bytes"])
    return plan


OVERHEAD = 1_500_000_000  # torch, onnxruntime, the traced templates and the graph's nodes


def available_memory() -> int | None:
    """MemAvailable of /proc/meminfo (Linux), None elsewhere."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
