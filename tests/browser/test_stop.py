"""Run and Stop in the real page (headless Chromium, default model): 20 Run/Stop cycles at random
moments, each ending "Stopped after N tokens", with every panel and badge marked stopped, Run
disabled while a run is in flight, and no error pill. Skipped when chromium or Playwright is missing.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_page import browser  # noqa: E402,F401 (the shared Chromium fixture)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ui_fixtures import serve, ui_engine  # noqa: E402

LONG_PROMPT = "Write a travel blog post about a week in Kyoto: temples, food, trains and people."
CYCLES = 20
METHODS = ("autoregressive", "prompt_lookup", "lookahead")


@pytest.fixture(scope="module")
def url(browser, request):  # noqa: F811
    with serve(ui_engine(request)) as u:
        yield u


@pytest.mark.real_model
def test_twenty_run_stop_cycles_each_end_stopped(browser, url):  # noqa: F811
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(url)
        prompt = page.locator("#prompt textarea")
        expect(prompt).to_be_visible(timeout=60_000)
        prompt.fill(LONG_PROMPT)
        for box in page.locator("[id^=use-] input[type=checkbox]").all():
            if box.is_enabled():
                box.uncheck()
        for m in METHODS:
            page.locator(f"#use-{m} input[type=checkbox]").check()
        page.get_by_text("Generation settings", exact=True).click()
        max_new = page.locator("#gen-max_new_tokens input[type=number]")
        max_new.fill("300")
        max_new.press("Enter")
        expect(max_new).to_have_value("300")

        run, stop, status = page.locator("#run"), page.locator("#stop"), page.locator("#status")
        expect(stop).to_be_disabled()  # nothing to stop yet
        rng = random.Random(20)
        for cycle in range(CYCLES):
            run.click()
            expect(run).to_be_disabled(timeout=10_000)  # no second run while one is in flight
            page.wait_for_timeout(rng.uniform(0, 2500))  # a random moment: queued, prefill or mid-stream
            stop.click()
            expect(status).to_contain_text("Stopped after", timeout=60_000)
            expect(run).to_be_enabled(timeout=30_000)
            expect(stop).to_be_disabled()
            text = {m: page.locator(f"#panel-{m}").inner_text() for m in METHODS}
            for m in METHODS:
                if "stopped before the first token" not in text[m]:  # a panel with text: its stats say so
                    expect(page.locator(f"#stats-{m}")).to_contain_text("stopped")
                if m != "autoregressive":
                    expect(page.locator(f"#badge-{m}")).to_contain_text("stopped")
            expect(page.locator(".pill-error")).to_have_count(0)
            page.wait_for_timeout(300)  # nothing arrives after the final update
            assert {m: page.locator(f"#panel-{m}").inner_text() for m in METHODS} == text, f"cycle {cycle}"
            assert "Traceback" not in page.locator("body").inner_text()
    finally:
        page.close()
