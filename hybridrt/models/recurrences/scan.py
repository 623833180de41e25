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
    # Slicing rather than narrow(): the same graph whether or not the exporter decomposes the
    # traced program (its translation of narrow adds the start to the length).
    return torch.cat([pad, x], dim=dim)[(slice(None),) * (dim % x.dim()) + (slice(0, size),)]


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


def _segsum(x: torch.Tensor) -> torch.Tensor:
    """exp of segment sums: x [..., T] -> [..., T, T] with [i, j] = exp(sum_{j<k<=i} x_k) for
    i >= j, else 0. Built by masked cumulative sums rather than differences of one cumsum,
    so nothing cancels; every exponent is <= 0 for decays, so nothing overflows."""
    t = x.shape[-1]
    idx = torch.arange(t, device=x.device)
    below = idx.unsqueeze(1) > idx.unsqueeze(0)  # [T, T], i > j
    xr = torch.where(below, x.unsqueeze(-1), torch.zeros((), dtype=x.dtype))  # [..., T, T], [i, j] = x_i
    sums = torch.cumsum(xr, dim=-2)
    return torch.where(below | (idx.unsqueeze(1) == idx.unsqueeze(0)), torch.exp(sums), torch.zeros((), dtype=x.dtype))


CHUNK_STATES = 16


def _eager(n: object) -> bool:
    """True when running eagerly (a concrete size, no TorchScript trace, no torch.export)."""
    return isinstance(n, int) and not torch.jit.is_tracing() and not torch.compiler.is_compiling()


def ssd_scan(
    xdt: torch.Tensor,
    log_decay: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    h0: torch.Tensor,
    chunk: int,
    max_len: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mamba2's SSD recurrence h_t = exp(g_t) h_{t-1} + x_t B_t^T, y_t = h_t C_t, chunked.

    Glossary: b batch, l length, H heads, P head_dim, n d_state, c chunks, L chunk length.
    xdt [b, l, H, P] (dt * x), log_decay [b, l, H] (dt * A, scalar per head),
    B, C [b, l, H, n], h0 [b, H, P, n] -> (y [b, l, H, P], h_last [b, H, P, n]).

    The "minimal SSD" of Dao & Gu 2024 (section 6; transformers' `mamba2_chunk_scan`):
    inside a chunk a masked [L, L] attention-like product, across chunks `linear_scan` over
    the chunk states, starting from h0 (`max_len` fixes its depth). Memory is
    O(b l H (L + P n / L)), never [b, l, H, P, n].
    """
    b, l, H, P = xdt.shape
    if isinstance(l, int) and l == 1 and not torch.jit.is_tracing():
        # One-token path: the closed-form step.
        h = torch.exp(log_decay[:, 0]).view(b, H, 1, 1) * h0 + xdt[:, 0].unsqueeze(-1) * B[:, 0].unsqueeze(2)
        return (h * C[:, 0].unsqueeze(2)).sum(-1).unsqueeze(1), h
    n_chunks = (l + chunk - 1) // chunk
    pad = n_chunks * chunk - l

    def chunked(t: torch.Tensor) -> torch.Tensor:  # [b, l, ...] -> [b, c, L, ...], zero tail
        tail = t.new_zeros([b, pad] + list(t.shape[2:]))
        return torch.cat([t, tail], dim=1).view([b, n_chunks, chunk] + list(t.shape[2:]))

    x, g, Bc, Cc = chunked(xdt), chunked(log_decay), chunked(B), chunked(C)
    g = g.permute(0, 3, 1, 2)  # [b, H, c, L]; zero padding = decay 1, no input
    cs = torch.cumsum(g, dim=-1)
    # 1. Within chunks: y_i = sum_{j<=i} (C_i . B_j) exp(cs_i - cs_j) x_j
    decay_in = _segsum(g)  # [b, H, c, L, L]
    scores = torch.einsum("bclhn,bcshn->bhcls", Cc, Bc) * decay_in
    y = torch.einsum("bhcls,bcshp->bclhp", scores, x)
    # 2. Each chunk's end state from a zero start.
    to_end = torch.exp(cs[..., -1:] - cs).permute(0, 2, 3, 1).unsqueeze(-1)  # [b, c, L, H, 1]
    states = torch.einsum("bclhn,bclhp->bchpn", Bc * to_end, x)
    # 3. Across chunks: h_end[k] = exp(total_k) h_end[k-1] + states[k] from h0, by the same
    # fixed-depth scan as Mamba1 (no [c, c] matrix whose size the trace could specialize).
    totals = torch.exp(cs[..., -1]).permute(0, 2, 1)[..., None, None].expand(states.shape)  # [b, c, H, P, n]
    # The chunk states are few (l / L of them): they are scanned in blocks of CHUNK_STATES, not
    # padded to a whole chunk of L (at L = 256 that padding was most of a long prompt's time).
    if _eager(n_chunks):  # running, not tracing: the few chunk states one after another
        ends_list, last = [], h0
        for k in range(n_chunks):
            last = totals[:, k] * last + states[:, k]
            ends_list.append(last)
        ends = torch.stack(ends_list, dim=1)
    else:
        ends, last = linear_scan(totals, states, h0, CHUNK_STATES, max(1, -(-max_len // chunk)))
    starts = torch.cat([h0.unsqueeze(1), ends[:, :-1]], dim=1)  # [b, c, H, P, n]
    # 4. What each chunk's start state contributes to its outputs.
    from_start = torch.exp(cs).permute(0, 2, 3, 1).unsqueeze(-1)  # [b, c, L, H, 1]
    y = y + torch.einsum("bclhn,bchpn->bclhp", Cc, starts) * from_start
    return y.reshape(b, n_chunks * chunk, H, P)[:, :l], last
