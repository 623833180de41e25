"""`hybridrt triton`: the model repository for Triton's onnxruntime backend, its config.pbtxt
parsed with Triton's own ModelConfig schema (tritonclient), and the client example's decode loop
driven against a stand-in for Triton's implicit state (Triton itself cannot run here)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import exports
import numpy as np
import onnxruntime as ort
import pytest

import hybridrt
from hybridrt.cli import main
from hybridrt.deploy.triton import DATA_TYPES, TritonOptions, config_text, plan, write_repository
from hybridrt.errors import DeployError
from hybridrt.graphs.contract import TensorSpec
from hybridrt.graphs.manifest import MANIFEST, Manifest, read_manifest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def mamba2_onnx() -> Path:
    """A model whose states are all fixed-size (Mamba2 conv + SSM): what Triton can hold."""
    from family_checkpoints import make_mamba2

    return exports.family(make_mamba2)


def parse(text: str) -> Any:
    """config.pbtxt as Triton reads it: text format into inference.ModelConfig."""
    import tritonclient.grpc.model_config_pb2 as pb
    from google.protobuf import text_format

    return text_format.Parse(text, pb.ModelConfig())


def as_dict(config: Any) -> dict[str, Any]:
    """The config as tritonclient's gRPC get_model_config(as_json=True) returns it."""
    from google.protobuf import json_format

    return json_format.MessageToDict(config, preserving_proto_field_name=True)


def batchable(manifest: Manifest) -> bool:
    """Triton can batch the graph: every non-state input it receives has a leading batch dim
    (logit_positions [n] has none, but the repository's graph computes it)."""
    sent = [s for s in manifest.inputs if not s.name.startswith("past.") and s.name != "logit_positions"]
    return all(s.dims[:1] == ("batch",) for s in sent)


def growing_copy(model: Path, tmp: Path) -> Path:
    """A copy of an exported directory as the graph contract before fixed-size KV (schema 1)
    described it: KV states that grow per token."""
    out = tmp / "growing"
    shutil.copytree(model, out)
    data = json.loads((out / MANIFEST).read_text())
    data["schema_version"] = 1
    for spec in data["inputs"] + data["outputs"]:
        grown = "past_len" if spec["name"].startswith("past.") else "total_len"
        spec["dims"] = [grown if d in ("capacity", "past_len", "total_len") else d for d in spec["dims"]]
    (out / MANIFEST).write_text(json.dumps(data))
    return out


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("triton_client", ROOT / "examples" / "triton_client.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_repository_layout_and_config(mamba2_onnx: Path, tmp_path: Path) -> None:
    target = write_repository(mamba2_onnx, tmp_path / "repo", TritonOptions(name="tiny", instances=2))
    assert target == tmp_path / "repo" / "tiny"
    assert sorted(p.name for p in target.iterdir()) == ["1", "config.pbtxt", "hybridrt"]
    assert (target / "hybridrt" / "tokenizer.json").is_file() and (target / "hybridrt" / "hybridrt.json").is_file()
    config = parse((target / "config.pbtxt").read_text())
    manifest = read_manifest(mamba2_onnx)
    batched = batchable(manifest)
    assert config.name == "tiny" and config.backend == "onnxruntime"
    assert config.max_batch_size == (8 if batched else 0)
    assert config.WhichOneof("scheduling_choice") == "sequence_batching"
    batching = config.sequence_batching
    assert batching.WhichOneof("strategy_choice") == "direct"
    kinds = {c.name: c.control[0] for c in batching.control_input}
    assert set(kinds) == {"START", "READY", "CORRID"}
    assert list(kinds["START"].int32_false_true) == [0, 1] and list(kinds["READY"].int32_false_true) == [0, 1]
    [group] = config.instance_group
    assert group.count == 2 and group.kind == group.KIND_CPU

    assert [s.input_name for s in batching.state] == [s.name for s in manifest.pasts]
    data_type = config.DESCRIPTOR.fields_by_name["input"].message_type.fields_by_name["data_type"].enum_type
    for state, past in zip(batching.state, manifest.pasts):
        assert state.output_name == past.name.replace("past.", "present.", 1)
        assert data_type.values_by_number[state.data_type].name == DATA_TYPES[past.dtype]
        assert list(state.dims) == ([] if batched else [1]) + list(past.dims[1:])  # the batch dim is Triton's
        [initial] = state.initial_state
        assert initial.zero_data and list(initial.dims) == list(state.dims) and initial.data_type == state.data_type
    sent = [s.name for s in manifest.inputs if not s.name.startswith("past.") and s.name != "logit_positions"]
    assert [i.name for i in config.input] == sent  # logit_positions: computed in the repository's graph
    assert [o.name for o in config.output] == ["logits"]
    assert list(config.output[0].dims) == ([] if batched else [1]) + [-1, manifest.vocab_size]


def test_graph_gains_the_control_inputs(mamba2_onnx: Path, tmp_path: Path) -> None:
    """Triton's onnxruntime backend refuses control inputs the graph does not declare."""
    target = write_repository(mamba2_onnx, tmp_path / "repo")
    inputs = {i.name: i for i in ort.InferenceSession(str(target / "1" / "model.onnx")).get_inputs()}
    shape = ["batch", 1] if batchable(read_manifest(mamba2_onnx)) else [1]
    assert inputs["START"].shape == shape and inputs["START"].type == "tensor(int32)"
    assert inputs["READY"].type == "tensor(int32)" and inputs["CORRID"].type == "tensor(uint64)"
    original = [i.name for i in ort.InferenceSession(str(mamba2_onnx / "model.onnx")).get_inputs()]
    assert "logit_positions" in original and "logit_positions" not in inputs  # computed in the copy
    assert list(inputs)[: len(original) - 1] == [n for n in original if n != "logit_positions"]


class TritonStandIn:
    """What Triton does for one sequence slot with implicit state, on the repository's graph:
    zero states at sequence start, each present fed back as the next past, the control inputs
    filled in, a reshaped [batch] input restored. Not Triton: its scheduling is not modelled."""

    def __init__(self, target: Path, config: dict[str, Any]) -> None:
        self.session = ort.InferenceSession(str(target / "1" / "model.onnx"))
        self.config = config
        self.batched = int(config.get("max_batch_size", 0)) > 0
        self.states: dict[int, dict[str, np.ndarray]] = {}

    def __call__(self, feeds: dict[str, np.ndarray], sequence_id: int, start: bool, end: bool) -> np.ndarray:
        specs = self.config["sequence_batching"]["state"]
        if start:
            lead = [1] if self.batched else []
            self.states[sequence_id] = {
                s["input_name"]: np.zeros(lead + [int(d) for d in s["dims"]], np.float32) for s in specs
            }
        states = self.states[sequence_id]
        feeds = dict(feeds)
        for spec in self.config["input"]:
            if "reshape" in spec and self.batched:
                feeds[spec["name"]] = feeds[spec["name"]].reshape(
                    1, *[int(d) for d in spec["reshape"].get("shape", [])]
                )
        control = (1, 1) if self.batched else (1,)
        feeds |= {
            "START": np.full(control, int(start), np.int32),
            "READY": np.ones(control, np.int32),
            "CORRID": np.full(control, sequence_id, np.uint64),
        }
        names = ["logits"] + [s["output_name"] for s in specs]
        logits, *presents = self.session.run(names, feeds | states)
        self.states[sequence_id] = {s["input_name"]: p for s, p in zip(specs, presents)}
        if end:
            del self.states[sequence_id]
        return logits


@pytest.mark.parametrize("name", ["mamba2", "jamba"])
def test_client_decode_loop_equals_generate(name: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """The example client's prefill + decode requests, with states kept as config.pbtxt says
    (jamba's KV as fixed-size states of kv_capacity rows), give the runtime's greedy tokens;
    two interleaved sequences keep their own states."""
    directory = request.getfixturevalue(f"{name}_onnx")
    example = load_example()
    target = write_repository(directory, tmp_path / "repo", TritonOptions(kv_capacity=32))
    config = as_dict(parse((target / "config.pbtxt").read_text()))
    triton = TritonStandIn(target, config)
    model = hybridrt.load(directory)
    for sequence_id, prompt in ((7, [5, 77, 300, 12, 9]), (8, [40, 41])):
        want = model.generate(prompt, max_new_tokens=6, do_sample=False, eos_token_id=[])
        assert example.generate(triton, config, prompt, 6, set(), sequence_id) == want
    assert triton.states == {}  # sequence_end released both


def test_client_example_parses_arguments() -> None:
    example = load_example()
    args = example.parse_args(["hi", "--repo", "r", "--model", "m", "--protocol", "http", "--sequence-id", "5"])
    assert (args.prompt, args.model, args.url, args.sequence_id, args.max_new_tokens) == (
        "hi",
        "m",
        "localhost:8000",
        5,
        32,
    )
    assert example.parse_args(["hi", "--repo", "r", "--model", "m"]).url == "localhost:8001"
    with pytest.raises(SystemExit) as e:
        example.parse_args(["hi", "--repo", "r", "--model", "m", "--max-new-tokens", "0"])
    assert e.value.code == 2


def test_client_example_reaches_for_the_server(mamba2_onnx: Path, tmp_path: Path) -> None:
    """Without a server (none runs here) the example gets as far as asking Triton for the
    model's config: it read the tokenizer and manifest from the repository and built the client."""
    import tritonclient.utils as utils

    example = load_example()
    target = write_repository(mamba2_onnx, tmp_path / "repo")
    argv = ["def", "--repo", str(target.parent), "--model", target.name, "--url", "localhost:1"]
    with pytest.raises(utils.InferenceServerException, match="UNAVAILABLE"):
        example.main(argv)


def test_growing_kv_is_refused(jamba_onnx: Path, tmp_path: Path) -> None:
    """Attention KV that grows per token cannot be a zero-initialised implicit state: a directory
    of that contract is refused, with the re-export that fixes it, before anything is written."""
    with pytest.raises(hybridrt.GraphError, match=r"schema version 1.*grows its KV per token.*Re-export"):
        write_repository(growing_copy(jamba_onnx, tmp_path), tmp_path / "repo")
    assert not (tmp_path / "repo").exists()  # refused before anything was written


def test_cli_writes_and_refuses(mamba2_onnx: Path, jamba_onnx: Path, tmp_path: Path, capsys: Any) -> None:
    repo = tmp_path / "repo"
    assert main(["triton", str(mamba2_onnx), "-o", str(repo), "--name", "m", "--gpu", "--max-batch-size", "0"]) == 0
    config = parse((repo / "m" / "config.pbtxt").read_text())
    assert config.max_batch_size == 0 and config.instance_group[0].kind == config.instance_group[0].KIND_GPU
    capsys.readouterr()
    assert main(["triton", str(mamba2_onnx), "-o", str(repo), "--name", "m"]) == 2
    err = capsys.readouterr().err
    assert "exists" in err and "--force" in err, err
    assert main(["triton", str(mamba2_onnx), "-o", str(repo), "--name", "m", "--force"]) == 0
    want = 8 if batchable(read_manifest(mamba2_onnx)) else 0
    assert parse((repo / "m" / "config.pbtxt").read_text()).max_batch_size == want
    assert main(["triton", str(growing_copy(jamba_onnx, tmp_path)), "-o", str(repo)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hybridrt: error: ") and "schema version 1" in err[0], err
    assert sorted(p.name for p in repo.iterdir()) == ["m"]


def fixed_kv(manifest: Manifest) -> Manifest:
    """The jamba manifest in the fixed-size KV contract: input_ids, past_lengths [batch],
    logit_positions [n], KV [batch, kv_heads, capacity, head_dim] for past and present."""

    def capacity(spec: TensorSpec) -> TensorSpec:
        dims = tuple("capacity" if d in ("past_len", "total_len") else d for d in spec.dims)
        return dataclasses.replace(spec, dims=dims)

    inputs = [
        TensorSpec("input_ids", ("batch", "seq"), "int64", "input_ids"),
        TensorSpec("past_lengths", ("batch",), "int64", "past_lengths"),
        TensorSpec("logit_positions", ("n",), "int64", "logit_positions"),
    ] + [capacity(s) for s in manifest.pasts]
    logits = TensorSpec("logits", ("batch", "n", manifest.vocab_size), "float32", "logits")
    outputs = [logits] + [capacity(s) for s in manifest.presents]
    return dataclasses.replace(manifest, inputs=inputs, outputs=outputs, schema_version=3)


def test_fixed_size_kv_contract(jamba_onnx: Path) -> None:
    """KV with a "capacity" dim becomes a fixed state of kv_capacity rows; logit_positions (no
    batch dim) is computed in the repository's graph, so sequences batch (max_batch_size 8)."""
    manifest = fixed_kv(read_manifest(jamba_onnx))
    config = parse(config_text(plan(manifest, TritonOptions(kv_capacity=64))))
    assert config.max_batch_size == 8
    states = {s.input_name: list(s.dims) for s in config.sequence_batching.state}
    assert set(states) == {s.name for s in manifest.pasts}
    for past in manifest.pasts:
        want = [64 if d == "capacity" else d for d in past.dims[1:]]
        assert states[past.name] == want
    assert states["past.1.key"][1] == 64 and states["past.0.conv"] == list(manifest.pasts[0].dims[1:])
    inputs = {i.name: list(i.dims) for i in config.input}
    assert inputs == {"input_ids": [-1], "past_lengths": [1]}
    default = parse(config_text(plan(manifest, TritonOptions())))
    assert default.sequence_batching.state[2].dims[1] == min(2048, manifest.max_length)


def test_fixed_size_kv_errors(jamba_onnx: Path) -> None:
    manifest = fixed_kv(read_manifest(jamba_onnx))
    with pytest.raises(DeployError, match="between 1 and the model's max length"):
        plan(manifest, TritonOptions(kv_capacity=manifest.max_length + 1))
    unbatched = dataclasses.replace(
        manifest, inputs=[*manifest.inputs[:3], TensorSpec("extra", ("n",), "int64", "extra"), *manifest.inputs[3:]]
    )
    with pytest.raises(DeployError, match=r"extra \['n'\] has no leading batch dim.*max_batch_size=0"):
        plan(unbatched, TritonOptions(max_batch_size=8))
    assert plan(unbatched, TritonOptions()).max_batch_size == 0
    config = parse(config_text(plan(manifest, TritonOptions(kv_capacity=16))))
    assert config.max_batch_size == 8
    [lengths] = [i for i in config.input if i.name == "past_lengths"]
    assert list(lengths.dims) == [1] and lengths.HasField("reshape") and list(lengths.reshape.shape) == []
    odd = dataclasses.replace(
        manifest,
        inputs=[
            dataclasses.replace(s, dims=("batch", 2, "window", 8)) if s.name == "past.1.key" else s
            for s in manifest.inputs
        ],
    )
    with pytest.raises(DeployError, match="symbolic dim 'window'"):
        plan(odd, TritonOptions())
    with pytest.raises(DeployError, match="runs ONNX graphs"):
        plan(dataclasses.replace(manifest, format="torchscript"), TritonOptions())
    with pytest.raises(DeployError, match="at least one instance"):
        plan(manifest, TritonOptions(instances=0))


def test_runtime_only_install_names_the_extra(mamba2_onnx: Path, tmp_path: Path) -> None:
    """Editing the graph needs onnx: without it, one line naming the extra and nothing written."""
    code = "import sys\nsys.modules['onnx'] = None\nfrom hybridrt.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    argv = ["triton", str(mamba2_onnx), "-o", str(tmp_path / "repo")]
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "pip install 'hybridrt[export]'" in done.stderr
    assert not (tmp_path / "repo" / "mamba2").exists() and list((tmp_path / "repo").glob(".*")) == []
