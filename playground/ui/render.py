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
    "draft": "#bbf7d0",          # green: proposed by the draft model and accepted
    "lookahead": "#fbcfe8",      # pink
    # Medusa: one clearly different hue per head, each saturated enough to stand apart from the
    # target's pale blue and from the other drafters: violet, orange, cyan, red, stone grey
    "medusa_head_1": "#c4b5fd", "medusa_head_2": "#fdba74", "medusa_head_3": "#67e8f9",
    "medusa_head_4": "#fca5a5", "medusa_head_5": "#d6d3d1",
    "suffix": "#eadbc8",         # tan: from a suffix tree (this request's or the global cache)
    "recycling": "#cbd5e1",      # slate: from the token-recycling adjacency table
    # EAGLE: by draft depth, a ramp from lime (depth 1) through teal and sky to rose (depth 10)
    "eagle_d1": "#d9f99d", "eagle_d2": "#a7f3d0", "eagle_d3": "#99f6e4", "eagle_d4": "#a5f3fc",
    "eagle_d5": "#bae6fd", "eagle_d6": "#c7d2fe", "eagle_d7": "#ddd6fe", "eagle_d8": "#f5d0fe",
    "eagle_d9": "#fde2e4", "eagle_d10": "#fecdd3",
}
"""Background colour of each token source: light enough that dark text (:data:`TOKEN_TEXT_COLOR`)
keeps a contrast above 7:1 on every one, in both themes; no two sources share a hue family."""

_SOURCE_WORDS = {"target": "the target", "draft": "the draft model", "prompt_lookup": "prompt lookup",
                 "lookahead": "Lookahead", "suffix": "suffix decoding", "recycling": "token recycling"}
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


def legend_html(sources: Iterable[str], labels: Mapping[str, str]) -> str:
    """HTML legend: one coloured swatch per source."""
    items = []
    for s in dict.fromkeys(sources):
        items.append(f'<span style="display:inline-flex;align-items:center;gap:6px;margin-right:18px">'
                     f'<span style="display:inline-block;width:14px;height:14px;border-radius:3px;'
                     f'border:1px solid #9ca3af;background:{source_color(s)}"></span>'
                     f"{html.escape(source_label(s, labels))}</span>")
    return ('<div id="legend-items" style="font-size:14px;padding:2px 0"><b style="margin-right:12px">'
            "Token source:</b>" + "".join(items) + "</div>")


def plural(n: int, word: str, plural_form: str | None = None) -> str:
    """``"1 token"``, ``"2 tokens"``: the count and the word in the right number."""
    return f"{n} {word if n == 1 else plural_form or word + 's'}"


def _num(x: float | None, fmt: str, missing: str = "–") -> str:
    return missing if x is None else format(x, fmt)


DRAFTER_INFO_LABELS: dict[str, tuple[str, str]] = {
    "pool_ngrams": ("n-gram in the pool", "n-grams in the pool"),
    "pool_hits": ("step with a pool hit", "steps with a pool hit"),
    "table_rows": ("token with a recycling row", "tokens with a recycling row"),
    "steps_with_hits": ("step with a table hit", "steps with a table hit"),
    "cached_outputs": ("earlier output in the cache", "earlier outputs in the cache"),
    "local_hits": ("match in this answer", "matches in this answer"),
    "global_hits": ("match in earlier outputs", "matches in earlier outputs"),
}
"""How the drafters' own counts (``RunStats.drafter``) read in the stats line: ``(singular, plural)``."""


def drafter_figure(key: str, value, labels: Mapping[str, str] | None = None) -> str:
    """One drafter count in words, in the right number: ``"1 step with a pool hit"``, ``"7 steps with a
    pool hit"``; a mixture's ``accepted_<source>`` reads ``"3 tokens accepted from prompt lookup"``;
    an unknown key is made readable (underscores become spaces)."""
    if key in DRAFTER_INFO_LABELS:
        one, many = DRAFTER_INFO_LABELS[key]
        return f"{value} {one if value == 1 else many}"
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
        finish_reason: ``"eos"``, ``"length"``, ``"stop"``, ``"cancelled"`` or None while running.
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
    parts = [
        f"**{new}** new token{'' if new == 1 else 's'}",
        plural(stats.get("steps", 0), "step"),
        f"**{tps:.1f} tok/s**",
        speed,
        f"τ {_num(stats.get('tau'), '.2f')}",
        f"α {_num(None if alpha is None else 100 * alpha, '.0f')}{'' if alpha is None else '%'}",
        f"TTFT {_num(stats.get('ttft_s'), '.2f')} s",
    ]
    parts += [drafter_figure(key, value, _SOURCE_WORDS) for key, value in (stats.get("drafter") or {}).items()]
    if finish_reason is None:  # no "running" mark: a stopped run's last line must not claim it
        return " · ".join(parts)
    done = {"eos": "done (end of text)", "length": "done (max new tokens)", "stop": "done (stop string)",
            "cancelled": "stopped"}.get(finish_reason, finish_reason)
    return " · ".join(parts) + f" · _{done}_"


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
