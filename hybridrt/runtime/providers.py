"""Execution provider selection: a pure function of the request and the installed providers.

`provider="auto"` walks PREFERENCE intersected with what this onnxruntime build has. A named
provider (short alias or full ONNX Runtime name, alone, as a `(name, options)` tuple, or an
ordered list of either) that the build lacks is a ProviderError that says how to get it, or,
with `allow_fallback=True`, a logged warning and the CPU provider.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ProviderError

log = logging.getLogger("hybridrt.runtime")

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
PREFERENCE = (CUDA, "ACLExecutionProvider", "XnnpackExecutionProvider", CPU)
ALIASES = {
    "cpu": CPU,
    "cuda": CUDA,
    "acl": "ACLExecutionProvider",
    "xnnpack": "XnnpackExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
    "coreml": "CoreMLExecutionProvider",
    "dml": "DmlExecutionProvider",
}
HOW_TO_GET = {
    CUDA: (
        "pip uninstall onnxruntime, then pip install onnxruntime-gpu (1.31.1 is built for CUDA 13) on a machine "
        "with an NVIDIA driver, and import torch first or call onnxruntime.preload_dlls() (docs/gpu.md)"
    ),
    "TensorrtExecutionProvider": "pip install onnxruntime-gpu and install TensorRT",
    "ACLExecutionProvider": "build onnxruntime from source with --use_acl (Arm Compute Library)",
    "XnnpackExecutionProvider": "build onnxruntime from source with --use_xnnpack (or use an onnxruntime mobile build)",
    "CoreMLExecutionProvider": "use the onnxruntime wheel for macOS",
    "DmlExecutionProvider": "pip install onnxruntime-directml (Windows)",
}

ProviderRequest = str | tuple[str, dict[str, Any]] | Sequence[str | tuple[str, dict[str, Any]]]


@dataclass(frozen=True)
class ProviderSelection:
    """What to hand to InferenceSession: ordered (name, provider options), and session threads."""

    providers: list[tuple[str, dict[str, str]]]
    threads: int | None = None
    fell_back: list[str] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.providers]


def canonical(name: str) -> str:
    """'cuda' -> 'CUDAExecutionProvider'; a full name is returned as given."""
    return ALIASES.get(name.lower(), name)


def select_providers(
    request: ProviderRequest,
    available: Sequence[str],
    *,
    allow_fallback: bool = False,
    threads: int | None = None,
) -> ProviderSelection:
    """The providers to create a session with, in order, ending with CPU.

    `available` is onnxruntime.get_available_providers() (passed in so the logic is testable on
    declared lists). Options per provider: `threads` and `device_id`; other keys pass through.
    """
    if threads is not None and (not _is_count(threads) or threads < 1):
        raise ProviderError(
            f"threads must be an integer in [1, {MAX_THREADS}] (or None for ONNX Runtime's choice), got {threads!r}"
        )
    if isinstance(request, str) and request.lower() == "auto":
        return _finish([(p, {}) for p in PREFERENCE if p in available], threads, [])
    chosen: list[tuple[str, dict[str, Any]]] = []
    missing: list[str] = []
    for name, options in _entries(request):
        if name in available:
            chosen.append((name, options))
        else:
            missing.append(name)
    if missing and not allow_fallback:
        raise ProviderError(_missing_message(missing, available))
    for name in missing:
        log.warning("execution provider %s is not available (%s); falling back to CPU", name, _hint(name))
    return _finish(chosen, threads, missing)


def _entries(request: ProviderRequest) -> list[tuple[str, dict[str, Any]]]:
    if isinstance(request, str) or (isinstance(request, tuple) and len(request) == 2 and isinstance(request[1], dict)):
        request = [request]  # type: ignore[list-item]
    if not isinstance(request, list | tuple):
        raise ProviderError(f"cannot read provider {request!r}: give 'auto', a name, or a list of names")
    entries: list[tuple[str, dict[str, Any]]] = []
    for item in request:
        if isinstance(item, str):
            entries.append((canonical(item), {}))
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], dict):
            entries.append((canonical(item[0]), dict(item[1])))
        else:
            raise ProviderError(f"cannot read provider {item!r}: give a name or a (name, options) tuple")
    if not entries:
        raise ProviderError("no execution provider requested; pass 'auto' or a provider name")
    return entries


def _finish(chosen: list[tuple[str, dict[str, Any]]], threads: int | None, missing: list[str]) -> ProviderSelection:
    if not any(name == CPU for name, _ in chosen):
        chosen.append((CPU, {}))  # ops another provider lacks run here
    providers = []
    for name, options in chosen:
        opts = dict(options)
        n = opts.pop("threads", None)
        if n is not None and name == "XnnpackExecutionProvider":
            opts["intra_op_num_threads"] = n  # XNNPACK keeps its own thread pool
        elif n is not None:
            if not _is_count(n) or n < 1:
                raise ProviderError(f"provider option threads must be an integer in [1, {MAX_THREADS}], got {n!r}")
            threads = int(n)
        providers.append((name, {k: str(v) for k, v in opts.items()}))
    return ProviderSelection(providers, threads, missing)


MAX_THREADS = 4096  # onnxruntime takes an int32; more threads than this is a typo


THREADS_ENV = "HYBRIDRT_THREADS"


def threads_from_env() -> int | None:
    """HYBRIDRT_THREADS: the intra-op thread count of a session opened with no count of its own
    (no `threads`, none in its session options). onnxruntime otherwise starts one thread per
    core of the host, and reads no container CPU limit: on a 64-core node with a 2-CPU limit,
    64 threads share 2 CPUs."""
    raw = os.environ.get(THREADS_ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_THREADS:
        raise ProviderError(f"{THREADS_ENV} must be an integer in [1, {MAX_THREADS}] (or unset), got {raw!r}")
    return int(raw)


def _is_count(n: object) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n <= MAX_THREADS


def _hint(name: str) -> str:
    return HOW_TO_GET.get(name, "install an onnxruntime build that includes it")


def _missing_message(missing: list[str], available: Sequence[str]) -> str:
    lines = [f"execution provider {', '.join(missing)} is not available in this onnxruntime build"]
    lines.append(f"installed: {', '.join(available) or 'none'}")
    lines += [f"to get {name}: {_hint(name)}" for name in missing]
    lines.append("or pass allow_fallback=True (--allow-fallback) to run on CPU instead")
    return "; ".join(lines)


def device_of(provider: str, options: dict[str, str]) -> tuple[str, int]:
    """Where the session keeps tensors: ('cpu', 0) or ('cuda', device_id)."""
    if provider in (CUDA, "TensorrtExecutionProvider"):
        return "cuda", int(options.get("device_id", 0))
    return "cpu", 0


def device_provider(provider: str, device_id: int | None) -> Any:
    """--provider with --device-id: CUDA on that device (with `auto` too, which then requires CUDA)."""
    if device_id is None:
        return provider
    if device_id < 0:
        raise ProviderError(f"--device-id must be >= 0, got {device_id}")
    if provider.lower() != "auto" and canonical(provider) != CUDA:
        raise ProviderError(f"--device-id picks a CUDA device; it does not apply to --provider {provider}")
    return [(CUDA, {"device_id": device_id})]
