"""The page's reading aids without a browser (issue 20, items 3, 7, 9 and 10): the run verdict, the guide,
drafter counts in words, page names of options, the charts' traces, and the advisor's K being the draft
panel's. Plain data in, strings and figures out; no model runs. The browser side is
tests/browser/test_page_reading.py.
"""

from __future__ import annotations

import html
import re
from types import SimpleNamespace

import pytest

from playground import advisor
from playground.engine import METHODS, source_labels, theory
from playground.ui import advisor_tab, charts, guide, insight, render, wording

SNAKE = re.compile(r"\b[a-z0-9]+(?:_[a-z0-9]+)+\b")


def _method(label, tps, tau=None, lossless=None, params=None, reason="eos"):
    return {"label": label, "params": params or {}, "lossless": lossless, "finish_reason": reason,
            "stats": {"tokens_per_s": tps, "tau": tau}}


def _summary(methods, base=10.0, greedy=True):
    return {"baseline_tokens_per_s": base, "greedy": greedy, "methods": methods}


# ----- item 3: the verdict and the guide -----------------------------------------------------------
def test_verdict_names_the_fastest_method_and_the_lossless_result():
    """12.4 / 10 = 1.24x for prompt lookup beats 11 / 10 = 1.10x for the draft model; both matched."""
    s = _summary({"autoregressive": _method("Autoregressive", 10.0, 1.0),
                  "prompt_lookup": _method("Prompt lookup", 12.4, 1.86, "match"),
                  "draft_model": _method("Draft model", 11.0, 1.5, "match")})
    assert guide.run_verdict(s) == ("Fastest: Prompt lookup, 1.24× the baseline, τ 1.86; all outputs identical "
                                    "to the baseline.")
    assert 'id="run-verdict"' in guide.verdict_html(s)


def test_a_stopped_run_says_the_outputs_agree_only_as_far_as_both_went():
    s = _summary({"autoregressive": _method("Autoregressive", 10.0, 1.0, reason="cancelled"),
                  "prompt_lookup": _method("Prompt lookup", 12.4, 1.86, "match", reason="cancelled")})
    assert guide.run_verdict(s).endswith("all outputs identical to the baseline as far as both went (stopped).")


def test_verdict_says_what_differs_and_what_was_not_checked():
    """A mismatch, a near tie and a method that is not lossless by design are each named; a slower-only run
    says so; sampling and a run without a baseline say why nothing was compared."""
    s = _summary({"autoregressive": _method("Autoregressive", 10.0, 1.0),
                  "lookahead": _method("Lookahead", 9.0, 1.4, "mismatch"),
                  "prompt_lookup": _method("Prompt lookup", 8.0, 1.2, "near_tie"),
                  "medusa": _method("Medusa", 7.0, 1.3, None, {"acceptance": "typical"})})
    text = guide.run_verdict(s)
    assert text.startswith("No method beat the baseline; the closest: Lookahead, 0.90× the baseline, τ 1.40")
    assert "Lookahead differs from the baseline" in text and "Prompt lookup differs only at a near tie" in text
    assert "Medusa not checked (not lossless by design)" in text
    one = _summary({"autoregressive": _method("Autoregressive", 10.0), "lookahead": _method("Lookahead", 9.0, 1.4,
                                                                                             "match")})
    assert guide.run_verdict(one).startswith("Lookahead ran at 0.90× the baseline, τ 1.40 (slower than plain "
                                             "decoding)")  # never "Fastest" when it is slower (found by a user)
    sampled = _summary(one["methods"], greedy=False)
    assert "sampling: outputs are not compared token for token" in guide.run_verdict(sampled)
    no_base = _summary({"lookahead": _method("Lookahead", 9.0, 1.4)}, base=None)
    assert guide.run_verdict(no_base) == ("Fastest: Lookahead, 9.0 tokens/s, τ 1.40 (tick Autoregressive to see "
                                          "speedups); no baseline ran, so no output was compared.")
    alone = guide.run_verdict(_summary({"autoregressive": _method("Autoregressive", 10.0)}))
    assert alone.startswith("Only the baseline ran (10.0 tokens/s)")
    assert guide.run_verdict(None) == "" and guide.verdict_html({"methods": {}}) == ""


def test_reading_guide_explains_each_term_and_colour():
    sources = ["target", "prompt_lookup", "draft"]
    out = guide.reading_guide_html(sources, source_labels())
    assert out.startswith('<details id="reading-guide"') and "<summary>How to read this</summary>" in out
    for term in ("τ (tau)", "α (alpha)", "TTFT", "speedup", "tok/s", "bonus token included", "token for token"):
        assert term in out, term
    assert out.count('class="guide-swatch"') == 2 and render.source_color("target") in out  # the rest: the legend


def test_drafter_counts_read_as_words_in_the_right_number():
    """'1 steps with a pool hit' was the bug: each drafter count reads in the singular for 1 and in words (no
    key) for every drafter's counts, a mixture's per-source counts included."""
    base = {"new_tokens": 5, "steps": 1, "tokens_per_s": 5.0, "tau": 5.0, "alpha": 0.5, "ttft_s": 0.1}
    one = {"pool_ngrams": 1, "pool_hits": 1, "table_rows": 1, "steps_with_hits": 1, "cached_outputs": 1,
           "local_hits": 1, "global_hits": 1, "accepted_prompt_lookup": 1, "accepted_medusa_head_1": 1}
    line = render.stats_line({**base, "drafter": one}, baseline_tokens_per_s=None, is_baseline=False).replace(
        "\u00a0", " ")  # non-breaking spaces keep each "label value" pair on one line
    assert "1 step with a pool hit" in line and "1 n-gram in the pool" in line
    assert "1 token accepted from prompt lookup" in line and "1 token accepted from Medusa head 1" in line
    assert not re.search(r"\b1 (steps|tokens|n-grams|matches|outputs)\b", line) and not SNAKE.search(line), line
    many = render.stats_line({**base, "drafter": {k: 7 for k in one}}, baseline_tokens_per_s=None,
                             is_baseline=False).replace("\u00a0", " ")
    assert "7 steps with a pool hit" in many and "7 tokens accepted from prompt lookup" in many
    assert not SNAKE.search(many), many


# ----- item 10: page names ---------------------------------------------------------------------------
def test_options_and_unavailable_methods_in_page_terms():
    """Named options show page names (the handler still gets the key); a method without its part says what is
    missing without a command-line flag."""
    proposer = next(k for k in METHODS["draft_model"].knobs if k.name == "proposer")
    pairs = wording.choice_pairs(proposer)
    assert [v for _, v in pairs] == list(proposer.choices) == ["model", "medusa_heads"]
    assert not any(SNAKE.search(label) for label, _ in pairs)
    assert wording.choice_label("members", "suffix,recycling,prompt_lookup") == \
        "Suffix decoding + Token recycling + Prompt lookup"
    assert wording.choice_label("tree_choices", "mc_sim_7b_63") == "Medusa paper, 63 nodes"
    engine = SimpleNamespace(target=SimpleNamespace(name="T"), unavailable_reason=lambda m: "raw --medusa X",
                             loaded_parts=lambda: {"draft": False, "medusa": False, "eagle": False})
    for m in ("draft_model", "medusa", "eagle"):
        if m in METHODS:
            text = wording.unavailable_text(engine, m)
            assert "--" not in text and "python" not in text and "T" in text, text
    assert wording.unavailable_text(SimpleNamespace(unavailable_reason=lambda m: None), "medusa") is None


# ----- item 7: charts ----------------------------------------------------------------------------------
def test_every_method_has_its_own_colour_and_symbol():
    colours = [charts.method_color(m) for m in METHODS]
    symbols = [charts.method_symbol(m) for m in METHODS]
    assert len(set(colours)) == len(METHODS) and len(set(symbols)) == len(METHODS)
    assert all(charts.method_symbol(m) == charts.method_symbol(i.label) for m, i in METHODS.items())


def test_tokens_per_step_small_multiples_and_theory_points():
    """One row (y axis) per method with its label as the row title; measured theory points are markers
    without text, each in its method's colour and symbol, named in the legend; curves are grey."""
    fig = charts.tokens_per_step_figure({"Autoregressive": [1, 1, 1], "Prompt lookup": [1, 3, 2],
                                         "Draft model": [1, 2]}, {})
    assert [t.yaxis for t in fig.data] == ["y", "y2", "y3"]
    assert [a.text for a in fig.layout.annotations] == ["Autoregressive", "Prompt lookup", "Draft model"]
    assert fig.layout.xaxis3.title.text and all(fig.layout[f"yaxis{i}"].title.text == "tokens" for i in ("", 2, 3))
    points = [{"label": "measured: Prompt lookup", "method": "prompt_lookup", "alpha": 0.5, "speedup": 1.2,
               "text": "measured: Prompt lookup: α 50%, 1.20×"},
              {"label": "measured: Lookahead", "method": "lookahead", "alpha": 0.51, "speedup": 1.21,
               "text": "measured: Lookahead: α 51%, 1.21×"}]
    fig = charts.theory_figure({"K=2, c=0.05": ([0, 1], [1, 2])}, points)
    marks = [t for t in fig.data if t.mode == "markers"]
    assert [t.name for t in marks] == [p["text"] for p in points] and not any(t.text for t in marks)
    assert [t.marker.color for t in marks] == [charts.method_color("prompt_lookup"), charts.method_color("lookahead")]
    assert len({t.marker.symbol for t in marks}) == 2
    assert fig.data[0].line.color in charts.CURVE_SHADES and fig.layout.xaxis.title.text.startswith("acceptance")


def test_run_charts_show_acceptance_by_position_once():
    """The draft panel no longer draws its own "Acceptance by draft position" (the run charts have it)."""
    import gradio as gr

    with gr.Blocks():
        assert len(insight.build_draft_panel()) == 1
    assert len(insight.after_run({"methods": {}}, "none")) == 5


# ----- item 9: the advisor agrees with the page --------------------------------------------------------
STATS = {"alpha": 0.21, "draft_s": 1.2, "verify_s": 2.0, "proposed": 160, "steps": 21}
"""A weak draft run (alpha 0.21, 8 tokens drafted per step, costly draft): the issue's "K = 1" situation."""


@pytest.mark.parametrize("appetite", advisor.APPETITES)
def test_advisor_k_is_the_draft_panels_k(appetite):
    """For code with any appetite (aggressive gave K = 8 beside a panel suggesting K = 1), the advisor's K is
    the draft panel's suggested K: both come from advisor.measure_draft."""
    m = advisor.measure_draft(STATS, 8, theory.FALLBACK)
    panel = insight.draft_panel_markdown(STATS, 8, theory.FALLBACK)
    assert f"Suggested K = {m.suggestion.k}**" in panel
    s = advisor.Situation(0.135, 0.00747, device="cpu", draft_loaded=True, draft_k=3, appetite=appetite, task="code",
                          draft_run=m)
    adv = advisor.advise(s)
    assert adv.params["draft_model"] == {"k": m.suggestion.k}
    assert m.suggestion.k < advisor.K_PRESETS["aggressive"]


def test_advisor_tab_reads_the_last_run_and_names_no_ids():
    """The tab turns the last run's summary into the advice (the panel's K; the fastest measured method first)
    and its text names no rule id, no method key and no knob key."""
    draft = SimpleNamespace(knob_defaults={"k": 3})
    engine = SimpleNamespace(draft=draft, medusa=object(), unavailable_reason=lambda m: None,
                             target=SimpleNamespace(device="cpu"))
    summary = {"greedy": True, "baseline_tokens_per_s": 10.0, "methods": {
        "autoregressive": {"label": "Autoregressive", "params": {}, "stats": {"tokens_per_s": 10.0}},
        "draft_model": {"label": "Draft model", "params": {"k": 8}, "stats": {**STATS, "tokens_per_s": 8.0}},
        "medusa": {"label": "Medusa", "params": {}, "stats": {"tokens_per_s": 12.0, "alpha": 0.3}}}}
    md, adv = advisor_tab.advise(engine, 0.135, 0.00747, False, "code", "aggressive", "cpu", True, True,
                                 summary=summary)
    md = html.unescape(md)
    k = advisor.measure_draft(STATS, 8, insight.verify_cost_for("")).suggestion.k
    assert adv["params"]["draft_model"] == {"k": k} and adv["primary"] == "medusa"
    assert adv["params"]["medusa"] == {"tree_choices": "auto"}
    assert "Recommended: **Medusa**" in md and "the draft panel's suggestion" in md
    assert not SNAKE.search(md) and "`" not in md and "posterior" not in md.lower(), md
    for rule_id in advisor.RULES:
        assert rule_id not in md
    md_before, adv_before = advisor_tab.advise(engine, 0.135, 0.00747, False, "code", "aggressive", "cpu", True, True)
    assert adv_before["params"]["draft_model"] == {"k": 3}  # no run yet: the draft's own K, as the slider shows


def test_a_run_stopped_after_a_few_tokens_ranks_no_speed():
    """Stopped after the first token, the prompt's pass and timing noise decided the "speedups": the verdict
    says there are too few tokens instead of crowning a method (found by a new-user trial)."""
    def made(m, n):
        return {**m, "stats": {**m["stats"], "new_tokens": n}}

    s = _summary({"autoregressive": made(_method("Autoregressive", 10.0, 1.0, reason="cancelled"), 1),
                  "draft_model": made(_method("Draft model", 13.2, 1.0, "match", reason="cancelled"), 1)})
    text = guide.run_verdict(s)
    assert text.startswith("Too few tokens to rank the speeds (1 token from the baseline)") and "Fastest" not in text
    s["methods"] = {m: made(d, 8) for m, d in s["methods"].items()}
    assert guide.run_verdict(s).startswith("Fastest: Draft model, 1.32× the baseline")
