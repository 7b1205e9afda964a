"""Run, Stop and typed values in the real page (headless Chromium, default model): 20 Run/Stop cycles at random
moments, each ending "Stopped after N tokens", with every panel and badge marked stopped, Run
disabled while a run is in flight, and no error pill. Skipped when chromium or Playwright is missing.
"""

from __future__ import annotations

import random
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_page import browser, prepare_run  # noqa: E402,F401 (the shared Chromium fixture)

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
        prepare_run(page, url, LONG_PROMPT, METHODS, "300")

        run, stop, status = page.locator("#run"), page.locator("#stop"), page.locator("#status")
        expect(stop).to_be_disabled()  # nothing to stop yet
        rng = random.Random(20)
        for cycle in range(CYCLES):
            run.click()
            expect(run).to_be_disabled(timeout=10_000)  # no second run while one is in flight
            if cycle == 0:  # nor other methods: the ticks are locked until the run ends
                for m in METHODS:
                    expect(page.locator(f"#use-{m} input[type=checkbox]")).to_be_disabled()
            page.wait_for_timeout(rng.uniform(0, 2500))  # a random moment: queued, prefill or mid-stream
            stop.click()
            # Stop answers at once, even while the first run still times this device's step-cost
            # curve for the budget (a minute or more on a slow 2-core CPU; it finishes in the background).
            expect(status).to_contain_text("Stopped after", timeout=30_000)
            expect(run).to_be_enabled(timeout=30_000)
            expect(stop).to_be_disabled()
            if cycle == 0:
                for m in METHODS:
                    expect(page.locator(f"#use-{m} input[type=checkbox]")).to_be_enabled()
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


def _toasts(page) -> str:
    return "\n".join(page.locator(".toast-body").all_inner_texts())


@pytest.mark.real_model
def test_typed_values_are_corrected_once_with_a_message_and_bad_options_are_not_offered(browser, url):  # noqa: F811
    """One rule: out of range is clamped and the message says "clamped to"; a fraction for a
    whole number is rounded and the message says "rounded to"; a box emptied keeps its value; the
    run uses what the field shows.
    The draft model's Medusa-heads proposer is not offered without draft heads (a broken Medusa
    tree's message: tests/test_medusa_ui.py)."""
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(url)
        expect(page.locator("#prompt textarea")).to_be_visible(timeout=60_000)
        page.locator("#prompt textarea").fill("Say hello.")
        # The generation settings come first in the method list, in view, not at its foot below every method.
        gen_box, first = page.locator("#gen-settings").bounding_box(), page.locator("#use-autoregressive").bounding_box()
        assert gen_box["y"] < first["y"] and gen_box["y"] < page.locator("#method-list").bounding_box()["y"] + 80
        page.get_by_text("Generation settings", exact=True).click()
        max_new = page.locator("#gen-max_new_tokens input[type=number]")
        clamped = "Max new tokens: allowed values are 1 to 2048 (whole numbers); 5000 is clamped to 2048."
        for attempt in range(3):  # a page just shown may not listen yet (a loaded CI machine): type again
            max_new.fill("64")
            max_new.fill("5000")
            try:
                expect(page.locator(".toast-body", has_text=clamped).last).to_be_visible(timeout=15_000)
                break
            except AssertionError:
                if attempt == 2:
                    raise
        page.locator("#prompt textarea").click()  # leaving the field: it shows what will run
        expect(max_new).to_have_value("2048")
        max_new.fill("12.5")
        expect(max_new).to_have_value("12", timeout=20_000)
        assert "12.5 is rounded to 12." in _toasts(page)
        # A box emptied and left keeps its value (Gradio alone would clamp nothing to the minimum, 1).
        for box, kept in ((max_new, "12"), (page.locator("#gen-top_p input[type=number]"), "1")):
            box.fill("")
            page.locator("#prompt textarea").click()
            expect(box).to_have_value(kept)
        page.wait_for_timeout(1000)
        expect(max_new).to_have_value("12")
        seed = page.locator("#gen-seed input")
        seed.fill("1.5")
        page.locator("#prompt textarea").click()
        expect(seed).to_have_value("2", timeout=20_000)
        assert "Seed" in _toasts(page) and "1.5 is rounded to 2." in _toasts(page)

        # The run uses what the fields show: 12 new tokens.
        for box in page.locator("[id^=use-] input[type=checkbox]").all():
            if box.is_enabled():
                box.uncheck()
        page.locator("#use-autoregressive input[type=checkbox]").check()
        page.locator("#run").click()
        expect(page.locator("#status")).to_contain_text("Done", timeout=120_000)
        expect(page.locator("#stats-autoregressive")).to_contain_text("12 new tokens", timeout=30_000)  # renders after

        # No proposer that needs draft heads when none are loaded.
        page.get_by_text("Draft model settings", exact=True).click()
        proposer = page.locator("#draft_model-proposer")
        expect(proposer).to_be_visible()
        choices = page.evaluate("() => window.gradio_config.components.find("
                                "c => c.props.elem_id === 'draft_model-proposer').props.choices")
        assert [c[1] if isinstance(c, list) else c for c in choices] == ["model"]
    finally:
        page.close()


@pytest.mark.real_model
def test_a_long_prompt_shows_which_method_reads_it(browser, url):  # noqa: F811
    """A prompt of a few thousand tokens: while the methods prefill it in turn, the status says so
    ("Reading the prompt (N tokens) for <method>: method i of n…"), then the run goes on."""
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        passage = " ".join(f"Station {i} lies on the river, {i * 3} km from the sea." for i in range(220))
        prepare_run(page, url, passage + "\nWhich station is 30 km from the sea?", METHODS, "4")
        page.locator("#run").click()
        expect(page.locator("#status")).to_contain_text(
            re.compile(r"Reading the prompt \([\d,]+ tokens\) for [A-Z][a-z ]+: method [123] of 3…"), timeout=120_000)
        expect(page.locator("#status")).to_contain_text("Done", timeout=240_000)
    finally:
        page.close()
