"""Streamed tool calls as OpenAI streams them: a first delta per call with its id and name, then
its arguments in fragments as tokens arrive, which join into the arguments of the same reply
answered whole; the markup never reaches content; LFM2's special-token markers are seen."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Literal

import httpx
import jsonschema
import pytest
from serving import AUTH, client_of, server_fixture, sse_data
from test_serve_structured import SAY, TIME, WEATHER

from hybridrt.runtime.text import decode
from hybridrt.serve.jobs import TextStream
from hybridrt.serve.server import Running
from hybridrt.serve.tool_parse import CallParser
from hybridrt.serve.tools import Tools, parse_calls, with_markers

NAMES = ["get_weather", "get_time"]
REPLIES = {
    "hermes": (
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Os\\"lo}", "unit": "C"}}\n'
        '</tool_call>\n<tool_call>\n{"name":"get_time","arguments":{"zone":"UTC"}}\n</tool_call>'
    ),
    "qwen3.5": (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=unit>\nC\n"
        "</parameter>\n</function>\n</tool_call>"
    ),
    "lfm2": (
        'Checking.<|tool_call_start|>[get_weather(city="Oslo (N)", unit="C"), get_time(zone="UTC")]<|tool_call_end|>'
    ),
    "lfm2, no markers": '[get_weather(city="Oslo", unit="C")]',
    "hermes, arguments first": '<tool_call>{"arguments": {"zone": "CET"}, "name": "get_time"}</tool_call>',
}
WANT = {
    "hermes": ("Let me look.", [("get_weather", {"city": 'Os"lo}', "unit": "C"}), ("get_time", {"zone": "UTC"})]),
    "qwen3.5": ("", [("get_weather", {"city": "Oslo", "unit": "C"})]),
    "lfm2": ("Checking.", [("get_weather", {"city": "Oslo (N)", "unit": "C"}), ("get_time", {"zone": "UTC"})]),
    "lfm2, no markers": ("", [("get_weather", {"city": "Oslo", "unit": "C"})]),
    "hermes, arguments first": ("", [("get_time", {"zone": "CET"})]),
}


def _replay(pieces: list[str]) -> tuple[str, list[dict[str, Any]], list[Any]]:
    """(content, calls as {"id", "name", "arguments"}, the events) of a reply fed in pieces,
    rebuilt from the events alone as a client rebuilds a stream."""
    parser = CallParser(NAMES)
    events: list[Any] = []
    for piece in pieces:
        events += parser.push(piece)
    events += parser.finish()
    calls: dict[int, dict[str, Any]] = {}
    for e in events:
        if isinstance(e, dict):
            if "id" in e:
                assert e["index"] not in calls and e["type"] == "function" and e["function"]["arguments"] == ""
                calls[e["index"]] = {"id": e["id"], "name": e["function"]["name"], "arguments": ""}
            else:
                assert set(e) == {"index", "function"} and set(e["function"]) == {"arguments"}
            calls[e["index"]]["arguments"] += e["function"]["arguments"]
    content = "".join(e for e in events if isinstance(e, str))
    return content, [calls[i] for i in sorted(calls)], events


@pytest.mark.parametrize("fmt", sorted(REPLIES))
def test_streamed_calls_equal_the_whole_replys_in_any_pieces(fmt: str) -> None:
    """Each format, fed whole, one character at a time and in 100 random splits: the same
    content and calls, and the arguments fragments join into the whole reply's arguments."""
    text = REPLIES[fmt]
    content, calls = parse_calls(text, Tools((WEATHER, TIME), "auto"))
    assert content == WANT[fmt][0]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == WANT[fmt][1]
    rng = random.Random(0)
    splits = [[text], list(text)]
    for _ in range(100):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, 12)))
        splits.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)])
    for pieces in splits:
        got, got_calls, _ = _replay(pieces)
        assert got == content and "tool_call" not in got
        assert [(c["name"], c["arguments"]) for c in got_calls] == [
            (c["function"]["name"], c["function"]["arguments"]) for c in calls
        ]


def test_arguments_stream_before_the_call_ends() -> None:
    """Hermes arguments and Qwen3.5 parameters go out as they arrive, not when the block closes."""
    _, calls, events = _replay(list(REPLIES["hermes"]))
    fragments = [e for e in events if isinstance(e, dict) and e["index"] == 0 and "id" not in e]
    assert len(fragments) >= len(calls[0]["arguments"]) - 1  # a character in, a character out (an escape: two)
    parser = CallParser(NAMES)
    head = REPLIES["qwen3.5"].split("<parameter=unit>")[0]
    events = parser.push(head)
    assert [e["function"] for e in events if isinstance(e, dict)] == [
        {"name": "get_weather", "arguments": ""},
        {"arguments": '{"city": "Oslo"'},
    ]


def test_what_is_not_a_call_stays_content() -> None:
    """Unknown functions, broken blocks and plain text: content, sent as it comes (less a
    possible opener's start, held until the next piece tells)."""
    for text in [
        '<tool_call>{"name": "rm", "arguments": {}}</tool_call>',
        "<tool_call>{oops</tool_call>",
        "[rm()]",
        "a < b and [1, 2] <tool",
    ]:
        assert parse_calls(text, Tools((WEATHER, TIME), "auto")) == (text, [])
        assert _replay(list(text))[:2] == (text, [])
    parser = CallParser(NAMES)
    assert parser.push("Hello <tool") == ["Hello"]
    assert parser.push("box> and more") == [" <toolbox> and more"]


def test_lfm2_markers_are_special_tokens_seen_by_the_parser_only(tmp_path: Path) -> None:
    """LFM2's <|tool_call_start|> and <|tool_call_end|> are special tokens: decoding with
    skip_special_tokens drops them (the call was then seen only as a bare list), with_markers
    keeps them for the parser, and content has no special token; streamed token by token
    through the server's TextStream, the calls are the same."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    special = ["<|im_end|>", "<|tool_call_start|>", "<|tool_call_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator([REPLIES["lfm2"].replace("<|", "").replace("|>", "")] * 20, trainer)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    tokenizer = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    ids = tokenizer.encode(REPLIES["lfm2"] + "<|im_end|>").ids
    assert {tokenizer.token_to_id(s) for s in special} <= set(ids)
    plain = decode(tokenizer, ids)
    assert "<|" not in plain  # what the parser saw before: no markers
    tools = Tools((WEATHER, TIME), "auto")
    assert parse_calls(plain, tools)[1] == []  # text before the list: not a bare list either
    marked = decode(with_markers(tokenizer), ids)
    assert marked == REPLIES["lfm2"]
    content, calls = parse_calls(marked, tools)
    assert content == "Checking." and [c["function"]["name"] for c in calls] == NAMES
    stream, parser, events = TextStream(with_markers(tokenizer), ()), CallParser(NAMES), []
    for t in ids:
        events += parser.push(stream.push([t]))
    events += parser.push(stream.finish()) + parser.finish()
    assert "".join(e for e in events if isinstance(e, str)) == "Checking."
    assert [c["function"] for c in parser.calls] == [c["function"] for c in calls]


server = server_fixture("default_onnx", slots=2)


def _stream(server: Running, body: dict[str, Any]) -> list[dict[str, Any]]:
    chunks = []
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, headers=AUTH, timeout=120) as r:
        assert r.status_code == 200
        for data in sse_data(r):
            if data.startswith("{"):
                chunks.append(json.loads(data))
    return chunks


def test_server_streams_tool_call_arguments_as_deltas(server: Running) -> None:
    """A forced call over HTTP: the first tool_calls delta has id, type and name with empty
    arguments, the arguments come in several fragments, joined they equal the non-streamed
    (greedy) reply's arguments, and finish_reason is tool_calls."""
    body = {"model": "default", "messages": SAY, "max_tokens": 200, "temperature": 0}
    body |= {"tools": [WEATHER, TIME], "tool_choice": "required"}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=AUTH, timeout=120)
    whole = r.json()["choices"][0]
    assert whole["finish_reason"] == "tool_calls"
    chunks = _stream(server, body | {"stream": True})
    deltas = [d for c in chunks for d in c["choices"][0]["delta"].get("tool_calls", [])]
    assert all(len(c["choices"][0]["delta"].get("tool_calls", [])) <= 1 for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert all("tool_call" not in (c["choices"][0]["delta"].get("content") or "") for c in chunks)
    calls: list[dict[str, Any]] = []
    for d in deltas:
        if "id" in d:
            assert d["index"] == len(calls) and d["type"] == "function" and d["function"]["arguments"] == ""
            calls.append({"id": d["id"], "type": "function", "function": dict(d["function"])})
        else:
            assert set(d) == {"index", "function"} and d["index"] == len(calls) - 1
            calls[-1]["function"]["arguments"] += d["function"]["arguments"]
    assert [c["function"] for c in calls] == [c["function"] for c in whole["message"]["tool_calls"]]
    fragments = [d for d in deltas if d["index"] == 0 and "id" not in d]
    assert len(fragments) > 2, fragments  # several tokens, several chunks
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
    for c in calls:
        jsonschema.validate(json.loads(c["function"]["arguments"]), schemas[c["function"]["name"]])


def test_openai_client_reassembles_streamed_calls(server: Running) -> None:
    """The openai package's stream helper (chat.completions.stream) and its delta accumulator
    rebuild the calls: arguments deltas, a done event with the parsed arguments, and the final
    message equal to the non-streamed one."""
    import openai
    from openai.lib.streaming.chat import ChatCompletionStreamState
    from pydantic import BaseModel, Field

    class GetWeather(BaseModel):
        city: str = Field(max_length=10)
        unit: Literal["C", "F"]

    client = client_of(server)
    tool = openai.pydantic_function_tool(GetWeather)
    kwargs: dict[str, Any] = {"model": "default", "messages": SAY, "max_tokens": 200, "temperature": 0}
    kwargs |= {"tools": [tool], "tool_choice": {"type": "function", "function": {"name": "GetWeather"}}}
    whole = client.chat.completions.create(**kwargs).choices[0].message.tool_calls
    with client.chat.completions.stream(**kwargs) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_completion()
    assert kinds.count("tool_calls.function.arguments.delta") > 2
    assert kinds.count("tool_calls.function.arguments.done") == 1
    assert final.choices[0].finish_reason == "tool_calls"
    (call,) = final.choices[0].message.tool_calls
    assert call.function.name == "GetWeather" and call.id.startswith("call_")
    assert call.function.arguments == whole[0].function.arguments
    assert isinstance(call.function.parsed_arguments, GetWeather)
    state = ChatCompletionStreamState()
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        state.handle_chunk(chunk)
    (again,) = state.get_final_completion().choices[0].message.tool_calls
    assert again.function.arguments == whole[0].function.arguments
