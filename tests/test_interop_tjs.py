"""hybridrt's transformers-js layout (hybridrt.interop.layouts) loaded and run by transformers.js.

The end-to-end tests run tests/js/generate.mjs under Node with transformers.js 4.3.1 on
onnxruntime-node. They need Node 20+ and the packages, installed once (network needed once):

    cd tests/js && npm ci

and are skipped, saying so, when `node` or tests/js/node_modules is missing. The layout's
files and its refusals are checked without Node.

Each family's tiny checkpoint is exported once with hybridrt's own layout and standard
operators; the reference tokens come from `hybridrt.load(...).generate` on it, and the
transformers.js directory is written around that same graph (`convert_transformers_js`), so
both runtimes run one graph with the same weights (quantized ones included: every mode on
LFM2, q4 and q8 on Granite 4.0 H and Falcon-H1). LFM2 also goes through the public path,
`export_model(..., layout="transformers-js")`, float and int4. Batches: rows of one length give
each row its tokens alone; a left-padded batch is refused.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import exports
import onnx
import pytest
from checkpoints import make_llama
from family_checkpoints import (
    make_falcon_h1,
    make_granitemoehybrid,
    make_lfm2,
    make_lfm2_moe,
    make_mamba2,
    make_nemotron_h,
    make_olmo_hybrid,
    make_qwen3_5_moe,
    make_qwen3_5_vl,
    make_qwen3_next,
)

import hybridrt
from hybridrt.errors import ExportError
from hybridrt.interop.files import PADDED_ROWS
from hybridrt.interop.layouts import convert_transformers_js

JS = Path(__file__).parent / "js"
PROMPT = [1, 5, 7, 9, 11, 40, 3]
NEW = 12
PREFILL = 40  # tokens of the one-call vs token-by-token check

# Every family transformers.js 4.3.1 runs as a causal LM and hybridrt exports, with the first
# states of its graph in transformers.js's names (after input_ids, attention_mask,
# num_logits_to_keep). Qwen3.5 is its multimodal checkpoint (model_type "qwen3_5"): the layout
# writes its language model as the text model; Qwen3.5 MoE its text checkpoint, which the layout
# wraps as "qwen3_5_moe" (transformers.js has no causal LM for "qwen3_5_moe_text").
FAMILIES: dict[str, tuple[Callable[..., Path], list[str]]] = {
    "lfm2": (make_lfm2, ["past_conv.0", "past_key_values.1.key"]),
    "lfm2_moe": (make_lfm2_moe, ["past_conv.0", "past_key_values.1.key"]),
    "granitemoehybrid": (make_granitemoehybrid, ["past_conv.0", "past_ssm.0", "past_key_values.1.key"]),
    "falcon_h1": (make_falcon_h1, ["past_key_values.0.key", "past_key_values.0.value", "past_conv.0", "past_ssm.0"]),
    "nemotron_h": (make_nemotron_h, ["past_conv.0", "past_ssm.0", "past_key_values.2.key"]),
    "qwen3_next": (make_qwen3_next, ["past_conv.0", "past_recurrent.0", "past_key_values.1.key"]),
    "qwen3_5": (make_qwen3_5_vl, ["past_conv.0", "past_recurrent.0", "past_key_values.1.key"]),
    "qwen3_5_moe": (make_qwen3_5_moe, ["past_conv.0", "past_recurrent.0", "past_key_values.1.key"]),
    "olmo_hybrid": (
        make_olmo_hybrid,
        ["past_conv.0.query", "past_conv.0.key", "past_conv.0.value", "past_recurrent.0", "past_key_values.1.key"],
    ),
    "llama": (make_llama, ["past_key_values.0.key", "past_key_values.0.value", "past_key_values.1.key"]),
}
# hybridrt --quantize mode -> the dtype transformers.js loads it with, and the file that dtype names
QUANTIZED = {
    "int4": ("q4", "model_q4.onnx"),
    "int8-dynamic": ("q8", "model_quantized.onnx"),
    "int8-weight": ("int8", "model_int8.onnx"),
}
# (family, --quantize mode) run quantized in transformers.js: every mode on LFM2 (short conv), q4
# and q8 on two Mamba2 hybrids: Granite 4.0 H (Mamba2 or attention per layer) and Falcon-H1 (both
# in every layer)
QUANTIZED_RUNS = [("lfm2", mode) for mode in sorted(QUANTIZED)] + [
    (name, mode) for name in ("granitemoehybrid", "falcon_h1") for mode in ("int4", "int8-dynamic")
]
# The attention + Mamba2 family's batches: PROMPT cut to SHORT's length beside SHORT (rows of one
# length), and the whole PROMPT beside SHORT (SHORT left-padded by three)
BATCH_FAMILY = "granitemoehybrid"
SHORT = [1, 8, 13, 21]


@pytest.fixture(scope="session")
def node() -> str:
    """The node executable with transformers.js installed, or a skip (session-scoped, so it is
    settled before the module's exports are built)."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (transformers.js runs under Node 20+)")
    if not (JS / "node_modules" / "@huggingface" / "transformers").is_dir():
        pytest.skip("transformers.js is not installed: run `npm ci` in tests/js once")
    return node


def _run_js(
    node: str, directory: Path, dtype: str = "fp32", prefill: bool = True, rows: list[list[int]] | None = None
) -> dict[str, Any]:
    """generate.mjs on `directory`: greedy tokens after PROMPT (or, for `rows`, of that batch,
    left-padded) and, with `prefill`, the largest last-logit difference between a
    PREFILL-token prompt in one call and token by token."""
    args = ["--new", str(NEW), "--dtype", dtype]
    if rows is None:
        args += ["--ids", ",".join(map(str, PROMPT))]
    else:
        args += ["--rows", ";".join(",".join(map(str, r)) for r in rows)]
    if prefill:
        args += ["--prefill", str(PREFILL), "--repeat", "1"]
    done = subprocess.run(
        [node, str(JS / "generate.mjs"), str(directory), *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _hybridrt_greedy(directory: Path, prompt: list[int] = PROMPT) -> list[int]:
    out = hybridrt.load(directory).generate(
        [prompt], max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, repetition_penalty=1.0
    )
    return list(out[0])


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[Path, Path, Path]]:
    """(checkpoint, hybridrt's own export with standard operators, the transformers.js layout
    around it) of a family, float or quantized by a --quantize mode; each built once."""
    done: dict[tuple[str, str | None], tuple[Path, Path, Path]] = {}

    def get(name: str, quantize: str | None = None) -> tuple[Path, Path, Path]:
        if (name, quantize) not in done:
            src = exports.checkpoint(FAMILIES[name][0])
            own = exports.export(src, validate=False, fused_ops=False, quantize=quantize)
            tjs = tmp_path_factory.mktemp(f"{name}-{quantize or 'fp32'}") / "tjs"
            done[name, quantize] = (src, own, convert_transformers_js(src, own, tjs))
        return done[name, quantize]

    return get


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest, exported: Callable[..., tuple[Path, Path, Path]]) -> dict[str, Any]:
    """One family's exports and its reference tokens."""
    _, own, tjs = exported(request.param)
    return {"name": request.param, "own": own, "tjs": tjs, "want": _hybridrt_greedy(own)}


@pytest.fixture(scope="module")
def family_js(node: str, family: dict[str, Any]) -> dict[str, Any]:
    return _run_js(node, family["tjs"])


def test_tjs_greedy_tokens_match_hybridrt(family: dict[str, Any], family_js: dict[str, Any]) -> None:
    """transformers.js (AutoModelForCausalLM.generate, greedy) on the layout generates the
    tokens hybridrt's runtime generates on the same graph, for every supported family."""
    assert len(family["want"]) == NEW
    assert family_js["tokens"] == family["want"]


def test_tjs_prompt_in_one_call_matches_token_by_token(family_js: dict[str, Any]) -> None:
    """In transformers.js, a 40-token prompt in one call (the graph's chunked scan) and fed one
    token at a time through the growing KV and the conv/SSM/recurrent states give the same
    last logits."""
    assert float(family_js["max_abs_last_logits"]) < 1e-4


def test_tjs_state_names_and_metadata(family: dict[str, Any]) -> None:
    """The graph's states in transformers.js's names (getCacheNames), each paired with its
    present in metadata_props, and config.json naming the dtype and external data."""
    model = onnx.load(str(family["tjs"] / "onnx" / "model.onnx"), load_external_data=False)
    inputs = [i.name for i in model.graph.input]
    outputs = [o.name for o in model.graph.output]
    first = FAMILIES[family["name"]][1]
    assert inputs[: 3 + len(first)] == ["input_ids", "attention_mask", "num_logits_to_keep", *first]
    assert outputs[0] == "logits"
    presents = [n.replace("past_key_values.", "present.").replace("past_", "present_") for n in inputs[3:]]
    assert outputs[1:] == presents
    states = json.loads({p.key: p.value for p in model.metadata_props}["hybridrt.states"])
    assert [(s["input"], s["output"]) for s in states] == list(zip(inputs[3:], outputs[1:], strict=True))
    # A state in parts (OLMo Hybrid's conv as its query, key and value convs) tiles its channels.
    spans: dict[str, list[list[int]]] = {}
    for s in states:
        spans.setdefault(s["hybridrt_name"], []).append(s.get("channels", [0, s["dims"][1]]))
        assert s["dims"][1] == spans[s["hybridrt_name"]][-1][1] - spans[s["hybridrt_name"]][-1][0]
    for parts in spans.values():
        assert parts[0][0] == 0 and all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
    if family["name"] == "olmo_hybrid":  # 2 key heads of 8 for q and k, 2 value heads of 12
        assert spans["past.0.conv"] == [[0, 16], [16, 32], [32, 56]]
    config = json.loads((family["tjs"] / "config.json").read_text())
    assert config["transformers.js_config"] == {"use_external_data_format": True, "dtype": "fp32"}
    assert (family["tjs"] / "onnx" / "model.onnx_data").is_file()


def test_tjs_config_layer_types_in_transformers_js_names() -> None:
    """config.json's layer_types in the names transformers.js's getCacheNames reads, per family:
    Granite's and Nemotron-H's Mamba2 layers "mamba" (transformers writes "linear_attention",
    with which transformers.js finds no Mamba cache), Falcon-H1 none at all (every layer then
    has both caches), Qwen3.5's multimodal checkpoint as its text model, Qwen3.5 MoE's text
    checkpoint under "qwen3_5_moe"."""
    from hybridrt.interop.tjs_names import FAMILIES as NAMES

    def config(model_type: str, kinds: list[str], ffns: list[str], hf: dict[str, Any]) -> dict[str, Any]:
        family = NAMES[model_type]
        return family.config(hf | {"model_type": model_type}, family.layer_types(kinds, ffns))

    granite = config("granitemoehybrid", ["mamba2", "attention"], ["moe", "moe"], {"layer_types": ["x", "y"]})
    assert granite["layer_types"] == ["mamba", "attention"]
    nemotron = config(
        "nemotron_h",
        ["mamba2", "none", "attention", "none"],
        ["none", "nemotron_moe", "none", "relu2_mlp"],
        {"layers_block_type": ["linear_attention", "moe", "full_attention", "mlp"]},
    )
    assert nemotron["layer_types"] == ["mamba", "moe", "attention", "mlp"]
    falcon = config("falcon_h1", ["parallel_hybrid"], ["scaled_mlp"], {"layer_types": ["x"]})
    assert "layer_types" not in falcon and "layers_block_type" not in falcon
    vl = config("qwen3_5", ["gated_delta", "attention"], ["mlp", "mlp"], {"text_config": {"hidden_size": 32}})
    assert (vl["model_type"], vl["architectures"], vl["hidden_size"]) == ("qwen3_5_text", ["Qwen3_5ForCausalLM"], 32)
    assert vl["layer_types"] == ["linear_attention", "full_attention"]
    moe = config("qwen3_5_moe_text", ["gated_delta"], ["gated_shared_moe"], {"eos_token_id": 2})
    assert (moe["model_type"], moe["architectures"], moe["eos_token_id"]) == (
        "qwen3_5_moe",
        ["Qwen3_5MoeForCausalLM"],
        2,
    )
    assert moe["text_config"]["model_type"] == "qwen3_5_moe_text"
    assert moe["text_config"]["layer_types"] == ["linear_attention"]


@pytest.fixture(scope="module", params=QUANTIZED_RUNS, ids="-".join)
def quantized(request: pytest.FixtureRequest, exported: Callable[..., tuple[Path, Path, Path]]) -> Any:
    name, mode = request.param
    return (mode, *exported(name, mode)[1:])


def test_tjs_quantized_greedy_tokens_match_hybridrt(node: str, quantized: Any) -> None:
    """A quantized export in transformers.js (dtype q4 / q8 / int8, the file that dtype names:
    MatMulNBits, or DynamicQuantizeLinear + MatMulInteger, and GatherBlockQuantized, which
    onnxruntime-node 1.30 runs) generates the tokens hybridrt generates on the same quantized
    graph, for short conv and Mamba2 hybrids. Regression: an int8-dynamic export with standard
    operators used to write GatherBlockQuantized without importing its com.microsoft domain,
    and failed its check."""
    mode, own, tjs = quantized
    dtype, file = QUANTIZED[mode]
    assert {p.name for p in (tjs / "onnx").iterdir()} == {file, f"{file}_data"}
    assert json.loads((tjs / "config.json").read_text())["transformers.js_config"]["dtype"] == dtype
    want = _hybridrt_greedy(own)
    assert len(set(want)) > 1  # not one token repeated: the comparison can tell
    assert _run_js(node, tjs, dtype, prefill=False)["tokens"] == want


def test_tjs_batch_of_equal_rows_matches_each_alone(
    node: str, exported: Callable[..., tuple[Path, Path, Path]]
) -> None:
    """A batch of two prompts of one length (attention + Mamba2) in transformers.js gives each
    row the greedy tokens hybridrt gives it alone."""
    _, own, tjs = exported(BATCH_FAMILY)
    rows = [PROMPT[: len(SHORT)], SHORT]
    want = [_hybridrt_greedy(own, row) for row in rows]
    assert want[0] != want[1]
    assert _run_js(node, tjs, prefill=False, rows=rows)["rows"] == want


def test_tjs_left_padded_batch_is_refused(node: str, exported: Callable[..., tuple[Path, Path, Path]]) -> None:
    """A left-padded batch (a shorter prompt's mask 0 on its left) fails in transformers.js
    with PADDED_ROWS: the graph reads no mask. Regression: the pads used to be attended to and
    folded into the Mamba2 states, so the padded row's tokens were not those it gets alone."""
    _, _, tjs = exported(BATCH_FAMILY)
    assert PADDED_ROWS in _run_js(node, tjs, prefill=False, rows=[PROMPT, SHORT])["error"]


@pytest.fixture(scope="module")
def lfm2_tjs(exported: Callable[..., tuple[Path, Path, Path]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """LFM2 through the public path."""
    out = tmp_path_factory.mktemp("lfm2-tjs") / "lfm2-tiny"
    hybridrt.export_model(exported("lfm2")[0], out, layout="transformers-js")
    return out


def test_tjs_public_export_path(
    node: str, exported: Callable[..., tuple[Path, Path, Path]], lfm2_tjs: Path, tmp_path: Path
) -> None:
    """`export_model(..., layout="transformers-js")` (the CLI's path), float and int4, writes the
    directory transformers.js runs: its tokens equal hybridrt's on its own export of the
    checkpoint with the same options (same weights), and the int4 one is onnx/model_q4.onnx."""
    src, own, _ = exported("lfm2")
    assert _run_js(node, lfm2_tjs, prefill=False)["tokens"] == _hybridrt_greedy(own)
    q4 = tmp_path / "q4"
    hybridrt.export_model(src, q4, layout="transformers-js", quantize="int4")
    assert {p.name for p in (q4 / "onnx").iterdir()} == {"model_q4.onnx", "model_q4.onnx_data"}
    assert _run_js(node, q4, "q4", prefill=False)["tokens"] == _hybridrt_greedy(exported("lfm2", "int4")[1])


def test_tjs_layout_files_and_interface(lfm2_tjs: Path) -> None:
    """The directory transformers.js loads: onnx/model.onnx with its weights in model.onnx_data
    (as config.json's transformers.js_config says), its inputs and outputs named as
    transformers.js names them for lfm2, the checkpoint's config and tokenizer beside."""
    tjs_dir = lfm2_tjs
    config = json.loads((tjs_dir / "config.json").read_text())
    assert config["model_type"] == "lfm2"
    assert config["transformers.js_config"]["use_external_data_format"] is True
    assert {"generation_config.json", "tokenizer.json", "tokenizer_config.json"} <= {p.name for p in tjs_dir.iterdir()}
    assert (tjs_dir / "onnx" / "model.onnx_data").is_file()
    model = onnx.load(str(tjs_dir / "onnx" / "model.onnx"), load_external_data=False)
    inputs = [i.name for i in model.graph.input]
    outputs = [o.name for o in model.graph.output]
    assert inputs == [
        "input_ids",
        "attention_mask",
        "num_logits_to_keep",
        "past_conv.0",
        "past_key_values.1.key",
        "past_key_values.1.value",
        "past_conv.2",
        "past_key_values.3.key",
        "past_key_values.3.value",
    ]
    assert outputs == [
        "logits",
        "present_conv.0",
        "present.1.key",
        "present.1.value",
        "present_conv.2",
        "present.3.key",
        "present.3.value",
    ]
    kv = next(i for i in model.graph.input if i.name == "past_key_values.1.key")
    assert [d.dim_param or d.dim_value for d in kv.type.tensor_type.shape.dim] == [
        "batch_size",
        2,
        "past_sequence_length",
        8,
    ]


def test_tjs_metadata_describes_each_state(lfm2_tjs: Path) -> None:
    """metadata_props pairs each state input with its output, with its kind and reset value."""
    tjs_dir = lfm2_tjs
    model = onnx.load(str(tjs_dir / "onnx" / "model.onnx"), load_external_data=False)
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["hybridrt.layout"] == "transformers-js"
    states = {s["input"]: s for s in json.loads(meta["hybridrt.states"])}
    assert set(states) == {i.name for i in model.graph.input} - {"input_ids", "attention_mask", "num_logits_to_keep"}
    assert states["past_conv.0"] | {"dims": None} == {
        "input": "past_conv.0",
        "output": "present_conv.0",
        "kind": "conv",
        "layer": 0,
        "dims": None,
        "dtype": "float32",
        "reset": "zeros",
        "hybridrt_name": "past.0.conv",
    }
    assert states["past_key_values.3.value"]["output"] == "present.3.value"
    assert states["past_key_values.3.value"]["reset"].startswith("empty")


def test_tjs_unsupported_family_is_a_typed_error(tmp_path: Path) -> None:
    """A family transformers.js does not run is refused before any work, naming the runtime,
    the model type and why."""
    src = exports.checkpoint(make_mamba2)
    with pytest.raises(ExportError, match=r"transformers\.js.*'mamba2'.*no causal LM"):
        hybridrt.export_model(src, tmp_path / "out", layout="transformers-js")
    assert not (tmp_path / "out").exists()


def test_tjs_layout_refuses_torch_formats(tmp_path: Path) -> None:
    """The transformers-js layout is an ONNX directory; other requests are typed errors."""
    src = exports.checkpoint(make_lfm2)
    with pytest.raises(ExportError, match="--format onnx"):
        hybridrt.export_model(src, tmp_path / "ts", layout="transformers-js", format="torchscript")
    with pytest.raises(ExportError, match="unknown layout"):
        hybridrt.export_model(src, tmp_path / "x", layout="mlc")


def test_cli_layout_choices_match_the_layouts() -> None:
    """`hybridrt export --layout` offers exactly interop.layouts.LAYOUTS, hybridrt's own first
    (the CLI writes them out: importing hybridrt.export imports torch)."""
    from hybridrt.commands.export import LAYOUTS as CLI_LAYOUTS
    from hybridrt.interop.layouts import DEFAULT_LAYOUT, LAYOUTS

    assert CLI_LAYOUTS == LAYOUTS
    assert CLI_LAYOUTS[0] == DEFAULT_LAYOUT
