"""Markup in prompts and model output is shown as text, never run or rendered (headless Chromium).

The default model, asked to copy an HTML snippet, answers with ``<b>bold</b>`` and a
``<script>`` tag that sets ``window.__x``; the page must show both literally in the panels,
with no ``<b>`` or ``<script>`` element created and the script never run. A stop string with
markup that is too long is refused: the warning (status line and toast) shows it as text.
"""

from __future__ import annotations

import pytest

from test_page import RUN_TIMEOUT_MS, browser, set_number, url  # noqa: F401 (the shared fixtures)

MARKUP_PROMPT = "Copy this HTML code exactly:\n```html\n<b>bold</b>\n<script>window.__x=1</script>\n```"
"""The default model (greedy, float32) answers this with the snippet in a fenced code block."""
METHODS_RUN = ("autoregressive", "prompt_lookup")


def _only(page, methods) -> None:
    """Tick exactly ``methods`` among the enabled method checkboxes."""
    for box in page.locator("[id^=use-] input[type=checkbox]").all():
        if box.is_enabled():
            box.set_checked(False)
    for m in methods:
        page.locator(f"#use-{m} input[type=checkbox]").check()


@pytest.mark.real_model
def test_markup_in_output_and_messages_is_shown_as_text(browser, url):
    """Panels show the model's ``<b>``/``<script>`` literally and run nothing; a refused stop string
    with markup is echoed as text in the status line and the toast."""
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(url)
        expect(page.locator("#prompt textarea")).to_be_visible(timeout=60_000)
        page.locator("#prompt textarea").fill(MARKUP_PROMPT)
        _only(page, METHODS_RUN)
        page.get_by_text("Generation settings", exact=True).click()
        set_number(page, "gen-max_new_tokens", "32")

        # 1. A stop string of markup, too long: refused, and the message shows it as text.
        stop = "<b>bold</b>" * 7  # 77 characters: over the 64 allowed
        page.locator("#gen-stop textarea").fill(stop)
        page.locator("#run").click()
        expect(page.locator("#status")).to_contain_text(stop, timeout=RUN_TIMEOUT_MS)
        toast = page.get_by_test_id("toast-body").filter(has_text="stop string")
        expect(toast.first).to_contain_text("<b>bold</b>", timeout=30_000)
        assert page.locator("#status b").filter(has_text="bold").count() == 0
        assert toast.first.locator("b").count() == 0, "the toast rendered the stop string's markup"

        # 2. The model echoes the markup: panels show it as text and no script runs.
        page.locator("#gen-stop textarea").fill("")
        page.locator("#run").click()
        expect(page.locator("#status")).to_contain_text("Done", timeout=RUN_TIMEOUT_MS)
        for m in METHODS_RUN:
            panel = page.locator(f"#panel-{m}")
            expect(panel).to_contain_text("<b>bold</b>")
            expect(panel).to_contain_text("<script>window.__x=1")
            assert panel.locator("b, script, .tokens strong").count() == 0, f"{m}: markup became elements"
            expect(page.locator(f"#stats-{m}")).to_contain_text("tok/s")
        assert page.evaluate("typeof window.__x") == "undefined", "a script from the model's output ran"
        # Markdown in the output stays as typed: the code fence shows its backticks.
        expect(page.locator("#panel-autoregressive")).to_contain_text("```")
    finally:
        page.close()
