"""The AWS Lambda handler, driven with payload 2.0 events against a real exported model."""

from __future__ import annotations

import base64
import importlib.metadata
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import hybridrt
from hybridrt.deploy import aws_lambda
from hybridrt.runtime.model import Model
from hybridrt.serve.chat import ChatTemplate, PlainDefaultTemplate, chat_template

KEY = "lambda-key"


def event(method: str, path: str, body: Any = None, *, key: str | None = KEY, **extra: Any) -> dict[str, Any]:
    headers = {"content-type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    out: dict[str, Any] = {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": path,
        "rawQueryString": "",
        "headers": headers,
        "requestContext": {"http": {"method": method, "path": path, "protocol": "HTTP/1.1"}},
        "isBase64Encoded": False,
    }
    if body is not None:
        out["body"] = body if isinstance(body, str) else json.dumps(body)
    return out | extra


def call(ev: Any) -> tuple[int, Any]:
    out = aws_lambda.handler(ev, None)
    assert set(out) == {"statusCode", "headers", "body", "isBase64Encoded"}
    if out["headers"]["content-type"].startswith("application/json"):
        return out["statusCode"], json.loads(out["body"])
    return out["statusCode"], out["body"]


@pytest.fixture(scope="module")
def model(jamba_onnx: Path) -> Model:
    return hybridrt.load(jamba_onnx)


@pytest.fixture(autouse=True)
def configured(jamba_onnx: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("HYBRIDRT_MODEL", str(jamba_onnx))
    monkeypatch.setenv("HYBRIDRT_MODEL_NAME", "tiny")
    monkeypatch.setenv("HYBRIDRT_API_KEY", KEY)
    monkeypatch.setattr(aws_lambda, "_state", None)
    yield


def test_greedy_completion_equals_generate(model: Model) -> None:
    for prompt, k in (("def", 6), ("class Stack:\n", 9)):
        status, out = call(
            event("POST", "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": k, "temperature": 0})
        )
        assert status == 200, out
        assert out["object"] == "text_completion" and out["model"] == "tiny" and out["id"].startswith("cmpl-")
        assert isinstance(out["created"], int)
        [choice] = out["choices"]
        assert choice["index"] == 0 and choice["logprobs"] is None
        assert choice["text"] == model.generate(prompt, max_new_tokens=k)
        rows = model.prompt_rows(prompt).rows
        usage = out["usage"]
        assert usage["prompt_tokens"] == len(rows[0])
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        assert choice["finish_reason"] == ("length" if usage["completion_tokens"] == k else "stop")


def test_token_ids_n_and_seeded_sampling(model: Model) -> None:
    ids = [5, 77, 300, 12, 9]
    body = {"model": "tiny", "prompt": [ids, ids[:2]], "max_tokens": 5, "temperature": 0, "n": 2}
    status, out = call(event("POST", "/v1/completions", body))
    assert status == 200, out
    want = [model.tokenizer.decode(t) for t in model.generate([ids, ids[:2]], max_new_tokens=5)]
    assert [c["text"] for c in out["choices"]] == [want[0], want[0], want[1], want[1]]
    assert out["usage"]["prompt_tokens"] == 7 and out["usage"]["completion_tokens"] == 20
    body = {"model": "tiny", "prompt": "def", "max_tokens": 6, "temperature": 0.9, "seed": 3}
    first, second = call(event("POST", "/v1/completions", body))[1], call(event("POST", "/v1/completions", body))[1]
    assert first["choices"][0]["text"] == second["choices"][0]["text"]
    assert first["choices"][0]["text"] == model.generate(
        "def", max_new_tokens=6, do_sample=True, temperature=0.9, seed=3
    )


def test_presence_and_frequency_penalties_are_the_samplers(model: Model) -> None:
    """The handler samples through the one sampler: its penalized completion is the library's."""
    body = {"model": "tiny", "prompt": "def", "max_tokens": 12, "temperature": 0}
    penalties = {"presence_penalty": 1.5, "frequency_penalty": 0.8}
    status, out = call(event("POST", "/v1/completions", body | penalties))
    assert status == 200, out
    want = model.generate("def", max_new_tokens=12, **penalties)
    assert out["choices"][0]["text"] == want
    assert want != model.generate("def", max_new_tokens=12)  # the penalties changed something


def test_chat(model: Model) -> None:
    messages = [{"role": "system", "content": "Write Python."}, {"role": "user", "content": "def add(a, b):"}]
    body = {"model": "tiny", "messages": messages, "max_tokens": 7, "temperature": 0}
    status, out = call(event("POST", "/v1/chat/completions", body))
    assert status == 200, out
    assert out["object"] == "chat.completion" and out["id"].startswith("chatcmpl-")
    prompt = ChatTemplate.for_model(model.path).render(messages)
    assert out["choices"][0]["message"] == {"role": "assistant", "content": model.generate(prompt, max_new_tokens=7)}
    assert out["usage"]["prompt_tokens"] == len(model.prompt_rows(prompt).rows[0])


def test_echo_and_logprobs_are_the_servers(model: Model) -> None:
    """The handler's logprobs (one more pass after generating) are the raw-logit ones that
    `hybridrt serve` returns: the prompt's those of hybridrt eval, the first null."""
    from hybridrt.runtime.evaluate import ort_logits_fn, token_nll

    ids = model.prompt_rows("def fibonacci(n):\n").rows[0]
    body = {"model": "tiny", "prompt": "def fibonacci(n):\n", "echo": True, "logprobs": 2, "temperature": 0}
    status, out = call(event("POST", "/v1/completions", body | {"max_tokens": 0}))
    assert status == 200, out
    [choice] = out["choices"]
    assert choice["text"] == "def fibonacci(n):\n" and out["usage"]["completion_tokens"] == 0
    assert choice["logprobs"]["token_logprobs"][0] is None
    want = -token_nll(ort_logits_fn(model), ids, len(ids), len(ids), lambda n: None)
    assert max(abs(a - b) for a, b in zip(choice["logprobs"]["token_logprobs"][1:], want)) < 1e-4
    status, out = call(event("POST", "/v1/completions", body | {"max_tokens": 4, "repetition_penalty": 1.0}))
    lp = out["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(ids) + out["usage"]["completion_tokens"]
    assert all(
        top[tok] == max(top.values()) for tok, top in zip(lp["tokens"][len(ids) :], lp["top_logprobs"][len(ids) :])
    )
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}
    status, out = call(event("POST", "/v1/chat/completions", chat | {"logprobs": True, "top_logprobs": 1}))
    content = out["choices"][0]["logprobs"]["content"]
    assert status == 200 and len(content) == out["usage"]["completion_tokens"]
    assert all(len(t["top_logprobs"]) == 1 and isinstance(t["bytes"], list) for t in content)


def test_plain_default_template_equals_jinja() -> None:
    template = ChatTemplate.for_model(Path("/nonexistent"))
    plain = PlainDefaultTemplate()
    for messages in (
        [{"role": "user", "content": "hi"}],
        [{"role": "system", "content": "{{ x }} {% if %}"}, {"role": "user", "content": "a\n\nb "}],
        [{"role": "user", "content": ""}, {"role": "assistant", "content": "  x\n"}, {"role": "tool", "content": "y"}],
    ):
        assert plain.render(messages) == template.render(messages)


def test_stream_is_one_buffered_event_stream(model: Model) -> None:
    body = {"model": "tiny", "prompt": "def", "max_tokens": 5, "temperature": 0, "stream": True}
    body["stream_options"] = {"include_usage": True}
    out = aws_lambda.handler(event("POST", "/v1/completions", body), None)
    assert out["statusCode"] == 200 and out["headers"]["content-type"].startswith("text/event-stream")
    events = out["body"].split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == model.generate("def", max_new_tokens=5)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] >= 1
    messages = [{"role": "user", "content": "hi"}]
    out = aws_lambda.handler(
        event("POST", "/v1/chat/completions", {"model": "tiny", "messages": messages, "stream": True})
    )
    chunks = [json.loads(e.removeprefix("data: ")) for e in out["body"].split("\n\n")[:-2]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[1]["object"] == "chat.completion.chunk" and chunks[1]["choices"][0]["finish_reason"] is not None


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["C", "F"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}


def test_response_format_is_decoded_under_its_grammar() -> None:
    """json_schema (greedy and sampled, n=2) and json_object, on chat and completions: the text
    is JSON valid against the schema, as `hybridrt serve` gives it."""
    import jsonschema

    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    for temperature in (0, 1.0):
        body = CHAT | {"max_tokens": 120, "temperature": temperature, "seed": 2, "n": 2, "response_format": fmt}
        status, out = call(event("POST", "/v1/chat/completions", body))
        assert status == 200, out
        for choice in out["choices"]:
            assert choice["finish_reason"] == "stop"
            jsonschema.validate(json.loads(choice["message"]["content"]), PERSON)
    body = GOOD | {"max_tokens": 120, "temperature": 0, "response_format": fmt}
    status, out = call(event("POST", "/v1/completions", body))
    assert status == 200 and out["choices"][0]["finish_reason"] == "stop", out
    jsonschema.validate(json.loads(out["choices"][0]["text"]), PERSON)
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}
    status, out = call(event("POST", "/v1/completions", GOOD | {"response_format": fmt}))
    assert status == 400 and "response_format" in out["error"]["message"], out


def test_forced_tool_calls_are_the_servers(default_onnx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A named tool_choice and "required" without parallel calls: exactly one call of an
    allowed function with valid arguments, finish_reason tool_calls; greedy, the same call as
    `hybridrt serve` makes; streamed, a first delta with the name and empty arguments, then
    the arguments, which join into the non-streamed ones. (The default model: the tool prompt
    does not fit the tiny model's 512 positions.)"""
    import httpx
    import jsonschema
    from serving import running as serving

    monkeypatch.setenv("HYBRIDRT_MODEL", str(default_onnx))

    named = {"type": "function", "function": {"name": "get_weather"}}
    body = CHAT | {"max_tokens": 120, "temperature": 0, "tools": [WEATHER, TIME], "tool_choice": named}
    status, out = call(event("POST", "/v1/chat/completions", body))
    assert status == 200, out
    [choice] = out["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [made] = choice["message"]["tool_calls"]
    assert made["type"] == "function" and made["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(made["function"]["arguments"]), WEATHER["function"]["parameters"])
    with serving(hybridrt.load(default_onnx), api_key=None, model_name="tiny") as server:
        r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["tool_calls"][0]["function"] == made["function"]
    out = aws_lambda.handler(event("POST", "/v1/chat/completions", body | {"stream": True}))
    chunks = [json.loads(e.removeprefix("data: ")) for e in out["body"].split("\n\n")[:-2]]
    deltas = [d for c in chunks for d in c["choices"][0]["delta"].get("tool_calls", [])]
    assert deltas[0]["id"].startswith("call_") and deltas[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert all(set(d) == {"index", "function"} for d in deltas[1:])
    assert "".join(d["function"]["arguments"] for d in deltas) == made["function"]["arguments"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    body = body | {"tool_choice": "required", "parallel_tool_calls": False, "temperature": 1.0, "seed": 5}
    status, out = call(event("POST", "/v1/chat/completions", body))
    [choice] = out["choices"]
    assert status == 200 and choice["finish_reason"] == "tool_calls", out
    [made] = choice["message"]["tool_calls"]
    assert made["function"]["name"] in ("get_weather", "get_time")
    assert isinstance(json.loads(made["function"]["arguments"]), dict)


def test_models_and_health(jamba_onnx: Path) -> None:
    status, out = call(event("GET", "/v1/models"))
    assert status == 200
    [card] = out["data"]
    assert out["object"] == "list" and card["id"] == "tiny" and card["object"] == "model"
    assert card["max_model_len"] == hybridrt.load(jamba_onnx).max_length
    assert call(event("GET", "/health", key=None)) == (200, {"status": "ok"})


def _error(status: int, out: Any, words: str) -> None:
    assert isinstance(out, dict) and set(out) == {"error"}, out
    assert set(out["error"]) == {"message", "type", "param", "code"}
    assert words in out["error"]["message"], out
    assert out["error"]["type"] == {401: "authentication_error", 404: "not_found_error"}.get(
        status, "invalid_request_error" if status < 500 else "server_error"
    )


GOOD = {"model": "tiny", "prompt": "def", "max_tokens": 2}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.mark.parametrize(
    "ev, status, words",
    [
        ("not a dict", 400, "payload format 2.0"),
        ({"version": "1.0", "httpMethod": "GET", "path": "/health"}, 400, "payload format 2.0"),
        ({"version": "2.0", "rawPath": "/health"}, 400, "requestContext.http.method"),
        ({"version": "2.0", "requestContext": {"http": {"method": "GET"}}}, 400, "rawPath"),
        (event("GET", "/health") | {"headers": ["x"]}, 400, "headers"),
        (event("POST", "/v1/completions"), 400, "no body"),
        (event("POST", "/v1/completions", "{not json"), 400, "not valid JSON"),
        (event("POST", "/v1/completions", "[1]"), 400, "JSON object"),
        (event("POST", "/v1/completions", "x" * 2 + "\ud800"), 400, "UTF-8"),
        (
            event("POST", "/v1/completions", base64.b64encode(b'{"a": "\xff"}').decode(), isBase64Encoded=True),
            400,
            "UTF-8",
        ),
        (event("POST", "/v1/completions", "***", isBase64Encoded=True), 400, "base64"),
        (event("POST", "/v1/completions", GOOD, isBase64Encoded="yes"), 400, "isBase64Encoded"),
        (event("POST", "/v1/completions", {"prompt": "x"}), 400, "model is required"),
        (event("POST", "/v1/completions", GOOD | {"model": "other"}), 404, "does not exist"),
        (event("POST", "/v1/completions", GOOD | {"max_tokens": -1}), 400, "max_tokens"),
        (event("POST", "/v1/completions", GOOD | {"bogus": 1}), 400, "unrecognized"),
        (event("POST", "/v1/completions", GOOD | {"presence_penalty": 2.5}), 400, "presence_penalty"),
        (event("POST", "/v1/completions", GOOD | {"response_format": {"type": "xml"}}), 400, "response_format"),
        (event("POST", "/v1/chat/completions", CHAT | {"tool_choice": "required"}), 400, "needs tools"),
        (event("POST", "/v1/chat/completions", CHAT | {"tools": [{"type": "function"}]}), 400, "tools[0]"),
        (event("POST", "/v1/completions", "x" * (1 << 21)), 413, "exceeds"),
        (event("POST", "/v1/chat/completions", {"model": "tiny", "messages": []}), 400, "messages"),
        (event("GET", "/v2/nothing"), 404, "Not Found"),
        (event("GET", "/"), 404, "Not Found"),
        (event("GET", "/v1/completions"), 405, "Method Not Allowed"),
        (event("POST", "/health"), 405, "Method Not Allowed"),
        (event("GET", "/v1/models", key=None), 401, "API key"),
        (event("GET", "/v1/models", key="wrong"), 401, "API key"),
        (event("POST", "/v1/completions", GOOD, key="wrong"), 401, "API key"),
    ],
)
def test_bad_events(ev: Any, status: int, words: str) -> None:
    got, out = call(ev)
    assert got == status, out
    _error(status, out, words)


def test_base64_body_and_trailing_slash(model: Model) -> None:
    raw = base64.b64encode(json.dumps(GOOD | {"temperature": 0}).encode()).decode()
    status, out = call(event("POST", "/v1/completions/", raw, isBase64Encoded=True))
    assert status == 200, out
    assert out["choices"][0]["text"] == model.generate("def", max_new_tokens=2)


def test_no_api_key_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HYBRIDRT_API_KEY")
    assert call(event("GET", "/v1/models", key=None))[0] == 200


def test_model_that_fails_to_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYBRIDRT_MODEL", str(tmp_path / "missing"))
    status, out = call(event("GET", "/v1/models"))
    assert status == 503
    _error(503, out, "failed to load")
    assert call(event("GET", "/health", key=None))[0] == 503
    monkeypatch.delenv("HYBRIDRT_MODEL")
    assert "HYBRIDRT_MODEL is not set" in call(event("GET", "/v1/models"))[1]["error"]["message"]


@pytest.mark.parametrize("mode", ["size", "none"])
def test_verify_modes(jamba_onnx: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    import shutil

    copy = tmp_path / "model"
    shutil.copytree(jamba_onnx, copy)
    monkeypatch.setenv("HYBRIDRT_MODEL", str(copy))
    monkeypatch.setenv("HYBRIDRT_VERIFY", mode)
    assert call(event("GET", "/v1/models"))[0] == 200
    monkeypatch.setattr(aws_lambda, "_state", None)
    tok = copy / "tokenizer.json"
    tok.write_bytes(tok.read_bytes() + b" ")  # one byte more: a size check sees it
    status, out = call(event("GET", "/v1/models"))
    assert status == (503 if mode == "size" else 200), out
    monkeypatch.setenv("HYBRIDRT_VERIFY", "bogus")
    monkeypatch.setattr(aws_lambda, "_state", None)
    assert "HYBRIDRT_VERIFY" in call(event("GET", "/v1/models"))[1]["error"]["message"]


def test_chat_template_without_jinja2(tmp_path: Path, jamba_onnx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without jinja2 the default template still renders; a model's own template is a clear error."""
    import shutil

    monkeypatch.setitem(sys.modules, "jinja2", None)
    assert isinstance(chat_template(jamba_onnx), PlainDefaultTemplate)
    copy = tmp_path / "model"
    shutil.copytree(jamba_onnx, copy)
    config_path = copy / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    config_path.write_text(json.dumps(config | {"chat_template": "{{ messages[0]['content'] }}"}))
    monkeypatch.setenv("HYBRIDRT_MODEL", str(copy))
    monkeypatch.setenv("HYBRIDRT_VERIFY", "none")
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    status, out = call(event("POST", "/v1/chat/completions", body))
    assert status == 500
    assert out["error"]["code"] == "chat_template_unavailable" and "jinja2" in out["error"]["message"]


RUNTIME_ONLY = """
import json, sys
for name in ("torch", "starlette", "uvicorn", "prometheus_client", "jinja2", "anyio", "transformers", "onnx"):
    sys.modules[name] = None  # any import of these now raises ImportError
from hybridrt.deploy.aws_lambda import handler
def event(method, path, body=None):
    ev = {"version": "2.0", "rawPath": path, "headers": {},
          "requestContext": {"http": {"method": method, "path": path}}}
    if body is not None:
        ev["body"] = json.dumps(body)
    return ev
assert handler(event("GET", "/health"))["statusCode"] == 200
out = handler(event("POST", "/v1/completions", {"model": "default", "prompt": "def", "max_tokens": 3}))
assert out["statusCode"] == 200, out
assert json.loads(out["body"])["usage"]["completion_tokens"] >= 1
msgs = [{"role": "user", "content": "hi"}]
out = handler(event("POST", "/v1/chat/completions", {"model": "default", "messages": msgs, "max_tokens": 3}))
assert out["statusCode"] == 200, out
blocked = ("torch", "starlette", "uvicorn", "prometheus_client", "jinja2", "anyio", "transformers", "onnx")
loaded = sorted(m for m in sys.modules if m.split(".")[0] in blocked and sys.modules[m] is not None)
assert not loaded, loaded
print("ok")
"""


def test_lambda_runs_runtime_only(jamba_onnx: Path) -> None:
    """The handler imports, loads at import and answers with torch and the serve extra unimportable."""
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("HYBRIDRT_")}
    env |= {"HYBRIDRT_MODEL": str(jamba_onnx), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    result = subprocess.run([sys.executable, "-c", RUNTIME_ONLY], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ok")


def test_package_layout(jamba_onnx: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`hybridrt package-lambda`'s layout, with the PyPI download replaced by nothing."""
    import zipfile

    from hybridrt.cli import main
    from hybridrt.deploy import lambda_package

    installed: list[str] = []
    monkeypatch.setattr(lambda_package, "install_dependencies", lambda target, python: installed.append(python))
    monkeypatch.setattr(lambda_package, "compile_bytecode", lambda build, python, exe, say: None)
    out = tmp_path / "out"
    assert main(["package-lambda", str(jamba_onnx), "-o", str(out)]) == 0
    assert installed == ["3.12"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the temporary directory was renamed
    names = set(zipfile.ZipFile(out / "lambda.zip").namelist())
    assert "hybridrt/deploy/aws_lambda.py" in names
    assert {f"model/{p.name}" for p in jamba_onnx.iterdir()} <= names
    assert not any("default-model" in n or "__pycache__" in n for n in names)
    docker = (out / "Dockerfile").read_text()
    assert "FROM public.ecr.aws/lambda/python:3.12" in docker
    assert 'CMD ["hybridrt.deploy.aws_lambda.handler"]' in docker
    [wheel] = out.glob("hybridrt-*.whl")
    assert wheel.name in docker
    assert sorted(p.name for p in (out / "model").iterdir()) == sorted(p.name for p in jamba_onnx.iterdir())
    sizes = json.loads((out / "sizes.json").read_text())
    assert sizes["zip_bytes"] == (out / "lambda.zip").stat().st_size and sizes["under_lambda_limit"]
    assert main(["package-lambda", str(jamba_onnx), "-o", str(out)]) == 2  # exists, no --force
    assert main(["package-lambda", str(jamba_onnx), "-o", str(out), "--force"]) == 0


def test_package_wheel_installs(tmp_path: Path) -> None:
    """The wheel that the container image installs: pip accepts it, with the console script and
    the runtime's base dependencies (no extras)."""
    from hybridrt.deploy.lambda_package import write_wheel

    wheel = write_wheel(tmp_path)
    target = tmp_path / "site"
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target", str(target)]
    result = subprocess.run([*cmd, str(wheel)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert (target / "hybridrt" / "deploy" / "aws_lambda.py").is_file()
    assert (target / "hybridrt" / "data" / "default-model").is_dir()
    [info] = target.glob("hybridrt-*.dist-info")
    assert "hybridrt = hybridrt.cli:main" in (info / "entry_points.txt").read_text()
    requires = [line for line in (info / "METADATA").read_text().splitlines() if line.startswith("Requires-Dist:")]
    base = [line.removeprefix("Requires-Dist: ") for line in requires if "extra ==" not in line]
    assert base == [r for r in importlib.metadata.requires("hybridrt") or [] if "extra ==" not in r]
    assert any(r.startswith("onnxruntime>=") for r in base) and not any(r.startswith("torch") for r in base)


class _Context:
    aws_request_id = "lambda-req-1"

    def __init__(self, remaining_ms: int) -> None:
        self.remaining_ms = remaining_ms

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


def test_each_invocation_logs_one_line_and_stops_before_its_deadline(
    model: Model, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    logging.getLogger("hybridrt.requests").addHandler(caplog.handler)  # the handler's own goes to stderr
    caplog.set_level(logging.INFO, logger="hybridrt.requests")
    # Greedy: sampled at the default temperature, the tiny model may end at its first token.
    ev = event("POST", "/v1/completions", GOOD | {"max_tokens": 3, "temperature": 0})
    ev["headers"]["x-request-id"] = "client-7"
    out = aws_lambda.handler(ev, _Context(60_000))
    assert out["statusCode"] == 200 and out["headers"]["x-request-id"] == "client-7"
    bad = aws_lambda.handler(event("POST", "/v1/completions", GOOD | {"top_p": 9}), _Context(60_000))
    assert bad["statusCode"] == 400 and bad["headers"]["x-request-id"] == "lambda-req-1"
    # 1.001 s left: the margin leaves a millisecond, so the generation stops after its first step.
    slow = aws_lambda.handler(event("POST", "/v1/completions", GOOD | {"max_tokens": 400}), _Context(1_001))
    assert slow["statusCode"] == 504 and json.loads(slow["body"])["error"]["code"] == "timeout"
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "hybridrt.requests"]
    assert [(x["request_id"], x["status"]) for x in lines] == [
        ("client-7", 200),
        ("lambda-req-1", 400),
        ("lambda-req-1", 504),
    ]
    assert lines[0]["model"] == "tiny" and lines[0]["completion_tokens"] == 3
    assert "top_p" in lines[1]["error"] and lines[2]["finish_reason"] == ["timeout"]
