"""Load a Hugging Face checkpoint directory (config.json + safetensors) into the reference model.

Weights come only from safetensors: nothing is unpickled and no checkpoint code runs.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from ..config import HybridConfig
from ..errors import CheckpointError
from .model import HybridForCausalLM
from .registry import Family, get_family

_LEGACY_EXPERT = re.compile(r"^(.*\.ffn\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def read_hf_config(src: Path) -> dict[str, Any]:
    if not src.is_dir():
        raise CheckpointError(f"checkpoint directory not found: {src}")
    path = src / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{src} has no config.json; a Hugging Face checkpoint directory needs one")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    return data


def load_config(src: str | Path) -> tuple[HybridConfig, Family, dict[str, Any]]:
    hf = read_hf_config(Path(src))
    family = get_family(hf.get("model_type"))
    try:
        cfg = family.translate(hf)
    except (TypeError, ValueError, KeyError, ZeroDivisionError) as e:
        raise CheckpointError(
            f"{Path(src) / 'config.json'} has a field of the wrong type or value ({type(e).__name__}: {e}); "
            "compare it with the model family's config in transformers"
        ) from None
    check_sizes(cfg, Path(src))
    return cfg, family, hf


def check_sizes(cfg: HybridConfig, src: Path) -> None:
    """Every integer field of the translated config is an integer >= 0, the sizes >= 1,
    every float a finite number: a config.json field of the wrong JSON type is named here."""
    import math

    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.type in ("int", "int | None") and value is not None:
            low = 1 if f.name in POSITIVE else 0
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise CheckpointError(_field_message(src, f.name, value, f"an integer >= {low}"))
        elif f.type in ("float", "float | None") and value is not None:
            if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
                raise CheckpointError(_field_message(src, f.name, value, "a finite number"))
        elif f.type == "bool" and not isinstance(value, bool):
            raise CheckpointError(_field_message(src, f.name, value, "true or false"))


POSITIVE = ("vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads", "max_position_embeddings")


def _field_message(src: Path, name: str, value: object, allowed: str) -> str:
    return (
        f"{src / 'config.json'}: {name} (as hybridrt reads it) must be {allowed}, got {value!r}; "
        "fix the checkpoint's config.json"
    )


def weight_files(src: Path) -> list[Path]:
    """model.safetensors, or the shards its index names, or every *.safetensors file."""
    index = src / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index} is not a valid safetensors index: {e}") from None
        files = [src / f for f in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{index} names shards that are missing: {', '.join(missing)}")
        return files
    files = sorted(src.glob("*.safetensors"))
    if not files:
        other = [p.name for p in src.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt")]
        hint = (
            f" (found {', '.join(other)}: hybridrt loads only safetensors, never pickles; "
            "convert them with transformers' save_pretrained(safe_serialization=True))"
            if other
            else ""
        )
        raise CheckpointError(f"no weights in {src}: expected model.safetensors or sharded *.safetensors{hint}")
    return files


def read_tensors(files: list[Path], family: Family, cfg: HybridConfig) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    if not family.ignored(name):
                        ours = family.rename(name, cfg)
                        tensor = f.get_tensor(name)
                        tensors[ours] = tensor if family.convert is None else family.convert(ours, tensor, cfg)
        except Exception as e:  # safetensors raises its own error types for corrupt files
            raise CheckpointError(f"cannot read {path}: {e} (the file is truncated or not safetensors)") from None
    return _stack_legacy_experts(tensors)


def _stack_legacy_experts(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-expert `experts.{e}.{gate,up,down}_proj` tensors -> stacked gate_up_proj / down_proj."""
    groups: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    for name in [n for n in tensors if _LEGACY_EXPERT.match(n)]:
        m = _LEGACY_EXPERT.match(name)
        assert m is not None
        groups.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = tensors.pop(name)
    for prefix, experts in groups.items():
        order = [experts[e] for e in sorted(experts)]
        tensors[f"{prefix}.gate_up_proj"] = torch.stack([torch.cat([x["gate_proj"], x["up_proj"]]) for x in order])
        tensors[f"{prefix}.down_proj"] = torch.stack([x["down_proj"] for x in order])
    return tensors


def load_model(src: str | Path) -> tuple[HybridForCausalLM, dict[str, Any]]:
    """Build the reference model from a checkpoint directory (float32, eval mode)."""
    src = Path(src)
    cfg, family, hf = load_config(src)
    tensors = read_tensors(weight_files(src), family, cfg)
    try:
        model = HybridForCausalLM(cfg)
    except (TypeError, ValueError, RuntimeError, ZeroDivisionError) as e:
        raise CheckpointError(f"{src}: config.json describes a model that cannot be built ({e})") from None
    expected = model.state_dict()
    if cfg.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
        expected.pop("lm_head.weight", None)
    missing = [k for k in expected if k not in tensors]
    unexpected = [k for k in tensors if k not in expected]
    if missing:
        raise CheckpointError(
            f"{src}: weights missing for {len(missing)} parameters, e.g. {', '.join(missing[:4])} "
            "(config.json and the safetensors files do not describe the same model)"
        )
    if unexpected:
        raise CheckpointError(
            f"{src}: {len(unexpected)} tensors the {cfg.model_type} config does not account for, "
            f"e.g. {', '.join(unexpected[:4])}"
        )
    for name, ref in expected.items():
        if tuple(tensors[name].shape) != tuple(ref.shape):
            raise CheckpointError(
                f"{src}: tensor {name} has shape {tuple(tensors[name].shape)} but config.json implies "
                f"{tuple(ref.shape)}; the config and the weights do not match"
            )
    model.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=False)
    model.eval()
    return model, hf
