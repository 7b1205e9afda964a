"""After a new user's try (issue 20): the page at 1400×900 in headless Chromium (Debian's chromium), on the
default model.

One short run (autoregressive and prompt lookup, 12 new tokens), then: the method panels start within the
first screen; each stats line keeps "τ" with its value; clicking a token scrolls the step inspector into
view; the legend lists only what the loaded models can produce; the guide explains the drafters' counts;
top-p 0 is corrected with one message. Saves ``artifacts/screenshots/polish_first_screen.png``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_page import ROOT, RUN_TIMEOUT_MS, browser, prepare_run  # noqa: E402,F401  (the shared fixtures)
from ui_fixtures import serve, ui_engine  # noqa: E402

SHOT = ROOT / "artifacts" / "screenshots" / "polish_first_screen.png"
WIDTH, HEIGHT = 1400, 900
METHODS_RUN = ("autoregressive", "prompt_lookup")
PROMPT = "Repeat this sentence twice: The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def served(request):
    """``(url, engine)``: the page of the tests' default engine."""
    engine = ui_engine(request)
    with serve(engine) as u:
        yield u, engine


@pytest.fixture(scope="module")
def ran(browser, served):  # noqa: F811
    """A page at 1400×900 after one finished run of two methods (12 new tokens)."""
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
    prepare_run(page, served[0], PROMPT, METHODS_RUN, "12")
    page.get_by_text("Generation settings", exact=True).click()
    page.evaluate("() => window.scrollTo(0, 0)")
    page.locator("#run").click()
    expect(page.locator("#status")).to_contain_text("Done", timeout=RUN_TIMEOUT_MS)
    try:
        yield page
    finally:
        page.close()


@pytest.mark.real_model
def test_panels_start_on_the_first_screen(ran):
    """After Run, at 1400×900 and scrolled to the top, the method panels begin within the first screen
    (the method list scrolls inside a capped box instead of pushing them down)."""
    ran.evaluate("() => window.scrollTo(0, 0)")
    top = ran.locator("#method-panels").bounding_box()["y"]
    SHOT.parent.mkdir(parents=True, exist_ok=True)
    ran.screenshot(path=str(SHOT))
    assert top < HEIGHT - 150, f"the panels start at y={top:.0f}, below a {HEIGHT}px screen"
    box = ran.locator("#method-list").bounding_box()
    assert box["height"] <= 480, box


@pytest.mark.real_model
def test_stats_line_keeps_each_label_with_its_value(ran):
    """τ, α, TTFT and tok/s are joined to their values by non-breaking spaces: the line never wraps between them."""
    for m in METHODS_RUN:
        text = ran.locator(f"#stats-{m}").evaluate("e => e.textContent")
        for joined in ("τ\u00a0", "α\u00a0", "TTFT\u00a0", "\u00a0tok/s"):
            assert joined in text, (m, joined, text)


@pytest.mark.real_model
def test_clicking_a_token_scrolls_to_the_inspector(ran):
    """The inspector sits below the panels and charts: a click on a token brings its pickers into view."""
    from playwright.sync_api import expect

    ran.evaluate("() => window.scrollTo(0, 0)")
    picker = ran.locator("#inspect-method")
    expect(picker).not_to_be_in_viewport()
    ran.locator("#panel-prompt_lookup .step[data-step]").last.click()
    expect(picker).to_be_in_viewport(timeout=10_000)
    expect(ran.locator("#step-tree")).to_contain_text("Step", timeout=20_000)


@pytest.mark.real_model
def test_legend_lists_what_the_loaded_models_produce(ran, served):
    """One legend entry per source the loaded models can produce (EAGLE's depths as one ramp), none for a
    method that cannot run; and the guide explains the drafters' counts and "α –"."""
    from playground.engine import source_labels
    from playground.ui import render
    from playground.ui.app import legend_sources

    engine = served[1]
    expected = legend_sources(engine)
    shown = ran.locator("#legend-items .legend-item[data-source]").evaluate_all(
        "els => els.map(e => e.dataset.source)")
    assert shown == [s for s in expected if not s.startswith("eagle_d")]
    legend = ran.locator("#legend-items").inner_text()
    if engine.unavailable_reason("eagle") is not None:
        assert "EAGLE" not in legend
    if getattr(engine, "medusa", None) is None:
        assert "Medusa head" not in legend
    assert render.source_label("target", source_labels()) in legend
    ran.get_by_text("How to read this", exact=True).click()
    guide = ran.locator("#reading-guide")
    for words in ("n-grams in the pool", "steps with a pool hit", "tokens with a recycling row",
                  "earlier outputs in the cache", "Per-head acceptance", "nothing was drafted", "mean tree nodes"):
        assert words in guide.inner_text(), words
    ran.get_by_text("How to read this", exact=True).click()


@pytest.mark.real_model
def test_top_p_zero_is_corrected_with_one_message(ran):
    """Top-p 0 (its minimum is 0.01): no message while typing (it may become 0.5), one when the field is left
    and shows 0.01."""
    from playwright.sync_api import expect

    ran.evaluate("""() => { window.__toasts = [];
      new MutationObserver(ms => ms.forEach(m => m.addedNodes.forEach(n => {
        if (n.nodeType !== 1) return;
        const bodies = n.matches('.toast-body') ? [n] : [...n.querySelectorAll('.toast-body')];
        bodies.forEach(b => window.__toasts.push(b.textContent));
      }))).observe(document.body, {childList: true, subtree: true}); }""")

    def said_times(text: str) -> int:
        return sum(text in t for t in ran.evaluate("() => window.__toasts"))

    ran.get_by_text("Generation settings", exact=True).click()
    top_p = ran.locator("#gen-top_p input[type=number]")
    expect(top_p).to_be_visible()
    top_p.fill("0")
    ran.locator("#prompt textarea").click()  # leave the field: the front end clamps it
    expect(top_p).to_have_value("0.01", timeout=20_000)
    said = "Top-p: allowed values are 0.01 to 1; 0 is clamped to 0.01."
    expect(ran.locator(".toast-body").filter(has_text=said).first).to_be_visible(timeout=20_000)
    top_p.fill("")
    top_p.press_sequentially("0.5", delay=150)  # through "0" and "0.": no message for a value that ends in range
    ran.locator("#prompt textarea").click()
    expect(top_p).to_have_value("0.5", timeout=20_000)
    top_p.fill("1")  # a last change, answered after the ones before it
    ran.locator("#prompt textarea").click()
    expect(top_p).to_have_value("1", timeout=20_000)
    assert said_times(said) == 1, ran.evaluate("() => window.__toasts")
    ran.get_by_text("Generation settings", exact=True).click()
