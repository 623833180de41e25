"""Parallel chunked scan of the linear recurrence h_t = a_t * h_{t-1} + u_t.

Glossary: b batch, l sequence length, c number of chunks, L chunk length, S state dims
(for Mamba1: d_inner, n).

The prompt path never loops over time. The sequence is cut into chunks of a constant
length L; inside a chunk an inclusive Hillis-Steele scan (log2 L doubling steps, all
chunks at once) composes the affine maps (a, u); the chunk summaries are then scanned the
same way across chunks with a fixed number of doubling steps, enough for `max_len`, so the
graph is the same whatever the length it was traced at. Decays stay multiplicative
(a in (0, 1]), which is exact where cumulative sums of log-decays overflow for
per-channel decays such as Mamba1's (the SSD segment-sum form needs an [L, L] matrix per
channel). A non-zero initial state h0 enters through the first chunk.
"""

from __future__ import annotations

import torch


def _shifted(x: torch.Tensor, k: int, dim: int, fill: float) -> torch.Tensor:
    """x shifted right by k along dim, the first k entries set to `fill` (same shape)."""
    size = x.shape[dim]
    pad_shape = list(x.shape)
    pad_shape[dim] = k
    pad = torch.full(pad_shape, fill, dtype=x.dtype, device=x.device)
    return torch.cat([pad, x], dim=dim).narrow(dim, 0, size)


def _hillis_steele(a: torch.Tensor, u: torch.Tensor, dim: int, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inclusive scan of affine maps along dim: returns (prod a, h from zero) per position."""
    k = 1
    for _ in range(steps):
        u = a * _shifted(u, k, dim, 0.0) + u
        a = a * _shifted(a, k, dim, 1.0)
        k *= 2
    return a, u


def linear_scan(
    a: torch.Tensor, u: torch.Tensor, h0: torch.Tensor, chunk: int, max_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """All states of h_t = a_t * h_{t-1} + u_t with h_{-1} = h0.

    a, u [b, l, *S]; h0 [b, *S] -> (h [b, l, *S], h_last [b, *S]).
    """
    b, l = a.shape[0], a.shape[1]
    state_shape = list(a.shape[2:])
    if isinstance(l, int) and l == 1 and not torch.jit.is_tracing():
        h = a[:, 0] * h0 + u[:, 0]  # one-token path: the closed-form step
        return h.unsqueeze(1), h
    n_chunks = (l + chunk - 1) // chunk
    pad = n_chunks * chunk - l
    # Identity maps (a=1, u=0) pad the tail, so the last chunk's end state is h_{l-1}.
    a = torch.cat([a, a.new_ones([b, pad] + state_shape)], dim=1).view([b, n_chunks, chunk] + state_shape)
    u = torch.cat([u, u.new_zeros([b, pad] + state_shape)], dim=1).view([b, n_chunks, chunk] + state_shape)
    intra_steps = max(1, (chunk - 1).bit_length())
    a_in, u_in = _hillis_steele(a, u, dim=2, steps=intra_steps)
    # Chunk summaries; the initial state folds into the first chunk's.
    a_c, u_c = a_in[:, :, -1], u_in[:, :, -1]
    first = a_c[:, :1] * h0.unsqueeze(1) + u_c[:, :1]
    u_c = torch.cat([first, u_c[:, 1:]], dim=1)
    inter_steps = max(1, (max(1, -(-max_len // chunk)) - 1).bit_length())
    _, h_end = _hillis_steele(a_c, u_c, dim=1, steps=inter_steps)  # [b, c, *S]
    h_start = torch.cat([h0.unsqueeze(1), h_end[:, :-1]], dim=1)
    h = a_in * h_start.unsqueeze(2) + u_in
    h = h.reshape([b, n_chunks * chunk] + state_shape)[:, :l]
    return h, h_end[:, -1]
