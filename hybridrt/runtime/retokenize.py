"""How many of a prompt's last tokens text appended to it may tokenize differently.

A conversation resent as text (a completions client's next turn, an agent's next step) is
tokenized again with the reply and the new text after the prompt. Where the reply's first
characters merge with the prompt's last token(s) ("Assistant:" then a reply opening with ":"
gives "::"), the next turn agrees with this one only up to a few tokens before its end. The
prefix state cache therefore stores a state that many tokens before a prompt's end
(runtime.prefix_plan's tail), which costs a prefill call of its own, of those tokens, on the
prompt's path to its first token (granite-h-350m: 4 tokens 34 ms, 1 token 18 ms, against
3 ms a token inside a long call).

`Tails.of` asks the tokenizer how deep that is for this prompt, instead of assuming a fixed
TAIL: the text of the prompt's last WINDOW tokens is encoded with each of PROBES appended
(letters, digits, punctuation, whitespace and common word starts: one of each character
class that a byte-level or SentencePiece BPE merges with what precedes it), and the tail is
the most trailing tokens any of them changed, at least 1 (a continuation the probes did not
try may still merge with the last token). A byte-level BPE's "Assistant:" gets 1; a word
split into three tokens at the end gets 3. It falls back to TAIL where the window's text does
not encode back to the window's own tokens (ids that are not this tokenizer's tokenization of
any text: the probes would say nothing about them), or where there is no tokenizer. A merge
deeper than the tail makes the next turn resume from the checkpoint before it: one turn's
prefill again, once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .prefix_plan import TAIL
from .radix import common_prefix

WINDOW = 8  # the prompt's last tokens whose text is encoded again
MEMO = 4096  # prompt endings remembered (an agent's steps end alike)
PROBES = (
    *"aestnAST019.,:;!?'\"()[]{}-_*#/\\=+<>`|&%$@~^é",
    *(" ", "  ", "\n", "\n\n", "\t", " \n", " the", " a", "The", "I", "ing", "ed", "'s"),
    *("n't", "://", "...", "**", "```"),
)


class Tails:
    """The tail (see the module docstring) of prompts under one tokenizer (None: always TAIL)."""

    def __init__(self, tokenizer: Any | None) -> None:
        self.tokenizer = tokenizer
        self.memo: dict[tuple[int, ...], int] = {}

    def of(self, tokens: Sequence[int]) -> int:
        window = tuple(int(t) for t in tokens[-WINDOW:])
        if self.tokenizer is None or len(window) < 2:
            return TAIL
        found = self.memo.get(window)
        if found is None:
            found = self._probe(window)
            if len(self.memo) >= MEMO:
                self.memo.clear()
            self.memo[window] = found
        return found

    def _probe(self, window: tuple[int, ...]) -> int:
        tok: Any = self.tokenizer
        try:
            text = tok.decode(list(window), skip_special_tokens=False)
            base = tok.encode(text, add_special_tokens=False).ids
            # One at a time: encode_batch's worker threads would wait behind onnxruntime's, which
            # spin on the cores for a while after each call (2-4 ms against 0.4 ms in a server).
            probed = [tok.encode(text + p, add_special_tokens=False) for p in PROBES]
        except Exception:  # ids the tokenizer cannot read (not its own): it cannot tell
            return TAIL
        changed = max(len(base) - common_prefix(base, e.ids) for e in probed)
        # The window's text must encode back to the window, with room before what changed:
        # else its tokens are not this tokenizer's tokenization of that text.
        if common_prefix(base[::-1], window[::-1]) < changed + 2:  # (how many last tokens agree)
            return TAIL
        return max(changed, 1)
