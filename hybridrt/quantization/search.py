"""Symmetric 4-bit blocks whose scale is searched, not read off the block's largest value
(`--algo mse`).

Round-to-nearest (onnxruntime's block quantizer, and llama.cpp's q4_0) takes the value of
largest magnitude m of a block, sets the scale d = m / -8 so that m lands on the level -8
exactly, and rounds every other value to the nearest of -8..7 steps of d. That choice serves
one value of the block and lets the step be wider than the rest need. Here each block tries
the scales m / -(8 + t) for t in -1.0..1.0 by quarters (levels rounded and clipped for each),
and keeps the levels with the least squared error, their scale refitted by least squares
(d = sum(x L) / sum(L^2), which minimises sum((x - d L)^2) for fixed levels L). It is the search
llama.cpp's k-quants run per sub-block (`make_qx_quants`), here over whole MatMulNBits blocks,
without an importance weighting (none is known at export).

The layout is MatMulNBits' own symmetric one, so the kernel and the bytes are those of
`--symmetric`; only the numbers differ. On random Gaussian weights the squared error falls by
11% at blocks of 64 (0.00902 -> 0.00807 of the weights' mean square; 32: 0.00739 -> 0.00655).
"""

from __future__ import annotations

import numpy as np

# Candidate scales: m / -(8 + t); t = 0 is round-to-nearest's scale. Tenths (21 candidates
# instead of 9) gave the same squared error to three figures; each candidate is a pass over the
# weights (granite-h-350m's int4 export: 58 s with 21, 43 s with 9).
STEPS = np.arange(-4, 5, dtype=np.float32) / 4
# Blocks searched at once: a few MB of float32 per pass, so the passes stay in cache.
CHUNK = 1 << 14


def search_blocks(weight: np.ndarray, block: int, bits: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """weight [K, N] -> packed [N, k_blocks, block * bits / 8] uint8 and scales [N, k_blocks]
    float32, in MatMulNBits' symmetric layout (stored level = L + 2^(bits-1), no zero points)."""
    if bits != 4:
        raise ValueError(f"the scale search writes 4-bit blocks, not {bits}-bit")
    k, n = weight.shape
    k_blocks = -(-k // block)
    rows = np.zeros((n, k_blocks * block), np.float32)
    rows[:, :k] = weight.T
    blocks = rows.reshape(n * k_blocks, block)
    scales = np.empty(n * k_blocks, np.float32)
    levels = np.empty((n * k_blocks, block), np.uint8)
    for start in range(0, len(blocks), CHUNK):
        scales[start : start + CHUNK], levels[start : start + CHUNK] = _search(blocks[start : start + CHUNK])
    levels = levels.reshape(n, k_blocks, block)
    packed = levels[..., 0::2] | (levels[..., 1::2] << 4)
    return packed.astype(np.uint8), scales.reshape(n, k_blocks)


def _search(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Scales [B] and stored levels [B, block] (0..15) for the blocks x [B, block]."""
    peak = x[np.arange(len(x)), np.abs(x).argmax(1)]
    peak = np.where(peak == 0, 1, peak).astype(np.float32)
    best = np.full(len(x), -1.0, np.float32)
    best_scale = np.zeros(len(x), np.float32)
    best_step = np.zeros(len(x), np.float32)
    for step in STEPS:
        levels = _levels(x, peak, step)
        sxl = np.einsum("ij,ij->i", x, levels)
        sll = np.einsum("ij,ij->i", levels, levels)
        nonzero = sll > 0
        sll = np.where(nonzero, sll, 1)
        # The squared error at the least-squares scale is sum(x^2) - sxl^2 / sll: the larger
        # sxl^2 / sll, the closer.
        score = np.where(nonzero, sxl * sxl / sll, 0)
        better = score > best
        best = np.where(better, score, best)
        best_scale = np.where(better, np.where(nonzero, sxl / sll, 0), best_scale)
        best_step = np.where(better, step, best_step)
    return best_scale.astype(np.float32), (_levels(x, peak, best_step) + 8).astype(np.uint8)


def _levels(x: np.ndarray, peak: np.ndarray, step: np.ndarray | np.float32) -> np.ndarray:
    """Round-to-nearest levels -8..7 of the blocks x [B, block] at the scales peak / -(8 + step)."""
    inverse = (-(8 + step) / peak).astype(np.float32)
    levels = np.rint(x * inverse[:, None])
    return np.clip(levels, -8, 7, out=levels)
