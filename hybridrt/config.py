"""The model configuration: one frozen dataclass, the single source of defaults. Torch-free,
below graphs/ (whose contract is a function of it) and models/ (which builds from it).

`layer_types` is the hybrid as data: one entry per layer, each a mixer kind of
`kinds.LAYER_KINDS`. It drives the model build, the graph's state inputs (graphs.contract),
the runtime's buffer allocation and the tests.

Parameters that one layer kind or one family alone reads are not fields here: a kind declares
them as a frozen dataclass (`LayerKind.params`), a family likewise (`Family.params`), and the
config carries them in `kind_params` (kind name -> its dataclass) and `family_params`. They
are read through the typed accessor `cfg.params(GatedDeltaParams).gdn_k_heads`, so a kind or
family registered from outside the package adds parameters without an edit here. A kind that
runs another kind's mixer inside its layer names it in `LayerKind.uses` (Falcon-H1's
parallel_hybrid and Zamba2's zamba2_hybrid use mamba2), so the config keeps the used kind's
parameters too (`kinds_in_use`); only the state-space dims that Mamba1 and Mamba2 share,
mamba_d_state and mamba_d_conv, stay fields here. Serialized (`to_dict`), the parameters
sit under "kind_params" and "family_params"; `from_dict` also reads the flat layout of older
manifests, and refuses a key it cannot place rather than drop it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .ffn_kinds import FFN_KINDS
from .kinds import LAYER_KINDS

MIXER_KINDS = LAYER_KINDS  # the table in kinds.py; names here for older imports
ROPE_TYPES = ("default", "linear", "llama3")
# model_type -> the frozen dataclass of that family's own parameters (registry.register fills it)
FAMILY_PARAMS: dict[str, type] = {}
P = TypeVar("P")
_TUPLES = ("layer_types", "ffn_types", "eos_token_id")


def kind_params_classes() -> dict[str, type]:
    """kind name -> its parameters dataclass, for the kinds that declare one."""
    return {name: kind.params for name, kind in LAYER_KINDS.items() if kind.params is not None}


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
    # Scalar multipliers (Granite); the defaults leave a model unchanged.
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    attention_multiplier: float | None = None  # None: 1 / sqrt(head_dim)
    logits_scaling: float = 1.0  # logits are divided by it
    # Shared expert beside the routed ones (Granite MoE); 0 = none.
    shared_intermediate_size: int = 0
    # Mixture of experts
    num_experts: int = 1
    num_experts_per_tok: int = 1
    moe_renormalize: bool = False  # top-k weights rescaled to sum to 1 (Granite); Jamba keeps them
    # LFM2-MoE (FFN "sigmoid_moe"): sigmoid router, selection-only expert bias, scaled weights.
    moe_intermediate_size: int = 0  # each routed expert's size (also Qwen3-Next); 0 = intermediate_size
    moe_expert_bias: bool = False  # a per-expert bias added to the scores for the top-k choice only
    moe_routed_scaling: float = 1.0  # the routing weights are multiplied by it
    # Gated attention (Qwen3-Next, Qwen3.5): q_proj also yields a per-head gate, y * sigmoid(gate).
    attn_output_gate: bool = False
    # Nemotron-H MoE (ffn kind nemotron_moe): a DeepSeek-V3 style router (sigmoid scores, a
    # score-correction bias for the choice, group-limited top-k, weights scaled by
    # moe_routed_scaling) over squared-ReLU experts of moe_intermediate_size, an optional
    # latent projection around them (0 = none) and a shared expert of shared_intermediate_size.
    moe_groups: int = 1
    moe_topk_groups: int = 1
    moe_latent_size: int = 0
    # Special tokens
    bos_token_id: int | None = None
    eos_token_id: tuple[int, ...] = ()
    pad_token_id: int | None = None
    # Prompt-path scan: chunk length of the parallel scan (a constant of the graph).
    scan_chunk: int = 16
    # Parameters owned by layer kinds (kind name -> its LayerKind.params dataclass; one entry per
    # kind in use, kinds_in_use, that declares parameters) and by the family (its Family.params, or
    # None). A mapping loaded for a family that is not installed stays a plain dict.
    kind_params: Mapping[str, Any] = field(default_factory=dict, hash=False)
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
        object.__setattr__(self, "kind_params", _kind_params(self.layer_types, self.kind_params))
        object.__setattr__(self, "family_params", _family_params(self.model_type, self.family_params))

    def params(self, cls: type[P]) -> P:
        """The parameters of the kind or family whose dataclass is `cls` (kinds.LayerKind.params,
        Family.params): this config's, or the defaults when no kind in use declares it."""
        for group in (*self.kind_params.values(), self.family_params):
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
        for obj in (self, *self.kind_params.values(), self.family_params):
            if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
                for f in dataclasses.fields(obj):
                    if f.name not in ("kind_params", "family_params"):
                        yield f.name, str(f.type), getattr(obj, f.name)

    @classmethod
    def make(cls, **fields: Any) -> HybridConfig:
        """A config from flat keyword fields: those that are not HybridConfig's own go to the
        kind or family parameters that declare them (an unknown name is an error)."""
        own = {f.name for f in dataclasses.fields(cls)}
        core = {k: v for k, v in fields.items() if k in own}
        rest = {k: v for k, v in fields.items() if k not in own}
        if rest:
            kinds, family = _place(str(core.get("model_type")), rest)
            core["kind_params"] = _merge(kinds, core.get("kind_params") or {})
            if family:
                core["family_params"] = family | dict(core.get("family_params") or {})
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


def kinds_in_use(layer_types: Iterable[str]) -> tuple[str, ...]:
    """The kinds of layer_types and, after them, those they use (`LayerKind.uses`, followed
    through): the kinds whose parameters a config with these layers reads."""
    out = list(dict.fromkeys(layer_types))
    for kind in out:  # out grows while it is walked, so the used kinds' own uses follow
        out += [used for used in LAYER_KINDS[kind].uses if used not in out]
    return tuple(out)


def _merge(placed: dict[str, dict[str, Any]], given: Mapping[str, Any]) -> dict[str, Any]:
    """Kind parameters placed from flat names joined with those given nested, kind by kind: a
    manifest may hold some of a kind's parameters under kind_params and others flat (written
    before they all moved to the kind). A nested value wins; flat names replace the fields of
    a dataclass given whole."""
    out: dict[str, Any] = dict(placed)
    for kind, values in given.items():
        flat = placed.get(kind, {})
        if dataclasses.is_dataclass(values) and not isinstance(values, type):
            out[kind] = dataclasses.replace(values, **flat)  # type: ignore[type-var]
        else:
            out[kind] = flat | dict(values)
    return out


def _kind_params(layer_types: tuple[str, ...], given: Mapping[str, Any]) -> dict[str, Any]:
    """One parameters instance per kind in use (kinds_in_use) that declares parameters (defaults
    where none were given). Parameters of a kind not in use are checked, then left out: they
    change nothing."""
    classes = kind_params_classes()
    in_use = kinds_in_use(layer_types)
    out: dict[str, Any] = {}
    for kind, values in given.items():
        if kind not in classes:
            raise ValueError(f"parameters given for kind {kind!r}, which declares none")
        params = _as_params(classes[kind], values)
        if kind in in_use:
            out[kind] = params
    for kind in in_use:
        if kind in classes and kind not in out:
            out[kind] = classes[kind]()
    return out


def _family_params(model_type: str, given: Any) -> Any:
    cls = FAMILY_PARAMS.get(model_type)
    if cls is None:
        return None if given is None else dict(given)  # a family not installed here: kept as read
    return cls() if given is None else _as_params(cls, given)


def _place(model_type: str, fields: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Flat fields -> (kind name -> {field: value}, the family's {field: value})."""
    owner: dict[str, str] = {}
    for kind, cls in kind_params_classes().items():
        for f in dataclasses.fields(cls):
            owner.setdefault(f.name, kind)
    family_cls = FAMILY_PARAMS.get(model_type)
    family_fields = {f.name for f in dataclasses.fields(family_cls)} if family_cls else set()
    kinds: dict[str, dict[str, Any]] = {}
    family: dict[str, Any] = {}
    for name, value in fields.items():
        if name in family_fields:
            family[name] = value
        elif name in owner:
            kinds.setdefault(owner[name], {})[name] = value
        else:
            raise ValueError(
                f"unknown config field {name!r}: not a field of HybridConfig, nor a parameter of a layer kind "
                f"or of the {model_type} family"
            )
    return kinds, family


def refuse_unknown(cls: type, given: Iterable[str], error: Callable[[str], Exception], what: str) -> None:
    """Raises `error` naming those of `given` that are not fields of the dataclass `cls`, and the
    known ones (the option dataclasses' from_kwargs)."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(given) - names)
    if unknown:
        raise error(f"unknown {what} {', '.join(unknown)}; known: {', '.join(sorted(names))}")


def register_family_params(model_type: str, cls: type) -> None:
    """Declare the dataclass of a family's own parameters (registry.register calls it)."""
    if not (dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen):  # type: ignore[attr-defined]
        raise TypeError(f"{model_type}: family parameters must be a frozen dataclass, not {cls!r}")
    FAMILY_PARAMS[model_type] = cls
