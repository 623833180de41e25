"""The schema of `hybridrt.json`, checked field by field (nested ones too) before the
manifest is built, so a hand-edited or damaged manifest is a GraphError naming the field
rather than an AttributeError somewhere in the runtime. Torch-free.

A schema is data: a Python type (or tuple of types), a `Record` of named fields, `ListOf`
or `MapOf` an element schema, `Maybe` (null allowed), `OneOf` several schemas, or a
`Check` (a schema plus a predicate with what it allows).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import GraphError


@dataclass(frozen=True)
class Record:
    required: dict[str, Any]
    optional: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ListOf:
    item: Any


@dataclass(frozen=True)
class MapOf:
    value: Any


@dataclass(frozen=True)
class Maybe:
    inner: Any


@dataclass(frozen=True)
class OneOf:
    options: tuple[Any, ...]


@dataclass(frozen=True)
class Check:
    inner: Any
    ok: Callable[[Any], bool]
    allowed: str


INT = Check(int, lambda v: True, "")
POSITIVE = Check(int, lambda v: v >= 1, "an integer >= 1")
NON_NEGATIVE = Check(int, lambda v: v >= 0, "an integer >= 0")
NUMBER = Check((int, float), lambda v: True, "")
NAME = Check(str, lambda v: bool(v) and "/" not in v and "\\" not in v and v not in (".", ".."), "a plain file name")
TOKEN = Maybe(NON_NEGATIVE)
TENSOR = Record(
    {
        "name": Check(str, bool, "a non-empty string"),
        "dims": ListOf(OneOf((str, NON_NEGATIVE))),
        "dtype": str,
        "kind": str,
    },
    {"layer": Maybe(NON_NEGATIVE)},
)
EMPTY = Check(dict, lambda v: not v, "an empty object")
PARITY = OneOf(
    (
        EMPTY,
        Record(
            {
                "max_abs_logits": NUMBER,
                "max_abs_state": NUMBER,
                "tolerance": NUMBER,
                "prompt": ListOf(Record({"seq": NON_NEGATIVE})),
                "decode": MapOf(object),
            },
            {"passed": bool},
        ),
    )
)
REPORT = Record(
    {"ppl_ratio": NUMBER, "mean_kl": NUMBER, "greedy_agreement": NUMBER, "tokens": NON_NEGATIVE},
    {"nll_quantized": NUMBER, "nll_delta": NUMBER, "prompts": NON_NEGATIVE, "greedy_tokens": NON_NEGATIVE},
)
QUANTIZATION = Record(
    {"mode": str},
    {
        "algo": Maybe(str),
        "quantized_nodes": ListOf(str),
        "excluded": MapOf(object),
        "float_activations": Maybe(OneOf((ListOf(str), MapOf(object)))),
        "vocab": Maybe(MapOf(object)),
        "size": Maybe(Record({"bytes": NON_NEGATIVE, "ratio": NUMBER})),
        "report": Maybe(REPORT),
        "report_skipped": str,
    },
)
GENERATION = Record(
    {},
    {
        "max_new_tokens": POSITIVE,
        "min_new_tokens": NON_NEGATIVE,
        "do_sample": bool,
        "temperature": Maybe(NUMBER),
        "top_k": Maybe(NON_NEGATIVE),
        "top_p": Maybe(NUMBER),
        "repetition_penalty": NUMBER,
        "eos_token_id": Maybe(OneOf((NON_NEGATIVE, ListOf(NON_NEGATIVE)))),
        "add_bos_token": bool,
    },
)
MANIFEST_SCHEMA = Record(
    {
        "format": str,
        "architecture": str,
        "layer_types": ListOf(str),
        "config": MapOf(object),
        "inputs": ListOf(TENSOR),
        "outputs": ListOf(TENSOR),
        "max_length": POSITIVE,
        "vocab_size": POSITIVE,
    },
    {
        "schema_version": NON_NEGATIVE,
        "logits": str,
        "special_tokens": Record(
            {}, {"bos_token_id": TOKEN, "eos_token_id": OneOf((TOKEN, ListOf(NON_NEGATIVE))), "pad_token_id": TOKEN}
        ),
        "quantization": Maybe(QUANTIZATION),
        "provenance": MapOf(object),
        "parity": PARITY,
        "files": MapOf(Record({"sha256": Check(str, lambda v: len(v) == 64, "64 hex digits"), "bytes": NON_NEGATIVE})),
        "generation": Maybe(GENERATION),
        "in_place": ListOf(str),
    },
)

_JSON_NAMES = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "an object",
    object: "any value",
}


def describe(schema: Any) -> str:
    """What a schema allows, in JSON terms."""
    if isinstance(schema, type):
        return _JSON_NAMES.get(schema, schema.__name__)
    if isinstance(schema, tuple):
        return " or ".join(describe(s) for s in schema)
    if isinstance(schema, Check):
        return schema.allowed or describe(schema.inner)
    if isinstance(schema, Record | MapOf):
        return "an object"
    if isinstance(schema, ListOf):
        return f"a list of {describe(schema.item).removeprefix('a ').removeprefix('an ')}s"
    if isinstance(schema, Maybe):
        return f"{describe(schema.inner)} or null"
    if isinstance(schema, OneOf):
        return " or ".join(describe(s) for s in schema.options)
    return str(schema)


def problem(value: Any, schema: Any, path: str) -> str | None:
    """The first field of `value` that `schema` does not allow, as 'path: why', or None."""
    if isinstance(schema, Maybe):
        return None if value is None else problem(value, schema.inner, path)
    if isinstance(schema, OneOf):
        if any(problem(value, s, path) is None for s in schema.options):
            return None
        return _wrong(value, schema, path)
    if isinstance(schema, Check):
        inner = problem(value, schema.inner, path)
        return inner or (None if schema.ok(value) else _wrong(value, schema, path))
    if isinstance(schema, type | tuple):
        return None if _is(value, schema) else _wrong(value, schema, path)
    if isinstance(schema, ListOf):
        if not isinstance(value, list):
            return _wrong(value, schema, path)
        return next((p for i, v in enumerate(value) if (p := problem(v, schema.item, f"{path}[{i}]"))), None)
    if isinstance(schema, MapOf):
        if not isinstance(value, dict):
            return _wrong(value, schema, path)
        return next((p for k, v in value.items() if (p := problem(v, schema.value, f"{path}.{k}"))), None)
    assert isinstance(schema, Record)
    if not isinstance(value, dict):
        return _wrong(value, schema, path)
    for name in schema.required:
        if name not in value:
            return f"{path}.{name}: missing (required)".lstrip(".")
    fields = schema.required | schema.optional
    return next(
        (p for k, v in value.items() if k in fields and (p := problem(v, fields[k], f"{path}.{k}".lstrip(".")))),
        None,
    )


def _is(value: Any, types: type | tuple[type, ...]) -> bool:
    options = types if isinstance(types, tuple) else (types,)
    if isinstance(value, bool):
        return bool in options or object in options  # JSON true is not a number here
    if isinstance(value, float) and not math.isfinite(value):
        return object in options
    return isinstance(value, options)


def _wrong(value: Any, schema: Any, path: str) -> str:
    text = repr(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    return f"{path or 'the manifest'}: must be {describe(schema)}, got {text}"


def check_manifest(data: Any, where: str, formats: tuple[str, ...]) -> None:
    """GraphError naming the first field of a parsed hybridrt.json that breaks the schema
    (formats: the graph formats there are)."""
    found = problem(data, MANIFEST_SCHEMA, "") or _cross_field(data, formats)
    if found:
        raise GraphError(f"{where} is not a valid hybridrt manifest: field {found}; re-export the model")


def _cross_field(data: dict[str, Any], formats: tuple[str, ...]) -> str | None:
    """What the types alone cannot say: the format is known, files are plain names in the
    directory, special tokens are in the vocabulary."""
    if data["format"] not in formats:
        return f"format: must be one of {', '.join(formats)}, got {data['format']!r}"
    for name in data.get("files", {}):
        if problem(name, NAME, "") is not None:
            return f"files: {name!r} is not a plain file name in the directory"
    vocab = data["vocab_size"]
    for key, value in (data.get("special_tokens") or {}).items():
        ids = value if isinstance(value, list) else [value]
        if any(isinstance(t, int) and t >= vocab for t in ids):
            return f"special_tokens.{key}: {value!r} is outside the vocabulary of {vocab} tokens"
    return None
