"""Several models in one `hybridrt serve`, and routes between them, on a real server on 127.0.0.1:
each model answers with its own greedy tokens, a length route splits at its threshold, a split
route keeps each user on one variant, and /metrics and the response say which was chosen."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from serving import AUTH, KEY

import hybridrt
from hybridrt.errors import GenerationError, GraphError
from hybridrt.runtime.model import Model
from hybridrt.serve import EngineConfig, ServeConfig
from hybridrt.serve.routes import LengthRoute, SplitRoute, check_routes, parse_route
from hybridrt.serve.server import Running, build, start_in_thread

THRESHOLD = 12


@pytest.fixture(scope="module")
def models(llama_onnx: Path, jamba_onnx: Path) -> dict[str, Model]:
    return {"llama": hybridrt.load(llama_onnx), "jamba": hybridrt.load(jamba_onnx)}


@pytest.fixture(scope="module")
def server(models: dict[str, Model]) -> Iterator[Running]:
    routes = [LengthRoute("auto", "llama", "jamba", THRESHOLD), SplitRoute("ab", (("llama", 9.0), ("jamba", 1.0)))]
    engine, app = build(dict(models), EngineConfig(slots=2), ServeConfig(api_key=KEY), routes=routes)
    running = start_in_thread(engine, app)
    try:
        assert all(e.ready.wait(60) for e in app.state.engines.values())
        yield running
    finally:
        running.stop()


def _complete(url: str, model: str, prompt: list[int], **extra: object) -> httpx.Response:
    body = {"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0} | extra
    return httpx.post(url + "/v1/completions", headers=AUTH, json=body, timeout=60)


def _tokens(model: Model, text: str) -> list[int]:
    return model.tokenizer.encode(text).ids


def test_each_model_answers_with_its_own_tokens(server: Running, models: dict[str, Model]) -> None:
    # Each engine ran a warm-up step on its model before it said it was ready.
    engines = server.server.config.app.state.engines
    assert set(engines) == {"llama", "jamba"} and all(e.warmup_s and e.warmup_s > 0 for e in engines.values())
    prompt = [5, 6, 7, 8, 9]
    for name, model in models.items():
        r = _complete(server.url, name, prompt)
        assert r.status_code == 200 and r.json()["model"] == name
        assert r.json()["choices"][0]["text"] == model.tokenizer.decode(model.generate(prompt, max_new_tokens=8))
    assert models["llama"].generate(prompt, max_new_tokens=8) != models["jamba"].generate(prompt, max_new_tokens=8)
    listed = httpx.get(server.url + "/v1/models", headers=AUTH).json()["data"]
    assert [m["id"] for m in listed] == ["llama", "jamba", "auto", "ab"]
    unknown = _complete(server.url, "gpt-4", prompt)
    assert unknown.status_code == 404 and "'llama', 'jamba', 'auto', 'ab'" in unknown.json()["error"]["message"]


def test_a_length_route_splits_at_its_threshold(server: Running, models: dict[str, Model]) -> None:
    for tokens, want in ((THRESHOLD - 1, "llama"), (THRESHOLD, "jamba")):
        prompt = list(range(5, 5 + tokens))
        r = _complete(server.url, "auto", prompt)
        assert r.status_code == 200 and r.headers["x-hybridrt-route"] == f"auto={want}" and r.json()["model"] == want
        model = models[want]
        assert r.json()["choices"][0]["text"] == model.tokenizer.decode(model.generate(prompt, max_new_tokens=8))


def test_a_split_keeps_each_user_on_one_variant(server: Running) -> None:
    seen: dict[str, str] = {}
    for i in range(12):
        user = f"user-{i % 4}"
        r = _complete(server.url, "ab", [5, 6, 7], user=user, max_tokens=1)
        variant = r.headers["x-hybridrt-route"].split("=")[1]
        assert seen.setdefault(user, variant) == variant  # the same user, the same model
    via_header = httpx.post(
        server.url + "/v1/completions",
        headers=AUTH | {"X-Hybridrt-User": "user-1"},
        json={"model": "ab", "prompt": [5, 6, 7], "max_tokens": 1},
        timeout=60,
    )
    assert via_header.headers["x-hybridrt-route"] == f"ab={seen['user-1']}"
    text = httpx.get(server.url + "/metrics", headers=AUTH).text
    counted = sum(
        float(v) for v in re.findall(r'^hybridrt_route_requests_total\{route="ab",variant="\w+"\} (\S+)$', text, re.M)
    )
    assert counted == 13
    # Each engine's series carry their model's label beside the others'.
    assert re.search(r'^hybridrt_generated_tokens_total\{model="jamba"\} [1-9]', text, re.M)
    assert re.search(r'^hybridrt_generated_tokens_total\{model="llama"\} [1-9]', text, re.M)


def test_a_90_10_split_over_1000_users_is_within_binomial_bounds() -> None:
    route = SplitRoute("ab", (("int4", 90.0), ("int8", 10.0)))
    picks = [route.choose(f"user-{i}") for i in range(1000)]
    tens = picks.count("int8")
    sd = math.sqrt(1000 * 0.1 * 0.9)
    assert abs(tens - 100) < 4 * sd, tens  # 4 standard deviations: about 1 run in 15,000 outside
    assert all(route.choose(f"user-{i}") == picks[i] for i in range(1000))  # sticky
    anonymous = [route.choose(None, draw=lambda x=x: x / 100) for x in range(100)]
    assert anonymous.count("int8") == 10  # without a user: a weighted draw


def test_route_specs_are_checked() -> None:
    assert parse_route("auto=length:a,b,1024") == LengthRoute("auto", "a", "b", 1024)
    assert parse_route("ab=split:a:90,b:10") == SplitRoute("ab", (("a", 90.0), ("b", 10.0)))
    for bad in ("auto", "auto=length:a,b", "auto=length:a,b,0", "ab=split:a:90", "ab=split:a:0,b:1", "x=other:a"):
        with pytest.raises(GenerationError, match="route"):
            parse_route(bad)
    with pytest.raises(GenerationError, match="not a served model"):
        check_routes([parse_route("auto=length:a,c,8")], ["a", "b"])
    with pytest.raises(GenerationError, match="unique"):
        check_routes([parse_route("a=split:a:1,b:1")], ["a", "b"])


def test_models_that_do_not_fit_are_refused_before_loading(llama_onnx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hybridrt.commands import serve as command

    monkeypatch.setattr("hybridrt.runtime.prefix_cache.available_memory", lambda: 1000)
    with pytest.raises(GraphError, match="serve fewer or smaller"):
        command.plan_memory({"a": llama_onnx, "b": llama_onnx}, None)
    monkeypatch.setattr("hybridrt.runtime.prefix_cache.available_memory", lambda: 10**9)
    budget = command.plan_memory({"a": llama_onnx, "b": llama_onnx}, None)
    assert 0 < budget < 10**9 // 4 // 2 + 1  # a quarter of what is left, shared by the two


CLI = """
import json, signal, sys, threading, time, urllib.request
from hybridrt.cli import main

def client():
    url = f"http://127.0.0.1:{sys.argv[3]}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(url + "/health").status == 200:
                break
        except OSError:
            time.sleep(0.1)
    body = json.dumps({"model": "auto", "prompt": [5, 6, 7], "max_tokens": 2, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Authorization": "Bearer k", "X-Request-ID": "cli-1"})
    reply = urllib.request.urlopen(req)
    print(reply.headers["X-Hybridrt-Route"], json.load(reply)["model"], flush=True)
    signal.raise_signal(signal.SIGTERM)

threading.Thread(target=client, daemon=True).start()
main(["serve", f"small={sys.argv[1]}", f"big={sys.argv[2]}", "--route", "auto=length:small,big,64",
      "--port", sys.argv[3], "--api-key", "k", "--log-level", "warning", "--log-file", sys.argv[4]])
"""


def test_the_command_line_serves_several_models_and_routes(llama_onnx: Path, jamba_onnx: Path, tmp_path: Path) -> None:
    import json
    import signal
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "requests.log"
    cmd = [sys.executable, "-c", CLI, str(llama_onnx), str(jamba_onnx), str(port), str(log)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode in (0, -signal.SIGTERM), result.stderr
    assert result.stdout.split() == ["auto=small", "small"], result.stderr
    [line] = [json.loads(x) for x in log.read_text().splitlines() if '"cli-1"' in x]
    assert line["route"] == "auto" and line["variant"] == "small" and line["model"] == "small"
