"""The demo page in real headless Chromium (Playwright): fill a state, submit, read the bars.

Skips with a reason when Playwright or a Chromium binary is missing. The server runs uvicorn in a
thread on a free loopback port with a tiny random model.
"""

from __future__ import annotations

import contextlib
import os
import shutil

import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
playwright_sync = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")

CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not CHROMIUM, reason="no chromium binary (apt-get install -y chromium)")]
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


@contextlib.contextmanager
def chromium_page():
    """A page in a fresh headless Chromium (closed afterwards)."""
    with playwright_sync.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield browser.new_page()
        finally:
            browser.close()


@pytest.fixture(scope="module")
def server(tiny_llama, tiny_tokenizer):
    from noulengine import Engine
    from noulengine.serve.app import create_app
    from noulengine.serve.config import ServeConfig
    from tests.live_server import live_server

    with live_server(create_app(Engine.from_model(tiny_llama, tiny_tokenizer), ServeConfig(model_name="tiny"))) as url:
        yield url


def test_demo_page_renders_answers(server, tmp_path):
    from PIL import Image

    with chromium_page() as page:
        page.goto(server + "/")
        page.fill("#state", "Three failed logins from a new country, then a password reset.")
        page.click("#submit")
        page.wait_for_selector("#answers[data-done='1']", timeout=30_000)
        fields = page.eval_on_selector_all("#answers .answer", "els => els.map(e => e.dataset.field)")
        assert fields == ["flag", "topic", "risk"]
        labels = page.eval_on_selector_all("#answers .answer[data-field='topic'] .bar-row",
                                           "els => els.map(e => e.dataset.label)")
        assert labels == ["world", "business", "sports"]
        probs = [float(x) for x in page.eval_on_selector_all(
            "#answers .answer[data-field='topic'] .bar-row .p", "els => els.map(e => e.textContent)")]
        assert abs(sum(probs) - 1) < 0.01
        # the question cap comes from GET /v1/limits; score bars name their level texts
        assert "3 of at most 16 questions" in page.inner_text("#cap")
        names = page.eval_on_selector_all("#answers .answer[data-field='risk'] .bar-row .name",
                                          "els => els.map(e => e.textContent)")
        assert names == ["0 (none)", "1 (low)", "2 (high)"]
        # An attached image travels as base64; the text-only model answers with a clear 4xx.
        img = tmp_path / "red.png"
        Image.new("RGB", (8, 8), (255, 0, 0)).save(img)
        page.set_input_files("#images", str(img))
        page.click("#submit")
        page.wait_for_selector("#answers[data-done='error']", timeout=30_000)
        assert "400" in page.inner_text("#error") and "text-only" in page.inner_text("#error")


@pytest.fixture(scope="module")
def vlm_server():
    from noulengine import Engine
    from noulengine.serve.app import create_app
    from noulengine.serve.config import ServeConfig
    from tests.live_server import live_server
    from tests.vision_models import build

    model, processor, tokenizer = build("qwen2_vl")
    engine = Engine.from_model(model, tokenizer, processor=processor)
    with live_server(create_app(engine, ServeConfig(model_name="tiny-vlm"))) as url:
        yield url


def test_demo_page_uploads_an_image_to_a_vision_model(vlm_server, tmp_path):
    from PIL import Image

    with chromium_page() as page:
        page.goto(vlm_server + "/")
        page.fill("#state", "What is drawn?")
        img = tmp_path / "red.png"
        Image.new("RGB", (64, 64), (255, 0, 0)).save(img)
        page.set_input_files("#images", str(img))
        page.click("#submit")
        page.wait_for_selector("#answers[data-done='1']", timeout=30_000)
        probs = [float(x) for x in page.eval_on_selector_all(
            "#answers .answer[data-field='topic'] .bar-row .p", "els => els.map(e => e.textContent)")]
        assert abs(sum(probs) - 1) < 0.01
