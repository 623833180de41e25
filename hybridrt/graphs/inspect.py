"""Human-readable description of an exported directory (torch-free)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .contract import state_bytes_per_sequence
from .manifest import Manifest, read_manifest


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


def describe(directory: str | Path, manifest: Manifest | None = None) -> str:
    directory = Path(directory)
    m = manifest or read_manifest(directory)
    kinds: dict[str, int] = {}
    for k in m.layer_types:
        kinds[k] = kinds.get(k, 0) + 1
    lines = [
        f"model        {directory}",
        f"architecture {m.architecture} ({m.format}, schema {m.schema_version})",
        f"layers       {len(m.layer_types)}: " + ", ".join(f"{n} {k}" for k, n in kinds.items()),
        f"layer kinds  {' '.join(m.layer_types)}",
        f"vocab        {m.vocab_size}   max length {m.max_length}   logits: {m.logits}",
        f"special      {m.special_tokens}",
        "inputs       " + ", ".join(s.name for s in m.inputs if not s.name.startswith("past.")),
        "states (per sequence):",
    ]
    fixed = grow = 0
    for s in m.pasts:
        n = state_bytes_per_sequence(s)
        dims = "[" + ", ".join(str(d) for d in s.dims) + "]"
        if s.is_kv:
            grow += n
            lines.append(f"  {s.name:<18} {s.kind:<6} {dims:<28} {s.dtype}  {_size(n)} per position")
        else:
            fixed += n
            where = "  in place" if s.name in m.in_place else ""
            lines.append(f"  {s.name:<18} {s.kind:<6} {dims:<28} {s.dtype}  {_size(n)}{where}")
    lines.append(f"  total: {_size(fixed)} fixed + {_size(grow)} per position of KV capacity")
    if any(not s.is_kv for s in m.pasts):
        lines.append(
            f"  in place: {len(m.in_place)} of {sum(not s.is_kv for s in m.pasts)} fixed-size states "
            "(read and written in one buffer; graphs written before this list none)"
        )
    lines.append("files:")
    for name, info in m.files.items():
        lines.append(f"  {name:<24} {_size(info['bytes']):>12}  sha256 {info['sha256'][:12]}")
    prov = m.provenance
    lines.append(
        "provenance   "
        + ", ".join(f"{k} {prov[k]}" for k in ("hybridrt", "torch", "onnx", "onnxscript", "opset") if k in prov)
    )
    if "source" in prov:
        lines.append(f"source       {prov['source']}")
    if m.quantization:
        lines.extend(_quantization_lines(m.quantization))
    plan = prov.get("plan")
    if isinstance(plan, dict) and "chosen" in plan:
        budget = "no budget" if plan["budget_bytes"] is None else f"budget {plan['budget_bytes'] / 2**20:.1f} MiB"
        lines.append(
            f"plan         {plan['chosen']}, chosen by {plan['objective']} of {plan['candidates']} candidates, "
            f"{budget} ({plan['file']}{', replayed' if plan.get('replayed') else ''})"
        )
    if m.parity:
        p = m.parity
        lines.append(
            f"parity       max |Δlogits| {p['max_abs_logits']:.2e}, max |Δstate| {p['max_abs_state']:.2e} "
            f"(tolerance {p['tolerance']:g}; prompts {[c['seq'] for c in p['prompt']]}, "
            f"{p['decode'].get('steps', 0)} decode steps)"
        )
    return "\n".join(lines)


def _quantization_lines(q: dict[str, Any]) -> list[str]:
    """Mode, what was quantized and how much smaller, and the quality report's figures."""
    label = " ".join(str(x) for x in (q.get("mode"), q.get("algo")) if x)
    lines = [
        f"quantization {label}, {len(q.get('quantized_nodes', []))} nodes, {len(q.get('excluded', {}))} kept float"
    ]
    vocab, size, report = describe_vocab(q.get("vocab")), q.get("size") or {}, q.get("report") or {}
    if vocab:
        lines.append(f"  vocabulary {vocab}")
    kv = q.get("kv_cache")
    if kv:
        lines.append(f"  KV cache   {kv['dtype']}, {kv['scales']} ({kv['calibration_windows']} windows)")
    if size:
        lines.append(f"  size       {size['bytes'] / 2**20:.1f} MiB, {size['ratio']:.3f} of the float graph")
    if q.get("report_skipped"):
        lines.append(f"  report     none: {q['report_skipped']}")
    if report:
        lines.append(
            f"  report     perplexity ratio {report['ppl_ratio']:.4f}, mean KL {report['mean_kl']:.2e}, "
            f"greedy agreement {report['greedy_agreement']:.3f} ({report['tokens']} held-out tokens)"
        )
    return lines


def describe_vocab(vocab: dict[str, Any] | None) -> str | None:
    """How the embedding and LM head were stored (a quantization record's `vocab`), or None."""
    if not vocab or not (vocab.get("embedding") or vocab.get("lm_head")):
        return None
    parts = " + ".join(x for x in (vocab.get("embedding"), vocab.get("lm_head")) if x)
    shared = ", one shared table" if vocab.get("shared") else ""
    return f"{parts}, {vocab.get('bits')}-bit blocks of {vocab.get('block_size')}{shared}"
