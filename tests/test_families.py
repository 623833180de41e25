"""One suite, run on every family of `family_checkpoints.BUILDERS` (a tiny random checkpoint
of each, built with transformers): reference vs transformers, step-by-step decode and
chunked prefill from a non-zero state equal to one full forward, rows of different lengths
in one call, ONNX export parity at several lengths, greedy tokens vs transformers' generate, batches vs single
prompts, and quantization. A new family adds a builder there and is tested by all of it.
The `ckpt` and `exported` fixtures (tests/conftest.py) build each family once per session."""

from __future__ import annotations

import json
from pathlib import Path

import exports
import numpy as np
import pytest
import torch
from family_checkpoints import BUILDERS

import hybridrt
from hybridrt.errors import UnsupportedArchitectureError
from hybridrt.graphs.contract import past_specs
from hybridrt.graphs.manifest import read_manifest
from hybridrt.models.loading.checkpoint import load_config, load_model
from hybridrt.models.state import zero_tensors
from hybridrt.quantization import quantize

TOL = 1e-4
SMALL = exports.REPORT
FAMILIES = sorted(BUILDERS)
GREEDY = {"max_new_tokens": 32, "min_new_tokens": 32}


@pytest.fixture(scope="session", params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _forward(model, ids, past, states):  # type: ignore[no-untyped-def]
    """ids [b, l] after `past` tokens (an int, or one per row) held by `states`."""
    lengths = torch.as_tensor(past, dtype=torch.long).expand(ids.shape[0]).contiguous()
    with torch.no_grad():
        return model(ids, lengths, None, states)


def _fresh(model, batch: int, capacity: int = 80):  # type: ignore[no-untyped-def]
    return zero_tensors(model.config, batch, capacity)


def _valid(spec, x, n: int):  # type: ignore[no-untyped-def]
    """A state as far as it is defined: KV buffers up to n positions."""
    return x[:, :, :n] if spec.is_kv else x


def _prompt(length: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed + length).integers(3, 320, length).tolist()


@pytest.mark.parametrize("length", [1, 7, 64, 300])
def test_reference_matches_transformers(ckpt: Path, length: int) -> None:
    from transformers import AutoModelForCausalLM

    model, _ = load_model(ckpt)
    hf = AutoModelForCausalLM.from_pretrained(ckpt).eval()
    ids = torch.randint(3, model.config.vocab_size, (2, length), generator=torch.Generator().manual_seed(length))
    logits, _ = _forward(model, ids, 0, _fresh(model, 2, length))
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    assert (logits - ref).abs().max().item() <= TOL


def test_step_by_step_decode_equals_full_forward(ckpt: Path) -> None:
    model, _ = load_model(ckpt)
    ids = torch.randint(3, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    full, full_states = _forward(model, ids, 0, _fresh(model, 2, 24))
    logits, states = _forward(model, ids[:, :8], 0, _fresh(model, 2, 24))
    steps = [logits]
    for t in range(8, 24):
        logits, states = _forward(model, ids[:, t : t + 1], t, states)
        steps.append(logits)
    assert (torch.cat(steps, dim=1) - full).abs().max().item() <= TOL
    for x, y in zip(states, full_states):
        assert (x - y).abs().max().item() <= TOL


def test_rows_of_different_lengths_share_a_call(ckpt: Path) -> None:
    """Rows that have seen 5 and 11 tokens take 6 more in one call: each gets the logits and
    states it gets alone (every row written and read at its own positions)."""
    model, _ = load_model(ckpt)
    g = torch.Generator().manual_seed(3)
    heads = [torch.randint(3, model.config.vocab_size, (1, n), generator=g) for n in (5, 11)]
    tails = torch.randint(3, model.config.vocab_size, (2, 6), generator=g)
    alone, carried = [], []
    for r, head in enumerate(heads):
        _, states = _forward(model, head, 0, _fresh(model, 1, 20))
        carried.append(states)
        alone.append(_forward(model, tails[r : r + 1], head.shape[1], states))
    batch_states = [torch.cat([a, b]) for a, b in zip(*carried)]
    out, states = _forward(model, tails, [5, 11], batch_states)
    for r, (logits, row_states) in enumerate(alone):
        assert (out[r : r + 1] - logits).abs().max().item() <= TOL
        for spec, x, y in zip(past_specs(model.config), states, row_states):
            n = (5, 11)[r] + 6
            assert (_valid(spec, x[r : r + 1], n) - _valid(spec, y, n)).abs().max().item() <= TOL, spec.name


@pytest.mark.parametrize("split", [1, 17, 40])
def test_chunked_prefill_equals_one_shot(ckpt: Path, split: int) -> None:
    """The second chunk starts from the first chunk's states (non-zero initial SSM state)."""
    model, _ = load_model(ckpt)
    ids = torch.randint(3, model.config.vocab_size, (2, 70), generator=torch.Generator().manual_seed(2))
    full, full_states = _forward(model, ids, 0, _fresh(model, 2))
    a, states = _forward(model, ids[:, :split], 0, _fresh(model, 2))
    b, states = _forward(model, ids[:, split:], split, states)
    assert (torch.cat([a, b], dim=1) - full).abs().max().item() <= TOL
    for x, y in zip(states, full_states):
        assert (x - y).abs().max().item() <= TOL


def test_export_parity_passes(exported: Path) -> None:
    parity = json.loads((exported / "hybridrt.json").read_text())["parity"]
    assert parity["passed"] is True
    assert [c["seq"] for c in parity["prompt"]] == [1, 7, 64, 300, 17]
    assert parity["prompt"][-1]["pasts"] == [3, 9]  # rows of different lengths in one call
    assert 0 <= parity["max_abs_logits"] <= TOL and 0 <= parity["max_abs_state"] <= TOL


@pytest.mark.parametrize("length", [1, 9])
def test_greedy_matches_transformers(ckpt: Path, exported: Path, length: int) -> None:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(ckpt).eval()
    ids = _prompt(length)
    t = torch.tensor([ids])
    with torch.no_grad():
        ref = hf.generate(t, attention_mask=torch.ones_like(t), do_sample=False, **GREEDY)
    assert hybridrt.load(exported).generate(ids, do_sample=False, **GREEDY) == ref[0, length:].tolist()


def test_batch_of_different_lengths_equals_each_prompt_alone(exported: Path) -> None:
    model = hybridrt.load(exported)
    prompts = [_prompt(n) for n in (1, 7, 20)]
    assert model.generate(prompts, **GREEDY) == [model.generate(p, **GREEDY) for p in prompts]


def test_states_in_place_equal_two_buffers(exported: Path) -> None:
    """Every conv and SSM state is read and written in one buffer (graphs.manifest.in_place_states) but a
    Mamba1 layer's SSM (an onnxruntime Scan), and generation in place (the default stepper)
    gives the logits of two alternating buffers bit for bit."""
    model = hybridrt.load(exported)
    m = model.manifest
    mamba1 = {i for i, kind in enumerate(m.layer_types) if kind == "mamba"}
    fixed = [s for s in m.pasts if not s.is_kv]
    assert m.in_place == [s.name for s in fixed if not (s.layer in mamba1 and s.kind == "ssm")]
    fast, slow = model.stepper(2, 48), model.stepper(2, 48, ring=2)
    rng = np.random.default_rng(0)
    for n in (7, 5, 1, 1, 1, 1):
        ids = rng.integers(3, 320, (2, n)).astype(np.int64)
        np.testing.assert_array_equal(fast.forward(ids), slow.forward(ids))


@pytest.mark.parametrize(
    ("mode", "ppl", "kl"), [("int8-dynamic", 0.02, 0.05), ("int4", 0.08, 0.3), ("float16", 0.01, 5e-3)]
)
def test_quantized_graph_stays_close_to_float(
    family: str, exported: Path, text_file: Path, tmp_path: Path, mode: str, ppl: float, kl: float
) -> None:
    """Every family quantizes: the graph loads, decodes, its perplexity stays under the bounds
    the default model is held to (1.02 for int8, 1.08 for int4) and its mean KL from float
    stays small (the tiny random models measure at most 0.009 for int8, 0.20 for int4 (lfm2_moe,
    rtn and mse alike) and 7e-4 for float16; a wrongly quantized graph is off by nats). The
    perplexity bound is one-sided: these random models predict nearly uniformly, so a shift of the
    KL's size moves their perplexity either way, and a lower one is no sign of a wrong graph
    (bamba at int4: ratio 0.976 with rtn, 0.899 with mse, mean KL 0.0885 and 0.0872; lfm2 0.940
    with rtn). Greedy agreement is not asserted: on random weights one early flip ends it."""
    out = tmp_path / "q"
    manifest = quantize(exported, out, mode, eval_text=text_file, **SMALL)
    assert manifest.quantization is not None
    report = manifest.quantization["report"]
    assert report["ppl_ratio"] < 1 + ppl, report
    assert report["mean_kl"] < kl, report
    assert len(hybridrt.load(out).generate(_prompt(5), **GREEDY)) == GREEDY["max_new_tokens"]


def test_every_layer_and_feed_forward_kind_is_tested_by_a_family() -> None:
    """Each kind of the tables (hybridrt.kinds, hybridrt.ffn_kinds) appears in some family of this
    suite, so a new kind cannot land without the exactness tests above running on it."""
    from hybridrt.ffn_kinds import FFN_KINDS
    from hybridrt.kinds import LAYER_KINDS

    layers: set[str] = set()
    ffns: set[str] = set()
    for name in FAMILIES:
        cfg = load_config(exports.checkpoint(BUILDERS[name]))[0]
        layers.update(cfg.layer_types)
        ffns.update(cfg.ffn_types)
    assert set(LAYER_KINDS) - layers == set()
    assert set(FFN_KINDS) - ffns == set()


def _with_config(src: Path, dst: Path, **changes: object) -> Path:
    dst.mkdir()
    data = json.loads((src / "config.json").read_text()) | changes
    (dst / "config.json").write_text(json.dumps(data))
    return dst


@pytest.mark.parametrize(
    "overrides",
    [
        {"embedding_multiplier": 1.0, "residual_multiplier": 1.0, "logits_scaling": 1.0},
    ],
    ids=["unit-multipliers"],
)
def test_granite_variants_match_transformers(overrides: dict[str, object]) -> None:
    from transformers import AutoModelForCausalLM

    ckpt = exports.checkpoint(BUILDERS["granitemoehybrid"], seed=1, **overrides)
    model, _ = load_model(ckpt)
    hf = AutoModelForCausalLM.from_pretrained(ckpt).eval()
    ids = torch.randint(3, model.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(4))
    logits, _ = _forward(model, ids, 0, _fresh(model, 2, 40))
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    assert (logits - ref).abs().max().item() <= TOL


def test_granite_released_layer_spelling(tmp_path: Path) -> None:
    """Released Granite 4.0 H files name the kinds "mamba"/"attention" in `layers_block_type`."""
    src = exports.checkpoint(BUILDERS["granitemoehybrid"])
    new, _, hf = load_config(src)
    spelled = {"linear_attention": "mamba", "full_attention": "attention"}
    old = _with_config(
        src, tmp_path / "old", layer_types=None, layers_block_type=[spelled[k] for k in hf["layer_types"]]
    )
    assert load_config(old)[0].layer_types == new.layer_types == ("mamba2", "attention", "mamba2", "attention")


@pytest.mark.parametrize(
    ("name", "field", "value"),
    [
        ("mamba2", "time_step_limit", [0.001, 0.1]),
        ("granitemoehybrid", "time_step_limit", [0.0, 0.5]),
        ("granitemoehybrid", "position_embedding_type", "alibi"),
        ("lfm2", "layer_types", ["conv", "sliding_attention", "conv", "full_attention"]),
        ("mamba", "hidden_act", "gelu"),
        ("falcon_h1", "time_step_limit", [0.0, 0.5]),
        ("falcon_h1", "hidden_act", "gelu"),
        ("falcon_h1", "ssm_multipliers", [1.0, 1.0]),
        ("falcon_h1", "mamba_d_head", 4),
        ("falcon_h1", "rope_parameters", {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0}),
        ("lfm2_moe", "layer_types", ["conv", "sliding_attention", "conv", "full_attention"]),
        ("lfm2_moe", "rope_parameters", {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}),
        ("qwen3_next", "hidden_act", "gelu"),
        ("qwen3_next", "layer_types", ["linear_attention", "sliding_attention", "linear_attention", "full_attention"]),
        ("qwen3_next", "linear_num_value_heads", 3),
        ("qwen3_5", "rope_parameters", {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}),
        ("qwen3_5", "linear_num_value_heads", 3),
        ("nemotron_h", "layers_block_type", ["linear_attention", "mamba2", "full_attention", "mlp"]),
        ("nemotron_h", "n_group", 3),
        ("nemotron_h", "mlp_hidden_act", "silu"),
        ("nemotron_h", "mamba_hidden_act", "gelu"),
        ("zamba2", "layers_block_type", ["mamba", "hybrid", "attention", "mamba", "hybrid"]),
        ("zamba2", "hidden_act", "gelu_pytorch_tanh"),
        ("zamba2", "num_key_value_heads", 2),
        ("olmo_hybrid", "hidden_act", "gelu"),
        ("olmo_hybrid", "layer_types", ["linear_attention", "sliding_attention", "linear_attention", "full_attention"]),
        ("olmo_hybrid", "linear_num_value_heads", 4),
        ("olmo_hybrid", "rope_parameters", {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0}),
    ],
)
def test_unsupported_variant_is_refused_by_field(name: str, field: str, value: object, tmp_path: Path) -> None:
    bad = _with_config(exports.checkpoint(BUILDERS[name]), tmp_path / "bad", **{field: value})
    with pytest.raises(UnsupportedArchitectureError, match=field):
        load_config(bad)


def test_plain_op_mamba2_graph_bakes_in_no_chunk_count() -> None:
    """Regression: traced at one scan chunk, the plain-op SSD graph failed beyond 16 chunks
    (a size baked in for another that was equal at trace time)."""
    import onnx

    out = exports.export(BUILDERS["mamba2"], fused_ops=False, validate=True)
    manifest = read_manifest(out)
    graph = onnx.load(str(out / "model.onnx"))
    assert {n.domain for n in graph.graph.node} <= {"", "ai.onnx"}
    assert manifest.parity["passed"] is True and manifest.parity["max_abs_logits"] <= TOL
    assert [c["seq"] for c in manifest.parity["prompt"]] == [1, 7, 64, 300, 17]


@pytest.mark.parametrize("name", ["bamba", "falcon_h1", "granitemoehybrid", "mamba2", "nemotron_h", "zamba2"])
def test_mamba2_scan_reads_one_key_per_group(name: str) -> None:
    """Each Mamba2 scan (a "gated" LinearAttention) reads B as its key with one head per group,
    like C as its query, and dt scales the value: run with the nodes' inputs as extra outputs,
    the key is [b, l, G n] for the state's n, not a key made for each of the H heads."""
    import onnx
    import onnxruntime as ort

    from hybridrt.graphs.feeds import graph_feeds, zero_states

    out = exports.family(BUILDERS[name])
    manifest = read_manifest(out)
    model = onnx.load(str(out / "model.onnx"))
    scans = [n for n in model.graph.node if n.op_type == "LinearAttention" and b"gated" == _attr(n, "update_rule")]
    assert scans
    for node in scans:
        model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(node.input[i]) for i in (0, 1, 2, 3))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ids = np.arange(3, 12, dtype=np.int64)[None]
    feeds = graph_feeds(manifest.inputs, ids, 0, zero_states(manifest.pasts, 1, 16))
    names = [o.name for o in session.get_outputs()]
    got = dict(zip(names, session.run(names, feeds)))
    for node in scans:
        query, key, value, state = (got[node.input[i]] for i in (0, 1, 2, 3))
        _, heads, n, head_dim = state.shape
        groups = _attr(node, "q_num_heads")
        assert query.shape == key.shape == (1, 9, groups * n) and groups < heads
        assert value.shape == (1, 9, heads * head_dim)


def _attr(node, name: str):  # type: ignore[no-untyped-def]
    import onnx

    return next(onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name)
