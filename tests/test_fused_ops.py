"""The fused-op seams (models.ops): each custom op computes its reference, the switch is a
setting of the model it is given, and every op brings its ONNX translation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from hybridrt.models import ops
from hybridrt.models.loading.checkpoint import load_model

B, L, CHUNK, MAX_LEN = 2, 11, 4, 64


def _op_cases(g: torch.Generator) -> dict[str, tuple[Any, tuple[object, ...]]]:
    """Each op's wrapper and arguments, shaped as its docstring says."""
    H, n, P, G, K, V, C, k = 6, 4, 3, 2, 4, 5, 6, 4
    heads, kv_heads, hd, cap = 4, 2, 8, 16

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    def rand(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=g)

    dt = F.softplus(randn(B, L, H))
    q, key = F.normalize(randn(B, L, H, K), dim=-1), F.normalize(randn(B, L, H, K), dim=-1)
    kv = torch.zeros(B, kv_heads, cap, hd)
    return {
        "selective_scan": (
            ops.selective_scan,
            (randn(B, L, H), dt, -rand(n, H), randn(B, L, n), randn(B, L, n), randn(B, n, H), CHUNK, MAX_LEN),
        ),
        "ssd_scan": (
            ops.ssd_scan,
            (
                randn(B, L, H * P),
                dt,
                -rand(H),
                randn(B, L, G * n),
                randn(B, L, G * n),
                randn(B, H, n, P),
                CHUNK,
                MAX_LEN,
            ),
        ),
        "gated_delta": (
            ops.gated_delta,
            (q, key, randn(B, L, H, V), -rand(B, L, H), rand(B, L, H), randn(B, H, K, V), CHUNK, MAX_LEN),
        ),
        "causal_conv": (ops.causal_conv, (randn(B, C, L), randn(B, C, k - 1), randn(C, 1, k), None, True)),
        "moe": (ops.moe, (randn(B * L, 8), randn(B * L, 5), randn(5, 2 * 6, 8), randn(5, 8, 6), 2, True)),
        "kv_attention": (
            ops.kv_attention,
            (randn(B, heads, L, hd), randn(B, kv_heads, L, hd), randn(B, kv_heads, L, hd), kv, kv.clone())
            + (torch.tensor([0, 3]), hd**-0.5),
        ),
    }


@pytest.mark.parametrize("name", sorted(ops.FUSED_OPS))
def test_custom_op_computes_its_reference(name: str) -> None:
    """fused=True runs the custom op, whose body must be the reference computation."""
    fn, args = _op_cases(torch.Generator().manual_seed(0))[name]
    plain, fused = fn(*args), fn(*args, fused=True)
    if isinstance(plain, torch.Tensor):  # one output
        plain, fused = (plain,), (fused,)
    assert len(plain) == len(fused)
    for p, f in zip(plain, fused):
        torch.testing.assert_close(f, p, rtol=0, atol=1e-6)


def test_every_fused_op_has_a_translation() -> None:
    table = ops.onnx_translations()
    assert sorted(ops.FUSED_OPS) == ["causal_conv", "gated_delta", "kv_attention", "moe", "selective_scan", "ssd_scan"]
    for name in ops.FUSED_OPS:
        assert getattr(torch.ops.hybridrt, name).default in table


def test_fused_ops_sets_the_given_model_only_and_restores_it(jamba_dir: Path) -> None:
    """Exporting one model must not route another model's mixers through the custom ops (a
    process-wide switch would), nor leave its own routed there afterwards."""
    exported, other = load_model(jamba_dir)[0], load_model(jamba_dir)[0]

    def flags(model: torch.nn.Module) -> list[bool]:
        return [m.fused for m in model.modules() if isinstance(m, ops.UsesFusedOps)]

    assert flags(exported) and not any(flags(exported))
    with ops.fused_ops(exported):
        assert all(flags(exported))
        assert not any(flags(other))
    assert not any(flags(exported))
