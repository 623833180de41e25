"""The runtime imports and generates in a process where `import torch` fails."""

from __future__ import annotations

import signal
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
assert len(model.generate([5, 6, 7], max_new_tokens=4, num_beams=3, eos_token_id=[])) == 4
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


SERVE = """
import json, signal, sys, time, urllib.request
sys.modules["torch"] = None
import threading
from hybridrt.cli import main

def client():
    url = f"http://127.0.0.1:{sys.argv[2]}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(url + "/health").status == 200:
                break
        except OSError:
            time.sleep(0.1)
    body = json.dumps({"model": "tiny", "prompt": "def", "max_tokens": 3, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Authorization": "Bearer k"})
    out = json.load(urllib.request.urlopen(req))
    assert out["usage"]["completion_tokens"] >= 1, out
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "onnx", "onnxscript"))
    assert loaded == ["torch"] and sys.modules["torch"] is None, loaded
    print("ok", flush=True)
    signal.raise_signal(signal.SIGTERM)  # graceful shutdown

threading.Thread(target=client, daemon=True).start()
args = ["serve", sys.argv[1], "--port", sys.argv[2], "--api-key", "k", "--model-name", "tiny", "--log-level", "warning"]
main(args)
"""


def test_serve_runs_without_torch(llama_onnx: Path) -> None:
    """`hybridrt serve` loads, answers and shuts down on SIGTERM in a process without torch."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-c", SERVE, str(llama_onnx), str(port)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    # uvicorn re-raises SIGTERM once its graceful shutdown is done.
    assert result.returncode in (0, -signal.SIGTERM), result.stderr
    assert result.stdout.strip().endswith("ok"), result.stderr
