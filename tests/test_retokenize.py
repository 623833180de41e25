"""How deep a prompt's tail checkpoint goes: as far back as text appended to the prompt can change
its tokens (runtime.retokenize), asked of real `tokenizers` tokenizers."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

import hybridrt
from hybridrt.runtime.prefix_plan import TAIL
from hybridrt.runtime.retokenize import PROBES, Tails

DEFAULT_TOKENIZER = Path(hybridrt.__file__).parent / "data" / "default-model" / "tokenizer.json"


def _remerging() -> Tokenizer:
    """A byte-level BPE where "t" after "...pab" takes two tokens apart: p|ab becomes pa|bt."""
    vocab = {c: i for i, c in enumerate("xpabt")} | {"bt": 5, "ab": 6, "pa": 7}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("b", "t"), ("a", "b"), ("p", "a")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok


@pytest.mark.parametrize(
    "text", ["User: what is the capital of France?\nAssistant:", "The capital of France is", "total = 12345"]
)
def test_a_byte_level_tokenizer_s_prompts_keep_all_but_their_tail_under_appended_text(text: str) -> None:
    tok = Tokenizer.from_file(str(DEFAULT_TOKENIZER))
    ids = tok.encode(text).ids
    tail = Tails(tok).of(ids)
    assert 1 <= tail < TAIL  # shallower than the fixed tail: its call is cheaper
    for probe in PROBES:
        assert tok.encode(text + probe).ids[: len(ids) - tail] == ids[: len(ids) - tail], probe


def test_a_prompt_ending_in_assistant_colon_gets_a_tail_of_one_that_a_reply_can_merge_into() -> None:
    """The bench's completions conversation: "Assistant:" then a reply opening with ":" is
    tokenized again as "::" (or ": " and so on), changing the prompt's last token only."""
    tok = Tokenizer.from_file(str(DEFAULT_TOKENIZER))
    ids = tok.encode("User: hello there\nAssistant:").ids
    assert Tails(tok).of(ids) == 1
    assert any(tok.encode("User: hello there\nAssistant:" + p).ids[len(ids) - 1] != ids[-1] for p in PROBES)


def test_a_merge_that_reaches_two_tokens_back_gets_a_tail_of_two() -> None:
    tok = _remerging()
    ids = tok.encode("xxxxxxpab").ids
    assert tok.encode("xxxxxxpabt").ids[:6] == ids[:6] != tok.encode("xxxxxxpabt").ids[:7]
    assert Tails(tok).of(ids) == 2


def test_ids_the_tokenizer_would_not_make_and_no_tokenizer_fall_back_to_the_fixed_tail() -> None:
    tok = _remerging()
    # "a", "b" as two tokens: the text "ab" encodes back as one, so the window is not this
    # tokenizer's tokenization of any text and the probes cannot speak for it.
    assert Tails(tok).of([0, 0, 0, 0, 0, 0, 2, 3]) == TAIL
    assert Tails(None).of(tok.encode("xxxxxxpab").ids) == TAIL
    assert Tails(tok).of([0]) == TAIL  # too short to tell


def test_the_prefix_cache_asks_the_model_s_tokenizer(jamba_onnx: Path) -> None:
    """A cache made for a model (the server's, the library's) plans a prompt's tail with its
    tokenizer: the stored checkpoint sits that many tokens before the end, not TAIL."""
    model = hybridrt.load(jamba_onnx)
    cache = model.state_cache(memory_bytes=2**26)
    ids = model.tokenizer.encode("User: hello there\nAssistant:").ids
    tail = Tails(model.tokenizer).of(ids)
    assert cache.tails.tokenizer is model.tokenizer and tail < TAIL
    assert cache.plan(ids, 0) == [len(ids) - tail, len(ids)]
    assert cache.plan(ids, 0, tail=False) == [len(ids)]
