"""Cold and warm timings of the Lambda handler (hybridrt.deploy.aws_lambda), each in fresh processes.

    python benchmarks/bench_lambda.py MODEL_DIR [--repeats 3] [--max-tokens 16] [--verify sha256|size|none]

Per repeat, fresh interpreters measure: `import hybridrt`; `import hybridrt.deploy.aws_lambda`
(model not loaded); the load's stages (numpy, onnxruntime and tokenizers imports, manifest, sha256 and
size checks, session creation, tokenizer load); cold start to the first token (a max_tokens=1
completion) and to the full answer (max_tokens=N), with the model loaded at import (Lambda's
init phase) and on the first call; and the warm latency of the next invocation. Prints the
median of each, in milliseconds; the cold figures start in the fresh interpreter (add its start-up).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

IMPORT_HYBRIDRT = """
import time; t = time.perf_counter()
import hybridrt
print(time.perf_counter() - t)
"""

IMPORT_LAMBDA = """
import time; t = time.perf_counter()
import hybridrt.deploy.aws_lambda
print(time.perf_counter() - t)
"""

STAGES = """
import sys, time, json
from pathlib import Path
out = {}
def mark(name, t0):
    out[name] = time.perf_counter() - t0
    return time.perf_counter()
t = time.perf_counter()
import numpy
t = mark("import numpy", t)
import onnxruntime as ort
t = mark("import onnxruntime (after numpy)", t)
import tokenizers
t = mark("import tokenizers", t)
from hybridrt.graphs.manifest import read_manifest, verify_files
from hybridrt.runtime.loader import check_session
from hybridrt.deploy.aws_lambda import check_sizes
from hybridrt.runtime.text import load_tokenizer
t = time.perf_counter()
d = Path(sys.argv[1])
m = read_manifest(d)
t = mark("manifest read", t)
check_sizes(d, m)
t = mark("size check", t)
verify_files(d, m)
t = mark("sha256 check", t)
opts = ort.SessionOptions(); opts.log_severity_level = 3
s = ort.InferenceSession(str(d / m.graph_file), opts, providers=["CPUExecutionProvider"])
t = mark("session creation", t)
check_session(s, m, d)
t = mark("graph check", t)
load_tokenizer(d)
t = mark("tokenizer load", t)
print(json.dumps(out))
"""

COLD = """
import time; t0 = time.perf_counter()
import json, os, sys
def event(n):
    body = {"model": "default", "prompt": "def fibonacci(n):", "max_tokens": n, "temperature": 0}
    return {"version": "2.0", "rawPath": "/v1/completions", "headers": {},
            "requestContext": {"http": {"method": "POST", "path": "/v1/completions"}}, "body": json.dumps(body)}
from hybridrt.deploy.aws_lambda import handler
t1 = time.perf_counter()
n = int(sys.argv[1])
out = handler(event(n))
assert out["statusCode"] == 200, out
t2 = time.perf_counter()
out = handler(event(n))
t3 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "first call": t2 - t1, "cold": t2 - t0, "warm": t3 - t2}))
"""


def run(code: str, *args: str, env: dict[str, str] | None = None) -> tuple[str, float]:
    t = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=ROOT, check=False
    )
    wall = time.perf_counter() - t
    if result.returncode:
        raise SystemExit(result.stderr)
    return result.stdout.strip().splitlines()[-1], wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--verify", default="sha256")
    args = ap.parse_args()
    base = {k: v for k, v in os.environ.items() if not k.startswith("HYBRIDRT_")}
    base["PYTHONPATH"] = str(ROOT)
    env = base | {"HYBRIDRT_MODEL": str(Path(args.model).resolve()), "HYBRIDRT_VERIFY": args.verify}
    rows: dict[str, list[float]] = {}

    def add(name: str, seconds: float) -> None:
        rows.setdefault(name, []).append(seconds * 1e3)

    for _ in range(args.repeats):
        add("interpreter start-up and exit (python -c pass)", run("print(0)", env=base)[1])
        add("import hybridrt", float(run(IMPORT_HYBRIDRT, env=base)[0]))
        add("import hybridrt.deploy.aws_lambda (no model)", float(run(IMPORT_LAMBDA, env=base)[0]))
        for name, s in json.loads(run(STAGES, env["HYBRIDRT_MODEL"], env=base)[0]).items():
            add(f"stage: {name}", s)
        for load in ("1", "0"):
            how = "load at import" if load == "1" else "load on first call"
            lenv = env | {"HYBRIDRT_LOAD_AT_IMPORT": load}
            for n, what in ((1, "first token"), (args.max_tokens, f"{args.max_tokens} tokens")):
                out, _ = run(COLD, str(n), env=lenv)
                t = json.loads(out)
                add(f"{how}: import", t["import"])
                add(f"{how}: first call ({what})", t["first call"])
                add(f"{how}: cold to {what}", t["cold"])
                add(f"{how}: warm call ({what})", t["warm"])
    width = max(len(k) for k in rows)
    print(f"{'ms (median of ' + str(args.repeats) + ')':<{width}}  median    runs")
    for name, values in rows.items():
        print(f"{name:<{width}}  {statistics.median(values):7.1f}  {' '.join(f'{v:.1f}' for v in values)}")


if __name__ == "__main__":
    main()
