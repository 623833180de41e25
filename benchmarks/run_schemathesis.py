"""Schemathesis against `hybridrt serve`, from the server's own GET /openapi.json.

Starts `hybridrt serve` on 127.0.0.1 (a subprocess, with an API key) and runs `st run` on its
description: schema-valid and schema-violating requests to every operation, with every check
but positive_data_acceptance (a valid request may still be refused for limits a JSON schema
cannot state: prompt tokens + max_tokens within the model's max length, prompts x n at most
16, min_tokens at most max_tokens: openapi.py's docstring). Then checks that the server is
still healthy and that no request it sent got a 5xx (its /metrics count responses by status; the 503s
"loading" that the start-up wait got from /health before the run are not counted).

    pip install schemathesis
    python benchmarks/run_schemathesis.py                     # the default model
    python benchmarks/run_schemathesis.py out/model --max-examples 200
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from run_lm_eval import KEY, served


def run_schemathesis(url: str, max_examples: int, seed: int, workers: int = 2) -> tuple[int, str]:
    """(exit code, output) of `st run` on the server's description."""
    cmd = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "run",
        f"{url}/openapi.json",
        "--header",
        f"Authorization: Bearer {KEY}",
    ]
    cmd += ["--checks", "all", "--exclude-checks", "positive_data_acceptance", "--max-response-time", "120"]
    cmd += ["--max-examples", str(max_examples), "--seed", str(seed), "--request-timeout", "120"]
    cmd += ["--workers", str(workers), "--no-color"]
    with tempfile.TemporaryDirectory() as scratch:  # st keeps its example database in the working directory
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=scratch)
    return done.returncode, done.stdout + done.stderr


def server_errors(url: str) -> dict[str, float]:
    """Responses with a 5xx status, by route, from the server's /metrics."""
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    found = re.findall(r'^hybridrt_requests_total\{route="([^"]*)",status="(5\d\d)"\} (\S+)$', text, re.M)
    return {f"{route} {status}": float(n) for route, status, n in found if float(n)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default="default", help="exported directory, or 'default'")
    parser.add_argument("--max-examples", type=int, default=100, help="test cases per operation and phase")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2, help="concurrent schemathesis workers (1: one order)")
    args = parser.parse_args()
    from hybridrt.default_model import model_dir

    model = model_dir(args.model, export=True).resolve()
    with served(Path(model)) as url:
        before = server_errors(url)  # the start-up wait's "loading" 503s from /health, by design
        t0 = time.perf_counter()
        code, output = run_schemathesis(url, args.max_examples, args.seed, args.workers)
        took = time.perf_counter() - t0
        health = httpx.get(f"{url}/health").json()
        after = server_errors(url)
    errors = {k: n - before.get(k, 0.0) for k, n in after.items() if n > before.get(k, 0.0)}
    summary = output[output.find("=== SUMMARY") :] if "=== SUMMARY" in output else output
    print(summary.strip())
    print(f"schemathesis ran in {took:.1f} s, exit code {code}; health afterwards: {health}; 5xx responses: {errors}")
    if code or errors or health.get("status") != "ok":
        print(output[-6000:], file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
