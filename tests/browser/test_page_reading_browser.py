"""The page as a reader meets it (issue 20, items 3, 7, 9 and 10), in headless Chromium.

One server on the embedded default model with its shipped distilled draft, and one
short run (Autoregressive, Prompt lookup, Draft model; 24 new tokens, greedy) shared by the tests:
the guide beside the legend and the verdict after the run; charts that read (one row per method,
one chart each, axes with units, the Theory tab's measured points as legend entries with their own
colour and symbol); the advisor agreeing with the draft panel; panels that never wrap inside a
word; and no developer wording (flags, file names, rule ids, method keys) on any tab.
Skipped when chromium or Playwright is missing.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/browser: the browser fixture
from test_page import PROMPT, RUN_TIMEOUT_MS, browser, set_number  # noqa: E402,F401  (the module-scoped Chromium fixture)
from ui_fixtures import serve  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RUN_METHODS = ("autoregressive", "prompt_lookup", "draft_model")
LABELS = {"autoregressive": "Autoregressive", "prompt_lookup": "Prompt lookup", "draft_model": "Draft model"}

pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module")
def engine(real_target):
    """The default target (the session's copy) with its shipped distilled draft, as the app loads it; without
    the Medusa heads, whose device-fitted tree costs minutes of calibration on a busy 2-core machine."""
    from playground.engine import Engine, default_draft_spec, load_draft

    return Engine(real_target, load_draft(default_draft_spec("default"), real_target))


@pytest.fixture(scope="module")
def url(browser, engine):
    with serve(engine) as u:
        yield u


def _open(browser, url):
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(url)
    expect(page.locator("#prompt textarea")).to_be_visible(timeout=60_000)
    return page


@pytest.fixture(scope="module")
def ran(browser, url):
    """A page after one finished run of :data:`RUN_METHODS` (24 new tokens, greedy)."""
    from playwright.sync_api import expect

    page = _open(browser, url)
    page.locator("#prompt textarea").fill(PROMPT)
    for box in page.locator("[id^=use-] input[type=checkbox]").all():
        if box.is_enabled() and box.is_checked():
            box.uncheck()
    for m in RUN_METHODS:
        page.locator(f"#use-{m} input[type=checkbox]").check()
    page.get_by_text("Generation settings", exact=True).click()
    set_number(page, "gen-max_new_tokens", "24")
    page.get_by_text("Generation settings", exact=True).click()
    page.locator("#run").click()
    expect(page.locator("#status")).to_contain_text("Done", timeout=RUN_TIMEOUT_MS)
    expect(page.locator("#steps-chart")).to_contain_text("Draft model", timeout=30_000)
    expect(page.locator("#draft-insight")).to_contain_text("Suggested K", timeout=30_000)
    try:
        yield page
    finally:
        page.close()


def _figure(page, elem_id: str) -> dict:
    """The Plotly figure drawn in ``#elem_id``: its traces and layout, as the browser holds them."""
    return page.evaluate(
        """id => { const el = document.querySelector('#' + id + ' .js-plotly-plot');
                   return el ? {data: el.data.map(t => ({name: t.name, mode: t.mode, type: t.type, xaxis: t.xaxis,
                                   yaxis: t.yaxis, color: (t.marker && t.marker.color) || (t.line && t.line.color),
                                   symbol: t.marker && t.marker.symbol, text: t.text})),
                                layout: JSON.parse(JSON.stringify(el.layout))} : null; }""", elem_id)


def _axis_titles(layout: dict) -> dict[str, str]:
    out = {}
    for key, axis in layout.items():
        # a shared axis (small multiples: ``matches`` another) is titled once, on the bottom row
        if re.fullmatch(r"[xy]axis\d*", key) and axis.get("visible", True) is not False and not axis.get("matches"):
            title = axis.get("title")
            out[key] = (title.get("text") if isinstance(title, dict) else title) or ""
    return out


# ----- item 3: numbers explained --------------------------------------------------------------------
def test_guide_beside_the_legend_explains_every_number(ran):
    """A collapsed "How to read this" sits in the legend; opened, it says what tau (bonus token included),
    alpha, TTFT, speedup and tok/s are, what each colour means and what the lossless check compares."""
    from playwright.sync_api import expect

    guide = ran.locator("#legend #reading-guide")
    expect(guide).to_be_visible()
    expect(guide.locator("summary")).to_have_text("How to read this")
    body = guide.locator(".guide-body")
    expect(body).to_be_hidden()
    guide.locator("summary").click()
    expect(body).to_be_visible()
    for words in ("τ (tau)", "bonus token included", "α (alpha)", "acceptance rate", "TTFT", "time to first token",
                  "speedup", "the baseline", "tok/s", "Pale blue", "target model's own token",
                  "compares each method's output with the baseline's, token for token", "greedy"):
        expect(body).to_contain_text(words)
    expect(body).to_contain_text("named in the legend above")
    expect(body.locator(".guide-swatch").first).to_be_visible()
    guide.locator("summary").click()
    expect(body).to_be_hidden()


def test_a_finished_run_ends_with_a_verdict(ran):
    """The line under the status names the fastest method with its speedup and tau, and says that the
    lossless methods' outputs were identical to the baseline's; no stats line says "1 steps"."""
    from playwright.sync_api import expect

    verdict = ran.locator("#status #run-verdict")
    expect(verdict).to_be_visible()
    text = verdict.inner_text()
    assert re.search(r"^(Fastest: |No method beat the baseline; the closest: )(Prompt lookup|Draft model), "
                     r"\d+\.\d\d× the baseline, τ \d\.\d\d", text), text
    assert "all outputs identical to the baseline" in text, text
    for m in RUN_METHODS:
        line = ran.locator(f"#stats-{m}").inner_text()
        assert not re.search(r"\b1\s(steps|tokens|n-grams|matches)\b", line), line  # \s: non-breaking too


# ----- item 7: charts that read --------------------------------------------------------------------
def test_tokens_per_step_is_one_row_per_method(ran):
    """"Accepted tokens per step" draws each method in its own row (its own y axis), titled with its label,
    in its own colour: no overlaid step lines."""
    fig = _figure(ran, "steps-chart")
    assert fig and len(fig["data"]) == len(RUN_METHODS)
    assert len({t["yaxis"] for t in fig["data"]}) == len(RUN_METHODS)
    assert len({t["color"] for t in fig["data"]}) == len(RUN_METHODS)
    titles = [a["text"] for a in fig["layout"].get("annotations", [])]
    assert sorted(titles) == sorted(LABELS.values()), titles


def test_each_chart_once_with_axis_titles(ran):
    """Every chart title appears once on the Playground tab ("Acceptance by draft position" used to be drawn
    twice); every visible axis of a chart with data has a title, and numeric axes name their unit."""
    titles = ran.evaluate("() => [...document.querySelectorAll('#tab-playground .gtitle')].map(e => e.textContent)")
    assert titles and len(titles) == len(set(titles)), titles
    assert sum("Acceptance by draft position" in t for t in titles) == 1, titles
    for elem in ("chart", "bars", "steps-chart", "steps-hist", "position-chart", "split-chart"):
        axes = _axis_titles(_figure(ran, elem)["layout"])
        assert axes and all(axes.values()), (elem, axes)
    units = {**_axis_titles(_figure(ran, "chart")["layout"]), **{"bars y": _axis_titles(
        _figure(ran, "bars")["layout"])["yaxis"]}}
    assert "(s" in units["xaxis"] and "tokens" in units["yaxis"] and "tokens / s" in units["bars y"], units


def test_theory_points_have_their_own_colour_symbol_and_legend_entry(ran):
    """On the Theory tab each measured method is a marker with its method's colour and its own symbol, named
    in the legend (label, alpha, speedup) and not by text drawn on the chart, where labels overlapped."""
    from playwright.sync_api import expect

    ran.get_by_role("tab", name="Theory").click()
    expect(ran.locator("#theory-summary")).to_contain_text("measured on this device", timeout=RUN_TIMEOUT_MS)
    expect(ran.locator("#theory-chart .legend")).to_contain_text("measured: Draft model", timeout=30_000)
    points = [t for t in _figure(ran, "theory-chart")["data"] if t["mode"] == "markers"]
    assert sorted(p["name"].split(":")[1].strip().split(" (")[0] for p in points) == ["Draft model", "Prompt lookup"]
    assert len({p["color"] for p in points}) == len({p["symbol"] for p in points}) == len(points)
    assert not any(p["text"] for p in points)  # no text labels on the chart
    legend = ran.locator("#theory-chart .legend").text_content()
    for p in points:
        assert p["name"] in legend and re.search(r"α \d+%, \d+\.\d\d×", p["name"]), p["name"]
    # An emptied alpha box: the tab says what the optimal K needs and keeps its curves (a stock slider
    # raised in preprocess: an error toast and no chart).
    alpha = ran.locator("#theory-alpha input[type=number]")
    alpha.fill("")
    expect(ran.locator("#theory-summary")).to_contain_text("Acceptance rate α: give a number from 0 to 1", timeout=30_000)
    expect(ran.locator("#theory-chart .js-plotly-plot").first).to_be_visible()
    alpha.fill("0.5")
    alpha.press("Enter")
    expect(ran.locator("#theory-summary")).to_contain_text("Optimal K for α = 50%", timeout=30_000)
    ran.get_by_role("tab", name="Playground").click()


# ----- item 9: the advisor agrees with the page ----------------------------------------------------
def test_advisor_k_is_the_draft_panels_k(ran):
    """After the run, the advisor's K for the loaded draft is the draft panel's suggested K, also for code
    with an aggressive appetite (it used to say K = 8 beside a panel suggesting K = 1); it names no rule id,
    no method key and no Medusa knob that does nothing under exact acceptance."""
    from playwright.sync_api import expect

    from playground import advisor

    suggested = re.search(r"Suggested K = (\d+)", ran.locator("#draft-insight").inner_text()).group(1)
    ran.get_by_role("tab", name="Advisor").click()
    out = ran.locator("#advisor-output")
    ran.locator("#advisor-appetite").get_by_text("aggressive", exact=True).click()
    ran.locator("#advisor-task input").click()
    ran.get_by_role("option", name="code", exact=True).click()
    expect(out).to_contain_text("prompt lookup copies it", timeout=30_000)
    expect(out).to_contain_text(f"Draft model: K = {suggested}")
    expect(out).to_contain_text("the draft panel's suggestion from this run")
    text = out.inner_text()
    for rule_id in advisor.RULES:
        assert rule_id not in text, rule_id
    assert "posterior" not in text.lower() and "draft_model" not in text and "prompt_lookup" not in text
    ran.locator("#advisor-apply").click()
    expect(ran.locator("#advisor-applied")).to_contain_text(f"Draft model (K = {suggested})")
    ran.get_by_role("tab", name="Playground").click()
    ran.get_by_text("Draft model settings", exact=True).click()
    expect(ran.locator("#draft_model-k input[type=number]")).to_have_value(suggested)
    ran.get_by_text("Draft model settings", exact=True).click()


# ----- item 10: layout and wording ----------------------------------------------------------------
def test_panels_never_wrap_inside_an_identifier_and_few_methods_get_wide_panels(ran):
    """A token panel breaks lines at spaces only: a long identifier stays on one line and the panel scrolls
    sideways; with two methods ticked each panel takes about half the row, with three about a third."""
    panel = "#panel-autoregressive .tokens"
    probe = ran.evaluate(
        """sel => { const box = document.querySelector(sel);
                    const span = document.createElement('span'); span.className = 'tok probe';
                    span.textContent = 'speculative_decoding_playground_identifier_that_is_longer_than_any_panel()';
                    box.appendChild(document.createElement('br')); box.appendChild(span);
                    const style = getComputedStyle(box), line = parseFloat(style.lineHeight);
                    const r = {height: span.getBoundingClientRect().height, line: line,
                               scroll: box.scrollWidth > box.clientWidth, wrap: style.overflowWrap,
                               ws: style.whiteSpace, overflowX: style.overflowX};
                    span.previousSibling.remove(); span.remove(); return r; }""", panel)
    assert probe["height"] < 1.5 * probe["line"], probe  # one line: not broken inside the identifier
    assert probe["scroll"] and probe["overflowX"] == "auto" and probe["wrap"] != "anywhere", probe
    assert probe["ws"] == "pre-wrap", probe  # indentation kept, lines still wrap at spaces

    def widths():
        return ran.evaluate("""() => { const g = document.querySelector('#method-panels').getBoundingClientRect();
            return [...document.querySelectorAll('#method-panels > .method-panel')]
                   .filter(c => c.offsetParent !== null).map(c => c.getBoundingClientRect().width / g.width); }""")
    three = widths()
    assert len(three) == 3 and all(w > 0.3 for w in three), three
    ran.locator("#use-draft_model input[type=checkbox]").uncheck()
    ran.wait_for_function("() => [...document.querySelectorAll('#method-panels > .method-panel')]"
                          ".filter(c => c.offsetParent !== null).length === 2")
    two = widths()
    assert len(two) == 2 and all(w > 0.45 for w in two), two
    ran.locator("#use-draft_model input[type=checkbox]").check()


FORBIDDEN = [(re.compile(r"(?<![\w-])--[a-z]"), "a command-line flag"), (re.compile(r"\.jsonl\b"), "a file name"),
             (re.compile(r"README"), "README"), (re.compile(r"python -m|app\.py"), "a command line"),
             (re.compile(r"development machine"), "the development machine"),
             (re.compile(r"made non-decreasing in n"), "an internal note")]
TABS = ["Playground", "Benchmark", "Theory", "Advisor", "Models", "History"]


@pytest.mark.parametrize("tab", TABS)
def test_no_developer_wording_on_any_tab(browser, url, tab):
    """With every accordion and guide opened, a tab's text names no command-line flag, file name, README,
    command line, advisor rule id, method key (``prompt_lookup``) or other snake_case name (``top_k``): the
    page says things in its own terms."""
    from playwright.sync_api import expect

    from playground import advisor
    from playground.engine import METHODS

    page = _open(browser, url)
    try:
        page.get_by_role("tab", name=tab).click()
        panel = page.locator(f"#tab-{tab.lower()}")
        expect(panel).to_be_visible()
        if tab == "Theory":
            expect(page.locator("#theory-summary")).to_contain_text("Verify cost", timeout=RUN_TIMEOUT_MS)
        page.evaluate("""id => { document.querySelectorAll('#' + id + ' details').forEach(d => d.open = true); }""",
                      f"tab-{tab.lower()}")
        for _ in range(3):  # open nested accordions too (opening one shows the next level)
            for acc in panel.locator("button.label-wrap:not(.open)").all():
                if acc.is_visible():
                    acc.click()
        text = panel.inner_text()
        found = [f"{why}: {m.group(0)!r}" for rx, why in FORBIDDEN for m in rx.finditer(text)]
        keys = [m for m in METHODS if "_" in m] + list(advisor.RULES)
        found += [f"internal id: {k!r}" for k in keys if re.search(rf"\b{k}\b", text)]
        found += [f"a snake_case name: {m.group(0)!r}" for m in re.finditer(r"\b[a-z0-9]+(?:_[a-z0-9]+)+\b", text)]
        assert not found, found
    finally:
        page.close()
