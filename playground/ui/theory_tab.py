"""The Theory tab: expected speedup against acceptance rate, for several K and draft costs c.

Formulas from :mod:`playground.engine.theory` (Leviathan et al. 2023): expected tokens per step
(1 - alpha^(K+1)) / (1 - alpha), step cost K*c + verify_cost(K+1), speedup = their ratio.
The verify cost is measured on this device with the loaded target the first time the tab opens
(cached per engine in :data:`insight.VERIFY_COSTS`); until then the chain curve the per-step
budget timed on this device at the first run, if any; before that, or on request, the project's own
measurement on another CPU (``theory.FALLBACK``, from ``assets/measurements.json``, which
``python -m playground.measure --verify-cost`` rewrites) or the paper's constant 1 is used. The
measured curve is the engine's one kept curve (``Engine.verify_cost``), which the "why this speed"
lines, the draft panel and the advisor read too. Whatever the source, the cost used and shown is
fitted robustly to a non-decreasing curve (``VerifyCost.monotone``: spikes capped, then isotonic
regression), since timings on a busy machine are noisy. The last run's measured (alpha, speedup) points are
overlaid.
"""

from __future__ import annotations

import html

import gradio as gr

from playground.engine import MAX_SPECULATIVE_TOKENS, Knob, theory

from . import charts, insight, knobs, worker
from .run_control import in_joined_thread

K_CHOICES = [1, 2, 3, 4, 6, 8, 12, 16]
C_CHOICES = [0.0, 0.02, 0.05, 0.1, 0.2, 0.5]
MEASURED, FALLBACK, CONSTANT = ("measured on this device", "measured by the project on another CPU",
                                "constant 1 (paper's assumption)")
MEASURE_SIZES = sorted({*theory.DEFAULT_MEASURE_SIZES, MAX_SPECULATIVE_TOKENS + 1})
"""Tokens per forward shown in the tab's cost row: K + 1 for K = 1, 2, 4, 8, 16 (the engine's curve
is measured at ``theory.VERIFY_COST_SIZES``, which hold these)."""
ALPHAS = [i / 100 for i in range(0, 101)]
ALPHA_KNOB = Knob("alpha", "Acceptance rate α (for the optimal K)", 0.0, 1.0, 0.7, step=0.01, integer=False)
C_KNOB = Knob("c", "Draft cost c (for the optimal K)", 0.0, 1.0, 0.05, step=0.01, integer=False)
"""The two inputs of the optimal K: a typed value out of range is clamped with a message (:mod:`.knobs`);
an empty or unusable one leaves the curves drawn and says what the optimal K needs."""


def _optimal_k_inputs(alpha, c) -> tuple[float, float] | str:
    """``(alpha, c)`` as numbers in their ranges, or the Markdown that says which is not."""
    for knob, value in ((ALPHA_KNOB, alpha), (C_KNOB, c)):
        try:
            knob.check(value)
        except ValueError:
            got = "nothing" if value is None or value == "" else html.escape(str(value))
            return (f"**{knob.label.split(' (')[0]}: give a number from {knobs.range_text(knob)} "
                    f"(got {got}) for the optimal K.**")
    return float(alpha), float(c)
SMOOTHED_NOTE = " (made non-decreasing in n)"
"""What ``VerifyCost.monotone`` appends to a cost's source; the tab says it in words instead."""


def _cost(mode: str, engine_key: str) -> tuple[theory.VerifyCost, theory.VerifyCost]:
    """``(cost used, raw table)`` for ``mode``. The cost used is the raw table made non-decreasing
    (:meth:`theory.VerifyCost.monotone`): a forward over more tokens never costs less, so a dip in
    a measurement is timing noise (a busy machine), and believing it would overrate bigger K."""
    if mode == CONSTANT:
        raw = theory.CONSTANT_VERIFY_COST
    elif mode == MEASURED:
        raw = insight.verify_cost_for(engine_key)
    else:
        raw = theory.FALLBACK
    return raw.monotone(), raw


def verify_cost_markdown(cost: theory.VerifyCost, raw: theory.VerifyCost, sizes=(1, 2, 3, 5, 9, 17)) -> str:
    """The verify-cost row shown under the chart: the fitted non-decreasing cost, and where the fit
    differs from the raw timing, the raw value too, with a word on noise."""
    rows = " | ".join(f"{n}: {cost(n):.2f}" for n in sizes)
    moved = [n for n in sorted(raw.table) if abs(cost(n) - raw(n)) > 0.005]
    md = f"**Verify cost** (tokens per forward: relative cost, fitted non-decreasing) {rows}"
    if moved:
        md += ("  \nSmoothed where a timing stood out from its neighbours: "
               + ", ".join(f"{n} tokens timed {raw(n):.2f}, fitted {cost(n):.2f}" for n in moved)
               + ". A forward over more tokens never costs less, and one size timed far above both neighbours "
               "is noise: such a point is capped at its neighbours, then dips are averaged with them, so one "
               "noisy timing cannot lift the whole curve.")
    if raw.seconds:
        md += ("  \nTimings on a busy machine (another run, the benchmark, other programs) are noisy: "
               "press **Measure again** when it is quiet.")
    return md + f"  \n_{html.escape(insight.verify_cost_source(cost))}_"


def measured_points(summary: dict | None) -> list[dict]:
    """(alpha, speedup) of each drafting method of the last run, when a baseline ran too."""
    if not summary or not summary.get("baseline_tokens_per_s"):
        return []
    base = summary["baseline_tokens_per_s"]
    points = []
    for m, d in summary.get("methods", {}).items():
        st = d.get("stats") or {}
        if st.get("alpha") is None or not st.get("tokens_per_s"):
            continue
        k = (d.get("params") or {}).get("k")
        label = d["label"] + (f" (K={k})" if k else "")
        speedup = st["tokens_per_s"] / base
        points.append({"label": f"measured: {label}", "method": m, "alpha": round(st["alpha"], 4),
                       "speedup": round(speedup, 4), "text": f"measured: {label}: α {100 * st['alpha']:.0f}%, {speedup:.2f}×"})
    return points


def render(alpha, c, ks, cs, mode, summary, engine_key: str) -> tuple:
    """The figure and the Markdown summary for the controls' values.

    Returns:
        ``(figure, markdown)``; bad values give an empty figure and a message (never raise).
    """
    try:
        cost, raw = _cost(mode, engine_key)
        ks = sorted(int(k) for k in (ks or []))
        cs = sorted(float(x) for x in (cs or []))
        curves, styles = {}, []  # one dash pattern per K, one grey per c
        for i, k in enumerate(ks):
            for j, cc in enumerate(cs):
                curves[f"K={k}, c={cc:g}"] = (ALPHAS, [theory.expected_speedup(a, k, cc, cost) for a in ALPHAS])
                styles.append((i, j))
        fig = charts.theory_figure(curves, measured_points(summary),
                                   title=f"Expected speedup vs alpha (verify cost: {mode})", styles=styles)
        checked = _optimal_k_inputs(alpha, c)
        if isinstance(checked, str):
            head = checked
        else:
            alpha, c = checked
            best_k, best = theory.optimal_k(alpha, c, cost)
            tau = theory.expected_tokens_per_step(alpha, best_k)
            verdict = "" if best > 1 else " **Speculation does not pay here: plain decoding is faster.**"
            head = (f"### Optimal K for α = {100 * alpha:.0f}%, c = {c:g}: **K = {best_k}** "
                    f"(expected {best:.2f}×, τ = {tau:.2f}).{verdict}")
        md = (f"{head}\n\nExpected tokens per step (1 − α^(K+1)) / (1 − α); cost per step K·c + (verify cost of K + 1 "
              f"tokens), in single-token target forwards (Leviathan et al. 2023).\n\n"
              + verify_cost_markdown(cost, raw))
        if not curves:
            md = "Tick at least one K and one c to draw curves.\n\n" + md
        return fig, md
    except (TypeError, ValueError) as e:
        return charts.empty_figure("Expected speedup vs alpha", str(e)), f"**Cannot compute:** {html.escape(str(e))}"


def measure_then_render(alpha, c, ks, cs, mode, summary, engine_key: str, force: bool = False):
    """Fetch the engine's one verify-cost curve (``Engine.verify_cost``: measured once, or again when
    ``force``), then render; yields (figure, markdown)."""
    if mode == MEASURED and (force or engine_key not in insight.VERIFY_COSTS):
        yield gr.skip(), "_Measuring the cost of verifying 1–65 tokens on this device (a few seconds)…_"
        try:
            # In a thread that ends (Gradio reuses this one; run_control.in_joined_thread says why).
            insight.VERIFY_COSTS[engine_key] = in_joined_thread(lambda: worker.MEASURE(engine_key, None, force),
                                                                name="verify-cost")
        except Exception as e:  # noqa: BLE001 - shown on the page; the fallback table stays in use
            fig, md = render(alpha, c, ks, cs, FALLBACK, summary, engine_key)
            yield fig, f"**Could not measure:** {html.escape(f'{type(e).__name__}: {e}')}; showing the fallback.\n\n{md}"
            return
    yield render(alpha, c, ks, cs, mode, summary, engine_key)


def after_load(alpha, c, ks, cs, mode, summary, engine_key: str) -> tuple:
    """(figure, markdown) after the session's models change: drawn with their verify cost when it was
    measured already, else a note that it is measured when the tab is opened (measuring is slow, and
    the tab is not in view while models load)."""
    if mode == MEASURED and engine_key not in insight.VERIFY_COSTS:
        return charts.empty_figure("Expected speedup vs alpha", "open this tab to measure the new models"), (
            "_New models are loaded: the cost of verifying 1–17 tokens with their target is measured when "
            "this tab is opened._")
    return render(alpha, c, ks, cs, mode, summary, engine_key)


def session_update(models, *values, force: bool = False):
    """The tab's handler with the Models tab: ``values`` are :func:`measure_then_render`'s inputs, the
    last one the session's engine key; the verify cost is measured on (and cached for) the session's
    engine (``models.engine_for``, loaded again if it was dropped). Yields (figure, markdown)."""
    *values, key = values
    models.engine_for(key)  # registered under its key again if it was dropped
    yield from measure_then_render(*values, engine_key=key, force=force)


def build(engine, last_run: gr.State, tab: gr.Tab, models=None) -> None:
    """Lay out the tab (``#theory-chart``, ``#theory-summary``); measuring starts when ``tab`` is first selected.

    With ``models`` (the Models tab's :class:`~.models_tab.ModelsPanel`) the verify cost is the session's
    engine's (its ``key`` state is an input of every handler) and the chart is redrawn after a load;
    without it, ``engine``'s."""
    key = worker.register(engine) if models is None else models.cache.default_key
    gr.Markdown("Speculative decoding's expected speedup (Leviathan et al. 2023) against the acceptance rate "
                "alpha, for several K (tokens drafted per step) and draft costs c (one drafted token's cost as a "
                "fraction of one target forward). The verification cost of K + 1 tokens is measured on this device; "
                "on a GPU it stays near one forward, on a CPU it grows with K. Timings on a busy machine are "
                "noisy, so the cost is fitted non-decreasing (more tokens never cost less; one outlying timing is capped at its neighbours). Grey lines: the "
                "formula (one dash pattern per K, one shade per c); coloured markers: the last run's methods as measured (one marker and legend entry each).")
    with gr.Row():
        with gr.Column(scale=1, min_width=280):
            alpha = knobs.knob_input(ALPHA_KNOB, "theory-alpha")
            c = knobs.knob_input(C_KNOB, "theory-c")
            ks = gr.CheckboxGroup(K_CHOICES, value=[2, 4, 8], label="K curves", elem_id="theory-ks")
            cs = gr.CheckboxGroup(C_CHOICES, value=[0.05], label="c curves", elem_id="theory-cs")
            mode = gr.Radio([MEASURED, FALLBACK, CONSTANT], value=MEASURED, label="Verification cost",
                            elem_id="theory-mode")
            again = gr.Button("Measure again", size="sm", elem_id="theory-measure")
        with gr.Column(scale=3):
            fig0, md0 = render(0.7, 0.05, [2, 4, 8], [0.05], FALLBACK, None, key)
            plot = gr.Plot(fig0, show_label=False, elem_id="theory-chart")
            summary = gr.Markdown(md0, elem_id="theory-summary")
    inputs = [alpha, c, ks, cs, mode, last_run]

    def update(*v):
        if models is None:
            yield from measure_then_render(*v, engine_key=key)
        else:
            yield from session_update(models, *v)

    def remeasure(*v):
        if models is None:
            yield from measure_then_render(*v, engine_key=key, force=True)
        else:
            yield from session_update(models, *v, force=True)

    if models is not None:
        inputs.append(models.key)
        models.follow(lambda _e, k, *v: after_load(*v, engine_key=k), inputs[:-1], [plot, summary])

    tab.select(update, inputs, [plot, summary], api_visibility="private", concurrency_id="engine")
    for comp in (alpha, c, ks, cs, mode, last_run):
        comp.change(update, inputs, [plot, summary], api_visibility="private", concurrency_id="engine")
    again.click(remeasure, inputs, [plot, summary], api_visibility="private", concurrency_id="engine")
