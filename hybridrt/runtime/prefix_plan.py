"""Where a prefill stores states for the prefix state cache (runtime.prefix_cache).

A hybrid's recurrent (conv, SSM) state cannot be cut back to a shorter prefix, so a request can
only resume from a state stored at or before the first token where it differs from what was
seen. States are therefore stored at checkpoints (`marks`):

- every `spacing` tokens of a long prompt (positions that are multiples of it, so prompts of
  different lengths that share a prefix share those checkpoints; see `spacing_for`), in a
  prefill of at least two spacings' new tokens, and not within a quarter spacing after where
  the prefill starts or before its tail checkpoint. A shorter prefill is one call or two
  (a conversation's turn: a few hundred tokens after a cached history); a checkpoint inside it
  would split a call (a call costs about a decode step's time besides its tokens: 35-45 ms a
  turn, with the copy, on granite-h-350m) to save at most a spacing's prefill for a request
  that parts inside this one turn's new tokens, which resumes from its start instead;
- where a prompt parts from something already stored or from another queued prompt (a shared
  system prompt gets one exact checkpoint at its end, the first time a second request shows
  it), unless that is within MIN_BRANCH tokens of where the prefill starts;
- a tail before a prompt's end: a conversation resent as text is tokenized again, and the
  reply's first characters may merge with the prompt's last token, so the next turn agrees
  with this one up to a few tokens before its end, never to the end itself. How many tokens:
  as deep as the tokenizer says text appended to this prompt can reach (runtime.retokenize;
  usually 1), TAIL where it cannot tell. Its call of those tokens is on the prompt's path to
  its first token, so the shallower the cheaper. Not for a prompt
  that continues a kept row's tokens exactly or resumes at a stored reply's end (a chat
  template's next turn, a ChatSession's): its client resends the reply as it was generated,
  so its next turn will likely continue this one's reply end too, and the tail's call (about
  a decode step's time, ~22 ms on granite-h-350m) is saved. Should a later reply's first
  characters merge with this prompt's last token after all (a reply that opens with a
  newline after a template's "assistant\n"), that turn resumes from the turn before this one:
  one turn's prefill again, once, and its own prompt gets a tail again;
- at a prompt's end (with its last logits: the same prompt again prefills nothing) and at a
  reply's end (what a chat template's next turn continues from).

Spacing: a prefill of L new tokens gets about DENSITY checkpoints, every power of two near
L / DENSITY tokens (at least MIN_SPACING, at most MAX_SPACING), so a request that parts from it
anywhere re-prefills at most about 1/DENSITY of it (a new question after a long shared system
prompt: ~6% of the first request's prefill, then nothing more once its branch point is
stored); a turn that appends a few hundred tokens to a cached conversation stores only its
tail and end. A checkpoint is never closer than the tokens whose prefill takes as long as
reading the checkpoint back from disk (its fixed-size states, S bytes a row, at
READ_BYTES_PER_S and the measured prefill rate): below that, storing it saves nothing. The
fixed-size states weigh the same at every position; the cache's value-based eviction drops the
checkpoints that are never used first, since a shallow checkpoint saves less prefill per byte
than a deep one. A model without recurrent state needs no checkpoints inside prompts: its KV
can be cut to any prefix, so any stored entry that agrees further serves (StateCache.lookup).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..graphs.contract import TensorSpec
from ..graphs.feeds import state_shape

TAIL = 4  # tail tokens where the tokenizer cannot tell (runtime.retokenize; llama.cpp's server uses 4)
DENSITY = 16
MIN_SPACING, MAX_SPACING = 256, 8192
MIN_BRANCH = 64  # a branch point closer than this to where a prefill starts is not stored
READ_BYTES_PER_S = 1e9


def fixed_sizes(pasts: Sequence[TensorSpec]) -> list[int]:
    """Bytes of each of one row's fixed-size (conv, SSM) states: what every checkpoint holds."""
    return [int(np.prod(state_shape(s, 1))) * np.dtype(s.dtype).itemsize for s in pasts if not s.is_kv]


def spacing_for(length: int, state_bytes: int, seconds_per_token: float) -> int:
    """Tokens between checkpoints in a prefill of `length` new tokens (see the module docstring):
    the power of two nearest length / DENSITY, or the one at or above the tokens whose prefill
    takes as long as reading a checkpoint back, if larger; within MIN_SPACING..MAX_SPACING."""
    near = 1 << max(0, round(math.log2(max(length / DENSITY, 1))))
    worth = state_bytes / READ_BYTES_PER_S / max(seconds_per_token, 1e-9)
    above = 1 << max(0, math.ceil(math.log2(max(worth, 1))))
    return min(max(near, above, MIN_SPACING), MAX_SPACING)


def marks(
    end: int,
    start: int,
    recurrent: bool,
    spacing: int | None,
    state_bytes: int,
    seconds_per_token: float,
    branches: Sequence[int],
    tail: int = TAIL,
) -> list[int]:
    """Checkpoint positions in (start, end] for a prefill of tokens start..end (see the module
    docstring): `spacing` tokens apart (None: spacing_for), `tail` tokens before the end (0:
    none), at the end, and at the `branches` (where the prompt parts from what is stored or queued) that
    are MIN_BRANCH past the start. Without recurrent state, the end alone."""
    if not recurrent:  # KV can be cut to any prefix: the end is enough
        return [end] if end > start else []
    found = {end}
    if tail and end - tail > start:
        found.add(end - tail)
    every = spacing_for(end - start, state_bytes, seconds_per_token) if spacing is None else spacing
    if every and end - start >= 2 * every:  # not within a quarter spacing of the start or the tail
        near, first = every // 4, (start // every + 1) * every
        found.update(m for m in range(first, end, every) if start + near <= m <= end - max(tail, TAIL) - near)
    found.update(a for a in branches if start + MIN_BRANCH <= a < end)
    return sorted(m for m in found if m > start)


def chunk_end(fed: int, chunk: int, length: int, stops: Sequence[int]) -> int:
    """Where a prefill call that starts at `fed` ends: at the prompt's end or the next
    checkpoint (so that storing one costs a copy) if that is at most a quarter past `chunk`
    tokens away (a call costs a step's fixed time besides its tokens: no call for a few
    left over), else after `chunk` tokens."""
    stop = min([length, *(m for m in stops if m > fed)])
    return stop if stop - fed <= chunk + chunk // 4 else fed + chunk
