"""What the layouts of other runtimes share (interop.layouts, interop.tjs_graph, interop.genai):
the prelude that maps their inputs onto hybridrt's and its installation in the graph, value infos,
metadata, the files they save, and the atomic write of a layout around hybridrt's own export."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ExportError
from ..graphs.files import EXTERNAL_SIZE_THRESHOLD, IR_VERSION, atomic_directory


class Prelude:
    """Nodes put ahead of hybridrt's graph body, which compute its inputs from a layout's, and
    their int64 constants; every name starts with `prefix` (`/tjs`, `/genai`)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.nodes: list[Any] = []
        self._consts: dict[str, Any] = {}

    def const(self, name: str, values: list[int], dims: list[int] | None = None) -> str:
        """An int64 constant (1-D unless `dims`); one per name."""
        from onnx import TensorProto, helper

        full = f"{self.prefix}/{name}"
        self._consts[full] = helper.make_tensor(
            full, TensorProto.INT64, [len(values)] if dims is None else dims, values
        )
        return full

    def node(self, op: str, inputs: list[str], output: str, name: str | None = None, **attrs: Any) -> str:
        """One node (named `{prefix}/{op}_{index}` unless `name`); returns its output's name."""
        from onnx import helper

        name = f"{self.prefix}/{name or f'{op}_{len(self.nodes)}'}"
        self.nodes.append(helper.make_node(op, inputs, [output], name=name, **attrs))
        return output

    @property
    def initializers(self) -> list[Any]:
        return list(self._consts.values())

    def install(self, model: Any, inputs: list[Any], outputs: list[Any], tail: list[Any]) -> None:
        """Put the prelude's nodes ahead of the model's graph body and `tail` (renaming
        Identities) after it, with its constants, and give the graph the layout's `inputs` and
        `outputs` (value infos) in place of hybridrt's."""
        g = model.graph
        nodes = self.nodes + list(g.node) + tail
        del g.node[:]
        g.node.extend(nodes)
        g.initializer.extend(self.initializers)
        del g.input[:]
        g.input.extend(inputs)
        del g.output[:]
        g.output.extend(outputs)


INT64 = 7  # onnx.TensorProto.INT64, for Cast (onnx is imported only where a graph is built)

# The name of the prelude node that fails on a padded batch; onnxruntime's error names it.
PADDED_ROWS = (
    "padded rows are not supported (an attention_mask row starts or ends with 0, or a prompt row "
    "of a batch starts or ends with the pad token): the graph reads no mask, so run prompts of "
    "different lengths one at a time"
)


def mask_lengths(p: Prelude, takes_lengths: bool, pad_token_id: int | None = None) -> str:
    """The new tokens' count, `seq` (int64 [1], from input_ids [batch, seq]), and, for a graph
    that takes them (`takes_lengths`), hybridrt's `past_lengths` [batch] = attention_mask's
    length (total_sequence_length) minus seq, the same for every row. Returns seq's name.

    The body takes no mask, so a pad would be attended to and folded into the conv and scan
    states (a row's tokens would change with its batch): `seq` comes through a Reshape named
    PADDED_ROWS that fails on a padded batch (`_unpadded`) instead.
    """
    pfx = p.prefix
    ids_shape = p.node("Shape", ["input_ids"], f"{pfx}/ids_shape")
    new = p.node("Slice", [ids_shape, p.const("one", [1]), p.const("two", [2])], f"{pfx}/new_tokens")  # [1]
    batch = p.node("Slice", [ids_shape, p.const("zero", [0]), p.const("one_b", [1])], f"{pfx}/batch")  # [1]
    mask_shape = p.node("Shape", ["attention_mask"], f"{pfx}/mask_shape")
    total = p.node("Slice", [mask_shape, p.const("one_c", [1]), p.const("two_c", [2])], f"{pfx}/total")  # [1]
    ok = _unpadded(p, new, batch, total, pad_token_id)
    seq = p.node("Reshape", [new, ok], f"{pfx}/seq", name=PADDED_ROWS, allowzero=1)  # to [0]: fails
    if takes_lengths:
        p.node("Expand", [p.node("Sub", [total, seq], f"{pfx}/past"), batch], "past_lengths")
    return seq


def _unpadded(p: Prelude, new: str, batch: str, total: str, pad_token_id: int | None) -> str:
    """int64 [1]: 1, or 0 for a padded batch: a row whose mask starts with 0 (left padding, in
    every call) or ends with 0 (right padding, in the prompt's call: the runtimes append 1 per
    new token), or, with `pad_token_id` (onnxruntime-genai pads prompts with it, its tokenizer's
    encode_batch on the right, and passes a mask of ones), a prompt call of several rows with
    one starting or ending with that token."""
    pfx = p.prefix

    def cast(op: str, inputs: list[str], name: str) -> str:
        return p.node("Cast", [p.node(op, inputs, f"{pfx}/is_{name}")], f"{pfx}/{name}", to=INT64)

    ends = p.node("Gather", ["attention_mask", p.const("first_last", [0, -1])], f"{pfx}/mask_ends", axis=1)
    ok = p.node("ReduceMin", [ends], f"{pfx}/mask_ends_min", keepdims=0)  # 1 unless a row is padded
    ok = p.node("Reshape", [ok, p.const("flat", [-1])], f"{pfx}/unpadded")  # [1]
    if pad_token_id is None:
        return ok
    ids_ends = p.node("Gather", ["input_ids", p.const("first_last", [0, -1])], f"{pfx}/ids_ends", axis=1)
    pad_end = cast("Equal", [ids_ends, p.const("pad", [pad_token_id])], "pad_end")  # [batch, 2]
    pads = p.node("ReduceMax", [pad_end], f"{pfx}/any_pad_end", keepdims=0)  # 1 if a row starts or ends with it
    prompt = cast("Equal", [total, new], "prompt_call")  # no past: [1]
    rows = cast("Greater", [batch, p.const("one_row", [1])], "rows")  # [1]
    padded = p.node("Mul", [p.node("Mul", [pads, prompt], f"{pfx}/pad_prompt"), rows], f"{pfx}/padded_prompt")
    return p.node("Min", [ok, p.node("Sub", [p.const("one", [1]), padded], f"{pfx}/unpadded_prompt")], f"{pfx}/ok")


def value_info(infos: Any, name: str) -> Any:
    for info in infos:
        if info.name == name:
            return info
    raise ExportError(f"exported graph has no {name!r}")


def write_around(
    out: Path,
    force: bool,
    export_inner: Callable[[Path], Any],
    write: Callable[[Path, Any, Path], None],
    say: Callable[[str], None],
    runtime: str,
) -> Any:
    """A layout's directory at `out`, atomically: hybridrt's own export into a scratch folder
    inside it (`export_inner(folder)` -> manifest), the layout's files written around that graph
    (`write(folder, manifest, tmp)`, moving its weights), the scratch folder removed. Returns
    hybridrt's manifest of the inner graph."""
    if out.exists() and not force:
        raise ExportError(f"output directory {out} already exists; pass --force (force=True) to replace it")
    with atomic_directory(out, ExportError) as tmp:
        inner = tmp / ".hybridrt"
        manifest = export_inner(inner)
        say(f"writing the {runtime} layout")
        write(inner, manifest, tmp)
        shutil.rmtree(inner)
    return manifest


def save_with_data(model: Any, src: Path, dest: Path, *, move: bool = True) -> None:
    """Save with every weight in `<dest name>_data` beside `dest`. Weights already in one
    external file are moved (or copied) with it, never loaded into memory; a graph with
    inline weights, or with several files, is written out whole."""
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    data = f"{dest.name}_data"
    model.ir_version = IR_VERSION
    tensors = [t for t in model.graph.initializer if uses_external_data(t)]
    files = {ExternalDataInfo(t).location for t in tensors}
    if len(files) == 1:
        (location,) = files
        (shutil.move if move else shutil.copyfile)(src.parent / location, dest.parent / data)
        for t in tensors:
            for entry in t.external_data:
                if entry.key == "location":
                    entry.value = data
        onnx.save_model(model, str(dest))
        return
    onnx.load_external_data_for_model(model, str(src.parent))
    onnx.save_model(
        model,
        str(dest),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=data,
        size_threshold=EXTERNAL_SIZE_THRESHOLD,
    )


def set_metadata(model: Any, meta: dict[str, str]) -> None:
    """metadata_props[key] = value for each entry, replacing what the graph already said (the
    inner graph carries hybridrt's own layout and state description)."""
    import onnx

    kept = [(p.key, p.value) for p in model.metadata_props if p.key not in meta]
    del model.metadata_props[:]
    for key, value in [*kept, *meta.items()]:
        model.metadata_props.append(onnx.StringStringEntryProto(key=key, value=value))
