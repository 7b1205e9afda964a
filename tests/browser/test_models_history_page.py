"""The Models and History tabs in headless Chromium, on the default model.

One browser tab loads the default target with itself as the draft (a real load, held at its first
stage until the progress bar has been seen): the header, the legend and the draft model's checkbox follow,
while a second browser tab keeps the server's models; the Benchmark tab offers the draft model and
runs a tiny benchmark with it. Two short runs appear in the History tab,
side by side, and their JSON-lines and CSV downloads read back with the benchmark's readers. A
server started with the models locked says so. Skipped when chromium or Playwright is missing.
"""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared UI helpers
from ui_fixtures import serve, ui_engine  # noqa: E402

from test_page import RUN_TIMEOUT_MS, browser  # noqa: E402,F401 - the shared chromium fixture

from playground import bench  # noqa: E402
from playground.engine import METHODS  # noqa: E402

PROMPT = "List three colours: red, green, blue. Then list them again: red, green,"
GATE_TIMEOUT_S = 120
SHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"


@pytest.fixture(scope="module")
def engine(request):
    return ui_engine(request)


@pytest.fixture
def gated_load(monkeypatch):
    """The real loader, held after its first progress report until the test releases it."""
    from playground.ui import models_tab

    real, gate = models_tab.load_choice, threading.Event()

    def held(choice, device="auto", dtype="auto", progress=None):
        progress(0.0, f"locating model {choice.target!r}")
        gate.wait(GATE_TIMEOUT_S)
        return real(choice, device, dtype, progress)
    monkeypatch.setattr(models_tab, "load_choice", held)
    return gate


def _pick(page, elem_id: str, label: str) -> None:
    page.locator(f"#{elem_id} input").click()
    page.get_by_role("option", name=label).click()


def _set_tokens(page, n: int) -> None:
    from playwright.sync_api import expect

    page.get_by_text("Generation settings", exact=True).click()
    box = page.locator("#gen-max_new_tokens input[type=number]")
    for _ in range(3):  # a busy machine may re-render the field: fill until it sticks
        box.fill(str(n))
        box.press("Enter")
        try:
            expect(box).to_have_value(str(n), timeout=10_000)
            return
        except AssertionError:
            continue
    expect(box).to_have_value(str(n))


def _only(page, methods: set[str]) -> None:
    for m in METHODS:
        box = page.locator(f"#use-{m} input[type=checkbox]")
        if box.is_enabled():
            box.set_checked(m in methods)


@pytest.mark.real_model
def test_choose_models_then_history_and_downloads(browser, engine, gated_load, tmp_path):  # noqa: F811
    from playwright.sync_api import expect

    with serve(engine, lock_models=False) as url:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        other = browser.new_context().new_page()
        try:
            page.goto(url)
            expect(page.locator("#header")).to_contain_text("Draft: none", timeout=60_000)
            expect(page.locator("#use-draft_model input[type=checkbox]")).to_be_disabled()
            draft_legend = page.locator('#legend .legend-item[data-source="draft"]')
            expect(draft_legend).to_have_count(0)  # no draft model loaded: no colour for it
            page.get_by_role("tab", name="Models").click()
            _pick(page, "models-draft", "The target itself (accepts every draft token: a check of the machinery)")
            page.locator("#models-load").click()
            # The progress bar, in page terms, while the load is held at its first stage.
            expect(page.locator("#models-status")).to_contain_text("Target: looking for it", timeout=30_000)
            gated_load.set()
            expect(page.locator("#models-status")).to_contain_text("Loaded in", timeout=120_000)
            expect(page.locator("#models-status")).to_contain_text("for this browser tab only")
            expect(page.locator("#header")).to_contain_text("Draft: SmolLM2-135M-Instruct")
            expect(page.locator("#models-current")).to_contain_text("Draft: SmolLM2-135M-Instruct")
            SHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SHOTS / "models.png"), full_page=True)

            # The methods follow this tab's models; another browser session keeps the server's.
            page.get_by_role("tab", name="Playground").click()
            expect(page.locator("#use-draft_model input[type=checkbox]")).to_be_enabled()
            expect(page.locator("#use-draft_model input[type=checkbox]")).to_be_checked()
            expect(page.locator("#reason-draft_model")).to_be_hidden()
            expect(draft_legend).to_have_count(1)  # the legend follows the load
            expect(draft_legend).to_contain_text("draft model")
            other.goto(url)
            expect(other.locator("#header")).to_contain_text("Draft: none", timeout=60_000)
            expect(other.locator("#use-draft_model input[type=checkbox]")).to_be_disabled()

            # The Benchmark tab follows too: the draft model is offered and ticked, and a tiny benchmark
            # (1 question, 4 new tokens, no warm-up) runs it on this tab's models.
            page.get_by_role("tab", name="Benchmark").click()
            bench_methods = page.locator("#bench-methods")
            expect(bench_methods.get_by_label("Draft model")).to_be_checked(timeout=30_000)
            for box in (page.locator("#bench-methods input[type=checkbox]"),
                        page.locator("#bench-categories input[type=checkbox]")):
                for i in range(box.count()):
                    box.nth(i).set_checked(False)
            bench_methods.get_by_label("Draft model").check()
            page.locator("#bench-categories input[type=checkbox]").first.check()
            for elem, n in (("bench-per-category", 1), ("bench-max-new-tokens", 4)):
                box = page.locator(f"#{elem} input[type=number]")
                box.fill(str(n))
                box.press("Enter")
                expect(box).to_have_value(str(n))
            page.locator("#bench-warmup input[type=checkbox]").uncheck()
            page.locator("#bench-run").click()
            # (the first category's question may have two turns: 2 or 4 runs)
            expect(page.locator("#bench-status")).to_contain_text(re.compile(r"Done: [24] runs"), timeout=RUN_TIMEOUT_MS)
            expect(page.locator("#bench-table")).to_contain_text("Draft model")
            page.get_by_role("tab", name="Playground").click()

            # Two short runs on this tab's models.
            page.locator("#prompt textarea").fill(PROMPT)
            _only(page, {"autoregressive", "draft_model"})
            _set_tokens(page, 8)
            for n in (1, 2):
                page.locator("#run").click()
                # This run's figures (8, then 6 tokens; the status may still say the last run's "Done"),
                # waited for as long as a run: the stats line's Markdown can render seconds after the status.
                stats = page.locator("#stats-draft_model")
                expect(stats).to_contain_text(f"{8 if n == 1 else 6} new tokens", timeout=RUN_TIMEOUT_MS)
                expect(stats).to_contain_text("tok/s")
                expect(page.locator("#status")).to_contain_text("Done", timeout=RUN_TIMEOUT_MS)
                if n == 1:  # the second run: the same prompt with 6 tokens
                    page.locator("#status").click()  # leave the settings field
                    page.locator("#gen-max_new_tokens input[type=number]").fill("6")
                    page.locator("#gen-max_new_tokens input[type=number]").press("Enter")

            page.get_by_role("tab", name="History").click()
            rows = page.locator("#history-table tbody tr")
            expect(rows).to_have_count(2, timeout=30_000)
            expect(rows.first).to_contain_text("6 new tokens, greedy")
            expect(rows.first).to_contain_text("Draft model")
            expect(page.locator("#history-table")).to_contain_text(PROMPT[:30])
            compare = page.locator("#history-compare")
            expect(compare).to_contain_text("Run 1")
            expect(compare).to_contain_text("Run 2")
            expect(compare.locator('tr[data-method="draft_model"]')).to_have_count(1)
            SHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SHOTS / "history.png"), full_page=True)

            # Downloads of the newest run: the benchmark's records, one per method.
            got = {}
            for elem in ("history-jsonl", "history-csv"):
                link = page.locator(f"#{elem} a").first
                expect(link).to_be_visible(timeout=30_000)
                with page.expect_download() as info:
                    link.click()
                path = tmp_path / info.value.suggested_filename
                info.value.save_as(path)
                got[elem] = path.read_text(encoding="utf-8")
            records = bench.from_jsonl(got["history-jsonl"])
            assert bench.from_csv(got["history-csv"]) == records
            assert [r["method"] for r in records] == ["autoregressive", "draft_model"]
            assert all(not bench.missing_fields(r) and r["question_id"] == "playground-run-2" for r in records)
            assert all(r["new_tokens"] == 6 and r["prompt"] == PROMPT for r in records)
            base, draft = records
            assert draft["output_ids"] == base["output_ids"]  # greedy and lossless: same tokens
            assert draft["mean_accepted_tokens"] > 1.0  # the target drafting for itself: every token accepted

            # Back to the server's models: every part built from the models follows again (the legend
            # kept the loaded draft's colour when the reset was not queued), and so does the form.
            page.get_by_role("tab", name="Models").click()
            page.locator("#models-reset").click()
            expect(page.locator("#models-status")).to_contain_text("Back to the server's models", timeout=30_000)
            expect(page.locator("#header")).to_contain_text("Draft: none")
            expect(page.locator("#models-draft input")).not_to_have_value(re.compile("target itself"))
            page.get_by_role("tab", name="Playground").click()
            expect(draft_legend).to_have_count(0, timeout=30_000)
            expect(page.locator("#use-draft_model input[type=checkbox]")).to_be_disabled()
        finally:
            other.context.close()
            page.close()


@pytest.mark.real_model
def test_locked_models_say_so(browser, engine):  # noqa: F811
    from playwright.sync_api import expect

    with serve(engine, lock_models=True) as url:
        page = browser.new_page()
        try:
            page.goto(url)
            page.get_by_role("tab", name="Models").click()
            locked = page.locator("#models-locked")
            expect(locked).to_contain_text("The models are fixed on this server", timeout=60_000)
            expect(locked).to_contain_text("SmolLM2-135M-Instruct")
            expect(page.locator("#models-load")).to_have_count(0)
        finally:
            page.close()
