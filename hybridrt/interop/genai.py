"""The onnxruntime-genai layout: the directory `og.Model(OUT)` (PyPI onnxruntime-genai 0.18)
loads and runs as it is, `og.Tokenizer` and `og.Generator` included:

    genai_config.json         written from the graph contract (runtime type, names, sizes)
    model.onnx                hybridrt's graph behind genai's interface
    model.onnx_data           its weights
    tokenizer.json, tokenizer_config.json, ...

Its graph is hybridrt's own (fused onnxruntime operators: genai runs on the onnxruntime it is
installed beside) with genai's interface around it, as onnxruntime-genai's builder names it:

  input_ids        int64 [batch_size, sequence_length]
  attention_mask   int64 [batch_size, total_sequence_length]   past_lengths = its length minus
                   sequence_length (every row the same length); a padded batch fails the call
                   with layout_files.PADDED_ROWS (the body reads no mask): genai pads a batch's
                   shorter prompts with pad_token_id (encode_batch on the right) and passes a
                   mask of ones, so a prompt call of several rows with one starting or ending
                   with pad_token_id is refused
  past_key_values.{i}.key / .value   [batch_size, kv_heads, max_length, head_dim]   hybridrt's KV
                   buffer as it is: genai's past_present_share_buffer binds one buffer of
                   search.max_length positions as past and present, as hybridrt's runtime does
  past.{i}.conv    [batch_size, channels, k-1]        short conv (LFM2) and Gated DeltaNet conv
  past.{i}.recurrent  [batch_size, heads, d_k, d_v]   Gated DeltaNet state (hybridrt's past.{i}.ssm)
  -> logits [batch_size, 1, vocab]   the last position only: genai reads a graph whose logits
     have 1 as their second dimension as "pruned" and allocates one position per row;
     present.{i}.key / .value, present.{i}.conv, present.{i}.recurrent

genai picks its runtime class by genai_config's `model.type`; the class only allocates and
binds the states, the graph does the compute. The states the layers hold decide the type
(runtime_type): KV alone runs as "decoder"; conv-only layers (LFM2's short conv) beside
attention as "lfm2", which reads decoder.layer_types and conv_cache_size; conv + recurrent
pairs as "qwen3_5_text", which finds them by name and reads their shapes from the graph's
inputs, whatever computes them: Gated DeltaNet, Mamba2 ([heads, d_state, head_dim]), Mamba1
([d_state, d_inner]), alone or beside attention in one layer (Falcon-H1, Zamba2). genai starts
a sequence from zero states and fills the KV as it goes, which is hybridrt's fresh state.
A layer kind with a state of another kind (runtime_type) is refused before any work.

With --quantize, the inner export is quantized layer by layer as hybridrt's own is (int4:
MatMulNBits), and genai runs it as it is. `convert(DIR, OUT)` writes the layout around an
existing hybridrt ONNX export instead, leaving it as it is.

The ONNX model's metadata_props carry the state description (`hybridrt.states`: input,
output, kind, layer, dims, dtype, reset value), as the transformers-js layout's do.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import ExportError
from ..graphs.contract import GraphContract, TensorSpec
from ..graphs.files import atomic_directory, copy_tokenizer
from ..graphs.manifest import Manifest
from .files import Prelude, mask_lengths, save_with_data, set_metadata, value_info

GENAI = "onnxruntime-genai"
RUNTIME = "onnxruntime-genai 0.18"

# genai's runtime classes (genai_config's model.type), by the states a model's layers hold:
# "lfm2" binds conv-only layers and reads decoder.layer_types to tell them from attention
# layers; "qwen3_5_text" finds conv + recurrent pairs by name and reads their shapes from the
# graph's inputs, whatever layer computes them; "decoder" binds the KV alone.
KV, CONV_ONLY, RECURRENT = frozenset({"key", "value"}), frozenset({"conv"}), "ssm"
LFM2_LAYER_TYPES = {KV: "full_attention", CONV_ONLY: "conv"}

# state kind -> (genai_config key stem, past name, present name), as genai's builder names them.
STATE_NAMES = {
    "key": ("key", "past_key_values.%d.key", "present.%d.key"),
    "value": ("value", "past_key_values.%d.value", "present.%d.value"),
    "conv": ("conv", "past.%d.conv", "present.%d.conv"),
    "ssm": ("recurrent", "past.%d.recurrent", "present.%d.recurrent"),
}
DIMS = {"batch": "batch_size", "seq": "sequence_length", "capacity": "max_length"}
TOTAL_LENGTH = "total_sequence_length"
CONFIG_FILE = "genai_config.json"
GRAPH = "model.onnx"


def check_genai(src: Path, quantized: bool) -> None:
    """Refuse, before any work, a model genai cannot run, naming the runtime, the family and
    the layer kind it has no binding for. Quantized exports pass: their operators (int4's
    MatMulNBits among them) are onnxruntime's, which genai runs on."""
    from ..models.loading.checkpoint import load_config

    cfg, _, hf = load_config(src)
    runtime_type(GraphContract.of(cfg).pasts, tuple(cfg.layer_types), hf.get("model_type"))


def runtime_type(pasts: tuple[TensorSpec, ...], layer_types: tuple[str, ...], family: object) -> str:
    """genai_config's model.type for a graph with these state inputs, or an ExportError naming
    the runtime, the family and the layer kind genai cannot bind."""

    def refuse(kind: str, why: str) -> ExportError:
        return ExportError(f"layout {GENAI}: {RUNTIME} cannot run model_type {family!r}: layer kind {kind!r} {why}")

    per_layer = [frozenset(s.kind for s in pasts if s.layer == i) for i in range(len(layer_types))]
    for kind, states in zip(layer_types, per_layer, strict=True):
        unnamed = sorted(states - set(STATE_NAMES))
        if unnamed:
            raise refuse(
                kind,
                f"holds a state ({', '.join(unnamed)}) genai has no binding for (it binds KV, conv "
                "and recurrent states)",
            )
        if RECURRENT in states and "conv" not in states:
            raise refuse(kind, "has a recurrent state without a conv state (genai binds them in pairs)")
    recurrent = any(RECURRENT in states for states in per_layer)
    if CONV_ONLY in per_layer:
        for kind, states in zip(layer_types, per_layer, strict=True):
            if states not in LFM2_LAYER_TYPES:
                why = "has a recurrent state beside" if recurrent else "is neither attention nor"
                raise refuse(kind, f"{why} a conv-only layer (genai's lfm2 class binds conv-only and KV layers)")
        return "lfm2"
    return "qwen3_5_text" if recurrent else "decoder"


def convert(directory: str | Path, out: str | Path, *, force: bool = False) -> Manifest:
    """genai's directory at `out` around the graph of an existing hybridrt ONNX export
    (`directory`, float or quantized: an int4 export's MatMulNBits run in genai as they are);
    `directory` is left as it is. Returns its manifest."""
    from ..graphs.manifest import read_manifest

    directory, out = Path(directory), Path(out)
    manifest = read_manifest(directory)
    if manifest.format != "onnx":
        raise ExportError(f"layout {GENAI} needs an ONNX export; {directory} holds {manifest.format}")
    if (manifest.quantization or {}).get("kv_cache"):
        raise ExportError(
            f"{directory} keeps its KV cache in int8 (quantize --kv-dtype int8); the {GENAI} layout is made and "
            "tested for float caches only: convert a directory quantized without --kv-dtype"
        )
    contract = GraphContract(tuple(manifest.inputs), tuple(manifest.outputs))
    runtime_type(contract.pasts, tuple(manifest.layer_types), manifest.architecture)
    if out.exists() and not force:
        raise ExportError(f"output directory {out} already exists; pass --force (force=True) to replace it")
    with atomic_directory(out, ExportError) as tmp:
        write_layout(directory, manifest, tmp, move=False)
    return manifest


def write_layout(inner: Path, manifest: Manifest, tmp: Path, move: bool) -> None:
    """The graph, tokenizer and genai_config.json of hybridrt's export at `inner` into `tmp`."""
    contract = GraphContract(tuple(manifest.inputs), tuple(manifest.outputs))
    adapt_graph(inner / manifest.graph_file, tmp / GRAPH, contract, pad_token_id(manifest), move=move)
    copy_tokenizer(inner, tmp)
    if (tmp / "tokenizer.json").is_file() and not (tmp / "tokenizer_config.json").is_file():
        # genai's tokenizer refuses to load without it; a tokenizer.json alone is a fast tokenizer
        (tmp / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}) + "\n")
    (tmp / CONFIG_FILE).write_text(json.dumps(genai_config(manifest), indent=2) + "\n")


def genai_config(manifest: Manifest) -> dict[str, Any]:
    """genai_config.json for the graph `manifest` describes: the runtime class, the state names
    and sizes from its contract, the special tokens and generation settings from the checkpoint."""
    cfg = manifest.config
    pasts = [s for s in manifest.inputs if s.name.startswith("past.")]
    kinds = {s.kind for s in pasts}
    inputs: dict[str, str] = {"input_ids": "input_ids", "attention_mask": "attention_mask"}
    outputs: dict[str, str] = {"logits": "logits"}
    for kind, (stem, past, present) in STATE_NAMES.items():
        if kind in kinds:
            inputs[f"past_{stem}_names"] = past
            outputs[f"present_{stem}_names"] = present
    kv = next((s for s in pasts if s.is_kv), None)
    # genai sizes the KV from these (and from the graph's inputs, per layer); without KV it reads none
    kv_heads, head_dim = (kv.dims[1], kv.dims[3]) if kv is not None else (cfg["num_key_value_heads"], 0)
    decoder: dict[str, Any] = {
        "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
        "filename": GRAPH,
        "head_size": head_dim,
        "hidden_size": cfg["hidden_size"],
        "inputs": inputs,
        "outputs": outputs,
        "num_attention_heads": cfg["num_attention_heads"],
        "num_hidden_layers": len(manifest.layer_types),
        "num_key_value_heads": kv_heads,
    }
    model_type = runtime_type(tuple(pasts), tuple(manifest.layer_types), manifest.architecture)
    if model_type == "lfm2":  # its runtime class reads which layers hold KV and the conv width here
        layers = range(len(manifest.layer_types))
        decoder["layer_types"] = [LFM2_LAYER_TYPES[frozenset(s.kind for s in pasts if s.layer == i)] for i in layers]
        conv = next(s for s in pasts if s.kind == "conv")
        decoder["conv_cache_size"] = conv.dims[-1]
    special = manifest.special_tokens
    eos = list(special["eos_token_id"])
    return {
        "model": {
            "bos_token_id": special["bos_token_id"],
            "context_length": manifest.max_length,
            "decoder": decoder,
            "eos_token_id": eos[0] if len(eos) == 1 else eos,
            "pad_token_id": pad_token_id(manifest),
            "type": model_type,
            "vocab_size": manifest.vocab_size,
        },
        "search": _search(manifest),
    }


def _search(manifest: Manifest) -> dict[str, Any]:
    """genai_config.json's search settings: the checkpoint's generation settings, one sequence."""
    generation = {k: v for k, v in (manifest.generation or {}).items() if v is not None}
    return {
        "diversity_penalty": 0.0,
        "do_sample": bool(generation.get("do_sample", False)),
        "early_stopping": True,
        "length_penalty": 1.0,
        "max_length": manifest.max_length,
        "min_length": 0,
        "no_repeat_ngram_size": 0,
        "num_beams": 1,
        "num_return_sequences": 1,
        # hybridrt's graph writes the new keys into its fixed-size buffer in place: genai must
        # bind one buffer as past and present (False would hand it a growing past)
        "past_present_share_buffer": True,
        "repetition_penalty": float(generation.get("repetition_penalty", 1.0)),
        "temperature": float(generation.get("temperature", 1.0)),
        "top_k": int(generation.get("top_k", 50)),
        "top_p": float(generation.get("top_p", 1.0)),
    }


def pad_token_id(manifest: Manifest) -> int:
    """The token genai pads a batch's shorter prompts with (genai_config's pad_token_id): the
    checkpoint's, else its first EOS."""
    special = manifest.special_tokens
    pad = special["pad_token_id"]
    return int(pad) if pad is not None else int(list(special["eos_token_id"])[0])


def adapt_graph(path: Path, dest: Path, contract: GraphContract, pad: int, *, move: bool) -> None:
    """hybridrt's graph at `path` with genai's inputs and outputs, saved at `dest` (weights in
    `model.onnx_data` beside it). The body is left as it is: the new inputs feed nodes that
    produce the old input names, renamed outputs come from Identity nodes. `pad`: genai's pad
    token: a prompt call of several rows, one starting or ending with it, is refused
    (layout_files.mask_lengths).
    move: move the weights file rather than copy it (`path` is a temporary export)."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(path), load_external_data=False)
    g = model.graph
    pre = Prelude("/genai")
    const, node = pre.const, pre.node
    seq = mask_lengths(pre, contract.takes_lengths, pad)  # [1]
    node("Sub", [seq, const("one_d", [1])], "logit_positions")  # [seq - 1]: the last position

    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch_size", TOTAL_LENGTH]),
    ]
    logits = _renamed(value_info(g.output, "logits"), "logits")
    logits.type.tensor_type.shape.dim[1].ClearField("dim_param")
    logits.type.tensor_type.shape.dim[1].dim_value = 1
    outputs = [logits]
    identities: list[Any] = []
    states = []
    for past, present in zip(contract.pasts, contract.presents, strict=True):
        past_name, present_name = genai_names(past)
        inputs.append(_renamed(value_info(g.input, past.name), past_name))
        if past_name != past.name:
            node("Identity", [past_name], past.name)
        outputs.append(_renamed(value_info(g.output, present.name), present_name))
        if present_name != present.name:
            identities.append(
                helper.make_node("Identity", [present.name], [present_name], name=f"/genai/out/{present_name}")
            )
        states.append(_state_record(past, past_name, present_name))

    pre.install(model, inputs, outputs, identities)
    meta = {
        "hybridrt.layout": GENAI,
        "hybridrt.states": json.dumps(states),
        "hybridrt.inputs": "input_ids, attention_mask (its length gives the past length); padded batches "
        f"are refused (a prompt row of several starting or ending with pad token {pad}); KV buffers of max_length "
        "positions bound as past and present (past_present_share_buffer)",
    }
    set_metadata(model, meta)
    save_with_data(model, path, dest, move=move)


def genai_names(spec: TensorSpec) -> tuple[str, str]:
    """genai's past and present names of one hybridrt state (STATE_NAMES)."""
    if spec.kind not in STATE_NAMES or spec.layer is None:
        raise ExportError(f"{RUNTIME} has no state name for a {spec.kind!r} state ({spec.name})")
    _, past, present = STATE_NAMES[spec.kind]
    return past % spec.layer, present % spec.layer


def _state_record(spec: TensorSpec, past: str, present: str) -> dict[str, Any]:
    """One state's entry in metadata_props["hybridrt.states"]."""
    reset = "zeros; genai fills positions 0 .. total_sequence_length-1 as it goes" if spec.is_kv else "zeros"
    return {
        "input": past,
        "output": present,
        "kind": spec.kind,
        "layer": spec.layer,
        "dims": [DIMS.get(d, d) if isinstance(d, str) else d for d in spec.dims],
        "dtype": spec.dtype,
        "reset": reset,
        "hybridrt_name": spec.name,
    }


def _renamed(info: Any, name: str) -> Any:
    """A copy of a graph input/output named `name`, its symbolic dims in genai's names."""
    import onnx

    new = onnx.ValueInfoProto()
    new.CopyFrom(info)
    new.name = name
    for d in new.type.tensor_type.shape.dim:
        if d.HasField("dim_param"):
            d.dim_param = DIMS.get(d.dim_param, d.dim_param)
    return new
