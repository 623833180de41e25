"""ONNX export one layer at a time (export.streamed): checkpoints stored the way released ones
are (bf16, sharded, with an index), one traced template per distinct layer, weights streamed
to the data file, parity against a reference run layer by layer, and quantization while
exporting equal to export followed by `quantize`."""

from __future__ import annotations

import json
from pathlib import Path

import exports
import onnx
import pytest
import torch
from family_checkpoints import make_granitemoehybrid
from safetensors.torch import load_file, save_file

import hybridrt
from hybridrt.errors import CheckpointError, QuantizationError
from hybridrt.export import export
from hybridrt.quantization import quantize

SMALL = exports.REPORT


def _as_released(src: Path, dst: Path, dtype: torch.dtype = torch.bfloat16, shards: int = 3) -> Path:
    """src's weights in `dtype`, split over `shards` safetensors files with an index, as hub
    checkpoints are stored."""
    dst.mkdir()
    tensors = {}
    for f in sorted(src.glob("*.safetensors")):
        tensors |= load_file(str(f))
    names = sorted(tensors)
    weight_map = {}
    for k in range(shards):
        part = names[k::shards]
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n].to(dtype).contiguous() for n in part}, str(dst / file), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(part, file)
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    for name in ("config.json", "tokenizer.json"):
        (dst / name).write_bytes((src / name).read_bytes())
    return dst


def _released_granite(directory: Path) -> Path:
    """Granite 4.0 H with six layers: a first Mamba2 layer, then Mamba2 and attention layers
    that repeat, so several layers share each traced template; in bf16 shards."""
    kinds = ["linear_attention", "linear_attention", "full_attention"] * 2
    return _as_released(exports.checkpoint(make_granitemoehybrid, num_hidden_layers=6, layer_types=kinds), directory)


@pytest.fixture(scope="module")
def granite() -> Path:
    return exports.checkpoint(_released_granite)


@pytest.fixture(scope="module")
def exported(granite: Path) -> Path:
    return exports.export(granite, validate=True)


def test_sharded_bf16_checkpoint_exports_with_parity(exported: Path) -> None:
    manifest = hybridrt.load(exported).manifest
    parity = manifest.parity
    assert parity["passed"] is True and parity["reference"] == "layer by layer"
    assert 0 <= parity["max_abs_logits"] <= 1e-4 and 0 <= parity["max_abs_state"] <= 1e-4
    assert len(parity["prompt"]) == 5 and parity["decode"]["steps"] > 0


def test_the_streamed_parity_check_catches_a_wrong_weight(granite: Path, exported: Path, tmp_path: Path) -> None:
    """The layer-by-layer check (reference outputs kept on disk, compared one at a time) is
    not vacuous: one layer's output projection scaled by 1.01 in the graph fails it."""
    from onnx import numpy_helper

    from hybridrt.export.parity import measure_parity_streamed
    from hybridrt.models.loading.checkpoint import open_weights

    model = onnx.load(str(exported / "model.onnx"))
    target = next(t for t in model.graph.initializer if "layers.3" in t.name and "out_proj" in t.name)
    target.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(target) * 1.01, target.name))
    onnx.save_model(model, str(tmp_path / "model.onnx"))
    with open_weights(granite) as weights:
        report = measure_parity_streamed(weights, tmp_path / "model.onnx", lengths=(7,), decode_steps=2)
    assert not report["passed"] and report["max_abs_logits"] > 1e-3, report
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".parity-")]  # the reference's outputs are gone


def test_the_graph_describes_its_state_pairs_in_its_metadata(exported: Path) -> None:
    """Every layout says, in the ONNX model's metadata, which state input pairs with which
    output (and its kind, dims, reset), so a runtime need not infer it from names; onnxruntime
    reads the entries back as the model's custom metadata."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(exported / "model.onnx"), providers=["CPUExecutionProvider"])
    meta = session.get_modelmeta().custom_metadata_map
    states = json.loads(meta["hybridrt.states"])
    pasts = [i.name for i in session.get_inputs() if i.name.startswith("past.")]
    presents = [o.name for o in session.get_outputs() if o.name.startswith("present.")]
    assert meta["hybridrt.layout"] == "hybridrt"
    assert [s["input"] for s in states] == pasts and [s["output"] for s in states] == presents
    assert all(s["input"].removeprefix("past.") == s["output"].removeprefix("present.") for s in states)
    assert {s["kind"] for s in states} == {"key", "value", "conv", "ssm"}, states


def test_each_distinct_layer_is_traced_once(exported: Path) -> None:
    """Six layers, three templates: the first layer, the Mamba2 layers after it, the attention
    layers; every layer's nodes are named under its own scope."""
    manifest = hybridrt.load(exported).manifest
    assert manifest.provenance["templates"] == [[0], [1, 3, 4], [2, 5]]
    graph = onnx.load(str(exported / "model.onnx"), load_external_data=False)
    names = [n.name for n in graph.graph.node]
    assert len(names) == len(set(names))
    for i in range(6):
        assert any(n.startswith(f"/model/layers.{i}/mixer/") for n in names)
    weights = {t.name for t in graph.graph.initializer}
    assert "model.layers.4.mixer.in_proj.weight" in weights and "model.layers.5.mixer.o_proj.weight" in weights


def test_streamed_weights_in_the_data_file_give_the_same_tokens(
    granite: Path, exported: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above the threshold every large initializer is written to model.onnx.data as it is made
    (page-aligned), and the graph generates what the one-file graph does."""
    from hybridrt.export import onnx_export

    monkeypatch.setattr(onnx_export, "EXTERNAL_DATA_THRESHOLD", 1024)
    export(granite, tmp_path / "ext")
    graph = onnx.load(str(tmp_path / "ext" / "model.onnx"), load_external_data=False)
    external = [t for t in graph.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert len(external) > 20
    offsets = [int(next(e.value for e in t.external_data if e.key == "offset")) for t in external]
    assert len(set(offsets)) == len(offsets)
    prompt = [[5, 6, 7, 8], [9, 10]]
    greedy = {"max_new_tokens": 8, "do_sample": False}
    assert hybridrt.load(tmp_path / "ext").generate(prompt, **greedy) == hybridrt.load(exported).generate(
        prompt, **greedy
    )


@pytest.mark.parametrize("mode", ["int4", "int8-dynamic"])
def test_quantize_while_exporting_equals_export_then_quantize(
    granite: Path, exported: Path, text_file: Path, tmp_path: Path, mode: str
) -> None:
    direct = hybridrt.export_model(
        granite, tmp_path / "direct", quantize=mode, quantize_options=SMALL, eval_text=text_file
    )
    after = quantize(exported, tmp_path / "after", mode, eval_text=text_file, **SMALL)
    a, b = direct.quantization, after.quantization
    assert a is not None and b is not None and a["direct"] is True
    assert sorted(a["quantized_nodes"]) == sorted(b["quantized_nodes"])
    assert a["excluded"] == b["excluded"]
    assert a["report"]["mean_kl"] == pytest.approx(b["report"]["mean_kl"], rel=1e-6)
    assert a["report"]["ppl_ratio"] == pytest.approx(b["report"]["ppl_ratio"], rel=1e-6)
    assert a["vocab"] == b["vocab"]
    assert direct.in_place == after.in_place and direct.in_place  # Granite's conv and SSM states
    assert not (tmp_path / "direct" / ".float").exists()
    # validate (the default) checks the float graph written beside for the report: its parity is
    # the quantized graph's parent's, as `quantize` records its parent's export parity.
    parity = a["parent"]["parity"]
    assert parity["passed"] is True and parity["max_abs_logits"] < parity["tolerance"]
    on_disk = json.loads((tmp_path / "direct" / "hybridrt.json").read_text())
    assert on_disk == json.loads(json.dumps(direct.to_dict()))  # the one manifest, written once
    ops = {n.op_type for n in onnx.load(str(tmp_path / "direct" / "model.onnx")).graph.node}
    assert ("MatMulNBits" if mode == "int4" else "MatMulInteger") in ops


def test_quantize_while_exporting_keeps_each_layers_shapes_apart(tmp_path: Path, text_file: Path) -> None:
    """int8-dynamic's shape inference names unknown dimensions per fragment (unk__0, ...); in
    one graph, onnxruntime would take equal names for equal sizes and reuse one layer's buffer
    for another of a different shape (Qwen3-Next's gated attention failed so at its first call)."""
    from family_checkpoints import make_qwen3_next

    src = exports.checkpoint(make_qwen3_next)
    direct = tmp_path / "direct"
    hybridrt.export_model(src, direct, quantize="int8-dynamic", validate=False)
    graph = onnx.load(str(direct / "model.onnx"), load_external_data=False).graph
    names = {d.dim_param for v in graph.value_info for d in v.type.tensor_type.shape.dim if d.dim_param}
    assert not [n for n in names if n.startswith("unk__")]
    after = tmp_path / "after"
    quantize(exports.family(make_qwen3_next), after, "int8-dynamic", eval_text=text_file, **SMALL)
    prompt = [[3, 4, 5, 6, 7, 8, 9]]
    assert hybridrt.load(direct).generate(prompt, max_new_tokens=6) == hybridrt.load(after).generate(
        prompt, max_new_tokens=6
    )


def test_quantize_while_exporting_without_text_skips_the_report(granite: Path, tmp_path: Path) -> None:
    manifest = hybridrt.export_model(granite, tmp_path / "q", quantize="int8-weight")
    assert manifest.quantization is not None and manifest.quantization["report_skipped"]
    # No float graph was written, so validate has nothing to check: it says so, not silently.
    assert "--eval-text" in manifest.quantization["parent"]["parity"]["skipped"]
    assert len(hybridrt.load(tmp_path / "q").generate([5, 6, 7], max_new_tokens=4)) == 4


def test_calibrating_modes_are_refused_before_any_work(granite: Path, tmp_path: Path) -> None:
    with pytest.raises(QuantizationError, match="hybridrt quantize"):
        hybridrt.export_model(granite, tmp_path / "q", quantize="int8-static")
    assert not (tmp_path / "q").exists()


def test_a_shard_that_does_not_match_the_config_is_named(granite: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in granite.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    index = json.loads((bad / "model.safetensors.index.json").read_text())
    name = "model.layers.2.self_attn.o_proj.weight"
    shard = bad / index["weight_map"][name]
    tensors = load_file(str(shard))
    tensors[name] = tensors[name][:, :-1].contiguous()
    save_file(tensors, str(shard))
    with pytest.raises(CheckpointError, match=r"o_proj.weight has shape"):
        export(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_an_export_that_would_not_fit_is_refused_before_any_work(
    granite: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The memory plan (export.streamed.memory_plan) against what the machine has: refused with
    the stage that would not fit and what to do, nothing written."""
    from hybridrt.errors import ExportError
    from hybridrt.export import streamed

    monkeypatch.setattr(streamed, "available_memory", lambda: 1_000_000)
    with pytest.raises(ExportError, match=r"needs about .* GB while checking parity .* --no-validate"):
        export(granite, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    monkeypatch.undo()
    manifest = export(granite, tmp_path / "ok")
    plan = manifest.provenance["memory_plan_mb"]
    assert plan["peak_bytes"] >= plan["write_bytes"] >= plan["overhead_bytes"] > 0


def test_a_model_id_exports_from_the_hugging_face_cache(granite: Path, tmp_path: Path) -> None:
    """`hybridrt export org/name`: the snapshot in the local hub cache (HF_HUB_OFFLINE, no
    network); an id that is not cached is a one-line error."""
    import os
    import subprocess
    import sys

    cache = tmp_path / "hub"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = cache / "models--acme--tiny-granite" / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for f in granite.iterdir():
        (snapshot / f.name).write_bytes(f.read_bytes())
    (cache / "models--acme--tiny-granite" / "refs").mkdir()
    (cache / "models--acme--tiny-granite" / "refs" / "main").write_text(commit)
    env = os.environ | {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    cli = [sys.executable, "-m", "hybridrt.cli", "export"]
    done = subprocess.run([*cli, "acme/tiny-granite", "-o", str(tmp_path / "out"), "--no-validate"], env=env)
    assert done.returncode == 0
    assert hybridrt.load(tmp_path / "out").manifest.provenance["source"] == str(snapshot.resolve())
    missing = subprocess.run(
        [*cli, "acme/not-cached", "-o", str(tmp_path / "x")], env=env, capture_output=True, text=True
    )
    assert missing.returncode == 2 and "not-cached" in missing.stderr and "Traceback" not in missing.stderr
