"""The Benchmark tab as a user meets it (headless Chromium, default model with itself as draft).

* Defaults: 2 questions per category, every loaded method ticked (the draft model too), page
  labels, no command-line wording.
* Uploads: no file says to choose one; a broken file's message names the chosen file and the
  line, never the server's path; a file over the size limit is refused with a message.
* A tiny run on an uploaded file (2 categories x 1 question, 4 new tokens, two methods) shows
  readable column titles, page labels, and a category holding markup as text.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared UI helpers
from ui_fixtures import serve  # noqa: E402

from test_page import RUN_TIMEOUT_MS, browser  # noqa: E402,F401 (the shared fixtures)

MARKUP = "<b>bold</b>"


@pytest.fixture(scope="module")
def url(browser, real_engine):
    with serve(real_engine) as u:  # the target as its own draft: the draft model is loaded
        yield u


@pytest.fixture()
def page(browser, url):
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(url)
    expect(page.locator("#prompt textarea")).to_be_visible(timeout=60_000)
    page.get_by_role("tab", name="Benchmark").click()
    expect(page.locator("#bench-run")).to_be_visible()
    yield page
    page.close()


def _upload(page, path: Path) -> None:
    page.locator("#bench-set").get_by_label("Upload a JSONL file").check()
    page.locator("#bench-upload input[type=file]").set_input_files(str(path))


@pytest.mark.real_model
def test_defaults_labels_and_upload_errors(page, tmp_path):
    """Per-category sample of 2, every loaded method ticked with its label, no developer wording;
    no file / a broken file / a file too large each get a message in the user's terms."""
    from playwright.sync_api import expect

    expect(page.locator("#bench-per-category")).to_contain_text("Questions per category")
    expect(page.locator("#bench-per-category input[type=number]")).to_have_value("2")
    boxes = page.locator("#bench-methods input[type=checkbox]")
    assert boxes.count() >= 4
    for i in range(boxes.count()):
        expect(boxes.nth(i)).to_be_checked()
    methods = page.locator("#bench-methods")
    expect(methods).to_contain_text("Draft model")
    expect(methods).to_contain_text("Prompt lookup")
    expect(methods).not_to_contain_text("prompt_lookup")
    expect(page.locator("#bench-categories")).to_contain_text("Math reasoning")
    tab = page.locator("#tab-benchmark").inner_text()
    for dev in ("CLI", "--", "README", "results.jsonl", "python -m", "Leaderboard.md", "mean_accepted_tokens"):
        assert dev not in tab, f"developer wording on the Benchmark tab: {dev!r}"

    # Under Run, what it would do (2 of each of the 13 categories; MT-bench's 8 have two turns), updated as the
    # inputs change; Run sits above the method settings, which opened push everything below them down.
    plan = page.locator("#bench-plan")
    expect(plan).to_contain_text("Next run: 26 questions (42 turns) × ")
    page.locator("#bench-categories").get_by_label("writing").uncheck()
    expect(plan).to_contain_text("Next run: 24 questions (38 turns) × ", timeout=30_000)
    page.locator("#bench-categories").get_by_label("writing").check()
    # Another question set: the line follows its categories (it kept the last set's, "no questions in ...").
    page.locator("#bench-set").get_by_label("HumanEval dev (bundled)").check()
    expect(plan).to_contain_text(re.compile(r"Next run: \d+ questions × "), timeout=30_000)
    expect(plan).not_to_contain_text("Run would stop here")
    page.locator("#bench-set").get_by_label("Spec-Bench dev (bundled)").check()
    expect(plan).to_contain_text("Next run: 26 questions (42 turns) × ", timeout=30_000)
    assert page.locator("#bench-run").bounding_box()["y"] < page.locator("#bench-knobs").bounding_box()["y"]

    # Nothing runs: Stop is disabled (pressed, it said "Stopped" beside "not started").
    expect(page.locator("#bench-stop")).to_be_disabled()

    # No file chosen: say so (not "no category is ticked"); Run is enabled again, Stop not.
    page.locator("#bench-set").get_by_label("Upload a JSONL file").check()
    page.locator("#bench-run").click()
    expect(page.locator("#bench-status")).to_contain_text("choose a file", timeout=30_000)
    expect(page.locator("#bench-run")).to_be_enabled(timeout=30_000)
    expect(page.locator("#bench-stop")).to_be_disabled()

    # Too large: refused before it reaches the server, naming the file and the limit.
    big = tmp_path / "big.jsonl"
    big.write_bytes(b" " * (6 * 1024 * 1024))
    page.locator("#bench-upload input[type=file]").set_input_files(str(big))
    refusal = page.get_by_text("exceed the maximum allowed size").first
    expect(refusal).to_be_visible(timeout=30_000)
    expect(refusal).to_contain_text("big.jsonl")

    # A broken file: its own name and the line at fault, never the server's upload folder.
    broken = tmp_path / "my questions.jsonl"
    broken.write_text(json.dumps({"question_id": 1, "category": "x", "turns": ["Hi"]}) + "\n"
                      + json.dumps({MARKUP: 1}) + "\n")  # line 2 is neither format; its key is markup
    _upload(page, broken)
    cats = page.locator("#bench-categories")
    expect(cats).to_contain_text("my questions.jsonl, line 2", timeout=30_000)
    page.locator("#bench-run").click()
    status = page.locator("#bench-status")
    expect(status).to_contain_text("my questions.jsonl, line 2: neither a Spec-Bench row", timeout=30_000)
    for where in (status, cats):
        shown = where.inner_text()
        assert "/tmp" not in shown and "gradio" not in shown, shown
        assert MARKUP in shown and where.locator("b").count() == 0, f"the file's markup rendered: {shown}"



@pytest.mark.real_model
def test_tiny_run_on_an_uploaded_file_reads_well(page, tmp_path):
    """2 categories x 1 question (one named with markup), 4 new tokens, autoregressive + prompt
    lookup: the tables use page labels and readable titles, and the markup shows as text."""
    from playwright.sync_api import expect

    rows = [{"question_id": 1, "category": "math_reasoning", "turns": ["What is 2 + 2?"]},
            {"question_id": 2, "category": "math_reasoning", "turns": ["What is 3 + 3?"]},
            {"question_id": 3, "category": MARKUP, "turns": ["Say hello."]}]
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _upload(page, path)
    cats = page.locator("#bench-categories")
    expect(cats).to_contain_text("3 questions in 2 categories", timeout=30_000)
    expect(cats).to_contain_text(MARKUP)
    boxes = page.locator("#bench-methods input[type=checkbox]")
    for i in range(boxes.count()):
        boxes.nth(i).set_checked(False)
    page.locator("#bench-methods").get_by_label("Prompt lookup").check()
    per_cat = page.locator("#bench-per-category input[type=number]")
    per_cat.fill("1")
    per_cat.press("Enter")
    new = page.locator("#bench-max-new-tokens input[type=number]")
    new.fill("4")
    new.press("Enter")
    expect(new).to_have_value("4")
    page.locator("#bench-warmup input[type=checkbox]").uncheck()
    expect(page.locator("#bench-plan")).to_contain_text("Next run: 2 questions × 2 methods (autoregressive included) "
                                                        "= 4 runs of up to 4 new tokens", timeout=30_000)
    page.locator("#bench-run").click()
    expect(page.locator("#bench-status")).to_contain_text("Done: 4 runs", timeout=RUN_TIMEOUT_MS)
    expect(page.locator("#bench-run")).to_be_enabled(timeout=30_000)
    expect(page.locator("#bench-stop")).to_be_disabled()

    table = page.locator("#bench-table")
    for text in ("Method", "Math reasoning speedup", f"{MARKUP} speedup", "Overall speedup", "τ (tokens per step)",
                 "Autoregressive", "Prompt lookup"):
        expect(table).to_contain_text(text)
    expect(table).not_to_contain_text("prompt_lookup")
    detail = page.locator("#bench-detail")
    for text in ("Category", "New tokens", "Tokens/s", "α (acceptance rate)", "Lossless", MARKUP):
        expect(detail).to_contain_text(text)
    expect(page.locator("#bench-speedup")).to_contain_text(MARKUP)
    expect(page.locator("#bench-speedup")).to_contain_text("Prompt lookup")
    for where in ("#bench-table", "#bench-detail", "#bench-categories", "#bench-speedup", "#bench-status"):
        assert page.locator(f"{where} b").filter(has_text="bold").count() == 0, f"{where} rendered the markup"

    # A Run the inputs make Run refuse (no method ticked) says why and leaves these results and downloads.
    for i in range(boxes.count()):
        boxes.nth(i).set_checked(False)
    page.locator("#bench-run").click()
    expect(page.locator("#bench-status")).to_contain_text("no method is ticked", timeout=30_000)
    expect(table).to_contain_text("Prompt lookup")
    expect(page.locator("#bench-csv")).to_contain_text(".csv")
    expect(page.locator("#bench-run")).to_be_enabled(timeout=30_000)
    page.locator("#bench-methods").get_by_label("Prompt lookup").check()

    # Stopped mid-question: the bar keeps its counts and says so (it kept "question N: every method in turn").
    new.fill("200")
    new.press("Enter")
    page.locator("#bench-run").click()
    bar = page.locator("#bench-progress")
    expect(bar).to_contain_text("every method in turn", timeout=RUN_TIMEOUT_MS)
    page.locator("#bench-stop").click()
    expect(page.locator("#bench-status")).to_contain_text("Stopped before every method had finished a turn: "
                                                          "nothing to download", timeout=30_000)
    expect(bar).to_contain_text("stopped")
    expect(bar).not_to_contain_text("every method in turn")
    # The first run's results are gone (no turn of this run finished): they read as this run's.
    expect(table).not_to_contain_text("Prompt lookup")
    expect(page.locator("#bench-speedup")).to_contain_text("running: results come as each")
    expect(page.locator("#bench-run")).to_be_enabled(timeout=60_000)
