"""hybridrt's graph behind transformers.js's inputs and outputs (interop.layouts' transformers-js).

  input_ids            int64 [batch_size, sequence_length]
  attention_mask       int64 [batch_size, total_sequence_length]   past_lengths = its length
                       minus sequence_length (every row the same length); a padded row (a 0
                       in its first or last column) fails the call with
                       layout_files.PADDED_ROWS: the body reads no mask
  num_logits_to_keep   int64 []   logits for the last n positions, all of them for 0
  past_key_values.{i}.key / .value  [batch_size, kv_heads, past_sequence_length, head_dim]
                       padded by sequence_length positions into hybridrt's KV buffer,
                       whose present then holds exactly past + new tokens (the growing KV
                       transformers.js concatenates for other models)
  past_conv.{i}, past_ssm.{i}, past_recurrent.{i}   hybridrt's states as they are
                       (names by interop.tjs_names); a state in parts (OLMo Hybrid's conv)
                       is concatenated along its channels
  -> logits [batch_size, num_logits, vocab], present.{i}.key / .value and a present_* per past

The body of the graph is left as it is: the new inputs feed nodes that produce the old input
names, the old outputs feed Identity (or, for parts, Slice) nodes named as the new outputs. The
ONNX model's metadata_props carry the state description (`hybridrt.states`: input, output,
kind, layer, dims, dtype, reset value).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..graphs.contract import GraphContract, TensorSpec
from .files import Prelude, mask_lengths, save_with_data, set_metadata, value_info
from .tjs_names import Part

LAYOUT = "transformers-js"
# transformers.js's symbolic dimension names; it resolves `batch_size` and starts the others at 0.
DIMS = {
    "batch": "batch_size",
    "seq": "sequence_length",
    "n_logits": "num_logits",
}
PAST_LENGTH, TOTAL_LENGTH = "past_sequence_length", "total_sequence_length"
KEEP = "num_logits_to_keep"


def adapt_graph(
    path: Path, dest: Path, contract: GraphContract, parts: dict[str, list[Part]], *, move: bool = True
) -> None:
    """hybridrt's graph at `path` with transformers.js's inputs and outputs, saved at `dest`
    (weights in `<dest name>_data` beside it, the name transformers.js loads; moved from
    beside `path`, or copied). `parts` maps each past of the contract to its transformers.js
    tensors."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(path), load_external_data=False)
    g = model.graph
    pre = Prelude("/tjs")
    seq = mask_lengths(pre, contract.takes_lengths)  # [1]
    _logit_positions(pre, seq)
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch_size", TOTAL_LENGTH]),
        helper.make_tensor_value_info(KEEP, TensorProto.INT64, []),
    ]
    outputs = [_renamed(value_info(g.output, "logits"), "logits", {})]
    finale: list[Any] = []
    states = []
    for past, present in zip(contract.pasts, contract.presents, strict=True):
        tensors = parts[past.name]
        past_info = value_info(g.input, past.name)
        present_info = value_info(g.output, present.name)
        for p in tensors:
            inputs.append(_renamed(past_info, p.past, {"capacity": PAST_LENGTH}, p))
            outputs.append(_renamed(present_info, p.present, {"capacity": TOTAL_LENGTH}, p))
            states.append(_state_record(past, p))
        finale += _wired(pre, past, present.name, tensors, seq)

    pre.install(model, inputs, outputs, finale)
    meta = {
        "hybridrt.layout": LAYOUT,
        "hybridrt.states": json.dumps(states),
        "hybridrt.inputs": "input_ids, attention_mask (its length gives the past length; a padded row, "
        "a 0 in its first or last column, is refused), num_logits_to_keep",
    }
    set_metadata(model, meta)
    save_with_data(model, path, dest, move=move)


def _logit_positions(pre: Prelude, seq: str) -> None:
    """logit_positions = max(seq - n, 0) .. seq-1 for n = num_logits_to_keep > 0, else 0 .. seq-1."""
    const, node = pre.const, pre.node
    seq0 = node("Squeeze", [seq, const("axis0", [0])], "/tjs/seq_scalar")
    zero = const("zero_scalar", [0], [])
    tail = node("Max", [node("Sub", [seq0, KEEP], "/tjs/seq_minus_n"), zero], "/tjs/tail_start")
    start = node("Where", [node("Greater", [KEEP, zero], "/tjs/keep_some"), tail, zero], "/tjs/start")
    node("Range", [start, seq0, const("one_scalar", [1], [])], "logit_positions")


def _wired(pre: Prelude, past: TensorSpec, present: str, tensors: list[Part], seq: str) -> list[Any]:
    """The nodes that give our graph its past `past` from transformers.js's tensors (in the
    prelude), and those that give transformers.js's presents from ours (returned: they run last)."""
    from onnx import helper

    const, node = pre.const, pre.node
    if len(tensors) > 1:  # a state in parts: concatenated in, sliced out along its channels
        node("Concat", [p.past for p in tensors], past.name, axis=1)
        return [
            helper.make_node(
                "Slice",
                [present, const(f"{p.present}/start", [p.start]), const(f"{p.present}/stop", [p.stop or 0])]
                + [const("axis1", [1])],
                [p.present],
                name=f"/tjs/out/{p.present}",
            )
            for p in tensors
        ]
    (p,) = tensors
    if past.is_kv:  # room for the new tokens: our graph writes them at past_lengths
        axis = past.kv_axis
        assert axis is not None
        before = const(f"pads_{p.past}", [0] * (len(past.dims) + axis))
        after = const(f"pads_end_{p.past}", [0] * (len(past.dims) - axis - 1))
        pads = node("Concat", [before, seq, after], f"/tjs/pads/{p.past}", axis=0)
        node("Pad", [p.past, pads], past.name, mode="constant")
    else:
        node("Identity", [p.past], past.name)
    if p.present == present:
        return []
    return [helper.make_node("Identity", [present], [p.present], name=f"/tjs/out/{p.present}")]


def _state_record(spec: TensorSpec, part: Part) -> dict[str, Any]:
    """One transformers.js state's entry in metadata_props["hybridrt.states"]."""
    dims = [DIMS.get(d, PAST_LENGTH if d == "capacity" else d) if isinstance(d, str) else d for d in spec.dims]
    if part.stop is not None:
        dims[1] = part.stop - part.start
    record: dict[str, Any] = {
        "input": part.past,
        "output": part.present,
        "kind": spec.kind,
        "layer": spec.layer,
        "dims": dims,
        "dtype": spec.dtype,
        "reset": "empty: 0 positions along past_sequence_length" if spec.is_kv else "zeros",
        "hybridrt_name": spec.name,
    }
    if part.stop is not None:
        record["channels"] = [part.start, part.stop]  # of hybridrt's state
    return record


def _renamed(info: Any, name: str, extra_dims: dict[str, str], part: Part | None = None) -> Any:
    """A copy of a graph input/output named `name`, its symbolic dims in transformers.js's
    names (and, for a part of a state, its channels)."""
    import onnx

    new = onnx.ValueInfoProto()
    new.CopyFrom(info)
    new.name = name
    dims = new.type.tensor_type.shape.dim
    for d in dims:
        if d.HasField("dim_param"):
            d.dim_param = (DIMS | extra_dims).get(d.dim_param, d.dim_param)
    if part is not None and part.stop is not None:
        dims[1].dim_value = part.stop - part.start
    return new
