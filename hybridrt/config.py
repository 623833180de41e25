"""The model configuration: one frozen dataclass, the single source of defaults. Torch-free,
below graphs/ (whose contract is a function of it) and models/ (which builds from it).

`layer_types` is the hybrid as data: one entry per layer, each a mixer kind of
`kinds.LAYER_KINDS`. It drives the model build, the graph's state inputs (graphs.contract),
the runtime's buffer allocation and the tests.

Parameters that one layer kind, one feed-forward kind or one family alone reads are not fields
here: a kind declares them as a frozen dataclass (`LayerKind.params`, `ffn_kinds.FfnKind.params`),
a family likewise (`Family.params`), and the config carries them in `kind_params` and
`ffn_params` (kind name -> its dataclass) and `family_params`. They are read through the typed
accessor `cfg.params(GatedDeltaParams).gdn_k_heads`, so a kind or family registered from
outside the package adds parameters without an edit here. A kind that runs another kind's
block inside its own names it in `uses` (Falcon-H1's parallel_hybrid and Zamba2's
zamba2_hybrid use mamba2; the MoE feed-forward kinds use moe), so the config keeps the used
kind's parameters too (`kinds_in_use`); only the state-space dims that Mamba1 and Mamba2 share,
mamba_d_state and mamba_d_conv, stay fields here. The scalar multipliers some families apply to
the embeddings, residual branches, attention scores and logits are one `Multipliers`, read
the same way. Serialized (`to_dict`), the parameters sit under "kind_params", "ffn_params",
"family_params" and "multipliers"; `from_dict` also reads the flat layout of older manifests,
and refuses a key it cannot place rather than drop it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .ffn_kinds import FFN_KINDS, FfnKind
from .kinds import LAYER_KINDS, LayerKind

MIXER_KINDS = LAYER_KINDS  # the table in kinds.py; names here for older imports
ROPE_TYPES = ("default", "linear", "llama3")
# model_type -> the frozen dataclass of that family's own parameters (registry.register fills it)
FAMILY_PARAMS: dict[str, type] = {}
P = TypeVar("P")
_TUPLES = ("layer_types", "ffn_types", "eos_token_id")
_GROUPS = ("multipliers", "kind_params", "ffn_params", "family_params")
KindTable = Mapping[str, LayerKind | FfnKind]  # LAYER_KINDS or FFN_KINDS
# The config's fields that hold parameters kind by kind -> the table of those kinds.
_BY_KIND: dict[str, KindTable] = {"kind_params": LAYER_KINDS, "ffn_params": FFN_KINDS}


def kind_params_classes(table: KindTable = LAYER_KINDS) -> dict[str, type]:
    """kind name -> its parameters dataclass, for the kinds of `table` that declare one."""
    return {name: kind.params for name, kind in table.items() if kind.params is not None}


@dataclass(frozen=True)
class Multipliers:
    """Scalar multipliers on the embeddings, the residual branches, the attention scores and the
    logits (Granite's; Falcon-H1's embedding, key and LM-head multipliers). The defaults leave a
    model unchanged."""

    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    attention_multiplier: float | None = None  # None: 1 / sqrt(head_dim)
    logits_scaling: float = 1.0  # logits are divided by it


@dataclass(frozen=True)
class HybridConfig:
    """Architecture of a hybrid decoder-only language model.

    Dimension glossary used across `hybridrt.models`:
      b  batch            l  sequence length (this call)     p  past length (KV)
      d  hidden_size      d_inner  mamba expand * d           n  d_state
      h  attention heads  h_kv  key/value heads               hd  head_dim
      k  d_conv           r  dt_rank                           v  vocab_size
      H  mamba2 heads     P  mamba2 head_dim                   G  mamba2 groups (of B, C)
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    layer_types: tuple[str, ...]
    ffn_types: tuple[str, ...]
    intermediate_size: int = 0
    num_attention_heads: int = 1
    num_key_value_heads: int = 1
    head_dim: int = 0
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096
    attention_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # RMSNorm over each query and key head before RoPE (LFM2)
    # Rotary position embedding; rope_theta None means the attention uses no positions
    # (Jamba: the Mamba layers carry position information).
    rope_theta: float | None = None
    rope_type: str = "default"
    rope_scaling: tuple[tuple[str, float], ...] = ()
    rope_partial_factor: float = 1.0  # rotary on the first int(head_dim * factor) dims only (Bamba)
    # State-space dims shared by Mamba1 and Mamba2 (d_state n, conv kernel k); each one's own
    # parameters are kinds.MambaParams and kinds.Mamba2Params.
    mamba_d_state: int = 16
    mamba_d_conv: int = 4
    # Gated attention (Qwen3-Next, Qwen3.5): q_proj also yields a per-head gate, y * sigmoid(gate).
    attn_output_gate: bool = False
    # Special tokens
    bos_token_id: int | None = None
    eos_token_id: tuple[int, ...] = ()
    pad_token_id: int | None = None
    # Prompt-path scan: chunk length of the parallel scan (a constant of the graph).
    scan_chunk: int = 16
    # Granite's and Falcon-H1's scalar multipliers, read as cfg.params(Multipliers).
    multipliers: Multipliers = field(default_factory=Multipliers)
    # Parameters owned by layer and feed-forward kinds (kind name -> its params dataclass; one
    # entry per kind in use, kinds_in_use, that declares parameters) and by the family (its
    # Family.params, or None). A mapping loaded for a family that is not installed stays a dict.
    kind_params: Mapping[str, Any] = field(default_factory=dict, hash=False)
    ffn_params: Mapping[str, Any] = field(default_factory=dict, hash=False)
    family_params: Any = field(default=None, hash=False)

    def __post_init__(self) -> None:
        if len(self.layer_types) != len(self.ffn_types):
            raise ValueError("layer_types and ffn_types must have one entry per layer")
        for kind in self.layer_types:
            if kind not in LAYER_KINDS:
                raise ValueError(f"unknown mixer kind {kind!r}; known: {', '.join(LAYER_KINDS)}")
        for kind in self.ffn_types:
            if kind not in FFN_KINDS:
                raise ValueError(f"unknown feed-forward kind {kind!r}; known: {', '.join(FFN_KINDS)}")
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"unknown rope type {self.rope_type!r}; known: {', '.join(ROPE_TYPES)}")
        object.__setattr__(self, "kind_params", _kind_params(LAYER_KINDS, self.layer_types, self.kind_params))
        object.__setattr__(self, "ffn_params", _kind_params(FFN_KINDS, self.ffn_types, self.ffn_params))
        object.__setattr__(self, "multipliers", _as_params(Multipliers, self.multipliers))
        object.__setattr__(self, "family_params", _family_params(self.model_type, self.family_params))

    def params(self, cls: type[P]) -> P:
        """The parameters of the kind or family whose dataclass is `cls` (kinds.LayerKind.params,
        ffn_kinds.FfnKind.params, Family.params) or the Multipliers: this config's, or the
        defaults when no kind in use declares it."""
        for group in (*self.kind_params.values(), *self.ffn_params.values(), self.family_params, self.multipliers):
            if isinstance(group, cls):
                return group
        return cls()

    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    @property
    def attn_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def rotary_dim(self) -> int:
        return int(self.attn_head_dim * self.rope_partial_factor)

    @property
    def has_attention(self) -> bool:
        """Whether any layer keeps KV (a kind with `attention`): the graph then takes past_lengths."""
        return any(LAYER_KINDS[k].attention for k in self.layer_types)

    @property
    def uses_positions(self) -> bool:
        """Whether attention rotates queries and keys by position (past_lengths + offset)."""
        return self.rope_theta is not None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def typed_fields(self) -> Iterator[tuple[str, str, Any]]:
        """(name, annotated type, value) of every field and every kind and family parameter
        held as a dataclass, for checks of a translated config's values."""
        groups = (*self.kind_params.values(), *self.ffn_params.values(), self.family_params, self.multipliers)
        for obj in (self, *groups):
            if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
                for f in dataclasses.fields(obj):
                    if f.name not in _GROUPS:
                        yield f.name, str(f.type), getattr(obj, f.name)

    @classmethod
    def make(cls, **fields: Any) -> HybridConfig:
        """A config from flat keyword fields: those that are not HybridConfig's own go to the
        kind or family parameters that declare them (an unknown name is an error)."""
        own = {f.name for f in dataclasses.fields(cls)}
        core = {k: v for k, v in fields.items() if k in own}
        rest = {k: v for k, v in fields.items() if k not in own}
        for group, flat in _place(str(core.get("model_type")), rest).items():
            given = core.get(group)
            core[group] = _merge(flat, given or {}) if group in _BY_KIND else _join(flat, given)
        return cls(**core)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HybridConfig:
        """The inverse of to_dict; also reads the flat layout of older manifests, in which the
        kinds' parameters were fields of their own."""
        kwargs = dict(data)
        for key in _TUPLES:
            if key in kwargs:
                kwargs[key] = tuple(kwargs[key])
        if "rope_scaling" in kwargs:
            kwargs["rope_scaling"] = tuple((str(k), float(v)) for k, v in kwargs["rope_scaling"])
        return cls.make(**kwargs)


def _as_params(cls: type, values: Any) -> Any:
    """`values` (a mapping, as JSON gives it, or already the dataclass) as an instance of `cls`."""
    if isinstance(values, cls):
        return values
    names = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    unknown = [k for k in values if k not in names]
    if unknown:
        raise ValueError(f"unknown parameter {unknown[0]!r} of {cls.__name__}; known: {', '.join(names)}")
    return cls(
        **{k: tuple(v) if names[k].startswith("tuple") and isinstance(v, list) else v for k, v in values.items()}
    )


def kinds_in_use(types: Iterable[str], table: KindTable = LAYER_KINDS) -> tuple[str, ...]:
    """The kinds of `types` (layer_types, or ffn_types with FFN_KINDS) and, after them, those they
    use (`uses`, followed through): the kinds whose parameters a config with these layers reads."""
    out = list(dict.fromkeys(types))
    for kind in out:  # out grows while it is walked, so the used kinds' own uses follow
        out += [used for used in table[kind].uses if used not in out]
    return tuple(out)


def _join(flat: dict[str, Any], given: Any) -> Any:
    """One group's parameters placed from flat names joined with those given nested: a manifest
    may hold some of a kind's parameters nested and others flat (written before they all moved
    to the kind). A nested value wins; flat names replace the fields of a dataclass given whole."""
    if given is None:
        return flat
    if dataclasses.is_dataclass(given) and not isinstance(given, type):
        return dataclasses.replace(given, **flat)  # type: ignore[type-var]
    return flat | dict(given)


def _merge(placed: dict[str, dict[str, Any]], given: Mapping[str, Any]) -> dict[str, Any]:
    """Kind parameters placed from flat names joined with those given nested, kind by kind (_join)."""
    return {kind: _join(placed.get(kind, {}), given.get(kind)) for kind in {**placed, **given}}


def _kind_params(table: KindTable, types: tuple[str, ...], given: Mapping[str, Any]) -> dict[str, Any]:
    """One parameters instance per kind of `table` in use (kinds_in_use) that declares parameters
    (defaults where none were given), in the order of kinds_in_use. Parameters of a kind not in
    use are checked, then left out: they change nothing."""
    classes = kind_params_classes(table)
    checked: dict[str, Any] = {}
    for kind, values in given.items():
        if kind not in classes:
            raise ValueError(f"parameters given for kind {kind!r}, which declares none")
        checked[kind] = _as_params(classes[kind], values)
    in_use = [kind for kind in kinds_in_use(types, table) if kind in classes]
    return {kind: checked[kind] if kind in checked else classes[kind]() for kind in in_use}


def _family_params(model_type: str, given: Any) -> Any:
    cls = FAMILY_PARAMS.get(model_type)
    if cls is None:
        return None if given is None else dict(given)  # a family not installed here: kept as read
    return cls() if given is None else _as_params(cls, given)


def _owners(model_type: str) -> dict[str, tuple[str, str | None]]:
    """Parameter name -> (the config field that holds it, the kind that declares it or None)."""
    owner: dict[str, tuple[str, str | None]] = {}
    for group, table in _BY_KIND.items():
        for kind, cls in kind_params_classes(table).items():
            for f in dataclasses.fields(cls):
                owner.setdefault(f.name, (group, kind))
    singles: dict[str, type | None] = {"multipliers": Multipliers, "family_params": FAMILY_PARAMS.get(model_type)}
    for group, single in singles.items():
        for f in dataclasses.fields(single) if single else ():
            owner[f.name] = (group, None)  # a family's or a multiplier's name wins over a kind's
    return owner


def _place(model_type: str, fields: dict[str, Any]) -> dict[str, Any]:
    """Flat fields -> {config field: {kind name: {name: value}} or {name: value}}."""
    owners = _owners(model_type)
    placed: dict[str, Any] = {}
    for name, value in fields.items():
        if name not in owners:
            raise ValueError(
                f"unknown config field {name!r}: not a field of HybridConfig, nor a parameter of a layer or "
                f"feed-forward kind or of the {model_type} family"
            )
        group, kind = owners[name]
        target = placed.setdefault(group, {})
        (target if kind is None else target.setdefault(kind, {}))[name] = value
    return placed


def register_family_params(model_type: str, cls: type) -> None:
    """Declare the dataclass of a family's own parameters (registry.register calls it)."""
    if not (dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen):  # type: ignore[attr-defined]
        raise TypeError(f"{model_type}: family parameters must be a frozen dataclass, not {cls!r}")
    FAMILY_PARAMS[model_type] = cls
