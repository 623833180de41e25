"""`hybridrt quantize --auto` on the shipped default model: a budget that admits only int4 picks
int4 (int8 never built), a gate int4 fails picks int8, gates nothing passes name each candidate's
failing figure and write nothing, the chosen model passes its gates when measured again, and a
plan replayed on a clean directory writes the same graph byte for byte."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from exports import REPORT, external_copy

import hybridrt
from hybridrt.errors import QuantizationError
from hybridrt.graphs.manifest import read_manifest
from hybridrt.quantization import quantize
from hybridrt.quantization.auto import FLOAT, Gates, choose, estimate_weights, state_bytes
from hybridrt.quantization.modes import QuantConfig
from hybridrt.quantization.report import quality_report

PAIR = ["int4-mse-b32", "int8-dynamic"]
QUICK = REPORT | {"agreement_tokens": 16}


def _choose(src: Path, out: Path, text: Path, **kwargs: Any) -> dict[str, Any]:
    choose(src, out, eval_text=text, only=kwargs.pop("only", PAIR), rounds=1, new_tokens=8, **QUICK, **kwargs)
    return json.loads((out / "plan.json").read_text())


@pytest.fixture(scope="module")
def unbudgeted(default_onnx: Path, text_file: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both candidates built and measured, no budget, no gate."""
    out = tmp_path_factory.mktemp("auto") / "any"
    return _choose(default_onnx, out, text_file, only=[*PAIR, FLOAT]) | {"out": out}


def test_estimates_are_the_built_sizes_and_states_follow_the_kv_dtype(
    default_onnx: Path, unbudgeted: dict[str, Any]
) -> None:
    by_name = {c["name"]: c for c in unbudgeted["candidates"]}
    for name in PAIR:
        c = by_name[name]
        assert abs(c["estimated_weight_bytes"] - c["weight_bytes"]) < 0.03 * c["weight_bytes"]
    assert by_name[FLOAT]["weight_bytes"] > 3 * by_name["int4-mse-b32"]["weight_bytes"]
    manifest = hybridrt.load(default_onnx).manifest
    assert state_bytes(manifest, {"kv_dtype": "int8"}, 2048, 2) < state_bytes(manifest, {}, 2048, 2)
    assert state_bytes(manifest, {}, 2048, 2) == 2 * state_bytes(manifest, {}, 2048, 1)
    assert estimate_weights(default_onnx, manifest, {}) == by_name[FLOAT]["weight_bytes"]


def test_a_budget_that_admits_only_int4_picks_int4_without_building_int8(
    default_onnx: Path, text_file: Path, tmp_path: Path, unbudgeted: dict[str, Any]
) -> None:
    by_name = {c["name"]: c for c in unbudgeted["candidates"]}
    int4, int8 = by_name["int4-mse-b32"]["total_bytes"], by_name["int8-dynamic"]["total_bytes"]
    plan = _choose(default_onnx, tmp_path / "out", text_file, budget_bytes=(int4 + int8) // 2)
    assert plan["chosen"] == "int4-mse-b32"
    dropped = plan["candidates"][1]
    assert dropped["status"] == "dropped" and dropped["why"].startswith("estimated") and dropped["weight_bytes"] is None
    manifest = hybridrt.load(tmp_path / "out").manifest
    assert manifest.quantization["mode"] == "int4" and manifest.provenance["plan"]["chosen"] == "int4-mse-b32"


def test_a_gate_int4_fails_picks_int8_and_the_winner_passes_it_again(
    default_onnx: Path, text_file: Path, tmp_path: Path, unbudgeted: dict[str, Any]
) -> None:
    kl = {c["name"]: c["quality"]["mean_kl"] for c in unbudgeted["candidates"]}
    assert kl["int8-dynamic"] < kl["int4-mse-b32"]
    gate = (kl["int8-dynamic"] + kl["int4-mse-b32"]) / 2
    plan = _choose(default_onnx, tmp_path / "out", text_file, gates=Gates(max_kl=gate))
    assert plan["chosen"] == "int8-dynamic"
    assert plan["candidates"][0]["why"].startswith("gate: mean_kl")
    again = quality_report(
        hybridrt.load(default_onnx), hybridrt.load(tmp_path / "out"), text_file.read_text(), QuantConfig(**QUICK)
    )
    assert again["mean_kl"] <= gate


def test_gates_nothing_passes_name_every_failure_and_write_nothing(
    default_onnx: Path, text_file: Path, tmp_path: Path
) -> None:
    with pytest.raises(QuantizationError) as e:
        _choose(default_onnx, tmp_path / "out", text_file, gates=Gates(max_kl=1e-9))
    for name in PAIR:
        assert f"{name}: gate: mean_kl" in str(e.value)
    assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []


def test_a_replayed_plan_writes_the_same_graph(unbudgeted: dict[str, Any], default_onnx: Path, tmp_path: Path) -> None:
    out = tmp_path / "replayed"
    done = subprocess.run(
        [sys.executable, "-m", "hybridrt.cli", "quantize", str(default_onnx), "-o", str(out), "--plan"]
        + [str(unbudgeted["out"] / "plan.json")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "chosen" in done.stdout and unbudgeted["chosen"] in done.stdout
    chosen = unbudgeted["out"]
    for f in chosen.iterdir():
        if f.name.startswith("model.onnx"):
            assert (out / f.name).read_bytes() == f.read_bytes()
    shown = subprocess.run([sys.executable, "-m", "hybridrt.cli", "inspect", str(out)], capture_output=True, text=True)
    assert f"plan         {unbudgeted['chosen']}, chosen by decode of 3 candidates" in shown.stdout, shown.stderr


def test_the_command_line_needs_one_way_and_the_eval_text(default_onnx: Path, tmp_path: Path) -> None:
    base = [sys.executable, "-m", "hybridrt.cli", "quantize", str(default_onnx), "-o", str(tmp_path / "o")]
    for extra, message in (
        ([], "give one of --mode MODE, --auto, or --plan"),
        (["--auto", "--mode", "int4"], "give one of --mode MODE, --auto, or --plan"),
        (["--auto"], "--auto measures each candidate's quality: give --eval-text"),
        (["--auto", "--eval-text", __file__, "--candidates", "int3"], "unknown candidate int3"),
    ):
        done = subprocess.run(base + extra, capture_output=True, text=True)
        assert done.returncode != 0 and message in done.stderr and "Traceback" not in done.stderr


def test_recheck_measures_the_same_figures_and_says_when_a_gate_fails_now(
    unbudgeted: dict[str, Any], default_onnx: Path, tmp_path: Path
) -> None:
    from hybridrt.quantization.plan import recheck

    result = recheck(default_onnx, unbudgeted["out"])
    chosen = next(c for c in unbudgeted["candidates"] if c["name"] == unbudgeted["chosen"])
    assert result["holds"] and result["chosen"] == unbudgeted["chosen"]
    for key, value in chosen["quality"].items():
        assert result["quality"][key] == pytest.approx(value, rel=1e-9, abs=1e-12)
    assert result["decode_tokens_per_s"] > 0 and result["machine"]["cores"] == unbudgeted["machine"]["cores"]
    stricter = tmp_path / "stricter"  # the same model under a plan whose gate it does not meet
    stricter.mkdir()
    for f in unbudgeted["out"].iterdir():
        (stricter / f.name).write_bytes(f.read_bytes())
    plan = json.loads((stricter / "plan.json").read_text())
    plan["gates"]["min_greedy_agreement"] = 1.01
    (stricter / "plan.json").write_text(json.dumps(plan))
    done = subprocess.run(
        [sys.executable, "-m", "hybridrt.cli", "quantize", str(default_onnx), "-o", str(stricter), "--recheck"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and "no longer holds: greedy_agreement" in done.stdout, done.stderr


def test_the_float_source_can_be_the_choice(default_onnx: Path, text_file: Path, tmp_path: Path) -> None:
    """When the source wins (here the only candidate), the written directory is the source's
    graph with the plan beside it, a valid model directory."""
    plan = _choose(default_onnx, tmp_path / "out", text_file, only=[FLOAT])
    assert plan["chosen"] == FLOAT and plan["candidates"][0]["status"] == "chosen"
    model = hybridrt.load(tmp_path / "out")
    assert model.manifest.quantization is None and model.manifest.provenance["plan"]["chosen"] == FLOAT
    assert (tmp_path / "out" / "model.onnx").read_bytes() == (default_onnx / "model.onnx").read_bytes()


def test_a_kv_int8_candidate_reads_its_base_weights_back_and_writes_what_quantize_writes(
    default_onnx: Path, text_file: Path, tmp_path: Path
) -> None:
    """The weights of X and X+kv-int8 are quantized once (kept on disk, weights in an external
    data file here), and the candidate built from them is byte for byte a quantization from scratch."""
    parent = external_copy(default_onnx, tmp_path / "external")
    pair = ["int4-awq-b32", "int4-awq-b32+kv-int8"]
    said: list[str] = []
    out = tmp_path / "auto"
    choose(parent, out, eval_text=text_file, calibration=[text_file], only=pair, objective="size", progress=said.append,
           samples=4, seq_len=64, **QUICK)  # fmt: skip
    plan = json.loads((out / "plan.json").read_text())
    by_name = {c["name"]: c for c in plan["candidates"]}
    assert by_name[pair[0]]["weights_from"] is None and by_name[pair[1]]["weights_from"] == pair[0]
    assert any("weights read back from int4-awq-b32's" in line for line in said), said
    assert plan["chosen"] == pair[1]  # the smaller KV: the least bytes in all
    direct = tmp_path / "direct"
    quantize(parent, direct, "int4", algo="awq", kv_dtype="int8", eval_text=text_file,
              calibration=[text_file], samples=4, seq_len=64, **QUICK)  # fmt: skip
    files = sorted(f.name for f in out.iterdir() if f.name.startswith("model.onnx"))
    assert files == ["model.onnx", "model.onnx.data"]
    for name in files:
        assert (out / name).read_bytes() == (direct / name).read_bytes(), name
    q, again = read_manifest(out).quantization, read_manifest(direct).quantization
    assert q is not None and again is not None
    assert q["calibration"] == again["calibration"] and q["kv_cache"] == again["kv_cache"]
    assert q["report"] == again["report"]


def test_weights_are_shared_only_between_options_that_give_the_same_weights() -> None:
    from hybridrt.quantization.shared import weights_key

    def key(**options: Any) -> str:
        return weights_key(QuantConfig.from_kwargs(**options))

    assert key(mode="int4") == key(mode="int4", kv_dtype="int8")
    assert key(mode="int4") != key(mode="int4", block_size=64) != key(mode="int4", algo="rtn")
    assert key(mode="int8-dynamic") == key(mode="int8-dynamic", kv_dtype="int8") != key(mode="int4")
    assert key(mode="float16") != key(mode="float16", kv_dtype="float16")  # float16 converts the KV with the weights
