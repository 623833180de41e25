"""A Triton Inference Server model repository for an exported model (the onnxruntime backend).

Triton keeps each sequence's states itself ("implicit state"): every `past.X` / `present.X`
pair of the manifest becomes one `sequence_batching.state` entry that starts from zeros, so a
client sends only the tokens of each step, tagged with a sequence id; the direct strategy
gives each live sequence a batch slot of a model instance and batches the slots' steps.

Triton needs every state at a fixed size. SSM and conv states are; attention KV is one
buffer for past and present whose KV dim is "capacity": it becomes `kv_capacity` rows.
(Directories of the contract whose KV grew per token, schema 1, are refused by read_manifest
with a re-export message before a repository is planned.)

Layout written (atomically, through a temporary directory beside REPO/NAME):

    REPO/NAME/config.pbtxt
    REPO/NAME/1/model.onnx (+ model.onnx.data)   the graph, plus the control inputs
    REPO/NAME/hybridrt/                          hybridrt.json and the tokenizer, for clients

Triton's onnxruntime backend refuses a config whose control inputs (START, READY, CORRID) the
graph does not declare, so the copy of the graph gains them as unused inputs; the states are
reset by Triton's zero initial state, not by START. The graph's `logit_positions` input [n]
has no batch dim, which Triton's batcher cannot stack: in the copy it is computed from the
call instead (the last position, what generation needs), so sequences batch. Editing the graph needs `onnx` (the
`export` extra). Torch-free.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from ..errors import DeployError
from ..graphs.contract import Dim, TensorSpec, present_name
from ..graphs.files import atomic_directory, copy_tokenizer
from ..graphs.manifest import MANIFEST, Manifest, read_manifest
from ..kinds import CAPACITY
from .triton_graph import BATCH, CONTROLS, LOGIT_POSITIONS, write_graph

DATA_TYPES = {
    "float32": "TYPE_FP32",
    "float16": "TYPE_FP16",
    "bfloat16": "TYPE_BF16",
    "float64": "TYPE_FP64",
    "int64": "TYPE_INT64",
    "int32": "TYPE_INT32",
    "uint64": "TYPE_UINT64",
    "int8": "TYPE_INT8",
    "uint8": "TYPE_UINT8",
    "bool": "TYPE_BOOL",
}
VERSION = "1"
DEFAULT_MAX_BATCH_SIZE = 8
DEFAULT_KV_CAPACITY = 2048


@dataclass(frozen=True)
class TritonOptions:
    """How the repository serves the model; the CLI's defaults come from here.

    max_batch_size: batch slots per instance; None: 8 when every non-state input has a leading
    batch dim, else 0 (Triton stacks requests along a leading batch dim, so an input without
    one allows one sequence per execution; `logit_positions` is computed in the graph copy). kv_capacity: KV
    rows per sequence for "capacity" dims; None: min(2048, the manifest's max length)."""

    name: str | None = None
    max_batch_size: int | None = None
    kv_capacity: int | None = None
    gpu: bool = False
    instances: int = 1
    idle_seconds: float = 60.0


@dataclass(frozen=True)
class Tensor:
    """One config.pbtxt tensor: Triton dims exclude the batch dim when max_batch_size > 0."""

    name: str
    data_type: str
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None = None  # a [batch] input is dims [1] reshaped to []


@dataclass(frozen=True)
class State:
    input_name: str
    output_name: str
    data_type: str
    dims: tuple[int, ...]


@dataclass(frozen=True)
class Plan:
    """What config.pbtxt says, derived from the manifest's TensorSpecs alone."""

    name: str
    max_batch_size: int
    inputs: list[Tensor]
    outputs: list[Tensor]
    states: list[State]
    kv_capacity: int | None
    gpu: bool
    instances: int
    idle_microseconds: int


def plan(manifest: Manifest, options: TritonOptions, default_name: str = "model") -> Plan:
    """The repository's config for this manifest; DeployError for what Triton cannot hold."""
    if manifest.format != "onnx":
        raise DeployError(
            f"Triton's onnxruntime backend runs ONNX graphs; this directory holds a {manifest.format} graph: "
            "export with --format onnx"
        )
    if options.instances < 1:
        raise DeployError(f"instances={options.instances}: a model needs at least one instance")
    if options.idle_seconds <= 0:
        raise DeployError(f"idle_seconds={options.idle_seconds}: must be > 0")
    plain = [s for s in manifest.inputs if not s.name.startswith("past.") and s.name != LOGIT_POSITIONS]
    batched = all(s.dims[:1] == (BATCH,) for s in plain)
    max_batch = _max_batch_size(options.max_batch_size, batched, plain)
    capacity = _kv_capacity(manifest, options.kv_capacity)
    return Plan(
        name=options.name or default_name,
        max_batch_size=max_batch,
        inputs=[_tensor(s, max_batch) for s in plain],
        outputs=[_tensor(s, max_batch) for s in manifest.outputs if not s.name.startswith("present.")],
        states=[_state(s, manifest, max_batch, capacity) for s in manifest.pasts],
        kv_capacity=capacity,
        gpu=options.gpu,
        instances=options.instances,
        idle_microseconds=round(options.idle_seconds * 1e6),
    )


def _max_batch_size(requested: int | None, batched: bool, plain: list[TensorSpec]) -> int:
    if requested is not None and requested < 0:
        raise DeployError(f"max_batch_size={requested}: must be >= 0")
    if batched:
        return DEFAULT_MAX_BATCH_SIZE if requested is None else requested
    if requested:
        first = next(s for s in plain if s.dims[:1] != (BATCH,))
        raise DeployError(
            f"max_batch_size={requested}, but input {first.name} {list(first.dims)} has no leading batch dim and "
            "Triton stacks every input of a batch along one: use max_batch_size=0 (one sequence per execution; "
            "run more instances for concurrency)"
        )
    return 0


def _kv_capacity(manifest: Manifest, requested: int | None) -> int | None:
    """KV rows of a "capacity" dim, or None when no state has one."""
    if not any(s.is_kv for s in manifest.pasts):
        return None
    limit = manifest.max_length
    capacity = min(DEFAULT_KV_CAPACITY, limit) if requested is None else requested
    if not 1 <= capacity <= limit:
        raise DeployError(f"kv_capacity={capacity}: must be between 1 and the model's max length {limit}")
    return capacity


def _data_type(spec: TensorSpec) -> str:
    try:
        return DATA_TYPES[spec.dtype]
    except KeyError:
        raise DeployError(f"{spec.name}: dtype {spec.dtype!r} has no Triton data type here") from None


def _tensor(spec: TensorSpec, max_batch: int) -> Tensor:
    """A non-state input or output: symbolic dims are variable (-1)."""
    dims = [(1 if d == BATCH else -1) if isinstance(d, str) else d for d in spec.dims]
    if max_batch > 0:
        dims = dims[1:]
        if not dims:
            return Tensor(spec.name, _data_type(spec), (1,), reshape=())
    return Tensor(spec.name, _data_type(spec), tuple(dims))


def _state(past: TensorSpec, manifest: Manifest, max_batch: int, capacity: int | None) -> State:
    output = present_name(past.name)
    present = next((s for s in manifest.presents if s.name == output), None)
    if present is None:
        raise DeployError(f"{past.name} has no {output} among the graph's outputs; re-export the model")
    if past.dims[:1] != (BATCH,):
        raise DeployError(f"state {past.name} {list(past.dims)}: Triton needs the batch dim first")
    dims = [_state_dim(past, d, capacity) for d in past.dims[1:]]
    if present.dims != past.dims:
        raise DeployError(
            f"state {past.name} {list(past.dims)} and {output} {list(present.dims)} differ in shape; Triton's "
            "implicit state needs one fixed shape: re-export the model"
        )
    return State(past.name, output, _data_type(past), tuple(dims if max_batch > 0 else [1, *dims]))


def _state_dim(past: TensorSpec, d: Dim, capacity: int | None) -> int:
    if isinstance(d, int):
        return d
    if d == CAPACITY and capacity is not None:
        return capacity
    raise DeployError(f"state {past.name} {list(past.dims)}: symbolic dim {d!r} has no fixed size for Triton")


def config_text(p: Plan) -> str:
    """config.pbtxt in protobuf text format (Triton's inference.ModelConfig)."""
    lines = [
        f'name: "{p.name}"',
        'backend: "onnxruntime"',
        f"max_batch_size: {p.max_batch_size}",
        "input [",
        ",\n".join(_tensor_text(t) for t in p.inputs),
        "]",
        "output [",
        ",\n".join(_tensor_text(t) for t in p.outputs),
        "]",
        "sequence_batching {",
        f"  max_sequence_idle_microseconds: {p.idle_microseconds}",
        "  direct { }",
        "  control_input [",
        ",\n".join(_control_text(*c) for c in CONTROLS),
        "  ]",
        "  state [",
        ",\n".join(_state_text(s) for s in p.states),
        "  ]",
        "}",
        "instance_group [",
        f"  {{ count: {p.instances} kind: {'KIND_GPU' if p.gpu else 'KIND_CPU'} }}",
        "]",
    ]
    return "\n".join(line for line in lines if line) + "\n"


def _dims(dims: tuple[int, ...]) -> str:
    return "[ " + ", ".join(str(d) for d in dims) + " ]" if dims else "[ ]"


def _tensor_text(t: Tensor) -> str:
    reshape = f" reshape: {{ shape: {_dims(t.reshape)} }}" if t.reshape is not None else ""
    return f'  {{ name: "{t.name}" data_type: {t.data_type} dims: {_dims(t.dims)}{reshape} }}'


def _control_text(name: str, kind: str, dtype: str) -> str:
    value = f"data_type: {DATA_TYPES[dtype]}" if kind.endswith("CORRID") else "int32_false_true: [ 0, 1 ]"
    return f'    {{ name: "{name}" control [ {{ kind: {kind} {value} }} ] }}'


def _state_text(s: State) -> str:
    return "\n".join(
        (
            "    {",
            f'      input_name: "{s.input_name}"',
            f'      output_name: "{s.output_name}"',
            f"      data_type: {s.data_type}",
            f"      dims: {_dims(s.dims)}",
            f'      initial_state: {{ name: "zero" data_type: {s.data_type} dims: {_dims(s.dims)} zero_data: true }}',
            "    }",
        )
    )


def write_repository(
    model: str | Path, repo: str | Path, options: TritonOptions = TritonOptions(), force: bool = False
) -> Path:
    """Write REPO/NAME for the exported directory `model`; returns REPO/NAME. An existing
    REPO/NAME is replaced only with `force`; other models in REPO are left alone."""
    model = Path(model)
    manifest = read_manifest(model)
    p = plan(manifest, options, default_name=_model_name(model))
    target = Path(repo) / p.name
    if target.exists() and not force:
        raise DeployError(f"{target} exists; pass force=True (--force) to replace it")
    text = config_text(p)
    graph = model / manifest.graph_file
    if not graph.is_file():
        raise DeployError(f"{graph} is missing; re-export the model")
    with atomic_directory(target, DeployError) as tmp:
        (tmp / VERSION).mkdir()
        write_graph(graph, tmp / VERSION / graph.name, p.max_batch_size > 0)
        (tmp / "config.pbtxt").write_text(text)
        (tmp / "hybridrt").mkdir()
        shutil.copy2(model / MANIFEST, tmp / "hybridrt" / MANIFEST)
        copy_tokenizer(model, tmp / "hybridrt")
    return target


def _model_name(model: Path) -> str:
    name = model.resolve().name
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "model"
