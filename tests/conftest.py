"""Session-scoped fixtures: tiny checkpoints and their exports, built once per run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import toy_kind
from checkpoints import TEXT, make_jamba, make_llama
from family_checkpoints import SHARED_FAMILIES, family_checkpoint
from fuzzing import TALLY


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The fuzz suite's tally (tests/test_fuzz.py), when it ran."""
    if TALLY:
        total = sum(TALLY.values())
        terminalreporter.write_line(
            f"fuzz: {total} cases, {TALLY['worked']} worked, {TALLY['typed error']} typed errors, "
            f"{TALLY['failure']} failures"
        )


@pytest.fixture(scope="session")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A text file of the tests' source code: calibration and held-out text (tests/checkpoints.TEXT)."""
    path = tmp_path_factory.mktemp("text") / "code.txt"
    path.write_text(TEXT * 8, encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def jamba_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_jamba(tmp_path_factory.mktemp("jamba"))


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_llama(tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="session", params=["jamba", "llama"])
def ckpt_dir(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(f"{request.param}_dir")


@pytest.fixture(scope="session")
def jamba_onnx(jamba_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import hybridrt

    out = tmp_path_factory.mktemp("jamba-onnx") / "model"
    hybridrt.export_model(jamba_dir, out)
    return out


@pytest.fixture(scope="session")
def llama_onnx(llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import hybridrt

    out = tmp_path_factory.mktemp("llama-onnx") / "model"
    hybridrt.export_model(llama_dir, out)
    return out


@pytest.fixture(scope="session", params=["jamba", "llama"])
def onnx_dir(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(f"{request.param}_onnx")


@pytest.fixture(scope="session")
def default_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped default model (Mamba1 + attention), exported once."""
    import hybridrt
    from hybridrt.default_model import CHECKPOINT_DIR

    out = tmp_path_factory.mktemp("default-onnx") / "model"
    hybridrt.export_model(CHECKPOINT_DIR, out)
    return out


@pytest.fixture(scope="session")
def jamba_int4(jamba_onnx: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Jamba quantized to int4: a draft model that keeps some of its drafts."""
    from hybridrt.quantization import quantize

    text = tmp_path_factory.mktemp("eval") / "text.txt"
    text.write_text(Path(__file__).read_text(encoding="utf-8") * 8, encoding="utf-8")
    out = tmp_path_factory.mktemp("jamba-int4") / "model"
    quick = {"samples": 3, "seq_len": 32, "decode_steps": 2, "agreement_prompts": 4, "eval_tokens": 192}
    quantize(jamba_onnx, out, "int4", eval_text=text, eval_window=128, **quick)
    return out


@pytest.fixture(scope="session")
def llama_kv8(llama_onnx: Path, text_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama with float weights and an int8 KV cache (quantize --mode none --kv-dtype int8)."""
    from hybridrt.quantization import quantize

    out = tmp_path_factory.mktemp("llama-kv8") / "model"
    quick = {"samples": 3, "seq_len": 32, "decode_steps": 2, "agreement_prompts": 4, "eval_tokens": 192}
    quantize(llama_onnx, out, "none", calibration=[text_file], kv_dtype="int8", eval_window=128, **quick)
    return out


# Every family of tests/family_checkpoints.BUILDERS, built and exported once per session for
# the suites that run on all of them (test_families, test_beam): a module defines a `family`
# fixture over the names and asks for `ckpt` / `exported`.


@pytest.fixture(scope="session")
def family_dirs() -> dict[str, Path]:
    return {}


@pytest.fixture(scope="session")
def family_onnx() -> dict[str, Path]:
    return {}


@pytest.fixture
def ckpt(
    family: str, family_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Path:
    if family in SHARED_FAMILIES:
        return Path(request.getfixturevalue(f"{family}_dir"))
    return family_checkpoint(family, family_dirs, tmp_path_factory)


@pytest.fixture
def exported(
    family: str,
    ckpt: Path,
    family_onnx: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Path:
    import hybridrt

    if family in SHARED_FAMILIES:
        return Path(request.getfixturevalue(f"{family}_onnx"))
    if family not in family_onnx:
        out = tmp_path_factory.mktemp(f"{family}-onnx") / "model"
        hybridrt.export_model(ckpt, out)
        family_onnx[family] = out
    return family_onnx[family]


@pytest.fixture
def toy_registered() -> Iterator[None]:
    """tests/toy_kind.py's layer kind "ema" (one state, an exponential moving average) and its
    family, registered as a third party would, and unregistered afterwards."""
    from hybridrt.kinds import LAYER_KINDS, LayerKind, register_kind
    from hybridrt.models.registry import FAMILIES, Family, register

    register_kind(LayerKind("ema", "toy_kind:EmaMixer", (toy_kind.EMA_STATE,), "toy moving average"))
    register(Family("toy_ema", toy_kind.translate))
    try:
        yield
    finally:
        LAYER_KINDS.pop("ema")
        FAMILIES.pop("toy_ema")
