"""A quantization plan (`quantize --auto`, quantization.auto): the file that records every
candidate and the choice, its writing beside the chosen model, and what can be done with it
later without choosing again: `replay` writes the chosen candidate again (the same graph, byte for
byte), `recheck` measures the written model again on this machine against the plan's gates."""

from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import QuantizationError
from ..graphs.files import atomic_directory
from ..graphs.manifest import Manifest, read_manifest
from .modes import QuantConfig

PLAN_FILE = "plan.json"
PLAN_VERSION = 1
# The source is the reference the others are measured against: its figures against itself.
SOURCE_REPORT = {"ppl_ratio": 1.0, "nll_delta": 0.0, "mean_kl": 0.0, "greedy_agreement": 1.0}


@dataclass(frozen=True)
class Gates:
    max_ppl_ratio: float | None = None
    max_nll_delta: float | None = None
    max_kl: float | None = None
    min_greedy_agreement: float | None = None

    def failures(self, report: dict[str, Any]) -> list[str]:
        checks = [
            ("ppl_ratio", self.max_ppl_ratio, ">", "--max-ppl-ratio"),
            ("nll_delta", self.max_nll_delta, ">", "--max-nll-delta"),
            ("mean_kl", self.max_kl, ">", "--max-kl"),
            ("greedy_agreement", self.min_greedy_agreement, "<", "--min-greedy-agreement"),
        ]
        out = []
        for key, limit, op, flag in checks:
            value = report[key]
            if limit is not None and (value > limit if op == ">" else value < limit):
                out.append(f"{key} {value:.6g} {op} {flag} {limit}")
        return out


def measure_speed(directories: list[Path], rounds: int, prompt_tokens: int, new_tokens: int) -> list[dict[str, Any]]:
    """`hybridrt bench`'s workload (random ids above the special tokens, greedy, never stopped
    early) on each model in turn, `rounds` times; medians of decode tokens/s and prefill ms."""
    import statistics

    from ..runtime import load
    from ..runtime.evaluate import bench_rows

    models = [load(d, "cpu") for d in directories]
    rows = bench_rows([m.manifest for m in models], 1, prompt_tokens, seed=0)
    settings: dict[str, Any] = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False}
    for m in models:
        m.generate(rows, **settings | {"max_new_tokens": 4, "min_new_tokens": 4})  # warm-up
    runs: list[list[tuple[float, float]]] = [[] for _ in models]
    for _ in range(rounds):
        for i, m in enumerate(models):
            _, stats = m.generate_with_stats(rows, **settings)
            runs[i].append((stats.prefill_ms, stats.decode_tokens_per_s))
    return [
        {
            "decode_tokens_per_s": statistics.median(x[1] for x in r),
            "prefill_ms": statistics.median(x[0] for x in r),
            "rounds": rounds,
            "prompt_tokens": prompt_tokens,
            "new_tokens": new_tokens,
        }
        for r in runs
    ]


def machine() -> dict[str, Any]:
    import onnxruntime

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "onnxruntime": onnxruntime.__version__,
        "python": platform.python_version(),
    }


def text_record(path: str | Path) -> dict[str, Any]:
    import hashlib

    p = Path(path)
    try:
        digest = hashlib.sha256(p.read_bytes()).hexdigest()
    except OSError:
        digest = None
    return {"path": str(p), "sha256": digest}


def write(directory: Path, out: Path, plan: dict[str, Any], move: bool) -> Manifest:
    """The chosen directory's files at `out` (atomically; moved from a built candidate, copied
    from the source) with the plan in plan.json and in the manifest's quantization record."""
    manifest = read_manifest(directory)
    with atomic_directory(out, QuantizationError) as tmp:
        for f in directory.iterdir():
            if f.is_file() and f.name != PLAN_FILE:
                (shutil.move if move else shutil.copy2)(f, tmp / f.name)
        (tmp / PLAN_FILE).write_text(json.dumps(plan, indent=1) + "\n")
        # In the provenance, not the quantization record: the float source may be the one chosen.
        manifest.provenance["plan"] = _summary(plan)
        manifest.write(tmp)
    return manifest


def _summary(plan: dict[str, Any]) -> dict[str, Any]:
    return {
        "chosen": plan["chosen"],
        "objective": plan["objective"],
        "budget_bytes": plan["budget_bytes"],
        "gates": plan["gates"],
        "candidates": len(plan["candidates"]),
        "file": PLAN_FILE,
        "replayed": plan.get("replayed", False),
    }


def replay(
    src: str | Path,
    out: str | Path,
    plan_path: str | Path,
    *,
    force: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Manifest:
    """Write the plan's chosen candidate from `src` again, measuring nothing new to choose: the
    same options and texts (checked by content), so the same graph."""
    from . import quantize

    src, out, plan_path = Path(src), Path(out), Path(plan_path)
    try:
        plan = json.loads(plan_path.read_text())
    except (OSError, ValueError) as e:
        raise QuantizationError(f"cannot read the plan {plan_path}: {e}") from None
    if plan.get("version") != PLAN_VERSION or "chosen_options" not in plan:
        raise QuantizationError(f"{plan_path} is not a hybridrt quantization plan (version {PLAN_VERSION})")
    texts = [plan["eval_text"], *plan["calibration"]]
    for record in texts:
        if record is not None and text_record(record["path"]) != record:
            raise QuantizationError(
                f"{record['path']} is not the text the plan measured on (its sha256 differs or it is gone)"
            )
    if out.exists() and not force:
        raise QuantizationError(f"{out} exists; pass --force to replace it")
    options = plan["chosen_options"]
    work = Path(tempfile.mkdtemp(prefix="hybridrt-plan-", dir=out.parent if out.parent.is_dir() else None))
    try:
        if not options:
            directory = src
        else:
            directory = work / "chosen"
            quantize(
                src,
                directory,
                calibration=[r["path"] for r in plan["calibration"]],
                eval_text=plan["eval_text"]["path"] if plan["eval_text"] else None,
                progress=progress,
                **plan["shared_options"] | options,
            )
        return write(directory, out, plan | {"replayed": True}, move=bool(options))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def recheck(src: str | Path, directory: str | Path, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Measure the model an --auto run wrote in `directory` again, on this machine, against its
    float source `src`: its quality on the plan's eval text (checked by sha256) against the plan's
    gates, and its speed by the plan's workload beside the speed the plan recorded. `holds` is
    whether every gate still passes."""
    from ..runtime import load
    from .report import quality_report

    say = progress or (lambda msg: None)
    src, directory = Path(src), Path(directory)
    try:
        plan = json.loads((directory / PLAN_FILE).read_text())
    except (OSError, ValueError) as e:
        raise QuantizationError(f"{directory} has no readable {PLAN_FILE} (write it with --auto): {e}") from None
    text = plan["eval_text"]
    if text is None or text_record(text["path"]) != text:
        raise QuantizationError(f"the plan's eval text {text and text['path']} is gone or changed; recheck needs it")
    chosen = next(c for c in plan["candidates"] if c["name"] == plan["chosen"])
    say(f"measuring {plan['chosen']}'s quality against {src}")
    cfg = QuantConfig.from_kwargs(**({"mode": "int4"} | plan["shared_options"]))
    if chosen["options"]:
        from .calibration import head, read_texts

        parent = load(src, "cpu")
        # The held-out text as quantize() cut it for the plan's report: the first eval_tokens tokens.
        held_out = head(parent.tokenizer, "\n\n".join(read_texts([Path(text["path"])])), cfg.eval_tokens)
        report = quality_report(parent, load(directory, "cpu"), held_out, cfg)
    else:
        report = dict(SOURCE_REPORT)
    failures = Gates(**plan["gates"]).failures(report)
    planned = chosen["speed"] or {}
    rate = None
    if planned:
        say("measuring its speed with the plan's workload")
        speed = measure_speed([directory], planned["rounds"], planned["prompt_tokens"], planned["new_tokens"])
        rate = speed[0]["decode_tokens_per_s"]
    return {
        "chosen": plan["chosen"],
        "holds": not failures,
        "failures": failures,
        "quality": {k: report[k] for k in ("ppl_ratio", "nll_delta", "mean_kl", "greedy_agreement")},
        "planned_quality": chosen["quality"],
        "decode_tokens_per_s": rate,
        "planned_decode_tokens_per_s": planned.get("decode_tokens_per_s"),
        "speed_ratio": None if not planned or not rate else rate / planned["decode_tokens_per_s"],
        "machine": machine(),
        "planned_machine": plan["machine"],
    }
