"""The step inspector in headless Chromium (Playwright, Debian's chromium), on the default model.

Runs two methods (autoregressive and prompt lookup, 32 new tokens), then: every panel shows its step
boundaries; clicking a token of the prompt-lookup panel draws that step's verified tree, and some
step there has both accepted and rejected nodes and the target's bonus token; choosing the baseline
in the method list shows one of its steps; the "why this speed" lines name both methods. Saves a
screenshot to ``artifacts/screenshots/step_inspector.png``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_page import ROOT, RUN_TIMEOUT_MS, browser, prepare_run, url  # noqa: E402,F401  (the shared fixtures)

SCREENSHOT = ROOT / "artifacts" / "screenshots" / "step_inspector.png"
METHODS_RUN = ("autoregressive", "prompt_lookup")
PROMPT = "Fix the typo and repeat the rest unchanged: 'def add(a, b):\n    retrun a + b\n\ndef sub(a, b):\n    return a - b'"
"""Greedy, the default model copies most of it: prompt lookup's chains are partly accepted at some steps."""
MAX_NEW = "32"


@pytest.mark.real_model
def test_pick_a_step_and_see_its_tree(browser, url):  # noqa: F811
    """Two methods run; clicking tokens picks steps; a prompt-lookup step shows accepted and rejected
    nodes and the bonus token with its draft and verify times; the why-lines name both methods."""
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    try:
        prepare_run(page, url, PROMPT, METHODS_RUN, MAX_NEW)
        page.locator("#run").click()
        expect(page.locator("#status")).to_contain_text("Done", timeout=RUN_TIMEOUT_MS)

        # Step boundaries in every panel: one span per step, alternating.
        for m in METHODS_RUN:
            expect(page.locator(f"#panel-{m} .step.odd").first).to_be_visible()
            expect(page.locator(f"#panel-{m} .step.even").first).to_be_visible()
        # Why this speed, for both methods, once the run ended.
        why = page.locator("#why-speed")
        expect(why).to_contain_text("Why this speed", timeout=30_000)
        expect(why).to_contain_text("Autoregressive: the baseline")
        expect(why).to_contain_text(re.compile(r"Prompt lookup: [\d.]+× the baseline, τ [\d.]+ over the whole run"))
        expect(why).to_contain_text("plain steps")
        expect(why).to_contain_text("expected")

        # Click the prompt-lookup panel's steps until one shows accepted and rejected nodes.
        tree = page.locator("#step-tree")
        steps = page.locator("#panel-prompt_lookup .step")
        found = None
        for i in range(steps.count()):
            span = steps.nth(i)
            number = span.get_attribute("data-step")
            span.click()
            expect(tree).to_contain_text(f"Step {number} of Prompt lookup", timeout=15_000)
            if tree.locator(".node-accepted").count() and tree.locator(".node-rejected").count():
                found = number
                break
        assert found is not None, "no prompt-lookup step had both accepted and rejected candidates"
        expect(tree).to_contain_text("accepted, then the target's own token")
        expect(tree).to_contain_text("Drafting")
        expect(tree).to_contain_text("verifying")
        expect(tree.locator(".node-bonus")).to_have_count(1)
        expect(page.locator("#inspect-step input[type=number]")).to_have_value(found)
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        page.locator("#step-inspector").screenshot(path=str(SCREENSHOT))

        # The step box picks a step too.
        box = page.locator("#inspect-step input[type=number]")
        box.fill("1")
        box.press("Enter")
        expect(tree).to_contain_text("Step 1 of Prompt lookup", timeout=15_000)
        # Past the last step (or below the first): the nearest step, with a message; nothing turns to "Error".
        numbers = [int(steps.nth(i).get_attribute("data-step")) for i in range(steps.count())]
        for typed, shown in (("999", max(numbers)), ("-3", min(0, *numbers))):  # step 0: the prefill
            box.fill(typed)
            box.press("Enter")
            expect(tree).to_contain_text(f"Step {shown} of Prompt lookup", timeout=15_000)
            expect(tree).to_contain_text(f"Step {typed} is outside the steps kept of Prompt lookup")
            expect(box).to_have_value(str(shown))
        expect(page.locator("#step-inspector .error")).to_have_count(0)

        # A click on the baseline's panel picks its step: one token from the target, nothing proposed.
        base = page.locator("#panel-autoregressive .step").nth(3)
        number = base.get_attribute("data-step")
        base.click()
        expect(tree).to_contain_text(f"Step {number} of Autoregressive")
        expect(tree).to_contain_text("Nothing was proposed at this step")
        # Choosing the method in the list shows that method's latest step with candidates.
        page.locator("#inspect-method input").click()
        page.get_by_role("option", name="Prompt lookup").click()
        expect(tree).to_contain_text("of Prompt lookup", timeout=15_000)
        expect(tree.locator(".node-accepted").first).to_be_visible()
    finally:
        page.close()
