"""The chat page at `/`: served without the key, and driven in a real headless Chromium
(Playwright over the system's chromium) against a real server on 127.0.0.1 that requires one.

The browser tests skip only where no chromium or no Playwright is installed; set
HYBRIDRT_SCREENSHOT=PATH to keep a screenshot of the page after a reply.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from serving import KEY, metric, running, server_fixture, wait_for

import hybridrt
from hybridrt.serve.server import Running

server = server_fixture("default_onnx", slots=2)


def test_page_and_assets_are_public_and_self_contained(server: Running) -> None:
    page = httpx.get(server.url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    for asset, kind in (("/static/chat.js", "text/javascript"), ("/static/chat.css", "text/css")):
        r = httpx.get(server.url + asset)
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind)
        assert "http://" not in r.text and "https://" not in r.text  # no CDN, no external font
    assert httpx.get(server.url + "/v1/models").status_code == 401  # the API still wants the key


def _chromium() -> str:
    path = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("no chromium installed (apt-get install chromium)")
    return path


@pytest.fixture
def page(server: Running) -> Iterator[tuple[Any, list[str]]]:
    """A fresh browser page on the chat page, its API key set, and the console errors it logs
    from its first load on."""
    path = _chromium()
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=path, args=["--no-sandbox"])
        try:
            tab = browser.new_page(viewport={"width": 900, "height": 640})
            errors: list[str] = []
            api_calls: list[str] = []
            tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            tab.on("pageerror", lambda e: errors.append(str(e)))
            tab.on("request", lambda r: api_calls.append(r.url) if "/v1/" in r.url else None)
            tab.goto(server.url + "/")
            expect(tab.locator("#model")).to_have_text("Set the API key in Settings.")
            # Regression: the keyless page used to call /v1/models, whose 401 the browser logged
            # as an error at a time of its choosing (a flaky `errors == []` below). The page
            # knows the server wants a key and calls nothing until it has one.
            assert api_calls == [] and errors == []
            tab.fill("#api-key", KEY)
            tab.dispatch_event("#api-key", "change")
            expect(tab.locator("#model")).to_have_text("Model: default")
            yield tab, errors
        finally:
            browser.close()


def test_page_without_a_key_sends_nothing(page: tuple[Any, list[str]], server: Running) -> None:
    """A prompt sent before the key is set is held with a hint, not sent to be refused."""
    from playwright.sync_api import expect

    tab, errors = page
    tab.fill("#api-key", "")
    tab.dispatch_event("#api-key", "change")
    expect(tab.locator("#model")).to_have_text("Set the API key in Settings.")
    calls: list[str] = []
    tab.on("request", lambda r: calls.append(r.url) if "/v1/" in r.url else None)
    tab.fill("#prompt", "Hello?")
    tab.press("#prompt", "Enter")
    expect(tab.locator("#status")).to_have_text("Set the API key in Settings.")
    assert calls == [] and tab.locator(".msg").count() == 0 and errors == []


def test_page_of_a_keyless_server_needs_no_key(default_onnx: Path) -> None:
    """Served without --api-key, the page names the model at once, with no key set."""
    path = _chromium()
    from playwright.sync_api import expect, sync_playwright

    with running(hybridrt.load(default_onnx), api_key=None) as s, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=path, args=["--no-sandbox"])
        try:
            tab = browser.new_page()
            errors: list[str] = []
            tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            tab.goto(s.url + "/")
            expect(tab.locator("#model")).to_have_text("Model: default")
            assert errors == []
        finally:
            browser.close()


def test_chat_page_streams_a_reply_with_its_speed(page: tuple[Any, list[str]], server: Running) -> None:
    from playwright.sync_api import expect

    tab, errors = page
    tab.fill("#max-tokens", "48")
    tab.fill("#temperature", "0")
    tab.fill("#prompt", "Write a Python function that adds two numbers.")
    tab.press("#prompt", "Enter")
    reply = tab.locator(".msg.assistant").last
    expect(reply.locator(".content")).to_have_text(re.compile(r"\S"))  # streamed text, before the end
    expect(reply).not_to_have_attribute("aria-busy", "true", timeout=60_000)
    stats = reply.locator(".stats").inner_text()
    assert "48 tokens" in stats and " tok/s" in stats and "– tok/s" not in stats and "first token" in stats
    assert tab.locator(".msg.user").last.inner_text().endswith("Write a Python function that adds two numbers.")
    # A second turn carries the first: the server sees the whole conversation.
    tab.fill("#prompt", "Now subtract them.")
    tab.click("#send")
    expect(tab.locator(".msg.assistant .stats")).to_have_count(2)
    expect(tab.locator(".msg.assistant").nth(1)).not_to_have_attribute("aria-busy", "true", timeout=60_000)
    assert tab.locator(".msg.assistant .content").nth(1).inner_text()
    assert errors == []
    if shot := os.environ.get("HYBRIDRT_SCREENSHOT"):
        tab.screenshot(path=shot, full_page=True)


def test_chat_page_stop_frees_the_slot(page: tuple[Any, list[str]], server: Running) -> None:
    from playwright.sync_api import expect

    tab, errors = page

    def long_reply(route: Any) -> None:  # the model may end a reply early: hold it to 1,500 tokens
        body = json.loads(route.request.post_data or "{}")
        route.continue_(post_data=json.dumps(body | {"min_tokens": 1500}))

    tab.route("**/v1/chat/completions", long_reply)
    tab.fill("#max-tokens", "1500")
    tab.fill("#prompt", "Count to a thousand.")
    tab.click("#send")
    expect(tab.locator(".msg.assistant .content")).to_have_text(re.compile(r"\S"))
    assert metric(server.url, "hybridrt_busy_slots") == 1
    tab.click("#stop")
    expect(tab.locator(".msg.assistant .stats")).to_have_text(re.compile("stopped$"))
    assert wait_for(lambda: metric(server.url, "hybridrt_busy_slots") == 0, 5)
    assert tab.is_enabled("#send") and not tab.is_enabled("#stop")
    assert errors == []
