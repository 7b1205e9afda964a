"""The page's vLLM tab in headless Chromium against real vLLM servers (Debian's chromium, vLLM's CPU build).

Starts the page with a vLLM tab, presses *Start vLLM servers* (baseline, prompt lookup, draft
model: about 75 s on a 2-core CPU, plus one warm-up request each), runs a short prompt with 32
new tokens and checks that every panel streams text, colours accepted tokens by source, shows
the statistics (tok/s, tau, alpha) and the lossless badge against vLLM's baseline; then that Stop
cancels a long run (and vLLM aborts the request). Nothing may show an error pill or a server
traceback. Saves a screenshot to ``artifacts/screenshots/vllm_tab.png``.

Skips without ``.venv-vllm`` (``scripts/setup.sh --vllm``) unless ``PLAYGROUND_REQUIRE_VLLM`` is
set, as ``tests/test_vllm_real.py`` does; skips without chromium or Playwright (fails under CI).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from playground.backends.vllm import client as C
from playground.engine import METHODS as ENGINE_METHODS

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/browser: the browser fixture
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared UI helpers
from test_page import browser  # noqa: E402,F401  (the module-scoped Chromium fixture)
from ui_fixtures import serve, ui_engine  # noqa: E402

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = ROOT / "artifacts" / "screenshots" / "vllm_tab.png"
METHODS = ("autoregressive", "prompt_lookup", "draft_model", "eagle")
PROMPT = "Repeat this list twice: apple, banana, cherry, date, elderberry, fig, grape."
# The default model loops on this one to the 1024-token cap (greedy, float32), so Stop lands
# mid-stream. A 256-token story and "Count from 1 to 1000" (EOS after 122 tokens) both finished on
# CI before the click arrived.
LONG_PROMPT = "Write the word 'go' 600 times, separated by spaces."
START_TIMEOUT_MS = 480_000  # four servers on a shared 2-core machine (they start in parallel)
RUN_TIMEOUT_MS = 180_000


from helpers import require_vllm as _require_vllm  # noqa: E402


@pytest.fixture(scope="module")
def vllm_page(browser, request):  # noqa: F811
    """The page with a vLLM tab (servers started by the test's click), and its session; stops the servers."""
    _require_vllm()
    from playground.ui.vllm_panel import VLLMSession

    session = VLLMSession()
    try:
        with serve(ui_engine(request), vllm=session) as url:
            yield url, session
    finally:
        session.stop()


def _no_error(page) -> None:
    from playwright.sync_api import expect

    expect(page.locator(".pill-error")).to_have_count(0)
    assert "Traceback" not in page.locator("body").inner_text()


def test_vllm_tab_runs_four_methods_and_stops(browser, vllm_page):  # noqa: F811
    """Start the servers, run 32 new tokens on four methods: text streams into each panel, tokens
    are coloured by source, stats and the lossless badge appear; Stop cancels a long run."""
    from playwright.sync_api import expect

    url, session = vllm_page
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(url)
        page.get_by_role("tab", name="vLLM").click()
        expect(page.locator("#vllm-start")).to_be_visible(timeout=60_000)
        for m in METHODS:  # by their page names, not their ids
            expect(page.locator("#vllm-methods")).to_contain_text(ENGINE_METHODS[m].label)
        expect(page.locator("#vllm-methods")).not_to_contain_text("prompt_lookup")
        page.get_by_text("Deploy these methods on vLLM servers of your own").click()  # the commands to run them yourself
        expect(page.locator("#vllm-deploy")).to_contain_text('"method":"eagle3"')
        expect(page.locator("#vllm-deploy")).to_contain_text("--vllm-url draft_model=http://gpu-host:8002")
        page.locator("#vllm-start").click()
        expect(page.locator("#vllm-status")).to_contain_text("starting vLLM servers", timeout=30_000)
        expect(page.locator("#vllm-status")).to_contain_text("servers ready", timeout=START_TIMEOUT_MS)
        assert session.warmed == set(METHODS)  # warmed up, so the first run's speedups are real
        _no_error(page)

        page.locator("#vllm-prompt textarea").fill(PROMPT)
        max_new = page.locator("#vllm-max-new input[type=number]")
        for _ in range(3):  # a loaded machine may re-render the field: fill until it sticks
            max_new.fill("32")
            max_new.press("Enter")
            try:
                expect(max_new).to_have_value("32", timeout=10_000)
                break
            except AssertionError:
                continue
        expect(max_new).to_have_value("32")

        page.locator("#vllm-run").click()
        # Streaming: the baseline's panel shows plain text before its coloured tokens arrive.
        expect(page.locator("#vllm-panel-autoregressive .placeholder")).to_have_count(0, timeout=RUN_TIMEOUT_MS)
        expect(page.locator("#vllm-status")).to_contain_text("done", timeout=RUN_TIMEOUT_MS)
        expect(page.locator("#vllm-status")).not_to_contain_text("servers ready")
        for m in METHODS:
            panel = page.locator(f"#vllm-panel-{m}")
            expect(panel.locator(".tok[data-source=target]").first).to_be_visible()
            assert panel.inner_text().strip()
        expect(page.locator("#vllm-panel-draft_model .tok[data-source=draft]").first).to_be_visible()
        expect(page.locator("#vllm-panel-eagle .tok[data-source=eagle_d1]").first).to_be_visible()  # by depth
        tab = page.locator("#tab-vllm")
        for m in METHODS:
            stats = tab.locator(f"#vllm-stats-{m}")
            for text in ("tok/s", "τ", "α"):
                expect(stats).to_contain_text(text)
        expect(tab.locator("#vllm-stats-autoregressive")).to_contain_text("(baseline)")
        for m in METHODS[1:]:
            expect(tab.locator(f"#vllm-stats-{m}")).to_contain_text("vs autoregressive")
            expect(tab.locator(f"#vllm-badge-{m}")).to_contain_text("vLLM's baseline")
            expect(tab.locator(f"#vllm-badge-{m}")).not_to_contain_text("first difference")
        _no_error(page)
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOT), full_page=True)

        # Stop: a long baseline-only run is cancelled mid-stream and vLLM aborts the request.
        for m in METHODS[1:]:
            page.locator("#vllm-methods").get_by_label(ENGINE_METHODS[m].label, exact=True).uncheck()
        page.locator("#vllm-prompt textarea").fill(LONG_PROMPT)
        max_new.fill("1024")
        max_new.press("Enter")
        expect(max_new).to_have_value("1024")
        expect(page.locator("#vllm-deploy")).not_to_contain_text("--port 8001")  # the unticks are shown
        # Scrolled to the end, as after reading the last run's panels: clearing them must not move Stop.
        page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight)")
        assert page.evaluate("window.scrollY") > 0
        expect(page.locator("#vllm-run")).to_be_in_viewport(ratio=1)
        stop_y = page.locator("#vllm-stop").bounding_box()["y"]
        page.locator("#vllm-run").click()
        expect(page.locator("#vllm-status")).to_contain_text("autoregressive on vLLM", timeout=RUN_TIMEOUT_MS)
        expect(page.locator("#vllm-panel-autoregressive .tokens")).to_contain_text("go", timeout=RUN_TIMEOUT_MS)
        # Clearing the last run's panels must not shrink the page: the page then scrolled up by what it
        # lost, Stop moved away from under the pointer, and the click missed it.
        assert page.locator("#vllm-stop").bounding_box()["y"] == pytest.approx(stop_y, abs=1)
        page.locator("#vllm-stop").click()
        expect(page.locator("#vllm-status")).to_contain_text("stopped", timeout=30_000)
        expect(page.locator("#vllm-run")).to_be_enabled()  # the run's last step: the row's height released
        assert page.evaluate('document.getElementById("vllm-panels").style.minHeight') == ""
        shown = page.locator("#vllm-panel-autoregressive").inner_text()
        e = session.endpoints["autoregressive"]
        deadline = time.monotonic() + 20
        while C.read_metrics(e.url).get("vllm:num_requests_running", 0) > 0:
            assert time.monotonic() < deadline, "the request kept running after Stop"
            time.sleep(0.5)
        assert page.locator("#vllm-panel-autoregressive").inner_text() == shown  # no more text after Stop
        _no_error(page)
    finally:
        page.close()
