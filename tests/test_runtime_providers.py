"""Execution provider selection on declared provider lists, and for real on this machine."""

from __future__ import annotations

import logging
from pathlib import Path

import onnxruntime as ort
import pytest

import hybridrt
from hybridrt.runtime.providers import CPU, CUDA, device_of, select_providers

ACL, XNNPACK = "ACLExecutionProvider", "XnnpackExecutionProvider"


@pytest.mark.parametrize(
    ("available", "expected"),
    [
        ([CPU], [CPU]),
        (["AzureExecutionProvider", CPU], [CPU]),
        ([CPU, CUDA, "TensorrtExecutionProvider"], [CUDA, CPU]),
        ([XNNPACK, ACL, CPU], [ACL, XNNPACK, CPU]),
        ([XNNPACK, CPU], [XNNPACK, CPU]),
        ([], [CPU]),
    ],
)
def test_auto_walks_the_preference_order(available: list[str], expected: list[str]) -> None:
    assert select_providers("auto", available).names == expected


def test_aliases_lists_and_options() -> None:
    sel = select_providers([("cuda", {"device_id": 1}), "cpu"], [CUDA, CPU], threads=3)
    assert sel.providers == [(CUDA, {"device_id": "1"}), (CPU, {})]
    assert sel.threads == 3
    assert select_providers(("cpu", {"threads": 2}), [CPU]).threads == 2
    assert select_providers("XnnpackExecutionProvider", [XNNPACK, CPU]).names == [XNNPACK, CPU]


@pytest.mark.parametrize(("name", "hint"), [("cuda", "onnxruntime-gpu"), ("acl", "--use_acl"), ("xnnpack", "xnnpack")])
def test_unavailable_provider_says_what_is_installed_and_how_to_get_it(name: str, hint: str) -> None:
    with pytest.raises(hybridrt.ProviderError, match=hint) as err:
        select_providers(name, ["AzureExecutionProvider", CPU])
    assert "installed: AzureExecutionProvider, CPUExecutionProvider" in str(err.value)


def test_fallback_logs_a_warning_and_uses_cpu(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="hybridrt.runtime"):
        sel = select_providers("cuda", [CPU], allow_fallback=True)
    assert sel.names == [CPU]
    assert "CUDAExecutionProvider is not available" in caplog.text


def test_unreadable_request() -> None:
    with pytest.raises(hybridrt.ProviderError):
        select_providers([42], [CPU])  # type: ignore[list-item]
    with pytest.raises(hybridrt.ProviderError):
        select_providers([], [CPU])


def test_load_reports_the_providers_it_runs_on(jamba_onnx: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert hybridrt.load(jamba_onnx, "cpu", threads=1).providers == [CPU]
    if CUDA in ort.get_available_providers():
        assert hybridrt.load(jamba_onnx, "cuda").providers[0] == CUDA
        return
    with pytest.raises(hybridrt.ProviderError, match="onnxruntime-gpu"):
        hybridrt.load(jamba_onnx, "cuda")
    with caplog.at_level(logging.WARNING, logger="hybridrt.runtime"):
        assert hybridrt.load(jamba_onnx, "cuda", allow_fallback=True).providers == [CPU]
    assert "falling back to CPU" in caplog.text


@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider' is not in available")
def test_cuda_loads_its_libraries_before_the_session(jamba_onnx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With CUDA requested, onnxruntime-gpu's preload_dlls() runs before the session opens (it
    finds the CUDA libraries of pip's nvidia packages in a process without torch), and a failing
    preload does not stop the load: the session's own error says what is missing. Here the CUDA
    provider is declared available but cannot start, which the loader reports."""
    calls: list[str] = []

    def preload() -> None:
        calls.append("preload")
        raise OSError("libcudart.so.13: cannot open shared object file")

    real = ort.InferenceSession

    def session(*args: object, **kwargs: object) -> object:
        calls.append("session")
        return real(*args, **kwargs)

    monkeypatch.setattr(ort, "preload_dlls", preload, raising=False)
    monkeypatch.setattr(ort, "InferenceSession", session)
    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA, CPU])
    with pytest.raises(hybridrt.ProviderError, match="could not start"):
        hybridrt.load(jamba_onnx, "cuda")
    assert calls[:2] == ["preload", "session"]
    calls.clear()
    hybridrt.load(jamba_onnx, "cpu")
    assert calls == ["session"]  # not for the CPU


def test_serve_device_id_picks_a_cuda_device() -> None:
    """`hybridrt serve --device-id N`: CUDA on device N (with --provider cuda or auto), its
    tensors placed there; refused with another provider or a negative id."""
    from hybridrt.runtime.providers import device_provider

    assert device_provider("auto", None) == "auto"
    for given in ("cuda", "CUDAExecutionProvider", "auto"):
        request = device_provider(given, 1)
        assert request == [(CUDA, {"device_id": 1})]
        chosen = select_providers(request, [CUDA, CPU]).providers
        assert chosen[0] == (CUDA, {"device_id": "1"}) and device_of(*chosen[0]) == ("cuda", 1)
    with pytest.raises(hybridrt.ProviderError, match="does not apply to --provider cpu"):
        device_provider("cpu", 0)
    with pytest.raises(hybridrt.ProviderError, match=">= 0"):
        device_provider("cuda", -1)
    with pytest.raises(hybridrt.ProviderError, match="CUDAExecutionProvider is not available"):
        select_providers(device_provider("auto", 0), [CPU])
