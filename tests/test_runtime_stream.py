"""Streaming: the pieces add up to the generated text; split characters come out whole."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, pre_tokenizers

import hybridrt
from hybridrt.runtime.text import REPLACEMENT, StreamDecoder, decode


def test_stream_pieces_add_up_to_the_generated_text(onnx_dir: Path) -> None:
    model = hybridrt.load(onnx_dir)
    pieces = list(model.stream("def fibonacci(n):", max_new_tokens=40))
    assert "".join(pieces) == model.generate("def fibonacci(n):", max_new_tokens=40)
    assert all(pieces)


def test_characters_split_across_tokens_come_out_whole(jamba_onnx: Path) -> None:
    """Guards against emitting U+FFFD for the first bytes of a multi-byte character."""
    tok = Tokenizer.from_file(str(jamba_onnx / "tokenizer.json"))
    text = "café 数据 naïve — ok"
    ((symbols, _),) = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False).pre_tokenize_str(text)
    ids = [tok.token_to_id(c) for c in symbols]  # one token per byte
    assert len(ids) == len(text.encode()) and decode(tok, ids) == text
    stream = StreamDecoder(tok)
    pieces = [stream.push(i) for i in ids] + [stream.flush()]
    assert "".join(pieces) == text
    assert not any(REPLACEMENT in p for p in pieces)


def test_stream_with_stop_string(jamba_onnx: Path) -> None:
    model = hybridrt.load(jamba_onnx)
    full = model.generate([5, 17, 42], max_new_tokens=40, eos_token_id=[])
    text = decode(model.tokenizer, full)
    stop = next(text[i : i + 2] for i in range(4, len(text)) if REPLACEMENT not in text[i : i + 2])
    out = model.generate([5, 17, 42], max_new_tokens=40, eos_token_id=[], stop_strings=stop)
    assert out == full[: len(out)]
    assert stop in decode(model.tokenizer, out) and stop not in decode(model.tokenizer, out[:-1])


def test_stream_carries_its_generation_stats(jamba_onnx: Path) -> None:
    """Statistics belong to the call that made them (they were read from a shared `last_stats`)."""
    model = hybridrt.load(jamba_onnx)
    stream = model.stream([5, 17, 42], max_new_tokens=6, min_new_tokens=6)
    assert stream.stats.new_tokens == 0
    text = "".join(stream)
    assert stream.stats.new_tokens == 6 and stream.stats.prompt_tokens == 3
    assert stream.stats.prefill_ms > 0 and stream.stats.decode_tokens == 5
    ids, stats = model.generate_with_stats([[5, 17, 42], [8]], max_new_tokens=6, min_new_tokens=6, eos_token_id=[])
    assert stats.tokens == ids and stats.prompt_tokens == 4 and stats.new_tokens == 12
    assert text == decode(model.tokenizer, model.generate([5, 17, 42], max_new_tokens=6, min_new_tokens=6))
