"""The web page in headless Chromium (Debian's chromium driven by Playwright) over a real server."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO, ServerThread
from tests.small_index import build_small_index, small_app


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def web_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    with ServerThread(small_app(build_small_index(tmp_path_factory))) as server:
        yield server


@pytest.fixture(scope="module")
def browser():  # a Playwright browser on Debian's chromium
    executable = _chromium()
    if executable is None:
        pytest.skip("no chromium on PATH: scripts/test.sh installs it with `apt-get install -y chromium`")
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=executable, headless=True, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


def test_page_and_static_files_are_served_without_a_cdn(web_server: ServerThread) -> None:
    page = httpx.get(web_server.url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'id="question"' in page.text and 'id="config"' in page.text
    assert "http://" not in page.text.replace("http://127", "") and "https://" not in page.text  # nothing external
    for asset in ("/static/app.js", "/static/app.css"):
        assert httpx.get(web_server.url + asset).status_code == 200


def test_ask_copy_and_validate_in_headless_chromium(web_server: ServerThread, browser, tmp_path: Path) -> None:
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=web_server.url)
    page = context.new_page()
    outside: list[str] = []
    page.on("request", lambda r: outside.append(r.url) if not r.url.startswith(web_server.url) else None)
    page.goto(web_server.url + "/")
    page.wait_for_function("document.getElementById('index-status').textContent.includes('deepspeed')")

    page.fill("#question", "How do I configure ZeRO stage 2 overlap_comm?")
    page.click("#ask-button")
    page.wait_for_selector("#result:not([hidden])", timeout=30_000)
    assert page.locator("#answer a.cite").count() >= 1
    first = page.locator("#passages li").first
    assert first.locator("a.where").get_attribute("href", timeout=5000).startswith("https://www.deepspeed.ai/tutorials/tiny/")
    snippets = page.locator(".snippet")
    assert snippets.count() >= 2
    assert snippets.first.get_attribute("data-status") == "checked"  # checked snippets come first (none ran here)
    head = snippets.first.locator(".head").inner_text()
    assert "checked statically against deepspeed" in head and "not run" in head

    snippets.first.locator("button.copy").click()
    page.wait_for_function("document.querySelector('.snippet button.copy').textContent === 'Copied'")
    copied = page.evaluate("navigator.clipboard.readText()")
    assert copied.strip() == snippets.first.locator("pre code").inner_text().strip()

    page.fill("#config", '{"train_batch_size": 8, "fp16": {"enabld": true}}')
    page.fill("#world-size", "1")
    page.click("#validate-button")
    page.wait_for_selector("#validation:not([hidden])", timeout=30_000)
    verdict = page.locator("#validation .verdict").inner_text()
    assert verdict.startswith("invalid")
    assert "/fp16/enabld" in page.locator("#validation .findings").inner_text()

    page.wait_for_timeout(1700)  # let the Copy button settle back before the picture
    shot = tmp_path / "web.png"
    page.screenshot(path=str(shot), full_page=True)
    saved = REPO / "var" / "screenshots"
    saved.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, saved / "web.png")
    assert shot.stat().st_size > 10_000
    assert outside == []  # no CDN, nothing fetched from elsewhere


def test_bad_question_shows_the_service_message(web_server: ServerThread, browser) -> None:
    page = browser.new_page()
    page.goto(web_server.url + "/")
    page.fill("#topic", "x" * 64)
    page.evaluate("document.getElementById('question').removeAttribute('maxlength')")
    page.fill("#question", "q" * 2500)
    page.click("#ask-button")
    page.wait_for_selector("#ask-error:not([hidden])", timeout=30_000)
    assert "question" in page.locator("#ask-error").inner_text()


def test_a_passage_part_from_another_section_opens_with_its_heading(web_server: ServerThread, browser) -> None:
    page = browser.new_page()
    page.goto(web_server.url + "/")
    text = "Stage 2 partitions gradients.\n\n### Stage 3\n\nIt also <b>partitions</b> parameters.\n\n```json\n{\"stage\": 3}\n```"
    html = page.evaluate("text => passageBody(text).innerHTML", text)
    assert html == ('<p>Stage 2 partitions gradients.</p><h4 class="part">Stage 3</h4>'
                    '<p>It also &lt;b&gt;partitions&lt;/b&gt; parameters.</p><pre><code>{"stage": 3}</code></pre>')


def test_plan_section_in_headless_chromium(web_server: ServerThread, browser) -> None:
    """The page's planner asks POST /plan (the same core as the CLI and MCP) and shows the choice, every
    candidate, the reasons with their docs links and the config; a bad field shows the service's message."""
    page = browser.new_page()
    page.goto(web_server.url + "/")
    page.fill("#plan-params", "13e9")
    page.fill("#plan-gpus", "1")
    page.fill("#plan-gpu-mem", "24")
    page.fill("#plan-gpu-kind", "a10")
    page.fill("#plan-lora", "0.01")
    page.click("#plan-button")
    page.wait_for_selector("#plan:not([hidden])", timeout=30_000)
    assert page.locator("#plan-choice").inner_text().startswith("plan: ZeRO stage 3, optimizer offload cpu, parameter offload cpu, bf16, lora")
    assert page.locator("#plan-candidates tbody tr").count() == 5
    assert page.locator("#plan-reasons a[href^='https://']").count() >= 3
    config = json.loads(page.locator("#plan-config").inner_text())
    assert config["zero_optimization"]["stage"] == 3 and config["bf16"] == {"enabled": True}
    assert "validated" in page.locator("#plan-validated").inner_text()
    page.fill("#plan-gpus", "0")
    page.evaluate("document.getElementById('plan-gpus').removeAttribute('min')")
    page.click("#plan-button")
    page.wait_for_selector("#plan-error:not([hidden])", timeout=30_000)
    assert page.locator("#plan-error").inner_text().startswith("gpus_per_node:")  # the field named, from the service
