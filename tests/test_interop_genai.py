"""hybridrt's onnxruntime-genai layout (hybridrt.interop.genai) loaded and run by
onnxruntime-genai (PyPI onnxruntime-genai 0.18, on the onnxruntime installed beside it).

Each supported family's tiny checkpoint is exported once with hybridrt's own layout; the
reference tokens come from `hybridrt.load(...).generate` on it, and the genai directory is
written around that same graph (`genai_layout.convert`), so the two runtimes run one graph.
One family also goes through the public path, `export_model(..., layout="onnxruntime-genai")`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import exports
import family_checkpoints
import numpy as np
import onnx
import onnxruntime_genai as og
import pytest
import toy_kind
from checkpoints import make_jamba, make_llama
from family_checkpoints import make_falcon_h1, make_granitemoehybrid, make_lfm2, make_qwen3_5

import hybridrt
from hybridrt.errors import ExportError
from hybridrt.interop.files import PADDED_ROWS
from hybridrt.interop.genai import convert

TEXT = "def fibonacci(n):\n    a, b = 0, 1"
NEW = 12

# One family per way genai binds the states: KV alone ("decoder"), short conv + KV ("lfm2"),
# conv + recurrent pairs ("qwen3_5_text") computed by Gated DeltaNet, Mamba2 (with a MoE),
# Mamba1, and Mamba2 beside attention in one layer (Falcon-H1).
FAMILIES: dict[str, Callable[..., Path]] = {
    "llama": make_llama,
    "lfm2": make_lfm2,
    "qwen3_5": make_qwen3_5,
    "granitemoehybrid": make_granitemoehybrid,
    "jamba": make_jamba,
    "falcon_h1": make_falcon_h1,
}
RUNTIME_TYPES = {
    "llama": "decoder",
    "lfm2": "lfm2",
    "qwen3_5": "qwen3_5_text",
    "granitemoehybrid": "qwen3_5_text",
    "jamba": "qwen3_5_text",
    "falcon_h1": "qwen3_5_text",
}


@pytest.fixture(scope="module")
def layouts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Per family: hybridrt's own export of its tiny checkpoint (the family suite's, from
    tests/exports.py) and genai's layout around it."""
    done = {}
    for name, make in FAMILIES.items():
        own = exports.family(make)
        genai = tmp_path_factory.mktemp(name) / "genai"
        convert(own, genai)
        done[name] = (own, genai)
    return done


def _genai_greedy(directory: Path, prompt: list[int], new: int) -> list[int]:
    """genai's greedy tokens after `prompt`: exactly `new` of them (EOS suppressed by min_length,
    as hybridrt's min_new_tokens does)."""
    return _genai_batch(directory, [prompt], new)[0]


def _genai_batch(directory: Path, rows: list[list[int]], new: int) -> list[list[int]]:
    """genai's greedy tokens after each of `rows`, one batch: exactly `new` per row."""
    model = og.Model(str(directory))
    params = og.GeneratorParams(model)
    width = len(rows[0])
    params.set_search_options(do_sample=False, max_length=width + new, min_length=width + new, batch_size=len(rows))
    generator = og.Generator(model, params)
    generator.append_tokens(np.array(rows, dtype=np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    return [[int(t) for t in generator.get_sequence(i)][width:] for i in range(len(rows))]


def _hybridrt_greedy(directory: Path, prompt: list[int], new: int) -> list[int]:
    out = hybridrt.load(directory).generate(
        [prompt], max_new_tokens=new, min_new_tokens=new, do_sample=False, repetition_penalty=1.0
    )
    return list(out[0])


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_genai_greedy_tokens_match_hybridrt(family: str, layouts: dict[str, tuple[Path, Path]]) -> None:
    """onnxruntime-genai (og.Model, og.Tokenizer, og.Generator, greedy) on the layout generates
    the tokens hybridrt's runtime generates on the same graph, from the same prompt ids."""
    own, genai = layouts[family]
    prompt = [int(t) for t in og.Tokenizer(og.Model(str(genai))).encode(TEXT)]
    assert prompt == hybridrt.load(own).prompt_rows(TEXT, add_special_tokens=False).rows[0]
    want = _hybridrt_greedy(own, prompt, NEW)
    assert len(want) == NEW and len(set(want)) > 1  # not one token repeated: the comparison can tell
    assert _genai_greedy(genai, prompt, NEW) == want


# Every other family hybridrt exports: genai binds their states as one of the classes above.
# The tiny Mamba1 checkpoints untie their head (tied, they repeat one token, which cannot tell
# two runtimes apart).
OTHER_FAMILIES: dict[str, tuple[Callable[..., Path], dict[str, object]]] = {
    name: (
        getattr(family_checkpoints, f"make_{name}"),
        {"tie_word_embeddings": False} if name.endswith("_mamba") or name == "mamba" else {},
    )
    for name in (
        "lfm2_moe",
        "qwen3_next",
        "qwen3_5_moe",
        "olmo_hybrid",
        "bamba",
        "nemotron_h",
        "mamba2",
        "zamba2",
        "mamba",
        "falcon_mamba",
    )
}


@pytest.mark.parametrize("family", sorted(OTHER_FAMILIES))
def test_genai_runs_every_other_family(family: str, tmp_path: Path) -> None:
    """The families not above, each the family suite's export (its parity checked there; the
    Mamba1 ones with an untied head, exported without the check): genai's greedy tokens equal
    hybridrt's on the same graph."""
    make, overrides = OTHER_FAMILIES[family]
    own = (
        exports.family(make) if not overrides else exports.export(exports.checkpoint(make, **overrides), validate=False)
    )
    convert(own, tmp_path / "genai")
    prompt = [int(t) for t in og.Tokenizer(og.Model(str(tmp_path / "genai"))).encode(TEXT)]
    want = _hybridrt_greedy(own, prompt, NEW)
    assert len(want) == NEW and len(set(want)) > 1
    assert _genai_greedy(tmp_path / "genai", prompt, NEW) == want


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_genai_config_from_the_contract(family: str, layouts: dict[str, tuple[Path, Path]]) -> None:
    """genai_config.json names the runtime class the layer kinds need, every state the graph
    takes under the names genai binds, and the graph's sizes; the KV is one shared buffer."""
    own, genai = layouts[family]
    manifest = hybridrt.load(own).manifest
    config = json.loads((genai / "genai_config.json").read_text())
    model = onnx.load(str(genai / "model.onnx"), load_external_data=False)
    names = [i.name for i in model.graph.input]
    decoder = config["model"]["decoder"]
    assert config["model"]["type"] == RUNTIME_TYPES[family]
    assert config["search"]["past_present_share_buffer"] is True
    assert decoder["num_hidden_layers"] == len(manifest.layer_types)
    assert config["model"]["vocab_size"] == manifest.vocab_size
    genai_name = {
        "key": "past_key_values.{}.key",
        "value": "past_key_values.{}.value",
        "conv": "past.{}.conv",
        "ssm": "past.{}.recurrent",
    }
    assert names == ["input_ids", "attention_mask"] + [genai_name[s.kind].format(s.layer) for s in manifest.pasts]
    templates = {k: v for k, v in decoder["inputs"].items() if k.startswith("past_")}
    kinds = {s.kind for s in manifest.pasts}
    want = {"past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"}
    if "conv" in kinds:
        want["past_conv_names"] = "past.%d.conv"
    if "ssm" in kinds:
        want["past_recurrent_names"] = "past.%d.recurrent"
    assert templates == want
    if family == "lfm2":
        assert decoder["layer_types"] == ["conv", "full_attention", "conv", "full_attention"]
        conv = next(s for s in manifest.pasts if s.kind == "conv")
        assert decoder["conv_cache_size"] == conv.dims[-1] == 2  # kernel 3
    logits = next(o for o in model.graph.output if o.name == "logits")
    assert logits.type.tensor_type.shape.dim[1].dim_value == 1  # genai's "pruned" logits: the last position


def test_genai_metadata_describes_each_state(layouts: dict[str, tuple[Path, Path]]) -> None:
    """metadata_props pairs each state input with its output, with its kind, hybridrt's name
    and its reset value."""
    _, genai = layouts["qwen3_5"]
    model = onnx.load(str(genai / "model.onnx"), load_external_data=False)
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["hybridrt.layout"] == "onnxruntime-genai"
    states = {s["input"]: s for s in json.loads(meta["hybridrt.states"])}
    assert set(states) == {i.name for i in model.graph.input} - {"input_ids", "attention_mask"}
    assert states["past.0.recurrent"] | {"dims": None} == {
        "input": "past.0.recurrent",
        "output": "present.0.recurrent",
        "kind": "ssm",
        "layer": 0,
        "dims": None,
        "dtype": "float32",
        "reset": "zeros",
        "hybridrt_name": "past.0.ssm",
    }
    assert states["past_key_values.1.key"]["dims"][2] == "max_length"


def test_genai_export_layout_public_path(layouts: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    """`export_model(..., layout="onnxruntime-genai")` writes the directory genai runs: its greedy
    tokens equal hybridrt's on hybridrt's own export of the same checkpoint."""
    own, _ = layouts["lfm2"]
    out = tmp_path / "genai"
    hybridrt.export_model(exports.checkpoint(make_lfm2), out, layout="onnxruntime-genai")
    assert sorted(p.name for p in out.iterdir()) == [
        "genai_config.json",
        "generation_config.json",
        "model.onnx",
        "model.onnx_data",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    prompt = [1, 5, 7, 9, 11, 40, 3]
    assert _genai_greedy(out, prompt, NEW) == _hybridrt_greedy(own, prompt, NEW)


def test_genai_layout_int4(tmp_path: Path) -> None:
    """`--layout onnxruntime-genai --quantize int4` (hybridrt's direct quantization: MatMulNBits)
    runs in genai with the tokens hybridrt's runtime gives on its own int4 export of the same
    checkpoint."""
    src = exports.checkpoint(make_lfm2)
    hybridrt.export_model(src, tmp_path / "genai", layout="onnxruntime-genai", quantize="int4")
    int4 = exports.export(src, quantize="int4", validate=False)
    model = onnx.load(str(tmp_path / "genai" / "model.onnx"), load_external_data=False)
    assert any(n.op_type == "MatMulNBits" for n in model.graph.node)
    prompt = [1, 5, 7, 9, 11, 40, 3]
    assert _genai_greedy(tmp_path / "genai", prompt, NEW) == _hybridrt_greedy(int4, prompt, NEW)


def test_genai_refuses_a_state_it_cannot_bind(toy_registered: None, tmp_path: Path) -> None:
    """A layer kind whose state is neither KV, conv nor recurrent has no binding in genai: the
    export is refused before any work, naming the runtime, the family and the kind."""
    src = toy_kind.make_toy(tmp_path / "src")
    with pytest.raises(ExportError, match=r"onnxruntime-genai 0\.18 cannot run model_type 'toy_ema'.*'ema'"):
        hybridrt.export_model(src, tmp_path / "out", layout="onnxruntime-genai")
    assert not (tmp_path / "out").exists()


def test_genai_layout_refuses_torch_formats(tmp_path: Path) -> None:
    """The layout is an ONNX directory: --format torchscript is a typed error, before any work."""
    with pytest.raises(ExportError, match="--format onnx"):
        hybridrt.export_model(
            exports.checkpoint(make_lfm2), tmp_path / "ts", layout="onnxruntime-genai", format="torchscript"
        )
    assert not (tmp_path / "ts").exists()


# The attention + Mamba2 family's batch: two prompts of one length, and a shorter one padded to
# the first's length with genai_config's pad_token_id
BATCH_FAMILY = "granitemoehybrid"
LONG, SHORT = [1, 5, 7, 9, 11, 40, 3], [1, 8, 13, 21]


def _pad_token_id(genai: Path) -> int:
    return int(json.loads((genai / "genai_config.json").read_text())["model"]["pad_token_id"])


def test_genai_batch_of_equal_rows_matches_each_alone(layouts: dict[str, tuple[Path, Path]]) -> None:
    """A batch of two prompts of one length (attention + Mamba2) in genai gives each row the
    greedy tokens hybridrt gives it alone."""
    own, genai = layouts[BATCH_FAMILY]
    rows = [LONG[: len(SHORT)], SHORT]
    want = [_hybridrt_greedy(own, row, NEW) for row in rows]
    assert want[0] != want[1]
    assert _genai_batch(genai, rows, NEW) == want


@pytest.mark.parametrize("side", ["left", "right"])
def test_genai_padded_batch_is_refused(layouts: dict[str, tuple[Path, Path]], side: str) -> None:
    """A batch whose shorter prompt is padded with the pad token (genai passes a mask of ones;
    its tokenizer's encode_batch pads on the right) fails with PADDED_ROWS: the graph reads no
    mask. Regression: the pads used to be attended to and folded into the Mamba2 states, so
    the padded row's tokens were not those it gets alone."""
    _, genai = layouts[BATCH_FAMILY]
    pad = [_pad_token_id(genai)] * (len(LONG) - len(SHORT))
    short = pad + SHORT if side == "left" else SHORT + pad
    with pytest.raises(RuntimeError, match=re.escape(PADDED_ROWS)):
        _genai_batch(genai, [LONG, short], NEW)


def test_genai_one_row_starting_with_the_pad_token_runs(layouts: dict[str, tuple[Path, Path]]) -> None:
    """A prompt of one row is never padded: one starting with the pad token runs as hybridrt
    runs it."""
    own, genai = layouts[BATCH_FAMILY]
    prompt = [_pad_token_id(genai), *SHORT[1:]]
    assert _genai_greedy(genai, prompt, NEW) == _hybridrt_greedy(own, prompt, NEW)
