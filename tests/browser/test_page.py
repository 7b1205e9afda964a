"""The real page in headless Chromium (Playwright, Debian's /usr/bin/chromium), on the default model.

Types a prompt, ticks two methods, runs, and waits until both panels show tokens coloured
by source, the lossless badge and the chart; saves a screenshot to
``artifacts/screenshots/playground.png``. Skipped when chromium or Playwright is missing.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from helpers import skip_unless_ci

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared UI helpers
from ui_fixtures import serve, ui_engine  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = ROOT / "artifacts" / "screenshots" / "playground.png"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-quic", "--disable-sync"]
BROKEN_WORDS_JS = """els => els.flatMap(el => {
    const out = [];
    for (const node of el.childNodes) {
        if (node.nodeType !== Node.TEXT_NODE) continue;
        for (const m of node.textContent.matchAll(/\\S+/g)) {
            const r = document.createRange();
            r.setStart(node, m.index);
            r.setEnd(node, m.index + m[0].length);
            if (r.getClientRects().length > 1) out.push(m[0]);
        }
    }
    return out;
})"""
"""Words of the matched elements' text that the browser laid out across two lines or more."""
PROMPT = "Repeat this sentence three times: The quick brown fox jumps over the lazy dog near the river bank."
RUN_TIMEOUT_MS = 240_000  # a 2-core machine shared with other jobs can be slow; never a sleep


def prepare_run(page, url: str, prompt: str, methods, max_new_tokens: str) -> None:
    """Open the page, type ``prompt``, tick only ``methods`` and set the most new tokens (opening the
    generation settings, left open); the caller presses Run."""
    from playwright.sync_api import expect

    page.goto(url)
    expect(page.locator("#prompt textarea")).to_be_visible(timeout=60_000)
    page.locator("#prompt textarea").fill(prompt)
    for box in page.locator("[id^=use-] input[type=checkbox]").all():
        if box.is_enabled() and box.is_checked():
            box.uncheck()
    for m in methods:
        page.locator(f"#use-{m} input[type=checkbox]").check()
    page.get_by_text("Generation settings", exact=True).click()
    set_number(page, "gen-max_new_tokens", max_new_tokens)


def set_number(page, elem_id: str, value: str) -> None:
    """Type ``value`` into the number field ``#elem_id`` and wait until the page keeps it."""
    from playwright.sync_api import expect

    box = page.locator(f"#{elem_id} input[type=number]")
    for _ in range(3):  # on a loaded machine the page may still re-render the field: fill until it sticks
        box.fill(value)
        box.press("Enter")
        try:
            expect(box).to_have_value(value, timeout=10_000)
            return
        except AssertionError:
            continue
    expect(box).to_have_value(value)


@pytest.fixture(scope="module")
def browser():
    chromium = shutil.which("chromium")
    if chromium is None:
        skip_unless_ci("chromium is not installed (apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def url(browser, request):
    with serve(ui_engine(request)) as u:
        yield u


@pytest.mark.real_model
def test_run_two_methods_in_the_page(browser, url):
    """Empty prompt: a message. Then prompt, two ticked methods, Run: both panels fill with tokens
    coloured by source, the stats lines, the lossless badge and both charts appear."""
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(url)
        prompt = page.locator("#prompt textarea")
        expect(prompt).to_be_visible(timeout=60_000)
        expect(page.locator("#header")).to_contain_text("SmolLM2-135M-Instruct")
        # The draft model is not loaded: its checkbox is disabled and the page says why.
        expect(page.locator("#use-draft_model input[type=checkbox]")).to_be_disabled()
        expect(page.locator("#reason-draft_model")).to_contain_text("no draft model is loaded")
        expect(page.locator("#col-draft_model")).to_be_hidden()

        # Bad input shows a message on the page (and the page keeps working: the run below).
        page.locator("#run").click()
        expect(page.locator("#status")).to_contain_text("the prompt is empty", timeout=30_000)

        prompt.fill(PROMPT)
        # Tick the two methods (untick first to see the panel follow the checkbox).
        lookup = page.locator("#use-prompt_lookup input[type=checkbox]")
        lookup.uncheck()
        expect(page.locator("#col-prompt_lookup")).to_be_hidden()
        lookup.check()
        page.locator("#use-autoregressive input[type=checkbox]").check()
        expect(page.locator("#col-prompt_lookup")).to_be_visible()
        expect(page.locator("#col-autoregressive")).to_be_visible()
        # A short run: 24 new tokens.
        page.get_by_text("Generation settings", exact=True).click()
        max_new = page.locator("#gen-max_new_tokens input[type=number]")
        expect(max_new).to_be_visible()
        for _ in range(3):  # on a loaded machine the page may still re-render the field: fill until it sticks
            max_new.fill("24")
            max_new.press("Enter")
            try:
                expect(max_new).to_have_value("24", timeout=10_000)
                break
            except AssertionError:
                continue
        expect(max_new).to_have_value("24")
        page.get_by_text("Generation settings", exact=True).click()  # fold it again for the screenshot
        expect(max_new).to_be_hidden()

        page.locator("#run").click()
        expect(page.locator("#status")).to_contain_text("Done", timeout=RUN_TIMEOUT_MS)

        for m in ("autoregressive", "prompt_lookup"):
            expect(page.locator(f"#panel-{m} .tok[data-source=target]").first).to_be_visible()
            expect(page.locator(f"#stats-{m}")).to_contain_text("tok/s")
        expect(page.locator("#panel-prompt_lookup .tok[data-source=prompt_lookup]").first).to_be_visible()
        expect(page.locator("#badge-prompt_lookup")).to_contain_text("matches the baseline token for token")
        expect(page.locator("#legend")).to_contain_text("prompt lookup")
        expect(page.locator("#chart .js-plotly-plot").first).to_be_visible(timeout=30_000)
        expect(page.locator("#bars .js-plotly-plot").first).to_be_visible(timeout=30_000)

        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOT), full_page=True)
    finally:
        page.close()


SHOTS = ROOT / "artifacts" / "screenshots"


@pytest.mark.real_model
def test_insight_tabs_and_a_tiny_benchmark(browser, url):
    """A short run fills the per-run charts; the Theory tab measures this device and draws its chart;
    the Advisor applies its advice to the Playground tab; the Benchmark tab runs 1 question x 8 new
    tokens (autoregressive + prompt lookup) and shows the leaderboard, charts, downloads and the
    published reference table. Screenshots of each go to artifacts/screenshots/."""
    from playwright.sync_api import expect

    SHOTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(url)
        expect(page.locator("#prompt textarea")).to_be_visible(timeout=60_000)
        # Lookahead's settings show the tokens per forward pass next to W/N/G.
        page.get_by_text("Lookahead settings", exact=True).click()
        expect(page.locator("#lookahead-pass")).to_contain_text("Tokens per forward pass")
        page.get_by_text("Lookahead settings", exact=True).click()

        # 1. A short run fills the per-run charts under the panels.
        page.locator("#prompt textarea").fill(PROMPT)
        for m in ("draft_model", "lookahead", "medusa"):
            box = page.locator(f"#use-{m} input[type=checkbox]")
            if box.count() and box.is_enabled() and box.is_checked():
                box.uncheck()
        page.locator("#use-autoregressive input[type=checkbox]").check()
        page.locator("#use-prompt_lookup input[type=checkbox]").check()
        page.get_by_text("Generation settings", exact=True).click()
        max_new = page.locator("#gen-max_new_tokens input[type=number]")
        max_new.fill("16")
        max_new.press("Enter")
        page.get_by_text("Generation settings", exact=True).click()
        page.locator("#run").click()
        expect(page.locator("#status")).to_contain_text("Done", timeout=RUN_TIMEOUT_MS)
        for chart in ("steps-chart", "steps-hist", "position-chart", "split-chart"):
            expect(page.locator(f"#{chart} .js-plotly-plot").first).to_be_visible(timeout=30_000)
        expect(page.locator("#steps-chart")).to_contain_text("Prompt lookup", timeout=30_000)
        page.locator("#steps-chart").scroll_into_view_if_needed()
        page.screenshot(path=str(SHOTS / "run_insight_charts.png"), full_page=True)

        # 2. Theory: the verify cost is measured on first opening; the optimal K is shown.
        page.get_by_role("tab", name="Theory").click()
        expect(page.locator("#theory-summary")).to_contain_text("measured on this device", timeout=RUN_TIMEOUT_MS)
        expect(page.locator("#theory-summary")).to_contain_text("Optimal K")
        expect(page.locator("#theory-chart .js-plotly-plot").first).to_be_visible()
        expect(page.locator("#theory-chart")).to_contain_text("measured: Prompt lookup", timeout=30_000)
        page.screenshot(path=str(SHOTS / "theory.png"), full_page=True)

        # 3. Advisor: its advice (with reasons) is applied to the Playground tab.
        page.get_by_role("tab", name="Advisor").click()
        expect(page.locator("#advisor-output")).to_contain_text("Recommended")
        expect(page.locator("#advisor-output")).to_contain_text("What the measurements say")
        page.locator("#advisor-apply").click()
        expect(page.locator("#advisor-applied")).to_contain_text("Applied to the Playground tab")
        page.screenshot(path=str(SHOTS / "advisor.png"), full_page=True)

        # 4. Benchmark: 1 question (writing), 8 new tokens, autoregressive + prompt lookup, no warm-up.
        page.get_by_role("tab", name="Benchmark").click()
        for group, keep in (("bench-categories", "Writing"), ("bench-methods", "Prompt lookup")):
            boxes = page.locator(f"#{group} input[type=checkbox]")
            for i in range(boxes.count()):
                boxes.nth(i).set_checked(False)
            page.locator(f"#{group}").get_by_label(keep, exact=True).check()
        for elem, value in (("bench-per-category", "1"), ("bench-max-new-tokens", "8")):
            box = page.locator(f"#{elem} input[type=number]")
            box.fill(value)
            box.press("Enter")
            expect(box).to_have_value(value)
        page.locator("#bench-warmup input[type=checkbox]").uncheck()
        page.locator("#bench-run").click()
        expect(page.locator("#bench-status")).to_contain_text("Done", timeout=RUN_TIMEOUT_MS)
        expect(page.locator("#bench-table")).to_contain_text("Prompt lookup")
        expect(page.locator("#bench-detail")).to_contain_text("Overall")
        expect(page.locator("#bench-progress")).to_contain_text("100%")
        expect(page.locator("#bench-speedup .js-plotly-plot").first).to_be_visible()
        expect(page.locator("#bench-tau .js-plotly-plot").first).to_be_visible()
        expect(page.locator("#bench-jsonl")).to_contain_text(".jsonl")  # the file itself: results.jsonl
        expect(page.locator("#bench-csv")).to_contain_text(".csv")
        page.get_by_text("Published Spec-Bench leaderboard: measured elsewhere on other hardware").click()
        expect(page.locator("#bench-reference")).to_contain_text("EAGLE2")
        # Headers wrap between words, never inside one ("Summariz / ation": Gradio sized columns by their cells).
        for table in ("#bench-reference-table", "#bench-table", "#bench-detail"):
            broken = page.locator(f"{table} th span.header").evaluate_all(BROKEN_WORDS_JS)
            assert not broken, f"{table}: words broken across lines in the headers: {broken}"
        page.screenshot(path=str(SHOTS / "benchmark.png"), full_page=True)
        page.locator("#bench-speedup").screenshot(path=str(SHOTS / "benchmark_speedup_chart.png"))
    finally:
        page.close()
