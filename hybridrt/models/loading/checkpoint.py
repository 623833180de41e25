"""Load a Hugging Face checkpoint directory (config.json + safetensors) into the reference model.

Weights come only from safetensors: nothing is unpickled and no checkpoint code runs.

A Hugging Face model id is a source too (`hybridrt export ibm-granite/granite-4.0-h-1b -o OUT`,
resolve): it resolves through huggingface_hub's snapshot cache, with HF_HUB_OFFLINE=1 only what
is already cached (nothing is downloaded), otherwise the hub fills the cache first. Only the
files export reads are fetched: config and generation config, the safetensors shards and their
index, the tokenizer.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ...config import HybridConfig
from ...errors import CheckpointError, UnsupportedArchitectureError
from ..decoder import HybridForCausalLM
from .registry import Family, get_family
from .weights import Weights

HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.jinja"]
_MODEL_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve(src: str | Path) -> Path:
    """`src` as a directory: itself when it exists or is not shaped like a model id, else the
    snapshot of that model in the Hugging Face cache."""
    path = Path(src)
    if path.exists() or not _MODEL_ID.match(str(src)):
        return path
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise CheckpointError(
            f"{src} is not a directory; to read a Hugging Face model id, install huggingface_hub"
        ) from None
    try:
        return Path(snapshot_download(str(src), allow_patterns=HUB_PATTERNS))
    except Exception as e:  # offline cache miss, unknown repository, no network
        raise CheckpointError(
            f"{src} is neither a checkpoint directory nor a model id found in the Hugging Face cache "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); download it first "
            "(huggingface-cli download ...) or pass the directory"
        ) from None


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
    if "model_type" not in hf and {"d_model", "n_layer", "ssm_cfg"} <= set(hf):
        raise UnsupportedArchitectureError(
            f"{Path(src) / 'config.json'} has no model_type: it is mamba_ssm's own config (d_model, n_layer, "
            "ssm_cfg), not a transformers one; export a checkpoint saved by transformers (Mamba2ForCausalLM, "
            "MambaForCausalLM: the -hf repositories)"
        )
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

    for name, ftype, value in cfg.typed_fields():  # the kinds' and the family's parameters too
        if ftype in ("int", "int | None") and value is not None:
            low = 1 if name in POSITIVE else 0
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise CheckpointError(_field_message(src, name, value, f"an integer >= {low}"))
        elif ftype in ("float", "float | None") and value is not None:
            if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
                raise CheckpointError(_field_message(src, name, value, "a finite number"))
        elif ftype == "bool" and not isinstance(value, bool):
            raise CheckpointError(_field_message(src, name, value, "true or false"))


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


def open_weights(src: str | Path) -> Weights:
    """The checkpoint's weights, read one tensor at a time (models.loading.weights); use it as a
    context manager. Its names and shapes are checked against the config on entry."""
    src = Path(src)
    cfg, family, hf = load_config(src)
    return Weights(src, cfg, family, hf, weight_files(src))


def load_model(src: str | Path) -> tuple[HybridForCausalLM, dict[str, Any]]:
    """Build the reference model from a checkpoint directory (float32, eval mode)."""
    with open_weights(src) as weights:
        state = {name: weights[name] for name in weights.names() if name in weights.shapes}
        cfg, hf = weights.cfg, weights.hf
    model = HybridForCausalLM(cfg)  # open_weights built it on the meta device already
    model.load_state_dict(state, strict=False)
    model.eval()
    return model, hf
