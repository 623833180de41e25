"""Exported graphs vs the PyTorch reference, and the exported directory itself."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import exports
import numpy as np
import onnx
import pytest
import torch
from checkpoints import make_jamba

import hybridrt
from hybridrt.export.onnx_export import checked_graph
from hybridrt.export.parity import measure_parity, ort_runner, torch_runner
from hybridrt.export.trace import GraphModule, feeds
from hybridrt.graphs.contract import GraphContract
from hybridrt.graphs.manifest import read_manifest
from hybridrt.models.loading.checkpoint import load_model
from hybridrt.models.state import zero_tensors

TOL = 1e-4
UNSEEN = (1, 3, 33, 129)  # the graph was traced at length 5


def _compare(model, run, length: int, past: int = 0) -> float:  # type: ignore[no-untyped-def]
    """Worst difference over logits and states; with `past`, rows have seen past and past + 4
    tokens (random states); KV buffers compared where they hold tokens."""
    g = torch.Generator().manual_seed(length)
    cfg = model.config
    ids = torch.randint(0, cfg.vocab_size, (2, length), generator=g)
    pasts = torch.tensor([past, past + 4]) if past else torch.zeros(2, dtype=torch.long)
    contract = GraphContract.of(cfg)
    states = zero_tensors(contract, 2, int(pasts.max()) + length + 3)
    if past:
        states = [s.normal_(generator=g) * 0.5 for s in states]
    args = feeds(contract, ids, pasts, states)
    with torch.no_grad():
        logits, *ref_states = GraphModule(model, contract)(*args)
    out = run(args)
    errs = [np.abs(out[0] - logits.numpy()).max()]
    ends = (pasts + length).numpy()
    for spec, o, r in zip(contract.pasts, out[1:], ref_states):
        d = np.abs(o - r.numpy())
        if spec.is_kv:
            d = d * (np.arange(d.shape[2])[None, :] < ends[:, None])[:, None, :, None]
        errs.append(d.max())
    return float(max(errs))


@pytest.mark.parametrize("length", UNSEEN)
def test_onnx_matches_reference_at_unseen_lengths(onnx_dir: Path, length: int) -> None:
    manifest = read_manifest(onnx_dir)
    model, _ = load_model(manifest.provenance["source"])
    run = ort_runner(onnx_dir / "model.onnx", model)
    assert _compare(model, run, length) <= TOL
    assert _compare(model, run, length, past=11) <= TOL  # continuing from non-zero states


def test_manifest_records_passing_parity(onnx_dir: Path) -> None:
    parity = read_manifest(onnx_dir).parity
    assert parity["passed"] is True
    assert [c["seq"] for c in parity["prompt"]] == [1, 7, 64, 300, 17]
    assert parity["decode"]["steps"] == 16
    assert 0 <= parity["max_abs_logits"] <= TOL


def test_manifest_describes_graph(onnx_dir: Path) -> None:
    manifest = read_manifest(onnx_dir)
    graph = onnx.load(str(onnx_dir / "model.onnx"), load_external_data=False)
    assert [i.name for i in graph.graph.input] == [s.name for s in manifest.inputs]
    assert [o.name for o in graph.graph.output] == [s.name for s in manifest.outputs]
    for value, spec in zip(graph.graph.input, manifest.inputs):
        dims = [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
        assert dims == list(spec.dims)
    assert set(manifest.files) >= {"model.onnx", "tokenizer.json"}
    data = json.loads((onnx_dir / "hybridrt.json").read_text())
    for key in ("schema_version", "architecture", "layer_types", "provenance", "files", "parity", "special_tokens"):
        assert key in data
    checked_graph(onnx_dir / "model.onnx")  # onnx.checker, allowing onnxruntime's fused norms


def test_node_names_are_hierarchical(jamba_onnx: Path) -> None:
    names = [n.name for n in onnx.load(str(jamba_onnx / "model.onnx")).graph.node]
    assert len(names) == len(set(names))
    assert "/model/layers.0/mixer/in_proj/MatMul" in names
    assert any(n.startswith("/model/layers.1/mixer/") for n in names)
    assert any(n.startswith("/lm_head/") for n in names)


@pytest.mark.parametrize("fixture", ["llama_onnx", "jamba_onnx"])
def test_every_node_feeds_an_output(fixture: str, request: pytest.FixtureRequest) -> None:
    """No node runs for nothing: llama's outer graph once computed rotary tables that no layer
    reads (its attention rotates inside the operator), at every call."""
    graph = onnx.load(str(request.getfixturevalue(fixture) / "model.onnx"), load_external_data=False).graph
    read = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    read |= {i for n in graph.node for a in n.attribute if a.type == a.GRAPH for m in a.g.node for i in m.input}
    assert [n.name for n in graph.node if not set(n.output) & read] == []
    assert {t.name for t in graph.initializer} <= read


def test_each_causal_conv_is_one_fused_node(jamba_onnx: Path) -> None:
    """The Mamba convs run as onnxruntime's CausalConvWithState, one node per Mamba layer, state
    in and out, and their SiLU as Sigmoid and Mul on its output (onnxruntime's vectorized
    QuickGelu once fused; the node's own SiLU is scalar): no Concat/Conv/Slice left for them."""
    nodes = onnx.load(str(jamba_onnx / "model.onnx")).graph.node
    convs = [n for n in nodes if n.op_type == "CausalConvWithState"]
    assert [n.name.split("/")[2] for n in convs] == ["layers.0", "layers.2"]
    assert all(n.domain == "com.microsoft" for n in convs)
    assert {a.s for n in convs for a in n.attribute if a.name == "activation"} == {b"none"}
    assert [n.input[3] for n in convs] == ["past.0.conv", "past.2.conv"]
    for conv in convs:
        readers = [n for n in nodes if conv.output[0] in n.input]
        assert sorted(n.op_type for n in readers) == ["Mul", "Sigmoid"]
        sigmoid = next(n for n in readers if n.op_type == "Sigmoid")
        mul = next(n for n in readers if n.op_type == "Mul")
        assert set(mul.input) == {conv.output[0], sigmoid.output[0]}
    assert not [n for n in nodes if n.op_type == "Conv"]


def test_each_mamba_scan_is_one_self_contained_scan(jamba_onnx: Path) -> None:
    """Each Mamba1 recurrence is one onnxruntime Scan over the tokens: it reads the state input
    of its layer and writes the present one, in contract 3's [batch, d_state, d_inner] layout,
    and its six-node body reads only its own inputs and its constant A (no outer-scope name,
    no export placeholder left)."""
    model = onnx.load(str(jamba_onnx / "model.onnx"))
    scans = [n for n in model.graph.node if n.op_type == "Scan"]
    assert [n.input[0] for n in scans] == ["past.0.ssm", "past.2.ssm"]
    assert [n.output[0] for n in scans] == ["present.0.ssm", "present.2.ssm"]
    for scan in scans:
        body = next(a.g for a in scan.attribute if a.name == "body")
        own = (
            {i.name for i in body.input} | {t.name for t in body.initializer} | {o for n in body.node for o in n.output}
        )
        assert {i for n in body.node for i in n.input} <= own
        assert [t.name for t in body.initializer] == ["A"] and len(body.node) == 6
        assert float(onnx.numpy_helper.to_array(body.initializer[0]).max()) < 0  # A = -exp(A_log)
    assert not {o.domain for o in model.opset_import} & {"hybridrt.export"}
    assert not [n for n in model.graph.node if n.op_type in ("SelectiveScan", "LinearAttention")]
    manifest = read_manifest(jamba_onnx)
    assert manifest.provenance["fused_norms"]["selective_scans"] == 2
    ssm = next(s for s in manifest.pasts if s.name == "past.0.ssm")
    cfg = manifest.config
    assert ssm.dims[1:] == (cfg["mamba_d_state"], cfg["kind_params"]["mamba"]["mamba_expand"] * cfg["hidden_size"])


@pytest.fixture(scope="module")
def jamba_traces(jamba_dir: Path) -> dict[str, Any]:
    """Jamba's outer graph and every distinct layer's template, layer 0's included, traced at 5
    and at 37 tokens (anew: no trace cache is read here), and the layer export makes layer 0's
    template from."""
    from hybridrt.export import fragments, onnx_export
    from hybridrt.export.templates import first_from

    cfg = load_model(jamba_dir)[0].config
    outer = fragments.outer_model(cfg)
    layers = list(range(cfg.num_layers))
    blocks, shared = fragments.layer_blocks(cfg, layers)
    groups: dict[tuple[object, ...], list[int]] = {}
    for i in layers:
        groups.setdefault(fragments.signature(cfg, outer, i, blocks[i], shared), []).append(i)
    traces: dict[int, dict[int, fragments.Template]] = {}
    decompositions = {"built": 0, "public": 0}  # the exporter's decomposition passes run, by path
    decompose = torch.export.ExportedProgram.run_decompositions
    with pytest.MonkeyPatch.context() as mp:
        path = "built"

        def counted(program: torch.export.ExportedProgram, *args: Any, **kwargs: Any) -> Any:
            decompositions[path] += 1
            return decompose(program, *args, **kwargs)

        mp.setattr(torch.export.ExportedProgram, "run_decompositions", counted)
        for seq in (5, 37):
            mp.setattr(fragments, "EXAMPLE_SEQ", seq)
            own = {m[0]: fragments.trace_layer(cfg, outer, m[0], blocks[m[0]], shared, True) for m in groups.values()}
            traces[seq] = own | {-1: fragments.trace_outer(cfg, outer, True)}
        # torch.onnx.export's own path, which builds the exporter's registry on every call
        path = "public"
        mp.setattr(fragments, "EXAMPLE_SEQ", 5)
        mp.setattr(onnx_export, "_registry", lambda: None)
        own = {m[0]: fragments.trace_layer(cfg, outer, m[0], blocks[m[0]], shared, True) for m in groups.values()}
        public = own | {-1: fragments.trace_outer(cfg, outer, True)}
    return {"traces": traces, "source": first_from(groups), "public": public, "decompositions": decompositions}


def test_node_count_does_not_depend_on_trace_length(jamba_traces: dict[str, Any]) -> None:
    """Nothing is unrolled over time: the outer graph and every distinct layer's template (what
    export instantiates for each layer) traced at 5 or 37 tokens have the same nodes."""
    counts = [[len(t.model.graph.node) for t in by_layer.values()] for by_layer in jamba_traces["traces"].values()]
    assert counts[0] == counts[1] and len(counts[0]) >= 4


def _canonical(template: Any, index: int, node_names: bool = True) -> list[str]:
    """The template with layer `index`'s names as layer 0's and every other value named by what
    computes it (its node's operator, attributes and canonical inputs; a constant by its
    content): two graphs that differ only in the exporter's value names (its note of each
    input's argument number, its numbering of size symbols and of nodes) and in the order of
    independent nodes print alike."""
    graph = template.model.graph
    scope = f"layers.{index}"
    names: dict[str, str] = {v.name: v.name.replace(scope, "layers.0") for v in graph.input}
    for t in graph.initializer:
        content = onnx.TensorProto()
        content.CopyFrom(t)
        content.name = ""
        names[t.name] = "const:" + hashlib.sha256(content.SerializeToString()).hexdigest()[:16]
    nodes = []
    for node in graph.node:  # topologically sorted, as every saved ONNX graph is
        attrs = sorted(str(attr) for attr in node.attribute)
        scoped = re.sub(r"_\d+$", "", node.name.replace(scope, "layers.0")) if node_names else ""
        described = repr((node.domain, node.op_type, scoped, attrs, [names.get(i, i) for i in node.input]))
        for k, out in enumerate(node.output):
            if out:
                names[out] = hashlib.sha256(f"{described}#{k}".encode()).hexdigest()[:16]
        nodes.append(described)
    ios = []
    for value in [*graph.input, *graph.output]:
        v = onnx.ValueInfoProto()
        v.CopyFrom(value)
        own = value.name.replace(scope, "layers.0")
        v.name = own if names.get(value.name) == own else f"{own}={names.get(value.name)}"
        del v.metadata_props[:]  # the exporter's record of its argument numbers
        for dim in v.type.tensor_type.shape.dim:  # torch's numbering of its own size symbols
            if dim.dim_param[:1] == "s" and dim.dim_param[1:].isdigit():
                dim.dim_param = "s"
        ios.append(str(v))
    return sorted(nodes) + sorted(ios)


def test_the_exporter_registry_built_once_gives_torch_onnx_exports_graphs(jamba_traces: dict[str, Any]) -> None:
    """Templates are translated with the exporter's registry built once per process (the torch
    the project pins takes it) and, where every operator translates as traced, without the
    exporter's decomposition pass; every Jamba template has the nodes torch.onnx.export writes,
    fused operators' translations included. Node names aside: where the decomposition pass
    rewrites a node it drops the node's module scope (one Split of Jamba's layer 0 is named
    "/Split" by torch.onnx.export's path, "/model/layers.0/mixer/Split" by this one)."""
    from hybridrt.export import onnx_export

    assert onnx_export._registry() is not None
    built, public = jamba_traces["traces"][5], jamba_traces["public"]
    assert built.keys() == public.keys()
    assert any(n.domain == "com.microsoft" for t in built.values() for n in t.model.graph.node)
    assert jamba_traces["decompositions"] == {"built": 0, "public": len(public)}
    for i in built:
        assert _canonical(built[i], max(i, 0), False) == _canonical(public[i], max(i, 0), False), f"template {i}"


def test_layer_0_made_from_a_later_layer_is_the_traced_one(jamba_traces: dict[str, Any]) -> None:
    """Export makes layer 0's template from a later layer's with the same signature (dropping
    the Add that joins the previous block's output) instead of tracing it: the result has the
    traced template's nodes, inputs and outputs, up to the exporter's value names."""
    from hybridrt.export.templates import first_layer

    k = jamba_traces["source"]
    assert k is not None and k > 0
    traced = jamba_traces["traces"][5]
    made = first_layer(traced[k])
    assert made is not None and "r" not in {v.name for v in made.model.graph.input}
    assert "r" in {v.name for v in traced[k].model.graph.input}
    assert _canonical(made, k) == _canonical(traced[0], 0)
    assert len(made.model.graph.node) == len(traced[k].model.graph.node) - 1
    assert first_layer(traced[0]) is None  # no r, nothing to drop: export traces such a layer


@pytest.mark.parametrize("fmt", ["torchscript", "pt2"])
def test_torch_graph_matches_reference(jamba_dir: Path, fmt: str) -> None:
    from hybridrt.export.torch_export import load_torch_graph

    out = exports.export(make_jamba, format=fmt, validate=True)
    manifest = read_manifest(out)
    path = out / manifest.graph_file
    model, _ = load_model(jamba_dir)
    run = torch_runner(load_torch_graph(path))
    for length in UNSEEN:
        assert _compare(model, run, length) <= TOL
    assert manifest.parity["passed"] is True


def test_contract_lists_states_per_layer_kind(jamba_dir: Path) -> None:
    model, _ = load_model(jamba_dir)
    contract = GraphContract.of(model.config)
    names = contract.input_names
    assert names[:3] == ["input_ids", "past_lengths", "logit_positions"]
    assert names[3:7] == ["past.0.conv", "past.0.ssm", "past.1.key", "past.1.value"]
    outs = contract.output_names
    assert outs[0] == "logits" and outs[1] == "present.0.conv"
    assert [s.name for s in contract.layer_pasts(1)] == ["past.1.key", "past.1.value"]
    assert [s.name for s in contract.head_inputs] == names[:3] and contract.takes_lengths


def test_full_parity_measurement_fails_a_wrong_graph(jamba_dir: Path) -> None:
    """The export gate can fail: a graph that is off by a little is reported as failing."""
    model, _ = load_model(jamba_dir)

    def wrong(args):  # type: ignore[no-untyped-def]
        with torch.no_grad():
            logits, *states = GraphModule(model)(*args)
        return [logits.numpy() + 1e-3] + [s.numpy() for s in states]

    report = measure_parity(model, wrong, lengths=(7,))
    assert report["passed"] is False and report["max_abs_logits"] >= 1e-3


def test_large_models_use_external_data(jamba_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Above the threshold, weights go to model.onnx.data; the runtime loads the pair."""
    from hybridrt.export import onnx_export

    monkeypatch.setattr(onnx_export, "EXTERNAL_DATA_THRESHOLD", 1024)
    manifest = hybridrt.export_model(jamba_dir, tmp_path / "out")
    assert {"model.onnx", "model.onnx.data"} <= set(manifest.files)
    graph = onnx.load(str(tmp_path / "out" / "model.onnx"), load_external_data=False)
    external = [t for t in graph.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert any(t.name.endswith("embed_tokens.weight") for t in external)
    assert manifest.parity["passed"] is True
    model = hybridrt.load(tmp_path / "out")
    assert len(model.generate([[5, 6, 7]], max_new_tokens=4, do_sample=False)[0]) == 4


def test_plain_ops_graph_matches_reference(jamba_dir: Path) -> None:
    """--plain-ops: standard ONNX operators only, the chunked scan in the graph."""
    out = exports.export(make_jamba, fused_ops=False, validate=True)
    manifest = read_manifest(out)
    graph = onnx.load(str(out / "model.onnx"))
    assert {n.domain for n in graph.graph.node} <= {"", "ai.onnx"}
    assert manifest.parity["passed"] is True and manifest.provenance["fused_ops"] is False
    model, _ = load_model(jamba_dir)
    run = ort_runner(out / "model.onnx", model)
    for length in UNSEEN:
        assert _compare(model, run, length) <= TOL


def test_rotary_runs_inside_group_query_attention() -> None:
    """Head and rotary sizes onnxruntime's kernel takes: q and k rotate inside the fused node
    (llama3-scaled frequencies included), exactly, and greedy decoding equals transformers."""
    from checkpoints import make_llama
    from transformers import AutoModelForCausalLM

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    src = exports.checkpoint(
        make_llama,
        hidden_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        rope_scaling=scaling | {"original_max_position_embeddings": 64},
    )
    out = exports.export(src, validate=True)
    manifest = read_manifest(out)
    assert manifest.parity["passed"] is True and manifest.parity["max_abs_logits"] <= TOL
    nodes = onnx.load(str(out / "model.onnx")).graph.node
    attention = [n for n in nodes if n.op_type == "GroupQueryAttention"]
    assert len(attention) == 2
    assert all({a.name: a.i for a in n.attribute}["do_rotary"] == 1 for n in attention)
    # One projection for query, key and value, in the operator's packed form.
    assert all(list(n.input[1:3]) == ["", ""] for n in attention)
    packed = [n for n in nodes if n.op_type == "MatMul" and "/qkv_proj/" in n.name]
    assert len(packed) == 2 and not any("/q_proj/" in n.name or "/k_proj/" in n.name for n in nodes)
    assert manifest.provenance["fused_norms"]["packed_qkv"] == 2
    prompt = list(range(5, 30))
    hf = AutoModelForCausalLM.from_pretrained(src).eval()
    with torch.no_grad():
        ids = torch.tensor([prompt])
        ref = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=16)
    tokens = hybridrt.load(out).generate(prompt, max_new_tokens=16, do_sample=False)
    assert tokens == ref[0, len(prompt) :].tolist()
