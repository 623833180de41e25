"""Structured output and tools on `hybridrt serve`: response_format and forced tool calls are
decoded under a grammar (hybridrt.serve.grammar), so the tiny models' nonsense text still
parses and validates; tool calls come back as `tool_calls` (streamed: test_serve_tool_stream.py);
the openai client works unchanged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import httpx
import jsonschema
import pytest
from serving import AUTH, client_of, server_fixture
from test_serve_engine import Result

import hybridrt
from hybridrt.serve.engine import Engine, EngineConfig, Request
from hybridrt.serve.grammar import Constraint, matchers
from hybridrt.serve.server import Running
from hybridrt.serve.tools import Tools, parse_calls

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pet": {"enum": ["cat", "dog", None]},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
    },
    "required": ["name", "age", "pet", "tags"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["C", "F"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]},
    },
}
SAY = [{"role": "user", "content": "Describe a person as JSON."}]


server = server_fixture("default_onnx", slots=4)


def _chat(server: Running, **body: Any) -> dict[str, Any]:
    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": "default", "messages": SAY, "max_tokens": 200} | body,
        headers=AUTH,
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_constrained_rows_validate_and_unconstrained_greedy_equals_generate(default_onnx: Path) -> None:
    """Greedy and sampled constrained requests, batched with unconstrained greedy ones: every
    constrained text is JSON valid against the schema; the others equal Model.generate."""
    model = hybridrt.load(default_onnx)
    engine = Engine(model, EngineConfig(slots=6, chunk=16, cache_bytes=0)).start()
    assert engine.ready.wait(60)
    prompts = [model.prompt_rows(f"Person number {i}:").rows[0] for i in range(6)]
    grammars = matchers(model, Constraint.json_schema(PERSON, "response_format"), 4)
    runs = []
    try:
        for i, p in enumerate(prompts):
            kwargs: dict[str, Any] = {"max_new_tokens": 160 if i < 4 else 24}
            if i in (1, 3):
                kwargs |= {"temperature": 0.9, "top_p": 0.95, "seed": i}
            result = Result()
            req = Request(p, model.generation_config(**kwargs), result, grammar=grammars[i] if i < 4 else None)
            engine.submit(req)
            runs.append((p, kwargs, result))
        assert all(r.done.wait(120) for _, _, r in runs)
    finally:
        engine.stop()
    for i, (p, kwargs, r) in enumerate(runs):
        if i < 4:
            assert r.finish == "stop"
            jsonschema.validate(json.loads(model.tokenizer.decode(r.tokens)), PERSON)
        else:
            assert r.tokens == model.generate(p, **kwargs)


@pytest.mark.parametrize("temperature", [0, 1.0])
def test_json_schema_response_format_validates(server: Running, temperature: float) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    out = _chat(server, response_format=fmt, temperature=temperature, n=2, seed=3)
    for choice in out["choices"]:
        assert choice["finish_reason"] == "stop"
        jsonschema.validate(json.loads(choice["message"]["content"]), PERSON)


def test_json_object_response_format_on_both_routes(server: Running) -> None:
    """json_object gives a JSON object on chat and, from a prompt, on completions."""
    out = _chat(server, response_format={"type": "json_object"}, max_tokens=300, temperature=0)
    if out["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(out["choices"][0]["message"]["content"]), dict)
    body = {"model": "default", "prompt": "{", "max_tokens": 300, "temperature": 0}
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
    r = httpx.post(f"{server.url}/v1/completions", json=body | {"response_format": fmt}, headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
    jsonschema.validate(json.loads(r.json()["choices"][0]["text"]), PERSON)


def test_named_tool_choice_forces_a_valid_call(server: Running) -> None:
    choice = {"type": "function", "function": {"name": "get_weather"}}
    for temperature in (0, 1.0):
        out = _chat(server, tools=[WEATHER, TIME], tool_choice=choice, temperature=temperature)["choices"][0]
        assert out["finish_reason"] == "tool_calls"
        (call,) = out["message"]["tool_calls"]
        assert call["type"] == "function" and call["function"]["name"] == "get_weather"
        jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER["function"]["parameters"])


def test_required_tool_choice_calls_allowed_functions(server: Running) -> None:
    out = _chat(server, tools=[WEATHER, TIME], tool_choice="required", temperature=1.0, seed=1)["choices"][0]
    assert out["finish_reason"] == "tool_calls" and 1 <= len(out["message"]["tool_calls"]) <= 4
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
    for call in out["message"]["tool_calls"]:
        jsonschema.validate(json.loads(call["function"]["arguments"]), schemas[call["function"]["name"]])


def test_tool_call_formats_parse() -> None:
    """The released templates' formats: Hermes JSON, Qwen3-Coder XML, LFM2's Python list."""
    tools = Tools((WEATHER, TIME), "auto")
    hermes = 'Sure.\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'
    xml = "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>"
    for text, name, args, rest in [
        (hermes, "get_time", {"zone": "UTC"}, "Sure."),
        (xml, "get_weather", {"city": "Oslo"}, ""),
        ('[get_weather(city="Oslo", unit="C")]', "get_weather", {"city": "Oslo", "unit": "C"}, ""),
    ]:
        content, calls = parse_calls(text, tools)
        assert content == rest and [c["function"]["name"] for c in calls] == [name]
        assert json.loads(calls[0]["function"]["arguments"]) == args
    # Unknown functions and broken JSON stay text.
    for text in ['<tool_call>{"name": "rm", "arguments": {}}</tool_call>', "<tool_call>{oops</tool_call>", "[rm()]"]:
        assert parse_calls(text, tools) == (text, [])


def test_bad_schemas_and_tool_choices_are_400s(server: Running) -> None:
    for extra in [
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
        {"response_format": {"type": "xml"}},
        {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "other"}}},
        {"tool_choice": "required"},
        {"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
    ]:
        r = httpx.post(
            f"{server.url}/v1/chat/completions",
            json={"model": "default", "messages": SAY} | extra,
            headers=AUTH,
            timeout=60,
        )
        assert r.status_code == 400 and r.json()["error"]["message"], (extra, r.text)


def test_openai_client_parse_and_tools(server: Running) -> None:
    """The openai package unchanged: chat.completions.parse with a pydantic response_format,
    and a forced call of a pydantic_function_tool."""
    import openai
    from pydantic import BaseModel, Field

    class Person(BaseModel):
        name: str = Field(max_length=12)
        age: int = Field(ge=0, le=120)
        pet: Literal["cat", "dog"]

    class GetWeather(BaseModel):
        city: str = Field(max_length=10)
        unit: Literal["C", "F"]

    client = client_of(server)
    done = client.chat.completions.parse(model="default", messages=SAY, response_format=Person, max_tokens=200)
    assert isinstance(done.choices[0].message.parsed, Person)
    done = client.chat.completions.parse(
        model="default",
        messages=SAY,
        tools=[openai.pydantic_function_tool(GetWeather)],
        tool_choice={"type": "function", "function": {"name": "GetWeather"}},
        max_tokens=200,
    )
    (call,) = done.choices[0].message.tool_calls
    assert isinstance(call.function.parsed_arguments, GetWeather)
    assert done.choices[0].finish_reason == "tool_calls"


def test_missing_llguidance_is_a_400_naming_it(default_onnx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server without llguidance answers constrained requests with a 400 that names it."""
    import sys

    from hybridrt.serve.protocol import ApiError

    monkeypatch.setitem(sys.modules, "llguidance", None)
    with pytest.raises(ApiError) as e:
        matchers(hybridrt.load(default_onnx), Constraint.json_schema({"type": "object"}, "response_format"), 1)
    assert e.value.status == 400 and "llguidance" in e.value.message
