"""The runtime imports and generates in a process where `import torch` fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CODE = """
import sys
sys.modules["torch"] = None  # any `import torch` now raises ImportError
import hybridrt
import hybridrt.graphs.inspect, hybridrt.default_model
model = hybridrt.load(sys.argv[1])
assert len(model.generate([5, 6, 7], max_new_tokens=4)) == 4
assert isinstance(model.generate(["def", "class Stack"], max_new_tokens=4)[1], str)
assert "".join(model.stream("def", max_new_tokens=4)) == model.generate("def", max_new_tokens=4)
from hybridrt.cli import main
assert main(["generate", sys.argv[1], "def", "--max-new-tokens", "3"]) == 0
assert main(["bench", sys.argv[1], "--prompt-tokens", "4", "--new-tokens", "3", "--repeats", "1"]) == 0
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "onnx", "onnxscript"))
assert loaded == ["torch"] and sys.modules["torch"] is None, loaded
print("ok")
"""


def test_runtime_runs_without_torch(llama_onnx: Path) -> None:
    result = subprocess.run([sys.executable, "-c", CODE, str(llama_onnx)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ok")
