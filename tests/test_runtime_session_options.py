"""load(session_options=...): the caller's onnxruntime options reach the session, merged with
the loader's own settings (threads, log level)."""

from __future__ import annotations

import json
from pathlib import Path

import onnxruntime as ort
import pytest

import hybridrt


def test_profiling_options_write_a_profile(jamba_onnx: Path, tmp_path: Path) -> None:
    opts = ort.SessionOptions()
    opts.enable_profiling = True
    opts.profile_file_prefix = str(tmp_path / "profile")
    opts.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    model = hybridrt.load(jamba_onnx, "cpu", verify=False, session_options=opts)
    model.generate([5, 17, 99], max_new_tokens=3, eos_token_id=[])
    trace = Path(model.inference_session.end_profiling())
    assert trace.parent == tmp_path and trace.name.startswith("profile")
    runs = [e for e in json.loads(trace.read_text()) if e.get("name") == "model_run"]
    assert len(runs) >= 3  # the prompt and every new token
    assert (tmp_path / "optimized.onnx").is_file()


def test_config_entries_are_kept_and_the_loaders_threads_win(jamba_onnx: Path) -> None:
    opts = ort.SessionOptions()
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.intra_op_num_threads = 3
    opts.log_severity_level = 1
    model = hybridrt.load(jamba_onnx, "cpu", threads=1, verify=False, session_options=opts)
    used = model.inference_session.get_session_options()
    assert used.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert used.intra_op_num_threads == 1  # load(threads=) over the options' own count
    assert used.log_severity_level == 1  # set by the caller: the loader's quieter default does not apply
    assert model.generate([5, 17, 99], max_new_tokens=2, eos_token_id=[])


def test_without_threads_the_options_count_stands(jamba_onnx: Path) -> None:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    model = hybridrt.load(jamba_onnx, "cpu", verify=False, session_options=opts)
    used = model.inference_session.get_session_options()
    assert used.intra_op_num_threads == 2
    assert used.log_severity_level == 3  # left unset: the loader keeps onnxruntime to errors


def test_session_options_of_another_type_are_refused(jamba_onnx: Path) -> None:
    with pytest.raises(hybridrt.ProviderError, match="onnxruntime.SessionOptions"):
        hybridrt.load(jamba_onnx, "cpu", verify=False, session_options={"enable_profiling": True})  # type: ignore[arg-type]


def _threads(model_dir: Path, **options: object) -> int:
    model = hybridrt.load(model_dir, "cpu", verify=False, **options)  # type: ignore[arg-type]
    return int(model.inference_session.get_session_options().intra_op_num_threads)


def test_hybridrt_threads_is_the_count_of_a_session_given_none(
    jamba_onnx: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HYBRIDRT_THREADS stands in for onnxruntime's one thread per host core, below every count
    the caller gives (load(threads=), the session options' own)."""
    monkeypatch.setenv("HYBRIDRT_THREADS", "3")
    assert _threads(jamba_onnx) == 3
    assert _threads(jamba_onnx, threads=1) == 1
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    assert _threads(jamba_onnx, session_options=opts) == 2
    for bad in ("0", "two", "-1", "5000"):
        monkeypatch.setenv("HYBRIDRT_THREADS", bad)
        with pytest.raises(hybridrt.ProviderError, match="HYBRIDRT_THREADS must be an integer"):
            hybridrt.load(jamba_onnx, "cpu", verify=False)
    monkeypatch.setenv("HYBRIDRT_THREADS", " ")  # blank: unset
    assert _threads(jamba_onnx) == 0


def test_the_loaders_own_options_plan_no_memory_pattern(jamba_onnx: Path) -> None:
    """A memory pattern is one block made for the second run of a set of input shapes: every prompt
    length seen twice would write new memory. The loader's own CPU options plan none; a caller's
    options keep their setting."""
    model = hybridrt.load(jamba_onnx, "cpu", verify=False)
    assert model.inference_session.get_session_options().enable_mem_pattern is False
    tokens = model.generate([5, 17, 99, 4], max_new_tokens=3, eos_token_id=[])
    assert model.generate([5, 17, 99, 4], max_new_tokens=3, eos_token_id=[]) == tokens
    given = hybridrt.load(jamba_onnx, "cpu", verify=False, session_options=ort.SessionOptions())
    assert given.inference_session.get_session_options().enable_mem_pattern is True
    assert given.generate([5, 17, 99, 4], max_new_tokens=3, eos_token_id=[]) == tokens
