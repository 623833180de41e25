"""Chunked plain-op gated delta rule (Yang et al. 2024, "Gated Delta Networks").

Glossary: b batch, l length, H value heads, K key head dim, V value head dim, c chunks,
L chunk length. The recurrence, per head, with S [K, V]:

    S_t = exp(g_t) S_{t-1} + beta_t k_t (v_t - exp(g_t) S_{t-1}^T k_t)^T,   o_t = S_t^T q_t

(transformers' `torch_recurrent_gated_delta_rule`; q and k arrive l2-normalized, q already
scaled). A step with g = 0 and beta = 0 leaves S unchanged (padding).

The prompt path never loops over time or chunks. Inside a chunk, the UT transform of
transformers' `torch_chunk_gated_delta_rule` condenses the delta updates into matmuls; its
unit lower-triangular system (I + N) X = R is solved by inverting I + N blockwise
(`unit_lower_inverse`: log2 L steps of batched matmuls, where transformers' forward
substitution takes L - 1 row steps, each a node of the traced graph). Across chunks the state map
is affine, S_end = M_c S_start + U_c with M_c [K, K], so the chunk maps are composed by a
Hillis-Steele scan of fixed depth (enough for `max_len`), as `scan.linear_scan` does for
diagonal maps: the graph is the same whatever length it was traced at.
"""

from __future__ import annotations

import torch


def _shifted(x: torch.Tensor, k: int, fill: torch.Tensor) -> torch.Tensor:
    """x [b, H, c, ...] shifted right by k along the chunk axis, the first k set to `fill`."""
    size = x.shape[2]
    pad = fill.expand(x.shape[0], x.shape[1], k, *x.shape[3:])
    return torch.cat([pad, x], dim=2)[:, :, :size]  # slicing, not narrow(): as in scan.py


def unit_lower_inverse(n: torch.Tensor) -> torch.Tensor:
    """(I + n)^-1 for n [..., L, L] strictly lower triangular, by doubling the blocks whose
    inverses are known: [[A, 0], [C, B]]^-1 = [[A^-1, 0], [-B^-1 C A^-1, B^-1]], from blocks of
    one (each 1) to one block of L (padded to a power of two with identity rows). Every step
    inverts all blocks of its size at once; the result equals forward substitution's up to
    rounding (tests/test_family_gated_delta.py)."""
    L = n.shape[-1]
    size = 1 << (L - 1).bit_length()
    flat = n.reshape(-1, L, L)
    if size != L:
        flat = torch.nn.functional.pad(flat, (0, size - L, 0, size - L))
    inv = torch.ones((1, 1, 1, 1), dtype=n.dtype, device=n.device).expand(flat.shape[0], size, 1, 1)
    s = 1
    while s < size:
        blocks = size // (2 * s)
        # The diagonal blocks of size 2s of n ([N, blocks, 2s, 2s]), by a mask rather than a
        # gather: their lower-left quarters are the C of each pair.
        pick = torch.eye(blocks, dtype=n.dtype, device=n.device).reshape(blocks, 1, blocks, 1)
        c = (flat.reshape(-1, blocks, 2 * s, blocks, 2 * s) * pick).sum(-2)[..., s:, :s]
        halves = inv.reshape(-1, blocks, 2, s, s)
        a, b = halves[:, :, 0], halves[:, :, 1]
        lower = -torch.matmul(b, torch.matmul(c, a))
        inv = torch.cat([torch.cat([a, torch.zeros_like(a)], dim=-1), torch.cat([lower, b], dim=-1)], dim=-2)
        s *= 2
    return inv.reshape(-1, size, size)[:, :L, :L].reshape(n.shape)


def _affine_scan(m: torch.Tensor, u: torch.Tensor, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inclusive scan of maps S -> m_i S + u_i along dim 2: m [b, H, c, K, K], u [b, H, c, K, V]."""
    eye = torch.eye(m.shape[-1], dtype=m.dtype, device=m.device)
    zero = torch.zeros((), dtype=u.dtype, device=u.device)
    k = 1
    for _ in range(steps):
        u = torch.matmul(m, _shifted(u, k, zero)) + u
        m = torch.matmul(m, _shifted(m, k, eye))
        k *= 2
    return m, u


def gated_delta_scan(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    s0: torch.Tensor,
    chunk: int,
    max_len: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [b, l, H, K], v [b, l, H, V], g, beta [b, l, H], s0 [b, H, K, V] (float32)
    -> (o [b, l, H, V], s_last [b, H, K, V])."""
    b, l, H, K = k.shape
    V = v.shape[-1]
    if isinstance(l, int) and l == 1 and not torch.jit.is_tracing():
        # One-token path: the recurrent step itself.
        q1, k1, v1 = q[:, 0], k[:, 0], v[:, 0]  # [b, H, K|V]
        s = s0 * torch.exp(g[:, 0])[..., None, None]
        delta = (v1 - (s * k1.unsqueeze(-1)).sum(-2)) * beta[:, 0].unsqueeze(-1)
        s = s + k1.unsqueeze(-1) * delta.unsqueeze(-2)
        return (s * q1.unsqueeze(-1)).sum(-2).unsqueeze(1), s
    n_chunks = (l + chunk - 1) // chunk
    pad = n_chunks * chunk - l

    def chunked(t: torch.Tensor) -> torch.Tensor:  # [b, l, H, ...] -> [b, H, c, L, ...], zero tail
        tail = t.new_zeros([b, pad] + list(t.shape[2:]))
        t = torch.cat([t, tail], dim=1).view([b, n_chunks, chunk] + list(t.shape[2:]))
        return t.permute(0, 3, 1, 2, 4) if t.dim() == 5 else t.permute(0, 3, 1, 2)

    qc, kc, vc, gc, bc = chunked(q), chunked(k), chunked(v), chunked(g), chunked(beta)
    cs = torch.cumsum(gc, dim=-1)  # [b, H, c, L]; zero tail: no decay, no update
    idx = torch.arange(chunk, device=q.device)
    lower = idx.unsqueeze(1) >= idx.unsqueeze(0)  # [L, L], i >= j
    diff = cs.unsqueeze(-1) - cs.unsqueeze(-2)  # [..., i, j] = cs_i - cs_j
    decay = torch.exp(torch.where(lower, diff, torch.full((), float("-inf"), dtype=diff.dtype)))
    k_beta = kc * bc.unsqueeze(-1)
    v_beta = vc * bc.unsqueeze(-1)
    strict = idx.unsqueeze(1) > idx.unsqueeze(0)
    n = torch.where(strict, torch.matmul(k_beta, kc.transpose(-1, -2)) * decay, torch.zeros((), dtype=q.dtype))
    inv = unit_lower_inverse(n)
    u = torch.matmul(inv, v_beta)  # [b, H, c, L, V]
    w = torch.matmul(inv, k_beta * torch.exp(cs).unsqueeze(-1))  # [b, H, c, L, K]
    attn = torch.matmul(qc, kc.transpose(-1, -2)) * decay  # [b, H, c, L, L]
    q_dec = qc * torch.exp(cs).unsqueeze(-1)
    k_dec = kc * torch.exp(cs[..., -1:] - cs).unsqueeze(-1)  # [b, H, c, L, K]
    total = torch.exp(cs[..., -1])[..., None, None]  # [b, H, c, 1, 1]
    # Chunk map: S_end = (total I - k_dec^T w) S_start + k_dec^T u
    m = total * torch.eye(K, dtype=q.dtype, device=q.device) - torch.matmul(k_dec.transpose(-1, -2), w)
    uc = torch.matmul(k_dec.transpose(-1, -2), u)  # [b, H, c, K, V]
    steps = max(1, (max(1, -(-max_len // chunk)) - 1).bit_length())
    m_in, u_in = _affine_scan(m, uc, steps)
    ends = torch.matmul(m_in, s0.unsqueeze(2)) + u_in  # [b, H, c, K, V]
    starts = torch.cat([s0.unsqueeze(2), ends[:, :, :-1]], dim=2)
    v_new = u - torch.matmul(w, starts)
    o = torch.matmul(q_dec, starts) + torch.matmul(attn, v_new)  # [b, H, c, L, V]
    o = o.reshape(b, H, n_chunks * chunk, V)[:, :, :l].transpose(1, 2)
    return o, ends[:, :, -1]
