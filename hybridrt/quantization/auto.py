"""`quantize(src, out, auto=True)`: the fastest model that fits a memory budget and passes the
quality gates, chosen by measurement on this machine, and the decision kept as a plan.

1. Candidates: weight modes (int8-dynamic, int8-weight, int4 with the mse and rtn algorithms at
   blocks of 32 and 64, and awq at 32 with calibration text), each also with an int8 KV cache
   where the model has attention; the float source itself is one too.
2. Budget: a candidate's bytes are its weights plus the states and KV of `context` tokens for
   `batch` sequences (from the manifest's state sizes, KV at the candidate's dtype). Weights are
   estimated before building from the source graph's quantizable matrices (quantization.budget),
   so a candidate whose estimate is over the budget is never built; a built one is measured.
   A candidate with an int8 KV cache reads back its base candidate's quantized weights
   (quantization.shared) instead of quantizing them again.
3. Gates: the quality report of each built candidate against the float source on the eval text
   (perplexity ratio, NLL delta, mean KL, greedy agreement); a candidate that fails one is dropped
   with the figure that failed.
4. Objective: decode tokens/s (default) or prefill time, measured with `hybridrt bench`'s workload,
   every passing candidate in turn within each round (the machine is noisy), medians; or size.
5. The winner is written to `out` with `plan.json` (and the plan in hybridrt.json): every
   candidate with its sizes, figures and why it was dropped or chosen, the machine, the gates;
   its summary goes in the manifest's provenance ("plan").
   quantization.plan writes it; its `replay` writes the chosen candidate again without measuring,
   its `recheck` measures the written model again and says whether the plan still holds.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import QuantizationError
from ..graphs.manifest import Manifest, read_manifest
from .budget import estimate_weights, state_bytes
from .modes import QuantConfig
from .plan import PLAN_VERSION, SOURCE_REPORT, Gates, machine, measure_speed, text_record, write
from .shared import SharedWeights

OBJECTIVES = ("decode", "prefill", "size")
# Weight modes tried, as QuantConfig options; each also with kv_dtype int8 when the model has attention.
WEIGHT_CANDIDATES: tuple[dict[str, Any], ...] = (
    {"mode": "int4", "algo": "mse", "block_size": 32},
    {"mode": "int4", "algo": "mse", "block_size": 64},
    {"mode": "int4", "algo": "awq", "block_size": 32},
    {"mode": "int4", "algo": "rtn", "block_size": 32},
    {"mode": "int8-weight", "algo": "rtn", "block_size": 32},
    {"mode": "int8-dynamic"},
)
FLOAT = "float32 (source)"


@dataclass
class Candidate:
    name: str
    options: dict[str, Any]
    estimated_bytes: int = 0  # weights, before building
    weight_bytes: int | None = None  # measured
    state_bytes: int = 0  # states and KV of `batch` sequences of `context` tokens
    report: dict[str, Any] | None = None
    speed: dict[str, float] = field(default_factory=dict)
    status: str = "pending"  # chosen, passed, dropped
    why: str = ""
    directory: Path | None = None
    weights_from: str | None = None  # the candidate whose quantized weights this one reused

    def record(self) -> dict[str, Any]:
        total = None if self.weight_bytes is None else self.weight_bytes + self.state_bytes
        keys = ("ppl_ratio", "nll_delta", "mean_kl", "greedy_agreement")
        figures = None if self.report is None else {k: self.report[k] for k in keys}
        return {
            "name": self.name,
            "options": self.options,
            "estimated_weight_bytes": self.estimated_bytes,
            "weight_bytes": self.weight_bytes,
            "state_bytes": self.state_bytes,
            "total_bytes": total,
            "quality": figures,
            "speed": self.speed or None,
            "status": self.status,
            "why": self.why,
            "weights_from": self.weights_from,
        }


def candidates(manifest: Manifest, only: Sequence[str] | None = None) -> list[Candidate]:
    """The candidates for a model (`only`: those names, in that order)."""
    out = [Candidate(FLOAT, {})]
    attention = any(s.is_kv for s in manifest.pasts)
    for options in WEIGHT_CANDIDATES:
        name = options["mode"] + (f"-{options['algo']}-b{options['block_size']}" if "algo" in options else "")
        out.append(Candidate(name, dict(options)))
        if attention:
            out.append(Candidate(f"{name}+kv-int8", dict(options) | {"kv_dtype": "int8"}))
    if only is None:
        return out
    by_name = {c.name: c for c in out}
    unknown = [n for n in only if n not in by_name]
    if unknown:
        raise QuantizationError(f"unknown candidate {', '.join(unknown)}; known: {', '.join(by_name)}")
    return [by_name[n] for n in only]


def choose(
    src: str | Path,
    out: str | Path,
    *,
    budget_bytes: int | None = None,
    context: int = 2048,
    batch: int = 1,
    gates: Gates | None = None,
    objective: str = "decode",
    eval_text: str | Path | None = None,
    calibration: Sequence[str | Path] = (),
    only: Sequence[str] | None = None,
    rounds: int = 3,
    prompt_tokens: int = 128,
    new_tokens: int = 64,
    force: bool = False,
    progress: Callable[[str], None] | None = None,
    **options: Any,
) -> Manifest:
    """Build, measure and choose (module docstring); returns the written model's manifest.
    options: QuantConfig fields every candidate shares (eval_tokens, agreement_prompts, ...)."""
    from . import quantize

    say = progress or (lambda msg: None)
    src, out, gates = Path(src), Path(out), gates or Gates()
    eval_text = _checked(objective, eval_text, out, force)
    manifest = read_manifest(src)
    t0 = time.perf_counter()
    pool = candidates(manifest, only)
    work = Path(tempfile.mkdtemp(prefix="hybridrt-auto-", dir=out.parent if out.parent.is_dir() else None))
    shared = SharedWeights(work)  # a candidate with an int8 KV cache reads its base's weights
    try:
        for i, c in enumerate(pool, 1):
            c.state_bytes = state_bytes(manifest, c.options, context, batch)
            c.estimated_bytes = estimate_weights(src, manifest, c.options)
            if not _worth_building(c, budget_bytes, bool(calibration)):
                say(f"[{i}/{len(pool)}] {c.name}: not built, {c.why}")
                continue
            say(f"[{i}/{len(pool)}] {c.name}: building and measuring its quality ({_elapsed(t0)}{_left(pool, i, t0)})")
            _build(quantize, src, work, c, eval_text, calibration, options, shared)
            if c.weights_from:
                say(f"[{i}/{len(pool)}] {c.name}: weights read back from {c.weights_from}'s, not quantized again")
            _gate(c, budget_bytes, gates)
        passed = _passed(pool)
        if objective != "size" and len(passed) > 1:
            say(f"measuring speed of {len(passed)} candidates, {rounds} rounds ({_elapsed(t0)})")
            speeds = measure_speed([c.directory for c in passed if c.directory], rounds, prompt_tokens, new_tokens)
            for c, speed in zip(passed, speeds):
                c.speed = speed
        winner = _pick(passed, objective)
        settings = {"budget_bytes": budget_bytes, "context": context, "batch": batch, "objective": objective}
        plan = _plan(src, manifest, settings, gates, eval_text, calibration, options, winner, pool, t0)
        assert winner.directory is not None
        written = write(winner.directory, out, plan, move=bool(winner.options))
        say(f"chose {winner.name} ({winner.why}); wrote {out} in {_elapsed(t0)}")
        return written
    finally:
        shared.close()
        shutil.rmtree(work, ignore_errors=True)


def _passed(pool: list[Candidate]) -> list[Candidate]:
    """The candidates that fit and passed the gates; none is an error naming each one's failure."""
    passed = [c for c in pool if c.status == "passed"]
    if not passed:
        lines = "; ".join(f"{c.name}: {c.why}" for c in pool)
        raise QuantizationError(f"no candidate fits the budget and passes every gate, nothing written: {lines}")
    return passed


def _checked(objective: str, eval_text: str | Path | None, out: Path, force: bool) -> str | Path:
    """choose's arguments checked before anything is built; the evaluation text."""
    if objective not in OBJECTIVES:
        raise QuantizationError(f"unknown objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")
    if eval_text is None:
        raise QuantizationError("--auto measures each candidate's quality: give --eval-text FILE (held-out text)")
    if out.exists() and not force:
        raise QuantizationError(f"{out} exists; pass --force to replace it")
    return eval_text


def _pick(passed: list[Candidate], objective: str) -> Candidate:
    """The candidate that passed with the least cost for `objective`, marked chosen; each other
    one says how far it was."""
    winner = min(passed, key=lambda c: _cost(c, objective))
    winner.status, winner.why = "chosen", _why(winner, passed, objective)
    for c in passed:
        if c is not winner:
            c.why = f"passed; {_cost_text(c, objective)} against the chosen {_cost_text(winner, objective)}"
    return winner


def _worth_building(c: Candidate, budget_bytes: int | None, have_calibration: bool) -> bool:
    """Whether candidate c can be built and may fit; if not, it is marked dropped (and why)."""
    if budget_bytes is not None and c.estimated_bytes + c.state_bytes > budget_bytes:
        c.status, c.why = "dropped", _over(c.estimated_bytes + c.state_bytes, budget_bytes, "estimated")
        return False
    if c.options and not have_calibration and QuantConfig.from_kwargs(**c.options).needs_text:
        c.status, c.why = "dropped", "calibrates on text: give --calibration FILE (apart from --eval-text)"
        return False
    return True


def _left(pool: list[Candidate], i: int, t0: float) -> str:
    """The building time left after candidate i (1-based), at the pace of those built so far."""
    built = [x for x in pool[: i - 1] if x.report is not None and x.options]
    if not built:
        return ""
    each = (time.perf_counter() - t0) / len(built)
    return f", about {each * sum(1 for x in pool[i - 1 :] if x.options):.0f} s of building left"


def _gate(c: Candidate, budget_bytes: int | None, gates: Gates) -> None:
    """A built candidate passes, or is dropped for its measured size or a quality gate."""
    if budget_bytes is not None and (c.weight_bytes or 0) + c.state_bytes > budget_bytes:
        c.status, c.why = "dropped", _over((c.weight_bytes or 0) + c.state_bytes, budget_bytes, "measured")
        return
    failed = gates.failures(c.report or {})
    c.status, c.why = ("dropped", "gate: " + "; ".join(failed)) if failed else ("passed", c.why)


def _plan(
    src: Path,
    manifest: Manifest,
    settings: dict[str, Any],
    gates: Gates,
    eval_text: str | Path,
    calibration: Sequence[str | Path],
    options: dict[str, Any],
    winner: Candidate,
    pool: list[Candidate],
    t0: float,
) -> dict[str, Any]:
    """The plan written beside the chosen model: every candidate, what it measured and why."""
    return {
        "version": PLAN_VERSION,
        "source": {"path": str(src), "files": manifest.files},
        "machine": machine(),
        **settings,
        "gates": gates.__dict__,
        "eval_text": text_record(eval_text),
        "calibration": [text_record(p) for p in calibration],
        "shared_options": options,
        "chosen": winner.name,
        "chosen_options": winner.options,
        "candidates": [c.record() for c in pool],
        "seconds": round(time.perf_counter() - t0, 1),
    }


def _build(
    quantize: Any,
    src: Path,
    work: Path,
    c: Candidate,
    eval_text: str | Path,
    calibration: Sequence[str | Path],
    options: dict[str, Any],
    shared: SharedWeights,
) -> None:
    if not c.options:  # the source is the reference the others are measured against
        c.directory, c.weight_bytes = src, c.estimated_bytes
        c.report = dict(SOURCE_REPORT)
        return
    c.directory = work / c.name.replace("+", "_")
    reused = shared.reused
    kw = options | c.options
    manifest = quantize(src, c.directory, calibration=calibration, eval_text=eval_text, shared=shared, **kw)
    c.weights_from = shared.kept.name if shared.reused > reused and shared.kept else None
    q = manifest.quantization or {}
    c.report = q["report"]
    c.weight_bytes = int(q["size"]["bytes"])


def _cost(c: Candidate, objective: str) -> float:
    if objective == "size" or not c.speed:
        return float((c.weight_bytes or 0) + c.state_bytes)
    return -c.speed["decode_tokens_per_s"] if objective == "decode" else c.speed["prefill_ms"]


def _cost_text(c: Candidate, objective: str) -> str:
    if objective == "size" or not c.speed:
        return f"{((c.weight_bytes or 0) + c.state_bytes) / 2**20:.1f} MiB"
    if objective == "decode":
        return f"{c.speed['decode_tokens_per_s']:.1f} decode tok/s"
    return f"{c.speed['prefill_ms']:.1f} ms prefill"


def _why(winner: Candidate, passed: list[Candidate], objective: str) -> str:
    what = {"decode": "fastest decode", "prefill": "fastest prefill", "size": "smallest"}[objective]
    return f"{what} of the {len(passed)} that fit and pass the gates: {_cost_text(winner, objective)}"


def _over(need: int, budget: int, how: str) -> str:
    return f"{how} {need / 2**20:.1f} MiB > budget {budget / 2**20:.1f} MiB"


def _elapsed(t0: float) -> str:
    return f"{time.perf_counter() - t0:.0f} s so far"
