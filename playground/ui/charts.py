"""Plotly figures of a run: tokens generated against time, and tokens/s per method.

Figures use ``template="none"`` plus a few explicit layout settings: a figure is resent
whole on every update, and the default template alone is about 7 KB of JSON.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import textwrap

import plotly.graph_objects as go

from playground.engine import METHODS

METHOD_COLORS = ("#2563eb", "#d97706", "#059669", "#db2777", "#7c3aed", "#0891b2", "#dc2626", "#65a30d",
                 "#475569", "#8c564b")
"""Line and bar colours, by the method's position in the registry: one hue per method (the registry's
ten methods get ten colours at least 30 CIELAB units apart; the mixture's was a dark yellow 22 from
prompt lookup's amber), mid-tones that read on the light and the dark theme."""
METHOD_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "cross", "x", "star", "triangle-down", "pentagon",
                  "hexagon")
"""Marker symbols, by the method's position in the registry: a second cue besides the colour."""
CURVE_SHADES = ("#374151", "#6b7280", "#9ca3af", "#57534e", "#a8a29e", "#cbd5e1")
CURVE_DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
"""Theory curves are grey, with a dash pattern and a shade each, so they never look like a measured method."""

METHOD_COLOR: dict[str, str] = {}
"""The one method -> colour mapping of every chart (Playground and Benchmark tab alike), keyed by
method name (``medusa``) and by label (``Medusa``): the registry position's colour."""
METHOD_SYMBOL: dict[str, str] = {}
"""Method name or label -> its marker symbol (like :data:`METHOD_COLOR`)."""
for _i, (_name, _info) in enumerate(METHODS.items()):
    METHOD_COLOR[_name] = METHOD_COLOR[_info.label] = METHOD_COLORS[_i % len(METHOD_COLORS)]
    METHOD_SYMBOL[_name] = METHOD_SYMBOL[_info.label] = METHOD_SYMBOLS[_i % len(METHOD_SYMBOLS)]

LEGEND_ROW_PX = 22
"""Height of one row of a horizontal legend (12 px font)."""

_AXIS = dict(showgrid=True, gridcolor="rgba(128,128,128,0.25)", zeroline=False, linecolor="#9ca3af",
             showline=True, ticks="outside", tickcolor="#9ca3af", automargin=True)
# Transparent backgrounds and a mid-grey font read well on the light and the dark theme alike.


def method_color(name_or_label: str, i: int = 0) -> str:
    """A method's colour (by name or label); other series take the palette's ``i``-th colour."""
    return METHOD_COLOR.get(name_or_label, METHOD_COLORS[i % len(METHOD_COLORS)])


def method_symbol(name_or_label: str, i: int = 0) -> str:
    """A method's marker symbol (by name or label); other series take the ``i``-th symbol."""
    return METHOD_SYMBOL.get(name_or_label, METHOD_SYMBOLS[i % len(METHOD_SYMBOLS)])


def _layout(fig: go.Figure, title: str, x_title: str, y_title: str, height: int = 320) -> go.Figure:
    """Title at the top left; the legend (when shown) in one or more horizontal rows at the
    bottom of the figure, below the x-axis title, so it never covers the title or the data.
    The bottom margin makes room for as many legend rows as the series need."""
    names = [t.name for t in fig.data if t.name and t.showlegend is not False]
    # A rough upper bound of the legend rows: about 6 px per character plus the swatch, in a
    # figure at least 420 px wide; an overestimate leaves a little blank space, never an overlap.
    width = sum(6 * len(n) + 50 for n in names)
    rows = 0 if not names else max(1, -(-width // 420))
    legend_px = rows * LEGEND_ROW_PX
    fig.update_layout(
        # y=1 with a padding in pixels: a fraction of the height put a tall figure's title onto its first row
        template="none", title=dict(text=title, x=0.02, xanchor="left", y=1.0, yanchor="top", yref="container",
                                    pad=dict(t=8), font=dict(size=15)),
        height=height + legend_px,
        margin=dict(l=60, r=20, t=44, b=50 + legend_px), font=dict(family="sans-serif", size=12, color="#6b7280"),
        paper_bgcolor="rgba(0,0,0,0)", plot_bgcolor="rgba(0,0,0,0)", showlegend=rows > 0,
        legend=dict(orientation="h", yref="container", y=0.0, yanchor="bottom", xanchor="left", x=0.0,
                    font=dict(size=12)),
    )
    fig.update_xaxes(title_text=x_title, **_AXIS)
    fig.update_yaxes(title_text=y_title, rangemode="tozero", **_AXIS)
    return fig


def timeline_figure(series: Mapping[str, Sequence[tuple[float, int]]],
                    colors: Mapping[str, str] | None = None) -> go.Figure:
    """Tokens generated against time, one line per method.

    Args:
        series: method label -> ``[(elapsed_s, new_tokens), ...]`` after each step (the
            ``RunStats.timeline``); each line starts at (0, 0).
        colors: method label -> line colour.

    Time is each method's own clock: side-by-side runs step round-robin, so a method's
    elapsed time counts only its own steps.
    """
    fig = go.Figure()
    for i, (label, points) in enumerate(series.items()):
        xs = [0.0] + [round(t, 4) for t, _ in points]
        ys = [0] + [n for _, n in points]
        color = _color(colors, label, i)
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=label, line=dict(color=color, width=2.5,
                                                                                    shape="hv")))
    return _layout(fig, "Tokens generated over time", "time (s, each method's own steps)", "new tokens (tokens)")


def speed_figure(tokens_per_s: Mapping[str, float], colors: Mapping[str, str] | None = None) -> go.Figure:
    """Bar chart of tokens/s per method.

    Args:
        tokens_per_s: method label -> tokens per second (prefill included).
        colors: method label -> bar colour.
    """
    labels = list(tokens_per_s)
    values = [round(v, 2) for v in tokens_per_s.values()]
    bar_colors = [_color(colors, lb, i) for i, lb in enumerate(labels)]
    # The text from the unrounded values, as the stats lines print them (8.2549 read 8.2 here, 8.3 there).
    fig = go.Figure(go.Bar(x=labels, y=values, marker_color=bar_colors,
                           text=[f"{v:.1f}" for v in tokens_per_s.values()], textposition="outside", cliponaxis=False))
    fig = _layout(fig, "Throughput", "method", "tokens / s")
    # Room below for slanted names: with ten methods the fixed margin cut them ("Autoregressi").
    fig.update_layout(showlegend=False)
    fig.update_xaxes(automargin=True)
    return fig


def _color(colors: Mapping[str, str] | None, label: str, i: int) -> str:
    return (colors or {}).get(label) or method_color(label, i)


EMPTY_NOTE_CHARS = 30
"""Longest line of an empty figure's note: short lines fit even the narrow draft-panel chart."""


def empty_figure(title: str, message: str, height: int = 320) -> go.Figure:
    """A figure with only a title and a grey note in the middle (no data yet); the note wraps
    onto short lines so a narrow chart does not clip it."""
    fig = _layout(go.Figure(), title, "", "", height=height)
    fig.add_annotation(text="<br>".join(textwrap.wrap(message, EMPTY_NOTE_CHARS)), showarrow=False,
                       x=0.5, y=0.5, xref="paper", yref="paper", font=dict(size=13, color="#9ca3af"))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


STEP_ROW_PX = 110
"""Height of one method's row in the small multiples of tokens per step."""


def tokens_per_step_figure(series: Mapping[str, Sequence[int]],
                           colors: Mapping[str, str] | None = None) -> go.Figure:
    """Tokens emitted by each step over the run (accepted drafts plus the bonus token), as small
    multiples: one row per method, titled with its label, sharing the step axis, so no two
    methods' steps overlap.

    Args:
        series: method label -> tokens emitted by step 0 (the prefill), 1, 2, ...
        colors: method label -> colour.
    """
    series = {k: list(v) for k, v in series.items() if v}
    if not series:
        return empty_figure("Accepted tokens per step", "run a comparison to see each step")
    from plotly.subplots import make_subplots

    rows = len(series)
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, subplot_titles=list(series),
                        vertical_spacing=min(0.12, 0.5 / rows))
    top = max(max(c) for c in series.values())
    for i, (label, counts) in enumerate(series.items()):
        fig.add_trace(go.Bar(x=list(range(len(counts))), y=counts, name=label, showlegend=False,
                             marker_color=_color(colors, label, i),
                             hovertemplate=f"{label}<br>step %{{x}}: %{{y}} tokens<extra></extra>"), row=i + 1, col=1)
    fig = _layout(fig, "Accepted tokens per step (bonus token included), one row per method", "", "",
                  height=88 + STEP_ROW_PX * rows)
    fig.update_layout(showlegend=False, bargap=0.15, margin=dict(t=72))  # 28 px more room for the first row's title
    fig.update_yaxes(range=[0, top + 0.5], dtick=1 if top <= 6 else None, title_text="tokens")
    fig.update_xaxes(title_text="step (one target pass each; step 0 reads the prompt)", row=rows, col=1)
    for a in fig.layout.annotations:  # subplot titles: left-aligned, the page's font size
        a.update(x=0.0, xanchor="left", font=dict(size=12))
    return fig


def tokens_per_step_histogram(series: Mapping[str, Sequence[int]],
                              colors: Mapping[str, str] | None = None) -> go.Figure:
    """Share of steps that emitted 1, 2, 3, ... tokens, per method (grouped bars).

    Args:
        series: method label -> tokens emitted by each step.
    """
    if not any(series.values()):
        return empty_figure("Tokens per step: histogram", "run a comparison to see the distribution")
    top = max(max(c) for c in series.values() if c)
    xs = list(range(1, top + 1))
    fig = go.Figure()
    for i, (label, counts) in enumerate(series.items()):
        if not counts:
            continue
        share = [round(sum(1 for c in counts if c == x) / len(counts), 4) for x in xs]
        fig.add_trace(go.Bar(x=xs, y=share, name=label, marker_color=_color(colors, label, i)))
    fig = _layout(fig, "Tokens per step: histogram", "tokens emitted by a step (tokens)", "share of steps (0–1)")
    fig.update_layout(barmode="group")
    fig.update_xaxes(dtick=1)
    return fig


def per_position_figure(series: Mapping[str, Sequence[float]],
                        colors: Mapping[str, str] | None = None) -> go.Figure:
    """Acceptance rate of the i-th drafted token, among steps that drafted one, per method.

    Args:
        series: method label -> ``RunStats.per_position_acceptance`` (position 1 first).
    """
    series = {k: v for k, v in series.items() if v}
    if not series:
        return empty_figure("Acceptance by draft position", "no method drafted tokens in the last run")
    fig = go.Figure()
    for i, (label, rates) in enumerate(series.items()):
        fig.add_trace(go.Scatter(x=list(range(1, len(rates) + 1)), y=[round(r, 4) for r in rates],
                                 mode="lines+markers", name=label, line=dict(color=_color(colors, label, i)),
                                 marker=dict(symbol=method_symbol(label, i), size=8)))
    fig = _layout(fig, "Acceptance by draft position", "position in the draft (1 = first drafted token)",
                  "acceptance rate (0–1)")
    fig.update_yaxes(range=[0, 1.05])
    fig.update_xaxes(dtick=1)
    return fig


def time_split_figure(split: Mapping[str, tuple[float, float]]) -> go.Figure:
    """Seconds spent drafting and verifying per method (stacked horizontal bars; prefill excluded).

    "Drafting" is a step's time before its target pass: the drafter's proposal, the budget and the
    step's setup, which the baseline has too (a millisecond or so a step, more while the page's own
    work competes for the CPU).

    Args:
        split: method label -> ``(draft_s, verify_s)``.
    """
    if not split:
        return empty_figure("Draft vs verify time", "run a comparison to see the split")
    labels = list(split)
    fig = go.Figure([
        go.Bar(y=labels, x=[round(split[lb][0], 4) for lb in labels], name="drafting and step setup", orientation="h",
               marker_color="#f59e0b"),
        go.Bar(y=labels, x=[round(split[lb][1], 4) for lb in labels], name="verifying (target pass)",
               orientation="h", marker_color="#3b82f6"),
    ])
    fig = _layout(fig, "Draft vs verify time (decode steps)", "time (s)", "method")
    fig.update_layout(barmode="stack")
    # The margin grows to fit the longest method name and the title beside it (they overlapped).
    fig.update_yaxes(rangemode="normal", automargin=True, title_standoff=10)
    return fig


def theory_figure(curves: Mapping[str, tuple[Sequence[float], Sequence[float]]],
                  points: Sequence[dict] = (), title: str = "Expected speedup vs acceptance rate",
                  styles: Sequence[tuple[int, int]] | None = None) -> go.Figure:
    """Expected-speedup curves against alpha, with measured points overlaid.

    Curves are grey, one dash pattern each; each measured point has its method's colour and marker
    symbol and a legend entry of its own (its label, alpha and speedup) rather than a text label
    on the chart, so points that lie close together stay readable.

    Args:
        curves: curve label (e.g. ``"K=4, c=0.05"``) -> ``(alphas, speedups)``.
        points: measured runs: ``{"label", "alpha", "speedup", "text"}`` each, with ``"method"`` (a
            method name or label) choosing the colour and symbol.
        styles: per curve ``(dash, shade)``: the index of its dash pattern and of its grey, darkest
            first (the Theory tab: the dash by K, the grey by c, so 20 curves read as a grid); by
            default each curve its own of both.
    """
    fig = go.Figure()
    for i, (label, (xs, ys)) in enumerate(curves.items()):
        dash, shade = styles[i] if styles is not None else (i, i)
        fig.add_trace(go.Scatter(x=list(xs), y=[round(y, 4) for y in ys], mode="lines", name=label,
                                 line=dict(color=CURVE_SHADES[shade % len(CURVE_SHADES)], width=2,
                                           dash=CURVE_DASHES[dash % len(CURVE_DASHES)])))
    for i, p in enumerate(points):
        key = p.get("method", p["label"])
        fig.add_trace(go.Scatter(x=[p["alpha"]], y=[p["speedup"]], mode="markers", name=p.get("text", p["label"]),
                                 marker=dict(size=13, symbol=method_symbol(key, i), color=method_color(key, i),
                                             line=dict(color="#ffffff", width=1.5)),
                                 hovertemplate=f"{html_escape(p.get('text', p['label']))}<extra></extra>"))
    fig.add_hline(y=1.0, line=dict(color="#9ca3af", dash="dot", width=1))
    fig = _layout(fig, title, "acceptance rate α (accepted / drafted, 0–1)", "expected speedup (× plain decoding)",
                  height=420)
    fig.update_xaxes(range=[0, 1])
    return fig


def html_escape(text: str) -> str:
    """``text`` safe inside a Plotly hover template (HTML-escaped)."""
    import html

    return html.escape(text)


def bench_speedup_figure(rows: Sequence[dict], baseline: str = "autoregressive") -> go.Figure:
    """Grouped bars: speedup over the baseline per category (and overall), one bar per method.

    Args:
        rows: ``playground.bench.summarize`` rows (category, method, speedup, ...).
    """
    methods = [m for m in dict.fromkeys(r["method"] for r in rows) if m != baseline]
    if not methods:
        return empty_figure("Speedup by category", "run a benchmark with at least one method besides the baseline")
    cats = list(dict.fromkeys(r["category"] for r in rows))
    by = {(r["category"], r["method"]): r for r in rows}
    fig = go.Figure()
    for i, m in enumerate(methods):
        ys = [by[(c, m)]["speedup"] if (c, m) in by and by[(c, m)]["speedup"] is not None else None for c in cats]
        fig.add_trace(go.Bar(x=cats, y=ys, name=m, marker_color=method_color(m, i + 1),
                             text=[None if y is None else f"{y:.2f}×" for y in ys], textposition="outside",
                             cliponaxis=False))
    fig.add_hline(y=1.0, line=dict(color="#9ca3af", dash="dot", width=1))
    fig = _layout(fig, "Speedup over autoregressive, by category", "", "speedup (×)", height=360)
    fig.update_layout(barmode="group")
    return fig


def bench_tau_figure(rows: Sequence[dict], overall_label: str = "overall") -> go.Figure:
    """Bars of tau (mean tokens per step, bonus included), overall, per method: the rows whose
    category is ``overall_label`` (as the rows name it: the Benchmark tab titles it "Overall")."""
    overall = [r for r in rows if r["category"] == overall_label]
    if not overall:
        return empty_figure("Tau per method", "run a benchmark")
    labels = [r["method"] for r in overall]
    ys = [round(r["tau"], 3) for r in overall]
    fig = go.Figure(go.Bar(x=labels, y=ys, marker_color=[method_color(m, i) for i, m in enumerate(labels)],
                           text=[f"{y:.2f}" for y in ys], textposition="outside", cliponaxis=False))
    fig = _layout(fig, "Tau: mean tokens per step (overall)", "", "tokens / step", height=360)
    fig.update_layout(showlegend=False)
    return fig
