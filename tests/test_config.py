"""HybridConfig: parameters owned by layer kinds and families, carried in the config and read as
attributes; serialization that keeps older manifests loadable and refuses what it cannot place."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from hybridrt.config import FAMILY_PARAMS, HybridConfig, Multipliers, kind_params_classes, kinds_in_use
from hybridrt.ffn_kinds import FFN_KINDS, MoEParams, NemotronMoEParams, SharedExpertParams
from hybridrt.kinds import LAYER_KINDS, GatedDeltaParams, LayerKind, ShortConvParams, StateDecl, register_kind
from hybridrt.models.loading.registry import FAMILIES, Family, register

BASE = dict(model_type="t", vocab_size=64, hidden_size=16, num_attention_heads=2, num_key_value_heads=2)


def _gdn(**params: object) -> HybridConfig:
    return HybridConfig.make(
        **BASE,
        layer_types=("gated_delta", "attention"),
        ffn_types=("mlp", "mlp"),
        gdn_k_heads=2,
        gdn_v_heads=4,
        gdn_k_head_dim=8,
        gdn_v_head_dim=4,
        **params,
    )


def test_kind_parameters_read_through_their_class_and_nest_in_the_dict() -> None:
    cfg = _gdn(gdn_beta_scale=2.0)
    assert cfg.kind_params["gated_delta"] == GatedDeltaParams(2, 4, 8, 4, gdn_beta_scale=2.0)
    gdn = cfg.params(GatedDeltaParams)
    assert (gdn.gdn_k_heads, gdn.gdn_beta_scale, gdn.gdn_conv_dim) == (2, 2.0, 2 * 2 * 8 + 4 * 4)
    assert cfg.params(ShortConvParams).conv_kernel == 3  # a kind no layer uses answers with its defaults
    with pytest.raises(AttributeError):
        cfg.gdn_k_heads  # type: ignore[attr-defined]  # noqa: B018 (no attribute lookup hides a kind's parameter)
    data = cfg.to_dict()
    assert "gdn_k_heads" not in data and data["kind_params"]["gated_delta"]["gdn_v_heads"] == 4
    assert HybridConfig.from_dict(json.loads(json.dumps(data))) == cfg
    with pytest.raises(AttributeError, match="nope"):
        _ = cfg.nope


def test_older_flat_manifest_config_still_loads() -> None:
    """Manifests written before kinds owned their parameters hold them as top-level fields,
    those of kinds the model does not use included (at their defaults)."""
    cfg = _gdn()
    flat = {k: v for k, v in cfg.to_dict().items() if k not in ("kind_params", "family_params")}
    flat |= dataclasses.asdict(cfg.kind_params["gated_delta"]) | {"conv_kernel": 3, "conv_bias": False}
    assert HybridConfig.from_dict(json.loads(json.dumps(flat))) == cfg


def test_unknown_keys_are_refused_by_name() -> None:
    """Regression: from_dict dropped keys it did not know, so a family's field vanished."""
    data = _gdn().to_dict()
    with pytest.raises(ValueError, match="'gdn_heads'"):
        HybridConfig.from_dict(data | {"gdn_heads": 3})
    data["kind_params"]["gated_delta"]["gdn_heads"] = 3
    with pytest.raises(ValueError, match="'gdn_heads'"):
        HybridConfig.from_dict(data)
    with pytest.raises(ValueError, match="'attention'"):  # a kind that declares no parameters
        HybridConfig.make(**BASE, layer_types=("attention",), ffn_types=("mlp",), kind_params={"attention": {}})


def test_parameter_names_are_unambiguous() -> None:
    """A name read as an attribute resolves to one owner: no kind's parameter shadows a field
    or another kind's parameter."""
    own = {f.name for f in dataclasses.fields(HybridConfig)}
    seen: set[str] = set()
    for cls in [*kind_params_classes().values(), *kind_params_classes(FFN_KINDS).values(), Multipliers]:
        names = {f.name for f in dataclasses.fields(cls)}
        assert not names & own and not names & seen
        seen |= names


@dataclass(frozen=True)
class ToyKindParams:
    toy_width: int = 4


@dataclass(frozen=True)
class ToyFamilyParams:
    toy_scale: float = 1.0
    toy_tags: tuple[str, ...] = ()


@pytest.fixture
def toy_params() -> Iterator[None]:
    register_kind(
        LayerKind(
            "toy",
            "toy_kind:EmaMixer",
            (StateDecl("s", lambda c: (c.params(ToyKindParams).toy_width,)),),
            "toy",
            params=ToyKindParams,
        )
    )
    register(Family("toy_family", lambda hf: HybridConfig.make(**hf), params=ToyFamilyParams))
    try:
        yield
    finally:
        LAYER_KINDS.pop("toy")
        FAMILIES.pop("toy_family")
        FAMILY_PARAMS.pop("toy_family")


def test_a_kind_and_a_family_from_outside_own_their_parameters(toy_params: None) -> None:
    from hybridrt.graphs.contract import GraphContract

    cfg = FAMILIES["toy_family"].translate(
        BASE
        | {"model_type": "toy_family", "layer_types": ("toy",), "ffn_types": ("none",)}
        | {"toy_width": 6, "toy_scale": 0.5, "toy_tags": ("a",)}
    )
    family = cfg.params(ToyFamilyParams)
    assert (cfg.params(ToyKindParams).toy_width, family.toy_scale, family.toy_tags) == (6, 0.5, ("a",))
    assert cfg.family_params == ToyFamilyParams(0.5, ("a",))
    assert GraphContract.of(cfg).pasts[0].dims == ("batch", 6)
    data = json.loads(json.dumps(cfg.to_dict()))
    assert data["family_params"] == {"toy_scale": 0.5, "toy_tags": ["a"]}
    assert HybridConfig.from_dict(data) == cfg
    FAMILY_PARAMS.pop("toy_family")  # a manifest read where the family is not installed
    kept = HybridConfig.from_dict(data)
    assert kept.family_params == {"toy_scale": 0.5, "toy_tags": ["a"]}  # kept as it was read
    assert kept.to_dict()["family_params"] == data["family_params"]
    FAMILY_PARAMS["toy_family"] = ToyFamilyParams


def test_falcon_h1_multipliers_are_the_parallel_hybrid_kinds_and_older_flat_files_load() -> None:
    """Falcon-H1's multipliers and Mamba2 variant belong to its layer kind (kinds.ParallelHybridParams),
    not to every config; a manifest written when they were fields of their own loads into them."""
    from hybridrt.kinds import ParallelHybridParams

    cfg = HybridConfig.make(
        **BASE,
        layer_types=("parallel_hybrid",),
        ffn_types=("scaled_mlp",),
        ssm_multipliers=(0.5, 1.0, 1.5, 2.0, 0.25),
        mlp_multipliers=(0.8, 1.2),
        mamba2_out_bias=True,
    )
    p = cfg.params(ParallelHybridParams)
    assert p.ssm_multipliers == (0.5, 1.0, 1.5, 2.0, 0.25) and p.mlp_multipliers == (0.8, 1.2) and p.mamba2_out_bias
    assert not hasattr(cfg, "ssm_multipliers") and "mlp_multipliers" not in _gdn().to_dict()
    flat = {k: v for k, v in cfg.to_dict().items() if k != "kind_params"}
    flat |= dataclasses.asdict(p)  # as an older manifest wrote them, lists from JSON
    assert HybridConfig.from_dict(json.loads(json.dumps(flat))) == cfg


def test_mamba1_and_zamba2_fields_are_their_kinds() -> None:
    """Mamba1's inner norms and Zamba2's shared blocks are their kinds' parameters; a config
    without such layers carries none of them."""
    from hybridrt.kinds import MambaParams, Zamba2Params

    mamba = HybridConfig.make(**BASE, layer_types=("mamba",), ffn_types=("none",), mamba_inner_norms=True)
    assert mamba.kind_params["mamba"] == MambaParams(mamba_inner_norms=True)
    zamba = HybridConfig.make(**BASE, layer_types=("zamba2_hybrid",), ffn_types=("none",), zamba2_adapter_rank=8)
    assert zamba.params(Zamba2Params) == Zamba2Params(zamba2_adapter_rank=8)
    assert not {"mamba_inner_norms", "zamba2_mem_blocks"} & set(_gdn().to_dict())
    flat = {k: v for k, v in zamba.to_dict().items() if k != "kind_params"} | dataclasses.asdict(Zamba2Params(3, 8))
    assert HybridConfig.from_dict(json.loads(json.dumps(flat))).params(Zamba2Params) == Zamba2Params(3, 8)


def test_mamba_dims_are_their_kinds_and_older_flat_files_load() -> None:
    """Mamba1's expand, dt rank and biases are kinds.MambaParams, Mamba2's heads, groups and
    variants kinds.Mamba2Params, with the sizes derived from them; d_state and d_conv, which
    both read, stay the config's. A manifest that held them as top-level fields loads into them."""
    from hybridrt.kinds import Mamba2Params, MambaParams

    cfg = HybridConfig.make(
        **BASE,
        layer_types=("mamba", "mamba2"),
        ffn_types=("none", "none"),
        mamba_d_state=8,
        mamba_expand=3,
        mamba_proj_bias=True,
        mamba2_heads=4,
        mamba2_head_dim=6,
        mamba2_groups=2,
        mamba2_dt_min=0.001,
    )
    m1, m2 = cfg.params(MambaParams), cfg.params(Mamba2Params)
    assert (m1.d_inner(cfg.hidden_size), m1.dt_rank(cfg.hidden_size), m1.mamba_proj_bias) == (48, 1, True)
    assert (m2.mamba2_d_inner, m2.mamba2_conv_dim(cfg.mamba_d_state), m2.mamba2_dt_min) == (24, 24 + 2 * 2 * 8, 0.001)
    assert not {"mamba_expand", "mamba2_heads", "mamba2_dt_min"} & set(cfg.to_dict())
    assert not hasattr(cfg, "d_inner") and not hasattr(cfg, "mamba2_conv_dim")
    flat = {k: v for k, v in cfg.to_dict().items() if k != "kind_params"}
    flat |= dataclasses.asdict(m1) | dataclasses.asdict(m2)  # as an older manifest wrote them
    assert HybridConfig.from_dict(json.loads(json.dumps(flat))) == cfg
    assert HybridConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


@pytest.mark.parametrize("kind", ["parallel_hybrid", "zamba2_hybrid"])
def test_a_kind_keeps_the_parameters_of_the_kinds_it_uses(kind: str) -> None:
    """Regression: Falcon-H1's parallel_hybrid and Zamba2's zamba2_hybrid layers run a Mamba2
    mixer, but the config kept parameters only for the kinds of layer_types, so a model of such
    layers alone would have run its mixer with Mamba2's defaults. Their kinds name mamba2 in
    `uses`, and the config keeps its parameters, through a round trip too."""
    from hybridrt.kinds import Mamba2Params

    assert kinds_in_use((kind, kind, "attention")) == (kind, "attention", "mamba2")
    cfg = HybridConfig.make(**BASE, layer_types=(kind,), ffn_types=("none",), mamba2_heads=4, mamba2_groups=2)
    assert cfg.params(Mamba2Params) == Mamba2Params(mamba2_heads=4, mamba2_groups=2)
    assert set(cfg.kind_params) == {kind, "mamba2"}
    assert HybridConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_a_kind_split_between_nested_and_flat_fields_loads_whole() -> None:
    """Regression: a manifest written while Mamba1's inner norms were already under kind_params
    but its expand and dt rank were still top-level fields lost the flat ones (the nested
    mapping replaced the kind's placed fields), so dt_rank fell back to its default."""
    from hybridrt.kinds import MambaParams

    data = HybridConfig.make(**BASE, layer_types=("mamba",), ffn_types=("none",)).to_dict()
    data["kind_params"] = {"mamba": {"mamba_inner_norms": True}}
    data |= {"mamba_expand": 3, "mamba_dt_rank": 2}
    want = MambaParams(mamba_expand=3, mamba_dt_rank=2, mamba_inner_norms=True)
    assert HybridConfig.from_dict(json.loads(json.dumps(data))).params(MambaParams) == want
    whole = {"mamba": MambaParams(mamba_dt_rank=2, mamba_inner_norms=True)}  # flat names replace its fields
    given = HybridConfig.make(**BASE, layer_types=("mamba",), ffn_types=("none",), mamba_expand=3, kind_params=whole)
    assert given.params(MambaParams) == want


def _flat(cfg: HybridConfig) -> dict[str, object]:
    """cfg as a manifest wrote it before the feed-forward kinds owned their parameters and the
    multipliers were one object: every one of them a top-level field, those of kinds the model
    does not use included (at their defaults)."""
    data = {k: v for k, v in cfg.to_dict().items() if k not in ("ffn_params", "multipliers")}
    for cls in (MoEParams, SharedExpertParams, NemotronMoEParams, Multipliers):
        data |= dataclasses.asdict(cfg.params(cls))
    return json.loads(json.dumps(data))


def test_moe_parameters_are_the_feed_forward_kinds_and_older_flat_files_load() -> None:
    """The MoE kinds use `moe` (and those with a shared expert `shared_mlp`), so the config keeps
    those kinds' parameters, nested under ffn_params; a model without MoE layers carries none,
    and a manifest that held them as top-level fields loads to an equal config."""
    assert kinds_in_use(("relu2_mlp", "nemotron_moe"), FFN_KINDS) == ("relu2_mlp", "nemotron_moe", "moe", "shared_mlp")
    moe = {"num_experts": 8, "num_experts_per_tok": 2, "moe_routed_scaling": 2.5, "shared_intermediate_size": 40}
    nemotron = {"moe_groups": 4, "moe_latent_size": 8}
    cfg = HybridConfig.make(
        **BASE, layer_types=("attention", "none"), ffn_types=("relu2_mlp", "nemotron_moe"), **moe, **nemotron
    )
    assert cfg.params(MoEParams) == MoEParams(num_experts=8, num_experts_per_tok=2, moe_routed_scaling=2.5)
    assert cfg.params(SharedExpertParams).shared_intermediate_size == 40
    assert cfg.params(NemotronMoEParams) == NemotronMoEParams(moe_groups=4, moe_latent_size=8)
    assert list(cfg.to_dict()["ffn_params"]) == ["nemotron_moe", "moe", "shared_mlp"]
    assert not {"num_experts", "moe_groups", "shared_intermediate_size"} & set(cfg.to_dict())
    assert not hasattr(cfg, "num_experts")
    assert HybridConfig.from_dict(_flat(cfg)) == cfg
    assert HybridConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    dense = _gdn()  # a flat file of a model without MoE layers: the defaults it held are left out
    assert dense.ffn_params == {} and HybridConfig.from_dict(_flat(dense)) == dense


def test_granite_shared_expert_alone_keeps_its_size_not_the_routers() -> None:
    """Granite's dense variant (shared_mlp) reads only the shared expert's size; the router fields
    its translator also sets belong to `moe`, which is not in use, and are left out."""
    cfg = HybridConfig.make(
        **BASE,
        layer_types=("attention",),
        ffn_types=("shared_mlp",),
        shared_intermediate_size=40,
        num_experts_per_tok=2,
    )
    assert cfg.ffn_params == {"shared_mlp": SharedExpertParams(40)}
    assert cfg.params(MoEParams) == MoEParams()
    assert HybridConfig.from_dict(_flat(cfg)) == cfg


def test_multipliers_are_one_object_and_older_flat_files_load() -> None:
    """Granite's and Falcon-H1's scalar multipliers are one config.Multipliers, nested under
    "multipliers"; a manifest that held them as top-level fields loads to an equal config."""
    flat = {"embedding_multiplier": 1.7, "attention_multiplier": 0.3, "logits_scaling": 2.5}
    cfg = HybridConfig.make(**BASE, layer_types=("attention",), ffn_types=("mlp",), **flat)
    assert cfg.params(Multipliers) == Multipliers(1.7, 1.0, 0.3, 2.5) == cfg.multipliers
    assert cfg.to_dict()["multipliers"]["logits_scaling"] == 2.5 and "logits_scaling" not in cfg.to_dict()
    assert HybridConfig.from_dict(_flat(cfg)) == cfg
    assert HybridConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert _gdn().params(Multipliers) == Multipliers()
    with pytest.raises(ValueError, match="'logit_scaling'"):
        HybridConfig.from_dict(cfg.to_dict() | {"multipliers": {"logit_scaling": 2.0}})
