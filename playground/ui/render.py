"""Text rendering for the UI: coloured tokens, the legend, stats lines and lossless badges.

Everything here turns plain data (text pieces with their source tags, statistics dicts)
into HTML or Markdown strings; nothing imports gradio or touches a model. Token colours
come from the source tag each token carries (provenance is data: nothing here re-finds
tokens in decoded text).
"""

from __future__ import annotations

import html
from typing import Iterable, Mapping

SOURCE_COLORS: dict[str, str] = {
    "target": "#dbeafe",         # pale blue: the target's own (bonus / correction) token
    "prompt_lookup": "#fde68a",  # yellow: copied from the prompt and accepted
    "draft": "#86efac",          # green: proposed by the draft model and accepted
    "lookahead": "#fbcfe8",      # pink
    # Medusa: one clearly different hue per head, each saturated enough to stand apart from the
    # target's pale blue and from the other drafters: violet, orange, cyan, red, stone grey
    "medusa_head_1": "#c4b5fd", "medusa_head_2": "#fdba74", "medusa_head_3": "#67e8f9",
    "medusa_head_4": "#fca5a5", "medusa_head_5": "#d6d3d1",
    "suffix": "#f3cfa4",         # tan: from a suffix tree (this request's or the global cache)
    "recycling": "#c9d6a3",      # sage: from the token-recycling adjacency table
    "rest": "#64b8f0",           # sky blue (apart from Medusa's violet first head): from the REST datastore
    "eagle": "#2dd4bf",          # teal, deeper than the draft's green: EAGLE's head as a mixture member
                                 # (alone, its depths have a ramp)
    # EAGLE: by draft depth, a ramp from pale lime (depth 1) through teal and blue to rose (depth 10)
    "eagle_d1": "#e9f5a0", "eagle_d2": "#bdf0dc", "eagle_d3": "#7ee0d0", "eagle_d4": "#a5f3fc",
    "eagle_d5": "#93c5fd", "eagle_d6": "#c7d2fe", "eagle_d7": "#e4c1f9", "eagle_d8": "#f9a8d4",
    "eagle_d9": "#fde2e4", "eagle_d10": "#fda4af",
}
"""Background colour of each token source: light enough that dark text (:data:`TOKEN_TEXT_COLOR`)
keeps a contrast above 7:1 on every one, in both themes. Sources that can share a panel (one method's
sources; a mixture's members) differ by a CIE76 colour difference of at least 14 (tests check it); the
draft's green and EAGLE's depth 1, the suffix tan and the recycling sage are far apart."""

_SOURCE_WORDS = {"target": "the target", "draft": "the draft model", "prompt_lookup": "prompt lookup",
                 "lookahead": "Lookahead", "suffix": "suffix decoding", "recycling": "token recycling",
                 "rest": "the REST datastore",
                 "eagle": "the EAGLE head"}
"""Sources as a word in a sentence (``accepted from prompt lookup``)."""

_FALLBACK_COLORS = ("#a5b4fc", "#fcd34d", "#86efac", "#f0abfc", "#fecaca", "#e9d5ff", "#99f6e4", "#fef08a")
TOKEN_TEXT_COLOR = "#111827"

TOKENS_CSS = """
.tokens { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 14px;
          line-height: 1.7; white-space: pre-wrap; overflow-wrap: normal; word-break: normal; overflow-x: auto;
          min-height: 9em;
          padding: 8px 10px; border: 1px solid var(--border-color-primary, #e5e7eb);
          border-radius: 8px; background: var(--background-fill-primary, #fff);
          color: var(--body-text-color, #111827); }
.tokens .tok { border-radius: 3px; padding: 1px 0; color: #111827; }
.tokens .placeholder { color: var(--body-text-color-subdued, #6b7280); font-style: italic; }
"""
"""CSS of the token panels (scoped to the panel by ``gr.HTML(css_template=...)``). Lines wrap at spaces only,
never inside a word or identifier (``pre-wrap`` keeps indentation); a longer unbroken run of text
scrolls sideways inside the panel."""


def source_color(source: str) -> str:
    """Background colour of a token source; unknown sources (``medusa_head_2``, ...) get a stable colour."""
    if source in SOURCE_COLORS:
        return SOURCE_COLORS[source]
    return _FALLBACK_COLORS[sum(map(ord, source)) % len(_FALLBACK_COLORS)]


def source_label(source: str, labels: Mapping[str, str]) -> str:
    """Legend text of a source: the engine's label, else the tag made readable."""
    if source in labels:
        return labels[source]
    if source.startswith("medusa_head_"):
        return f"Medusa head {source.removeprefix('medusa_head_')}"
    return source.replace("_", " ")


def token_spans(pieces: Iterable[tuple[str, str]], labels: Mapping[str, str] | None = None) -> str:
    """HTML of text pieces, one ``<span>`` per piece, coloured by its source.

    The result is meant to be *appended* to what came before (the panel's value only
    grows during a run, so Gradio streams it as an append-only diff). Text is
    HTML-escaped; each span's title names its source.

    Args:
        pieces: ``(text, source)`` pairs as carried by ``StepEvent.pieces``.
        labels: source -> legend text, used for the hover titles.
    """
    out = []
    for text, source in pieces:
        if not text:
            continue
        title = html.escape(source_label(source, labels or {}), quote=True)
        out.append(f'<span class="tok" data-source="{html.escape(source, quote=True)}" title="{title}" '
                   f'style="background:{source_color(source)};color:{TOKEN_TEXT_COLOR}">'
                   f"{html.escape(text)}</span>")
    return "".join(out)


def placeholder(text: str) -> str:
    """HTML of a grey placeholder line shown in an empty panel."""
    return f'<span class="placeholder">{html.escape(text)}</span>'


_SWATCH = "display:inline-block;width:14px;height:14px;border:1px solid #9ca3af;background:{}"


def _depth(source: str) -> int | None:
    """The depth of an EAGLE source tag (``eagle_d3`` -> 3), else None."""
    rest = source.removeprefix("eagle_d")
    return int(rest) if rest != source and rest.isdigit() else None


def legend_html(sources: Iterable[str], labels: Mapping[str, str]) -> str:
    """HTML legend (``#legend-items``): one coloured swatch per source; EAGLE's depths (``eagle_d1``, ...)
    as one entry, a ramp of their swatches (each titled with its depth) labelled ``EAGLE depth 1–N``."""
    sources = list(dict.fromkeys(sources))
    depths = [s for s in sources if _depth(s) is not None]
    items = []
    for s in sources:
        if s in depths[1:]:
            continue
        if s in depths:  # the first depth stands for the whole ramp
            ramp = "".join(f'<span class="ramp-step" title="{html.escape(source_label(d, labels), quote=True)}" '
                           f'style="{_SWATCH.format(source_color(d))};border-radius:0"></span>' for d in depths)
            last = max(_depth(d) for d in depths)
            text = f"EAGLE depth 1–{last}" if last > 1 else "EAGLE depth 1"
            items.append(f'<span class="legend-item legend-ramp" style="display:inline-flex;align-items:center;'
                         f'gap:6px;margin-right:18px"><span style="display:inline-flex">{ramp}</span>'
                         f"{html.escape(text)}</span>")
            continue
        items.append(f'<span class="legend-item" data-source="{html.escape(s, quote=True)}" '
                     f'style="display:inline-flex;align-items:center;gap:6px;margin-right:18px">'
                     f'<span style="{_SWATCH.format(source_color(s))};border-radius:3px"></span>'
                     f"{html.escape(source_label(s, labels))}</span>")
    return ('<div id="legend-items" style="font-size:14px;padding:2px 0"><b style="margin-right:12px">'
            "Token source:</b>" + "".join(items) + "</div>")


def plural(n: int, word: str, plural_form: str | None = None) -> str:
    """``"1 token"``, ``"2 tokens"``: the count and the word in the right number."""
    return f"{n} {word if n == 1 else plural_form or word + 's'}"


def _num(x: float | None, fmt: str, missing: str = "–") -> str:
    return missing if x is None else format(x, fmt)


def percent_text(x) -> str:
    """An acceptance rate alpha (a fraction, or the CLI's printed cell ``0.523``) as the page shows it
    everywhere: ``52%``; ``-`` when there is none (no drafted token, or not a number)."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return "-"
    return "-" if x != x else f"{100 * x:.0f}%"


DRAFTER_INFO_LABELS: dict[str, tuple[str, str]] = {
    "pool_ngrams": ("n-gram in the pool", "n-grams in the pool"),
    "pool_hits": ("step with a pool hit", "steps with a pool hit"),
    "table_rows": ("token with a recycling row", "tokens with a recycling row"),
    "steps_with_hits": ("step with a table hit", "steps with a table hit"),
    "cached_outputs": ("earlier output in the cache", "earlier outputs in the cache"),
    "local_hits": ("match in this answer", "matches in this answer"),
    "global_hits": ("match in earlier outputs", "matches in earlier outputs"),
    "mean_tree_nodes": ("mean tree node per step", "mean tree nodes per step"),
    "datastore_tokens": ("token in the datastore", "tokens in the datastore"),
    "datastore_hits": ("step with a datastore hit", "steps with a datastore hit"),
}
"""How the drafters' own counts (``RunStats.drafter``) read in the stats line: ``(singular, plural)``."""


HIDDEN_DRAFTER_INFO = frozenset({"tree_nodes"})
"""Drafter counts the stats line leaves out: EAGLE's latest tree size repeats its mean (``mean_tree_nodes``)."""


def drafter_figure(key: str, value, labels: Mapping[str, str] | None = None) -> str:
    """One drafter count in words, in the right number: ``"1 step with a pool hit"``, ``"7 steps with a
    pool hit"``; a mixture's ``accepted_<source>`` reads ``"3 tokens accepted from prompt lookup"``;
    an unknown key is made readable (underscores become spaces)."""
    if key in DRAFTER_INFO_LABELS:
        one, many = DRAFTER_INFO_LABELS[key]
        shown = f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else value
        return f"{shown} {one if value == 1 else many}"
    if key.startswith("accepted_"):
        source = source_label(key.removeprefix("accepted_"), labels or {})
        return f"{plural(value, 'token')} accepted from {source}"
    return f"{value} {key.replace('_', ' ')}"


def stats_line(stats: Mapping, *, baseline_tokens_per_s: float | None, is_baseline: bool,
               finish_reason: str | None = None) -> str:
    """One Markdown line of a method's running statistics.

    Args:
        stats: ``RunStats.as_dict()`` (new_tokens, steps, tokens_per_s, tau, alpha, ttft_s, ...);
            its ``drafter`` figures (e.g. Lookahead's pool size and hits) follow the totals.
        baseline_tokens_per_s: the autoregressive baseline's tokens/s in the same run,
            None when no baseline ran (no speedup shown).
        is_baseline: this method is the baseline (speedup shown as 1.00x).
        finish_reason: ``"eos"``, ``"length"``, ``"stop"``, ``"cancelled"``, ``"error"`` or None while running.
    """
    tps = stats.get("tokens_per_s") or 0.0
    if is_baseline:
        speed = "1.00× (baseline)"
    elif baseline_tokens_per_s:
        speed = f"{tps / baseline_tokens_per_s:.2f}× vs autoregressive"
    else:
        speed = "speedup – (no baseline)"
    alpha = stats.get("alpha")
    new = stats.get("new_tokens", 0)
    nb = "\u00a0"  # a non-breaking space: a label and its value stay on one line ("τ 1.00", never "τ" / "1.00")
    parts = [
        f"**{new}**{nb}new token{'' if new == 1 else 's'}",
        plural(stats.get("steps", 0), "step").replace(" ", nb, 1),
        f"**{tps:.1f}{nb}tok/s**",
        speed,
        f"τ{nb}{_num(stats.get('tau'), '.2f')}",
        f"α{nb}{_num(None if alpha is None else 100 * alpha, '.0f')}{'' if alpha is None else '%'}",
        f"TTFT{nb}{_num(stats.get('ttft_s'), '.2f')}{nb}s",
    ]
    parts += [drafter_figure(key, value, _SOURCE_WORDS).replace(" ", nb, 1)
              for key, value in (stats.get("drafter") or {}).items() if key not in HIDDEN_DRAFTER_INFO]
    if finish_reason is not None:  # no "running" mark while running: a stopped run's last line must not claim it
        done = {"eos": "done (end of text)", "length": "done (max new tokens)", "stop": "done (stop string)",
                "cancelled": "stopped", "error": "failed"}.get(finish_reason, finish_reason)
        parts.append(f"_{done}_")
    # The line wraps at the " · " separators and between words of a longer phrase, never between a
    # number and what it counts.
    return " · ".join(parts)


_PILL = {  # kind -> (symbol, background, text colour); symbols common text fonts have (no emoji font needed)
    "match": ("✓", "#dcfce7", "#14532d"),
    "done": ("✓", "#dcfce7", "#14532d"),
    "mismatch": ("✗", "#fee2e2", "#7f1d1d"),
    "error": ("✗", "#fee2e2", "#7f1d1d"),
    "near_tie": ("⚠", "#fef3c7", "#78350f"),
    "warning": ("⚠", "#fef3c7", "#78350f"),
    "running": ("●", "#dbeafe", "#1e3a8a"),
    "stopped": ("■", "#f3f4f6", "#374151"),
    "info": ("ℹ", "#f3f4f6", "#374151"),
}


def _pill(kind: str, html_text: str) -> str:
    symbol, bg, fg = _PILL.get(kind, _PILL["info"])
    return (f'<div class="pill pill-{kind}" style="display:inline-block;background:{bg};color:{fg};'
            f'border-radius:6px;padding:4px 10px;font-size:14px;line-height:1.45">'
            f"{symbol} {html_text}</div>")


def badge(kind: str, message: str) -> str:
    """HTML badge of a lossless check: a coloured pill.

    Args:
        kind: ``"match"`` (green), ``"mismatch"`` (red), ``"near_tie"`` (amber) or ``"info"`` (grey).
        message: the text (e.g. ``LosslessCheck.message()``); it is escaped.
    """
    return _pill(kind, f'<b style="color:inherit">Lossless check:</b> {html.escape(message)}')


def status_html(kind: str, message: str) -> str:
    """HTML of the status line: a coloured pill.

    Args:
        kind: ``"running"``, ``"done"``, ``"warning"`` (bad input), ``"error"`` (unexpected
            failure) or ``"stopped"``.
        message: the text; it is escaped.
    """
    return _pill(kind, html.escape(message))


def header_markdown(title: str, target: str, draft: str | None, device: str, dtype: str) -> str:
    """The page header: title and what is loaded where."""
    return (f"# {title}\n"
            f"**Target:** {target} &nbsp;·&nbsp; **Draft:** {draft or 'none'} &nbsp;·&nbsp; "
            f"**Device:** {device} &nbsp;·&nbsp; **dtype:** {dtype}")
