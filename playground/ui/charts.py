"""Plotly figures of a run: tokens generated against time, and tokens/s per method.

Figures use ``template="none"`` plus a few explicit layout settings: a figure is resent
whole on every update, and the default template alone is about 7 KB of JSON.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import plotly.graph_objects as go

METHOD_COLORS = ("#2563eb", "#d97706", "#059669", "#db2777", "#7c3aed", "#0891b2")
"""Line and bar colours, by the method's position in the registry."""

_AXIS = dict(showgrid=True, gridcolor="rgba(128,128,128,0.25)", zeroline=False, linecolor="#9ca3af",
             showline=True, ticks="outside", tickcolor="#9ca3af", automargin=True)
# Transparent backgrounds and a mid-grey font read well on the light and the dark theme alike.


def _layout(fig: go.Figure, title: str, x_title: str, y_title: str) -> go.Figure:
    fig.update_layout(
        template="none", title=dict(text=title, x=0.02, font=dict(size=15)), height=320,
        margin=dict(l=60, r=20, t=44, b=50), font=dict(family="sans-serif", size=12, color="#6b7280"),
        paper_bgcolor="rgba(0,0,0,0)", plot_bgcolor="rgba(0,0,0,0)",
        legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1.0),
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
        color = (colors or {}).get(label, METHOD_COLORS[i % len(METHOD_COLORS)])
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=label, line=dict(color=color, width=2.5,
                                                                                    shape="hv")))
    return _layout(fig, "Tokens generated over time", "seconds (each method's own steps)", "new tokens")


def speed_figure(tokens_per_s: Mapping[str, float], colors: Mapping[str, str] | None = None) -> go.Figure:
    """Bar chart of tokens/s per method.

    Args:
        tokens_per_s: method label -> tokens per second (prefill included).
        colors: method label -> bar colour.
    """
    labels = list(tokens_per_s)
    values = [round(v, 2) for v in tokens_per_s.values()]
    bar_colors = [(colors or {}).get(lb, METHOD_COLORS[i % len(METHOD_COLORS)]) for i, lb in enumerate(labels)]
    fig = go.Figure(go.Bar(x=labels, y=values, marker_color=bar_colors, text=[f"{v:.1f}" for v in values],
                           textposition="outside", cliponaxis=False))
    fig = _layout(fig, "Throughput", "", "tokens / s")
    fig.update_layout(showlegend=False)
    return fig
