"""Weights quantized once for several outputs: `quantize --auto` builds each weight mode with
and without an int8 KV cache, and both candidates' weights are the same.

`SharedWeights` keeps the last quantized graph (before its KV buffers are rewritten) in a file of
its own, keyed by every option of the quantization except the KV dtype; a later call whose options
differ only in that reads it back instead of quantizing again. The graph is kept on disk, not as a
second copy in memory, so the memory a quantization needs does not grow (a graph whose weights
live in an external data file is saved with its data, then read back into the same model). A
graph read back is the one that was kept: the outputs are byte-identical to a quantization from
scratch (tests/test_quantize_auto.py).
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..graphs.files import save_onnx
from .modes import QuantConfig
from .selection import NodeSelection


@dataclass
class Quantized:
    """A quantization's weights: the graph, the nodes it changed, the vocabulary's record,
    whether the weights live in an external data file, and the calibration feeds it read."""

    model: Any
    selection: NodeSelection
    vocab: Any
    external: bool
    feeds: int
    name: str = ""  # what first quantized these weights (for progress)


def weights_key(cfg: QuantConfig) -> str:
    """Every option that changes the weights: all but the KV cache's dtype (which float16
    converts with the weights)."""
    fields = dataclasses.asdict(cfg)
    if cfg.mode != "float16":
        del fields["kv_dtype"]
    return repr(sorted(fields.items()))


class SharedWeights:
    """The last quantized weights (see the module docstring); `close` removes its file."""

    def __init__(self, parent: Path | None = None) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="hybridrt-shared-", dir=parent))
        self.key: str | None = None
        self.kept: Quantized | None = None
        self.reused = 0

    def get(self, cfg: QuantConfig) -> Quantized | None:
        """The weights kept for options equal to `cfg`'s but for the KV dtype, read back."""
        import onnx

        if self.kept is None or self.key != weights_key(cfg):
            return None
        self.reused += 1
        model = onnx.load(str(self.directory / "model.onnx"))
        return dataclasses.replace(self.kept, model=model)

    def keep(self, cfg: QuantConfig, quantized: Quantized) -> None:
        """Keep these weights for a later call (the model stays as it was)."""
        import onnx

        shutil.rmtree(self.directory)
        self.directory.mkdir()
        path = self.directory / "model.onnx"
        save_onnx(quantized.model, path, quantized.external)
        if quantized.external:  # saving moved the weights out of the model: read them back in
            onnx.load_external_data_for_model(quantized.model, str(self.directory))
        self.key, self.kept = weights_key(cfg), dataclasses.replace(quantized, model=None)

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
