"""`hybridrt serve` over real HTTP on 127.0.0.1, driven by the official openai client."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from serving import AUTH, client_of, metric, running, server_fixture, sse_data, wait_for

import hybridrt
from hybridrt.runtime.model import Model
from hybridrt.serve.chat import DEFAULT_CHAT_TEMPLATE, ChatTemplate
from hybridrt.serve.protocol import ApiError
from hybridrt.serve.server import Running

PROMPTS = ["import os\n", "def fibonacci(n):\n", "class Stack:\n    def push(self, x):\n", "#", "for i in range(10):"]


@pytest.fixture(scope="module")
def model(default_onnx: Path) -> Model:
    return hybridrt.load(default_onnx)


server = server_fixture("model", slots=3, chunk=4)


@pytest.fixture
def client(server: Running) -> openai.OpenAI:
    return client_of(server)


def _complete(client: openai.OpenAI, prompt: str | list[int], max_tokens: int, stream: bool) -> str:
    kwargs = dict(model="default", prompt=prompt, max_tokens=max_tokens, temperature=0)
    if not stream:
        return client.completions.create(**kwargs).choices[0].text  # type: ignore[call-overload]
    return "".join(c.choices[0].text for c in client.completions.create(stream=True, **kwargs))  # type: ignore[call-overload]


def test_concurrent_completions_equal_generate_alone(client: openai.OpenAI, model: Model) -> None:
    jobs = [(p, 6 + 5 * i, i % 2 == 1) for i, p in enumerate(PROMPTS * 2)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        texts = list(pool.map(lambda job: _complete(client, *job), jobs))
    for (prompt, k, _), text in zip(jobs, texts):
        assert text == model.generate(prompt, max_new_tokens=k)


def test_token_id_prompts_and_n(client: openai.OpenAI, model: Model) -> None:
    ids = [5, 77, 300, 12, 9]
    out = client.completions.create(model="default", prompt=[ids, ids[:2]], max_tokens=7, temperature=0, n=2)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    want = [model.tokenizer.decode(t) for t in model.generate([ids, ids[:2]], max_new_tokens=7)]
    assert [c.text for c in out.choices] == [want[0], want[0], want[1], want[1]]
    assert out.usage is not None and out.usage.prompt_tokens == 7 and out.usage.completion_tokens == 28


def test_chat_default_template_and_cached_turn(client: openai.OpenAI, model: Model) -> None:
    template = ChatTemplate.for_model(model.path)
    assert template.source == DEFAULT_CHAT_TEMPLATE  # the default model's tokenizer config has none
    messages = [{"role": "system", "content": "Write Python."}, {"role": "user", "content": "def add(a, b):"}]
    first = client.chat.completions.create(model="default", messages=messages, max_tokens=12, temperature=0)  # type: ignore[arg-type]
    prompt = template.render(messages)
    assert prompt == "<|system|>\nWrite Python.\n<|user|>\ndef add(a, b):\n<|assistant|>\n"
    reply = first.choices[0].message.content
    assert reply == model.generate(prompt, max_new_tokens=12)
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "def sub(a, b):"}]
    chunks = list(
        client.chat.completions.create(
            model="default",
            messages=messages,  # type: ignore[arg-type]
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == model.generate(template.render(messages), max_new_tokens=8)
    usage = chunks[-1].usage
    assert usage is not None and not chunks[-1].choices
    assert usage.prompt_tokens_details is not None
    # At least the first turn's prompt came from the prefix cache.
    assert usage.prompt_tokens_details.cached_tokens >= len(model.tokenizer.encode(prompt).ids)


def test_stop_strings_are_cut_from_the_text(client: openai.OpenAI, model: Model) -> None:
    free = model.generate(PROMPTS[1], max_new_tokens=30)
    stop = free[10:13]
    want = free[: free.index(stop)]
    for stream in (False, True):
        kwargs = dict(model="default", prompt=PROMPTS[1], max_tokens=30, temperature=0, stop=[stop, "\x00never"])
        if stream:
            chunks = list(client.completions.create(stream=True, **kwargs))  # type: ignore[call-overload]
            assert "".join(c.choices[0].text for c in chunks) == want
            assert chunks[-1].choices[0].finish_reason == "stop"
        else:
            out = client.completions.create(**kwargs)  # type: ignore[call-overload]
            assert out.choices[0].text == want and out.choices[0].finish_reason == "stop"


def test_load_tools_default_body_fixes_the_length_and_reports_usage_per_chunk(server: Running) -> None:
    """guidellm's default streaming request (vLLM's ignore_eos and continuous_usage_stats) was
    answered 400. Now every choice runs to max_tokens, and each chunk carries the usage so far."""
    body = {
        "model": "default",
        "prompt": "def main():",
        "max_tokens": 40,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    with httpx.stream("POST", server.url + "/v1/completions", json=body, headers=AUTH, timeout=60) as r:
        assert r.status_code == 200
        events = [json.loads(data) for data in sse_data(r) if data.startswith("{")]
    with_text = [e for e in events if e["choices"]]
    counts = [e["usage"]["completion_tokens"] for e in with_text]
    assert counts == sorted(counts) and counts[-1] == 40 and len(set(counts)) > 1
    assert all(e["usage"]["prompt_tokens"] == events[-1]["usage"]["prompt_tokens"] for e in with_text)
    assert with_text[-1]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["usage"]["completion_tokens"] == 40 and not events[-1]["choices"]
    bad = body | {"stream_options": {"include_usage": True, "other": 1}}
    r = httpx.post(server.url + "/v1/completions", json=bad, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options"


def test_models_and_api_key(server: Running, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == ["default"]
    wrong = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    for path in ("/v1/models", "/metrics"):
        r = httpx.get(server.url + path)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}


def test_a_server_s_numpy_arrays_get_plain_pages(server: Running) -> None:
    """build() turns numpy's transparent huge page advice off (serve.server.plain_pages: a new
    state buffer's first write otherwise stalls on memory compaction before a first token)."""
    from numpy._core import multiarray

    from hybridrt.serve.server import plain_pages

    assert multiarray._set_madvise_hugepage(False) is False  # (it returns the setting it replaces)
    multiarray._set_madvise_hugepage(True)
    assert plain_pages() and multiarray._set_madvise_hugepage(False) is False


def test_metrics(server: Running, client: openai.OpenAI) -> None:
    client.completions.create(model="default", prompt="import sys\n", max_tokens=5, temperature=0)
    text = httpx.get(server.url + "/metrics", headers=AUTH).text
    assert 'hybridrt_requests_total{route="/v1/completions",status="200"}' in text
    for name in ("hybridrt_time_to_first_token_seconds_count", "hybridrt_inter_token_seconds_count"):
        assert metric(server.url, name) > 0
    assert metric(server.url, "hybridrt_generated_tokens_total") >= 5
    assert metric(server.url, "hybridrt_prefix_cache_bytes") > 0
    assert metric(server.url, "hybridrt_slots") == 3


def test_health_is_503_while_loading(default_onnx: Path) -> None:
    release = threading.Event()

    def slow_load() -> Model:
        release.wait(30)
        return hybridrt.load(default_onnx)

    with running(slow_load, wait=False) as s:
        assert httpx.get(s.url + "/health").status_code == 503
        r = httpx.post(s.url + "/v1/completions", headers=AUTH, json={"model": "default", "prompt": "x"})
        assert r.status_code == 503 and "loading" in r.json()["error"]["message"]
        release.set()
        assert wait_for(lambda: httpx.get(s.url + "/health").status_code == 200, 60)


LONG = {"model": "default", "prompt": "import os\n", "max_tokens": 1500, "min_tokens": 1500, "stream": True}


def _read_one_line_and_leave(url: str) -> None:
    with httpx.stream("POST", url + "/v1/completions", headers=AUTH, json=LONG, timeout=60) as r:
        next(r.iter_lines())


def test_full_queue_gets_429_and_a_disconnect_frees_the_slot(model: Model) -> None:
    with running(model, slots=1, max_queue=1) as s:
        with httpx.stream("POST", s.url + "/v1/completions", headers=AUTH, json=LONG, timeout=60) as first:
            lines = first.iter_lines()  # kept: a dropped iterator closes the connection
            next(lines)  # running: it holds the only slot for seconds
            queued = threading.Thread(target=_read_one_line_and_leave, args=(s.url,))
            queued.start()
            assert wait_for(lambda: metric(s.url, "hybridrt_queue_depth") == 1)
            refused = httpx.post(s.url + "/v1/completions", headers=AUTH, json=LONG)
            assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
            assert refused.json()["error"]["type"] == "rate_limit_error"
            # Both clients leave after their first line: each slot is freed at once, not after
            # 1500 tokens (about 10 s on this model).
            lines.close()
        queued.join(10)
        assert not queued.is_alive()
        assert wait_for(lambda: metric(s.url, "hybridrt_busy_slots") == 0, 3)
        assert metric(s.url, "hybridrt_generated_tokens_total") < 1000


def test_request_timeout_is_504(model: Model) -> None:
    with running(model, request_timeout=0.3) as s:
        r = httpx.post(s.url + "/v1/completions", headers=AUTH, json=LONG | {"stream": False}, timeout=60)
        assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
        assert wait_for(lambda: metric(s.url, "hybridrt_busy_slots") == 0, 5)


def test_graceful_shutdown_lets_open_requests_finish(model: Model) -> None:
    body = LONG | {"max_tokens": 300, "min_tokens": 300, "stream": False}
    result: list[httpx.Response] = []
    with running(model) as s:
        t = threading.Thread(target=lambda: result.append(httpx.post(s.url + "/v1/completions", headers=AUTH,
                                                                     json=body, timeout=60)))  # fmt: skip
        t.start()
        assert wait_for(lambda: metric(s.url, "hybridrt_busy_slots") == 1)
    # running() has stopped the server: the open request was answered in full first.
    t.join(60)
    assert result and result[0].status_code == 200 and result[0].json()["usage"]["completion_tokens"] == 300
    assert not s.engine.thread.is_alive()


def test_chat_template_comes_from_the_tokenizer_config(tmp_path: Path) -> None:
    template = (
        "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tools') }}{% endif %}"
        "[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}"
    )
    config = {"bos_token": {"content": "<s>"}, "chat_template": template}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    chat = ChatTemplate.for_model(tmp_path)
    assert chat.render([{"role": "user", "content": "hi"}]) == "<s>[user] hi\n[assistant] "
    with pytest.raises(ApiError) as e:
        chat.render([{"role": "tool", "content": "x"}])
    assert e.value.status == 400 and "no tools" in e.value.message


def test_server_with_an_assistant_answers_as_without(jamba_onnx: Path, jamba_int4: Path) -> None:
    """`hybridrt serve --assistant`: a lone request decodes speculatively, same greedy text."""
    model = hybridrt.load(jamba_onnx)
    with running(model, assistant=hybridrt.load(jamba_int4), slots=2) as server:
        client = client_of(server)
        for stream in (False, True):
            text = _complete(client, "def fibonacci(n):\n", 24, stream)
            assert text == model.generate("def fibonacci(n):\n", max_new_tokens=24)
        assert metric(server.url, "hybridrt_speculative_drafted_tokens_total") > 0
        assert metric(server.url, "hybridrt_speculative_accepted_tokens_total") >= 0


def test_cached_states_survive_a_restart_and_a_template_file_renders_chats(default_onnx: Path, tmp_path: Path) -> None:
    """`serve --cache-dir DIR --chat-template FILE`: states stored by one server resume in the
    next one on the same directory (usage reports them as cached tokens), and chats render
    with the file's template, not the model's."""
    from hybridrt.serve.chat import read_template

    template = tmp_path / "chat.jinja"
    template.write_text(
        "{% for m in messages %}### {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}### assistant:{% endif %}"
    )
    source = read_template(template)
    model = hybridrt.load(default_onnx)
    prompt = "### user: What does a prefix cache keep?\n### assistant:"
    options = dict(cache_dir=str(tmp_path / "states"), cache_bytes=1, chat_template=source)
    with running(model, **options) as s:
        client = client_of(s)
        chat = client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "What does a prefix cache keep?"}], max_tokens=4
        )
        # The template's rendering is the prompt: its tokens, and the completion of that text.
        assert chat.usage.prompt_tokens == len(model.prompt_rows(prompt).rows[0])
        alone = client.completions.create(model="default", prompt=prompt, max_tokens=4, temperature=0)
        assert alone.usage.prompt_tokens_details.cached_tokens == chat.usage.prompt_tokens  # stored whole, on disk
        assert metric(s.url, "hybridrt_prefix_cache_disk_bytes") > 0
        assert metric(s.url, "hybridrt_prefix_cache_budget_bytes") == 1
        assert metric(s.url, "hybridrt_prefix_cache_checkpoints_total") >= 2
    with running(model, **options) as s:
        again = client_of(s).completions.create(model="default", prompt=prompt + " It", max_tokens=4, temperature=0)
        assert again.usage.prompt_tokens_details.cached_tokens == chat.usage.prompt_tokens
        assert again.choices[0].text == model.generate(prompt + " It", max_new_tokens=4)
        assert metric(s.url, "hybridrt_prefix_cache_disk_reads_total") >= 1


def test_a_chat_template_file_that_is_not_jinja_is_refused(tmp_path: Path) -> None:
    from hybridrt.errors import GenerationError
    from hybridrt.serve.chat import read_template

    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m['content'] }")
    with pytest.raises(GenerationError, match="not a valid Jinja template: line 1"):
        read_template(bad)
    with pytest.raises(GenerationError, match="cannot read the chat template"):
        read_template(tmp_path / "missing.jinja")
