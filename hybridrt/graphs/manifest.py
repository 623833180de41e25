"""`hybridrt.json`: the manifest that makes an exported directory self-describing.

The runtime reads only this file and the graph; it never guesses. Torch-free. Two of its
records are read off the checkpoint and the graph here:

`generation`, a model's recommended generation settings: read at export from the checkpoint's
`generation_config.json` (read_generation_config) and applied by the runtime to every
generate/stream/session call unless the caller overrides them (merge). Keys taken:
repetition_penalty, max_new_tokens, min_new_tokens as transformers; do_sample, temperature,
top_k, top_p only when do_sample is true (transformers ignores the others without it), and then
as one group: a caller who sets any sampling parameter replaces the whole group; add_bos_token
(hybridrt's key): prepend the tokenizer's BOS token to text prompts that do not start with it.
Other keys (bos/eos/pad ids, transformers_version, ...) are ignored: special token ids come from
config.json.

`in_place`, the fixed-size states a graph may read and write in one buffer (in_place_states). A
decode step reads each conv and SSM state once and writes its successor. Bound to two buffers,
onnxruntime's LinearAttention first copies the whole past state into the present one before
updating it (22 MB a token on granite-h-350m); bound to one, the copy is a no-op and the state
stays in cache (`docs/notes/onnxruntime-fused-ops.md`, "States in place"). That is only correct
where the node that reads `past.X` writes `present.X`, nothing else reads `past.X`, and the
kernel reads the past before it overwrites it: the CPU kernels of these two onnxruntime
operators do (tests/test_in_place.py); any other producer (a Scan, plain Concat/Slice) keeps two
buffers. The runtime binds in place on the CPU only, and only for a stepper that does not rewind
(`Model.stepper(ring=1)`, the default).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import GraphError
from .contract import TensorSpec, present_name
from .edit import subgraph_reads
from .schema import GENERATION, check_manifest, problem

# 2: fixed-size KV buffers (past and present one buffer), past_lengths and logit_positions
# instead of attention_mask and position_ids. 3: Mamba SSM states [batch, d_state, d_inner].
# Directories of older versions must be re-exported (those of 2 without Mamba layers load as 3).
SCHEMA_VERSION = 3
# What each older schema lacks, for the re-export message.
_OLD_SCHEMAS = {
    1: "its graph grows its KV per token and takes an attention mask (schema 2 on: fixed-size KV buffers)",
    2: "its Mamba layers keep their SSM state as [batch, d_inner, d_state] "
    "(schema 3: [batch, d_state, d_inner], for a faster one-token step)",
}
MANIFEST = "hybridrt.json"
GRAPH_FILES = {"onnx": "model.onnx", "torchscript": "model.pt", "pt2": "model.pt2"}
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "generation_config.json",
)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass
class Manifest:
    """What an exported directory holds. `config` is the HybridConfig as a dict."""

    format: str
    architecture: str
    layer_types: list[str]
    config: dict[str, Any]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    special_tokens: dict[str, Any]
    max_length: int
    vocab_size: int
    logits: str = "logit_positions"  # which positions get logits: the ones the logit_positions input names
    quantization: dict[str, Any] | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    parity: dict[str, Any] = field(default_factory=dict)
    generation: dict[str, Any] | None = None  # recommended settings (read_generation_config)
    # Fixed-size states whose one reader is their writer, so that a step may read and write them
    # in one buffer (in_place_states); empty in manifests written before it.
    in_place: list[str] = field(default_factory=list)
    schema_version: int = SCHEMA_VERSION

    @property
    def graph_file(self) -> str:
        return GRAPH_FILES[self.format]

    @property
    def pasts(self) -> list[TensorSpec]:
        return [s for s in self.inputs if s.name.startswith("past.")]

    @property
    def presents(self) -> list[TensorSpec]:
        return [s for s in self.outputs if s.name.startswith("present.")]

    @property
    def recurrent(self) -> bool:
        """Whether any state is recurrent (conv, SSM: a fixed size that every token updates).
        Without one, forgetting the last tokens is only setting the lengths back: their keys and
        values stay in the KV buffers, unread; with one, it needs the states from before them."""
        return any(not s.is_kv for s in self.pasts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "format": self.format,
            "architecture": self.architecture,
            "layer_types": self.layer_types,
            "logits": self.logits,
            "max_length": self.max_length,
            "vocab_size": self.vocab_size,
            "special_tokens": self.special_tokens,
            "inputs": [s.to_dict() for s in self.inputs],
            "outputs": [s.to_dict() for s in self.outputs],
            "quantization": self.quantization,
            "provenance": self.provenance,
            "parity": self.parity,
            "generation": self.generation,
            "in_place": self.in_place,
            "files": self.files,
            "config": self.config,
        }

    def write(self, directory: Path) -> Path:
        path = directory / MANIFEST
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    def record_files(self, directory: Path) -> None:
        """sha256 and size of every file in the directory but the manifest itself."""
        self.files = {
            p.name: {"sha256": sha256(p), "bytes": p.stat().st_size}
            for p in sorted(directory.iterdir())
            if p.is_file() and p.name != MANIFEST
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Manifest:
        return cls(
            format=d["format"],
            architecture=d["architecture"],
            layer_types=list(d["layer_types"]),
            config=d["config"],
            inputs=[TensorSpec.from_dict(s) for s in d["inputs"]],
            outputs=[TensorSpec.from_dict(s) for s in d["outputs"]],
            special_tokens=d.get("special_tokens", {}),
            max_length=int(d["max_length"]),
            vocab_size=int(d["vocab_size"]),
            logits=d.get("logits", "logit_positions"),
            quantization=d.get("quantization"),
            provenance=d.get("provenance", {}),
            files=d.get("files", {}),
            parity=d.get("parity", {}),
            generation=d.get("generation"),
            in_place=list(d.get("in_place", [])),
            schema_version=int(d.get("schema_version", SCHEMA_VERSION)),
        )


def read_manifest(directory: str | Path) -> Manifest:
    directory = Path(directory)
    path = directory / MANIFEST
    if not directory.is_dir():
        raise GraphError(f"model directory not found: {directory}")
    if not path.is_file():
        raise GraphError(
            f"{directory} has no {MANIFEST}; export a checkpoint with `hybridrt export SRC -o {directory}`"
        )
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise GraphError(f"{path} is corrupt or not a hybridrt manifest ({e!r}); re-export the model") from None
    except OSError as e:
        raise GraphError(f"{path} cannot be read ({e.strerror}); check its permissions") from None
    version = data.get("schema_version", 1) if isinstance(data, dict) else None
    if version == 2 and "mamba" not in (data.get("layer_types") or ["mamba"]):
        version = data["schema_version"] = SCHEMA_VERSION  # 3 changed only the Mamba layers' state
    if isinstance(version, int) and version < SCHEMA_VERSION:
        why = _OLD_SCHEMAS.get(version, "it predates the graph contract")
        raise GraphError(
            f"{path} has schema version {version}, which this hybridrt no longer runs: {why}. "
            f"Re-export the model (schema {SCHEMA_VERSION}): hybridrt export SRC -o {directory}"
        )
    check_manifest(data, str(path), tuple(GRAPH_FILES))
    manifest = Manifest.from_dict(data)
    fixed = {s.name for s in manifest.pasts if not s.is_kv}
    if unknown := [n for n in manifest.in_place if n not in fixed]:
        raise GraphError(
            f"{path} lists {unknown[0]!r} under in_place, which is not a fixed-size state of the graph; "
            "the manifest was edited or damaged: re-export the model"
        )
    if manifest.schema_version > SCHEMA_VERSION:
        raise GraphError(
            f"{path} has schema version {manifest.schema_version}; this hybridrt reads up to {SCHEMA_VERSION}. "
            "Upgrade hybridrt."
        )
    return manifest


def verify_files(directory: Path, manifest: Manifest, hashes: bool = True) -> None:
    """Every file the manifest lists exists with its recorded size and sha256 (hashes=False:
    its size only, which reads no file: a check before work that will read them anyway)."""
    for name, info in manifest.files.items():
        path = directory / name
        if not path.is_file():
            raise GraphError(f"{path} is listed in {MANIFEST} but missing; the directory is incomplete")
        if path.stat().st_size != info["bytes"] or (hashes and sha256(path) != info["sha256"]):
            raise GraphError(
                f"{path} does not match the checksum in {MANIFEST}: the file is corrupt or was changed "
                "after export; re-export the model"
            )


MS_DOMAIN = "com.microsoft"
# op type -> (input index of the past state, output index of the present state)
IN_PLACE_OPS = {"LinearAttention": (3, 1), "CausalConvWithState": (3, 1)}


def in_place_states(graph: Any, pasts: list[TensorSpec]) -> list[str]:
    """The fixed-size pasts of `graph` (a GraphProto, its fields read) that one node reads and
    writes and nothing else reads."""
    readers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    nested = subgraph_reads(graph)
    out = []
    for spec in pasts:
        if spec.is_kv or spec.name in nested:
            continue
        nodes = readers.get(spec.name, [])
        if len(nodes) != 1 or nodes[0].domain != MS_DOMAIN or nodes[0].op_type not in IN_PLACE_OPS:
            continue
        node = nodes[0]
        past_at, present_at = IN_PLACE_OPS[node.op_type]
        inputs, outputs = list(node.input), list(node.output)
        if inputs.count(spec.name) != 1 or inputs.index(spec.name) != past_at:
            continue
        if len(outputs) > present_at and outputs[present_at] == present_name(spec.name):
            out.append(spec.name)
    return out


GENERATION_CONFIG = "generation_config.json"
SAMPLING = ("do_sample", "temperature", "top_k", "top_p")
SINGLE = ("repetition_penalty", "max_new_tokens", "min_new_tokens", "add_bos_token")


def read_generation_config(directory: Path) -> dict[str, Any] | None:
    """The recommended settings in `directory/generation_config.json`, or None without one."""
    path = directory / GENERATION_CONFIG
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except ValueError as e:
        raise GraphError(f"{path} is not valid JSON ({e}); fix or remove it") from None
    if not isinstance(data, dict):
        raise GraphError(f"{path} must hold a JSON object, got {type(data).__name__}; fix or remove it")
    keys = SINGLE + (SAMPLING if data.get("do_sample") is True else ())
    found = {k: data[k] for k in keys if k in data and data[k] is not None}
    bad = problem(found, GENERATION, "")
    if bad:
        raise GraphError(f"{path}: {bad}; fix or remove it")
    return found or None


def merge(recommended: dict[str, Any] | None, given: dict[str, Any]) -> dict[str, Any]:
    """The caller's parameters over the model's recommendations (sampling as one group)."""
    if not recommended:
        return given
    base = dict(recommended)
    if any(given.get(k) is not None for k in SAMPLING):
        for k in SAMPLING:
            base.pop(k, None)
    return base | given
