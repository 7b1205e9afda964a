"""What the page's numbers mean: the "How to read this" guide beside the legend, and the verdict
line shown when a run ends.

Both are plain strings built from plain data: :func:`reading_guide_html` from the token sources
the legend lists, :func:`run_verdict` from a finished run's summary (``RunView.summary()`` in
:mod:`.run_view`). Nothing here imports gradio or runs a model.
"""

from __future__ import annotations

import html
from typing import Iterable, Mapping

from playground.engine import BASELINE, METHODS, is_lossless

from . import render

GUIDE_TERMS: tuple[tuple[str, str], ...] = (
    ("tok/s", "new tokens per second of that method's own time: its steps only (the other methods' turns do not "
              "count), the prompt reading included, so a long prompt lowers it."),
    ("speedup (×)", "a method's tokens per second divided by the baseline's (Autoregressive, plain decoding "
                    "one token per target pass) in the same run: 1.50× means 50% faster."),
    ("steps", "passes of the target model over the candidates; every step emits at least one token."),
    ("τ (tau)", "mean tokens emitted per step, the bonus token included: 1.00 for plain decoding, 2.50 when "
                "each target pass yields two and a half tokens on average. Higher is better."),
    ("α (alpha)", "acceptance rate: guessed tokens the target accepted ÷ guessed tokens proposed "
                  "(a tree counts all its nodes). Shown as a percentage; “α –” means nothing was drafted "
                  "(plain decoding, or no guess found yet)."),
    ("TTFT", "time to first token, in seconds: reading the prompt (prefill) and emitting the first new token. "
             "Shown on its own and also counted in tok/s."),
)
"""The stats line's terms and what each means, in the order the stats line shows them."""

DRAFTER_TERMS: tuple[tuple[str, str], ...] = (
    ("n-grams in the pool", "Lookahead: guesses collected so far from its look-ahead window, ready to be tried."),
    ("steps with a pool hit", "Lookahead: steps where the target accepted at least one token from the pool."),
    ("tokens with a recycling row", "Token recycling: tokens whose likely next tokens the table remembers "
                                    "(from earlier steps' candidates)."),
    ("steps with a table hit", "Token recycling: steps where the target accepted at least one guess from the table."),
    ("earlier outputs in the cache", "Suffix decoding: earlier answers kept to copy from (0 on a first run)."),
    ("matches in this answer / in earlier outputs", "Suffix decoding: steps with an accepted guess copied from "
                                                    "this answer so far, or from an earlier answer."),
    ("tokens in the datastore", "REST: tokens of the target's own earlier answers it retrieves from (fixed; "
                                "this run adds none)."),
    ("steps with a datastore hit", "REST: steps where the target accepted at least one retrieved token."),
    ("tokens accepted from …", "Mixture: accepted guesses counted by the drafter that proposed them."),
    ("mean tree nodes per step", "EAGLE: candidate tokens the target checked in one pass, on average."),
    ("Per-head acceptance", "Medusa: for each head (head k guesses the token k places ahead), the share of the "
                            "steps that verified its guesses (steps the budget or the draft gate left plain "
                            "do not count) where one of them was accepted."),
)
"""The drafters' own counts after the stats line (``render.DRAFTER_INFO_LABELS``) and Medusa's per-head line."""

LOSSLESS_TEXT = ("It compares each method's output with the baseline's, token for token, under "
                 "greedy decoding (temperature 0): a lossless method must produce exactly the baseline's text. "
                 "“Near tie” means the first difference is where the target's two best tokens were almost equally "
                 "likely, so rounding in reduced precision can pick either: not a bug. Under sampling, and for "
                 "methods that are not lossless by design, there is no token-for-token check.")

COLOUR_TEXT = ("Each token's background says where it came from. Pale blue: the target model's own token, the one "
               "every step adds (after the accepted guesses, or in place of the first rejected one). Any other "
               "colour: a guess by a drafter (named in the legend above) that the target checked and accepted. "
               "Hover a token to see its source.")


def reading_guide_html(sources: Iterable[str], labels: Mapping[str, str]) -> str:
    """The collapsible "How to read this" guide (``#reading-guide``): colours, the stats line's terms
    (tok/s, speedup, steps, τ, α, TTFT) and what the lossless check compares.

    Args:
        sources: token sources the legend lists (e.g. ``legend_sources(engine)``).
        labels: source -> legend text (``source_labels()``).
    """
    sources = list(dict.fromkeys(sources))
    swatches = "".join(  # the target's colour and one drafter's, as examples; the legend lists them all
        f'<li><span class="guide-swatch" style="background:{render.source_color(s)}"></span>'
        f"{html.escape(render.source_label(s, labels))}</li>" for s in sources[:2])
    terms = "".join(f"<dt>{html.escape(t)}</dt><dd>{html.escape(d)}</dd>" for t, d in GUIDE_TERMS)
    counts = "".join(f"<dt>{html.escape(t)}</dt><dd>{html.escape(d)}</dd>" for t, d in DRAFTER_TERMS)
    return ('<details id="reading-guide" class="reading-guide"><summary>How to read this</summary>'
            '<div class="guide-body">'
            f"<p><b>Colours.</b> {html.escape(COLOUR_TEXT)}</p><ul class=\"guide-colours\">{swatches}</ul>"
            f'<p><b>The line under each panel.</b></p><dl class="guide-terms">{terms}</dl>'
            f'<p><b>Drafters\' own counts</b> (after the figures above).</p><dl class="guide-terms">{counts}</dl>'
            f"<p><b>Lossless check.</b> {html.escape(LOSSLESS_TEXT)}</p>"
            "<p>When a run ends, the line under Run names the fastest method.</p></div></details>")


def legend_with_guide_html(sources: Iterable[str], labels: Mapping[str, str]) -> str:
    """The page's legend (``render.legend_html``) with the guide right under it."""
    sources = list(sources)
    return render.legend_html(sources, labels) + reading_guide_html(sources, labels)


GUIDE_CSS = """
.reading-guide { font-size: 14px; margin: 2px 0 6px 0; }
.reading-guide summary { cursor: pointer; font-weight: 600; }
.reading-guide .guide-body { max-width: 980px; padding: 4px 4px 0 18px; }
.reading-guide ul.guide-colours { list-style: none; padding: 0; margin: 4px 0; display: flex; gap: 18px; }
.reading-guide .guide-swatch { display: inline-block; width: 12px; height: 12px; border-radius: 3px;
                               border: 1px solid #9ca3af; margin-right: 6px; vertical-align: -1px; }
.reading-guide dl.guide-terms { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 4px 0; }
.reading-guide dt { font-weight: 600; } .reading-guide dd { margin: 0; }
"""
"""CSS of the guide (the page adds it to its own)."""


# ----- the verdict ---------------------------------------------------------------------------------
def _speed(stats: Mapping) -> float:
    return float(stats.get("tokens_per_s") or 0.0)


def overall_figures(stats: Mapping, baseline_tokens_per_s: float | None) -> tuple[float | None, float | None]:
    """``(speedup, tau)`` of a method over the whole run, the page's one definition (the stats line's):
    its ``RunStats`` tokens_per_s (prompt processing included) over the baseline's in the same run
    (None without a baseline), and its ``RunStats`` tau (the first token's step included). The verdict
    and the "why this speed" lines both print these."""
    base = float(baseline_tokens_per_s or 0.0)
    speedup = _speed(stats) / base if base > 0 and _speed(stats) > 0 else None
    tau = stats.get("tau")
    return speedup, None if tau is None else float(tau)


MIN_RANKED_TOKENS = 8
"""The verdict ranks the methods' speeds only when the fastest and the baseline made this many tokens:
over fewer (a run stopped at once, or a cap of a few tokens) the prompt's pass and timing noise decide
(a run stopped after its first token crowned a method)."""


def _tokens(d: Mapping) -> float:
    """A method's new tokens in a run summary (infinite when its stats do not say)."""
    n = (d.get("stats") or {}).get("new_tokens")
    return float("inf") if n is None else int(n)


def _tau(stats: Mapping) -> str:
    tau = stats.get("tau")
    return "" if tau is None else f", τ {tau:.2f}"


def _names(labels: list[str]) -> str:
    return labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " and " + labels[-1]


def failed_methods(summary: Mapping | None) -> list[str]:
    """The methods of a run summary that failed (finish reason ``"error"``)."""
    return [m for m, d in ((summary or {}).get("methods") or {}).items() if d.get("finish_reason") == "error"]


def _failed(labels: list[str]) -> str:
    return f"{_names(labels)} failed (see {'its panel' if len(labels) == 1 else 'their panels'})"


def lossless_verdict(summary: Mapping) -> str:
    """The lossless half of the verdict: ``"all outputs identical to the baseline"``, which methods
    differ, or why nothing was compared. Empty when only the baseline ran.

    Reads each method's ``lossless`` (``"match"``, ``"near_tie"``, ``"mismatch"`` or None when not
    checked), ``params`` and ``finish_reason``, and the summary's ``greedy``.
    """
    methods = summary.get("methods") or {}
    others = {m: d for m, d in methods.items() if m != BASELINE and d.get("finish_reason") != "error"}
    if not others:
        return ""
    if BASELINE not in methods:
        return "no baseline ran, so no output was compared"
    if methods[BASELINE].get("finish_reason") == "error":
        return "the baseline failed, so no output was compared"
    if not summary.get("greedy", True):
        return "sampling: outputs are not compared token for token"
    checkable = {m: d for m, d in others.items() if m in METHODS and is_lossless(m, d.get("params") or {})}
    by_kind: dict[str, list[str]] = {}
    for m, d in checkable.items():
        by_kind.setdefault(d.get("lossless") or "unchecked", []).append(d["label"])
    skipped = [d["label"] for m, d in others.items() if m not in checkable]
    parts = []
    if by_kind.get("match"):
        everyone = len(by_kind["match"]) == len(others)
        stopped = any(d.get("finish_reason") == "cancelled" for d in methods.values())
        same = "identical to the baseline" + (" as far as both went (stopped)" if stopped else "")
        parts.append(f"all outputs {same}" if everyone else f"{_names(by_kind['match'])} {same}")
    if by_kind.get("near_tie"):
        parts.append(f"{_names(by_kind['near_tie'])} differ{'s' if len(by_kind['near_tie']) == 1 else ''} "
                     "only at a near tie")
    if by_kind.get("mismatch"):
        parts.append(f"{_names(by_kind['mismatch'])} differ{'s' if len(by_kind['mismatch']) == 1 else ''} "
                     "from the baseline")
    if by_kind.get("unchecked"):
        parts.append(f"{_names(by_kind['unchecked'])} not checked (stopped early)")
    if skipped:
        parts.append(f"{_names(skipped)} not checked (not lossless by design)")
    return "; ".join(parts)


def run_verdict(summary: Mapping | None) -> str:
    """One line summing up a finished run, e.g. ``"Fastest: Prompt lookup, 1.24× the baseline, τ 1.86;
    all outputs identical to the baseline."``

    Args:
        summary: ``RunView.summary()``: ``{"baseline_tokens_per_s", "greedy", "methods": {method:
            {"label", "params", "stats", "lossless", "finish_reason"}}}``.

    Returns:
        the line; empty when no method produced a token.
    """
    everyone = (summary or {}).get("methods") or {}
    failed_keys = failed_methods(summary)
    failed = [everyone[m]["label"] for m in failed_keys]
    methods = {m: d for m, d in everyone.items()
               if _speed(d.get("stats") or {}) > 0 and m not in failed_keys}
    if not methods:
        return f"{_failed(failed)}." if failed else ""
    base = (summary or {}).get("baseline_tokens_per_s") if BASELINE not in failed_keys else None
    others = {m: d for m, d in methods.items() if m != BASELINE}
    if not others:
        head = (f"Only the baseline ran ({_speed(methods[BASELINE]['stats']):.1f} tokens/s): tick a speculative "
                "method to compare")
    else:
        best = max(others, key=lambda m: _speed(others[m]["stats"]))
        d = others[best]
        ratio, _ = overall_figures(d["stats"], base)
        fewest = min([BASELINE, best] if BASELINE in methods else [best], key=lambda m: _tokens(methods[m]))
        if _tokens(methods[fewest]) < MIN_RANKED_TOKENS:  # the prompt's pass and noise would decide
            who = "the baseline" if fewest == BASELINE else methods[fewest]["label"]
            head = f"Too few tokens to rank the speeds ({render.plural(int(_tokens(methods[fewest])), 'token')} from {who})"
        elif ratio is not None:
            if ratio >= 1:
                head = f"Fastest: {d['label']}, {ratio:.2f}× the baseline{_tau(d['stats'])}"
            elif len(others) == 1:
                head = f"{d['label']} ran at {ratio:.2f}× the baseline{_tau(d['stats'])} (slower than plain decoding)"
            else:
                head = (f"No method beat the baseline; the closest: {d['label']}, {ratio:.2f}× the baseline"
                        f"{_tau(d['stats'])}")
        else:
            head = (f"Fastest: {d['label']}, {_speed(d['stats']):.1f} tokens/s{_tau(d['stats'])} "
                    "(tick Autoregressive to see speedups)")
    tail = lossless_verdict(summary or {})
    if failed:
        tail = (f"{tail}; " if tail else "") + _failed(failed)
    return head + (f"; {tail}" if tail else "") + "."


def verdict_html(summary: Mapping | None) -> str:
    """The verdict as a line under the status pill (``#run-verdict``); empty when there is none."""
    text = run_verdict(summary)
    return f'<div id="run-verdict" style="margin-top:4px;font-size:14px">{html.escape(text)}</div>' if text else ""
