"""Constrained decoding: a request's grammar as a token mask on its row's logits.

`response_format` ({"type": "json_object"} or {"type": "json_schema", "json_schema": {...}})
and forced tool calls (hybridrt.serve.tools) become a `Constraint`: a grammar in llguidance's
format (https://github.com/guidance-ai/llguidance), parsed here without the library. Serving
such a request compiles it with llguidance (the `serve` extra; imported on the first
constrained request) against the model's tokenizer: one `Matcher` per choice, which the
engine asks for a mask before each of the row's samples and feeds every token sampled. The
mask allows EOS only where the grammar is complete, so the text always parses; rows without
a constraint cost nothing.

JSON is generated compact (no free whitespace between tokens): a model may otherwise spend
its max_tokens on whitespace that the grammar allows forever.

Shapes: V = vocabulary size; `logits` [1, V]; the bitmask [1, ceil(V / 32)] int32 (bit i
of word j allows token 32j + i).
"""

from __future__ import annotations

import json
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .api_error import ApiError

if TYPE_CHECKING:
    from ..runtime.model import Model

PACKAGE = "llguidance"
JSON_OPTIONS = {"whitespace_flexible": False}


@dataclass(frozen=True)
class Constraint:
    """A grammar in llguidance's format (JSON text), and where it came from (for errors)."""

    grammar: str
    param: str

    @classmethod
    def json_schema(cls, schema: dict[str, Any], param: str) -> Constraint:
        grammar = {"grammars": [{"json_schema": schema | {"x-guidance": JSON_OPTIONS}}]}
        return cls(json.dumps(grammar), param)

    @classmethod
    def lark(cls, source: str, param: str) -> Constraint:
        return cls(json.dumps({"grammars": [{"lark_grammar": source}]}), param)


def response_constraint(value: Any) -> Constraint | None:
    """`response_format`: None for text, else its JSON constraint (a 400 for anything else)."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text" and set(value) == {"type"}:
        return None
    if kind == "json_object" and set(value) == {"type"}:
        return Constraint.json_schema({"type": "object"}, "response_format")
    if kind == "json_schema" and set(value) == {"type", "json_schema"}:
        spec = value["json_schema"]
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise ApiError(400, "response_format.json_schema must be an object with a string name", "response_format")
        unknown = set(spec) - {"name", "description", "schema", "strict"}
        if unknown:
            raise ApiError(400, f"response_format.json_schema has unknown fields: {', '.join(sorted(unknown))}")
        if not isinstance(spec.get("description", ""), str) or not isinstance(spec.get("strict", False), bool | None):
            raise ApiError(400, "response_format.json_schema: description is a string, strict a boolean")
        schema = spec.get("schema", {})
        if not isinstance(schema, dict):
            raise ApiError(400, "response_format.json_schema.schema must be a JSON schema object", "response_format")
        return Constraint.json_schema(schema, "response_format")
    raise ApiError(
        400,
        'response_format must be {"type": "text"}, {"type": "json_object"} or '
        '{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}',
        "response_format",
    )


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError:
        raise ApiError(
            400,
            f"structured output and forced tool calls need the {PACKAGE} package, which this server "
            f"lacks: pip install {PACKAGE} (or hybridrt[serve])",
            code="grammar_unavailable",
        ) from None
    return llguidance


_tokenizers: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _tokenizer(llg: Any, model: Model) -> Any:
    """llguidance's view of the model's tokenizer (built once per model: ~50 ms for 8k tokens)."""
    with _lock:
        found = _tokenizers.get(model)
        if found is None:
            if model.tokenizer is None:
                raise ApiError(400, "this model has no tokenizer, which constrained decoding needs")
            vocab = int(model.manifest.vocab_size)
            found = llg.LLTokenizer(model.tokenizer.to_str(), n_vocab=vocab, eos_token=list(model.eos_token_ids))
            _tokenizers[model] = found
        return found


def matchers(model: Model, constraint: Constraint, n: int) -> list[Matcher]:
    """`n` fresh matchers of `constraint` on `model` (a 400 if the grammar does not compile)."""
    llg = _llguidance()
    tokenizer = _tokenizer(llg, model)
    first = llg.LLMatcher(tokenizer, constraint.grammar, log_level=0)
    if first.is_error():
        raise ApiError(400, f"{constraint.param} cannot be compiled: {first.get_error()[:300]}", constraint.param)
    vocab = int(model.manifest.vocab_size)
    return [Matcher(first if i == 0 else first.deep_copy(), vocab) for i in range(n)]


class Matcher:
    """One choice's place in its grammar: the mask of the tokens it allows next."""

    def __init__(self, matcher: Any, vocab: int) -> None:
        self.matcher = matcher
        self.vocab = vocab
        self.bits = np.full((1, (vocab + 31) // 32), -1, dtype=np.int32)

    def allowed(self) -> np.ndarray:
        """bool [V]: the tokens the grammar allows next (EOS only once it is complete)."""
        self.matcher.unsafe_compute_mask_ptr(self.bits.ctypes.data, self.bits.nbytes)
        return np.unpackbits(self.bits.view(np.uint8), bitorder="little")[: self.vocab].astype(bool)

    def constrain(self, logits: np.ndarray) -> np.ndarray:
        """logits [1, V] with every token the grammar forbids at -inf (a copy). A matcher in
        error allows nothing: its logits pass unchanged, and consume() ends the request."""
        allowed = self.allowed()[: logits.shape[-1]]
        if not allowed.any():
            return logits
        return np.where(allowed[None], logits, np.float32(-np.inf)).astype(np.float32)

    def consume(self, token: int) -> bool:
        """Feed the sampled token; True once the grammar can take no more tokens."""
        self.matcher.consume_token(token)
        return bool(self.matcher.is_stopped() or self.matcher.is_error())
