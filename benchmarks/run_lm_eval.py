"""lm-evaluation-harness against `hybridrt serve`, with its `local-completions` model.

Starts `hybridrt serve` on 127.0.0.1 (a subprocess, with an API key), runs lm-eval's CLI on
the two local tasks of docs/serve-clients/lm-eval (multiple choice by loglikelihood, i.e.
echo + logprobs on /v1/completions; and generate_until), prints lm-eval's table, then scores
every (context, continuation) of the multiple-choice task with hybridrt's own scoring
(hybridrt.runtime.evaluate.token_nll, what `hybridrt eval` runs) and checks that lm-eval's
loglikelihoods agree.

    pip install "lm-eval[api]"
    python benchmarks/run_lm_eval.py                 # the default model
    python benchmarks/run_lm_eval.py out/model --out build/lm-eval

lm-eval tokenizes (tokenized_requests=True, its default) with the model directory's
tokenizer.json through transformers, and sends token ids; the server scores exactly those.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
TASKS = ROOT / "docs" / "serve-clients" / "lm-eval"
KEY = "lm-eval-key"
NAME = "default"
AGREEMENT = 1e-3  # nats: float32 logits of differently chunked calls, summed over a continuation


@contextlib.contextmanager
def served(model: Path, key: str = KEY, extra: tuple[str, ...] = ()) -> Iterator[str]:
    """`hybridrt serve model` on a free port of 127.0.0.1; yields its base URL once healthy."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "hybridrt.cli", "serve", str(model), "--port", str(port), "--model-name", NAME]
    proc = subprocess.Popen([*cmd, "--api-key", key, "--log-level", "warning", *extra])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server did not start (exit code {proc.poll()})")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(60)


def run_lm_eval(url: str, model: Path, out: Path, limit: int | None = None) -> str:
    """lm-eval's CLI on the local tasks (run from their directory: their data paths are relative)."""
    args = [
        "model=" + NAME,
        f"base_url={url}/v1/completions",
        "tokenizer_backend=huggingface",
        f"tokenizer={model}",
        "max_length=2048",
    ]
    cmd = [sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args", ",".join(args)]
    cmd += ["--tasks", "hybridrt_code_choice", "hybridrt_code_line", "--include_path", str(TASKS)]
    cmd += ["--output_path", str(out), "--log_samples"]
    if limit is not None:
        cmd += ["--limit", str(limit)]
    env = os.environ | {"OPENAI_API_KEY": KEY, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(cmd, cwd=TASKS, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"lm-eval failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return done.stdout


def samples(out: Path, task: str) -> list[dict]:
    [path] = sorted(out.rglob(f"samples_{task}_*.jsonl"))[-1:]
    return [json.loads(line) for line in path.read_text().splitlines()]


def own_loglikelihood(model: object, context: str, continuation: str) -> float:
    """The continuation's loglikelihood after the context, tokenized as lm-eval does (trailing
    spaces of the context go to the continuation; no special tokens; the context's own tokens,
    then those of context + continuation past their count) and scored by
    hybridrt.runtime.evaluate.token_nll."""
    from hybridrt.runtime.evaluate import ort_logits_fn, token_nll

    tok = model.tokenizer  # type: ignore[attr-defined]
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    head = tok.encode(context, add_special_tokens=False).ids
    ids = head + tok.encode(context + continuation, add_special_tokens=False).ids[len(head) :]
    nll = token_nll(ort_logits_fn(model), ids, len(ids), len(ids), lambda k: None)  # nll[i]: token i + 1
    return -float(nll[len(head) - 1 :].sum())


def agreement(model_dir: Path, out: Path) -> tuple[int, float]:
    """(continuations compared, max |lm-eval's loglikelihood - hybridrt's|)."""
    import hybridrt

    model = hybridrt.load(model_dir)
    worst, count = 0.0, 0
    for sample in samples(out, "hybridrt_code_choice"):
        for args, resp in zip(sample["arguments"].values(), sample["resps"]):
            theirs = float(resp[0][0])
            ours = own_loglikelihood(model, args["arg_0"], args["arg_1"])
            worst, count = max(worst, abs(theirs - ours)), count + 1
    return count, worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default="default", help="exported directory, or 'default'")
    parser.add_argument("--out", type=Path, help="lm-eval's output directory (default: a temporary one)")
    parser.add_argument("--limit", type=int, help="documents per task (default: all)")
    args = parser.parse_args()
    from hybridrt.default_model import model_dir

    model = model_dir(args.model, export=True).resolve()
    with contextlib.ExitStack() as stack:
        out = args.out or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        with served(model) as url:
            t0 = time.perf_counter()
            table = run_lm_eval(url, model, out.resolve(), args.limit)
            took = time.perf_counter() - t0
        print(table.strip())
        print(f"lm-eval ran in {took:.1f} s")
        count, worst = agreement(model, out)
        print(f"loglikelihoods of {count} continuations: max |lm-eval - hybridrt token_nll| = {worst:.2e} nats")
        if worst > AGREEMENT:
            raise SystemExit(f"lm-eval's loglikelihoods differ from hybridrt's by up to {worst:.2e} (> {AGREEMENT})")


if __name__ == "__main__":
    main()
