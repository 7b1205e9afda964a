"""Insight views of the main tab: per-run charts, the draft-model panel's numbers, Lookahead's pass size.

Everything here reads a finished run's plain data (``RunView.summary()`` in :mod:`.run_view`) and the
formulas of :mod:`playground.engine.theory`; it runs no model. The verify-cost table measured
by the Theory tab is cached here, per engine, so the draft panel's suggested K uses it once it
exists; before that, the chain curve of the per-step budget's step timing on this device, and before
that the project's measurement (:func:`verify_cost_for`).
"""

from __future__ import annotations

import dataclasses
import html

import gradio as gr

from playground.engine import theory
from playground.engine import METHODS
from playground.engine import LOOKAHEAD_PRESETS
from playground.advisor_figures import measure_draft

from . import charts, wording, worker

VERIFY_COSTS: dict[str, dict] = {}
"""Engine key -> the engine's kept verify cost (``Engine.verify_cost().as_dict()``) as the Theory tab
last fetched it (a ZeroGPU child measures it in another process, so the page keeps a copy)."""

CUSTOM = "custom"
"""The Lookahead preset dropdown's value when the sliders match no preset."""


def verify_cost_for(engine_key: str) -> theory.VerifyCost:
    """The one verify-cost curve every part of the page reads: the engine's kept curve
    (``Engine.verify_cost``, as the Theory tab last fetched it, or as the engine holds it when another
    part measured it, e.g. EAGLE's tree sizing), else the chain curve of the per-step budget's
    step-cost timing when the engine has made it (``step_cost``: decoding steps verifying a chain,
    relative to plain steps, timed on this device at the first run), else the project's measurement
    (``theory.FALLBACK``). Raw (as timed); callers use ``.monotone()``, the fit shown on the Theory tab."""
    d = VERIFY_COSTS.get(engine_key)
    if d:
        return theory.VerifyCost.from_dict(d)
    engine = worker.ENGINES.get(engine_key)
    if engine is not None and getattr(engine, "has_persistent", lambda k: False)("verify_cost"):
        return engine.verify_cost()
    steps = getattr(engine, "persisted", lambda k: None)("step_cost")
    if steps is not None:
        chain = steps.chain
        return dataclasses.replace(chain, source=f"measured on this device ({chain.source})")
    return theory.FALLBACK


def measured_here(cost: theory.VerifyCost) -> bool:
    """Whether ``cost`` was measured on this device (not the project's measurement or a constant)."""
    return cost.measured_here


def verify_cost_source(cost: theory.VerifyCost) -> str:
    """Where a verify cost was measured, in the words every panel uses (without the fits' notes, which
    nested a third pair of brackets in the step inspector's header)."""
    return cost.source.replace(" (made non-decreasing in n)", "").replace(
        " (lower quartiles, a monotone piecewise-linear fit)", "")


def _colors() -> dict[str, str]:
    return {info.label: charts.method_color(m) for m, info in METHODS.items()}


# ----- per-run charts ------------------------------------------------------------------------
def run_figures(summary: dict | None) -> tuple:
    """The four per-run figures from a run summary: tokens per step over the run, its histogram,
    acceptance by draft position, draft vs verify time."""
    methods = (summary or {}).get("methods", {})
    per_step = {d["label"]: d["tokens_per_step"] for d in methods.values()}
    per_pos = {d["label"]: d["stats"].get("per_position_acceptance") or [] for d in methods.values()
               if d["stats"].get("proposed")}
    split = {d["label"]: (d["stats"].get("draft_s", 0.0), d["stats"].get("verify_s", 0.0))
             for d in methods.values() if d["stats"]}
    colors = _colors()
    return (charts.tokens_per_step_figure(per_step, colors), charts.tokens_per_step_histogram(per_step, colors),
            charts.per_position_figure(per_pos, colors), charts.time_split_figure(split))


def build_run_charts() -> list:
    """The per-run charts under the panels (``#steps-chart``, ``#steps-hist``, ``#position-chart``,
    ``#split-chart``), filled at the end of each run."""
    gr.Markdown("### Inside the last run\nFilled when a run ends: how many tokens each step produced, how "
                "often each drafted position was accepted, and where the time went.")
    empty = run_figures(None)
    with gr.Row():
        steps = gr.Plot(empty[0], show_label=False, elem_id="steps-chart")
        hist = gr.Plot(empty[1], show_label=False, elem_id="steps-hist")
    with gr.Row():
        pos = gr.Plot(empty[2], show_label=False, elem_id="position-chart")
        split = gr.Plot(empty[3], show_label=False, elem_id="split-chart")
    return [steps, hist, pos, split]


# ----- the draft-model panel -------------------------------------------------------------------
def draft_panel_markdown(stats: dict | None, k: int | None, verify_cost: theory.VerifyCost,
                         advised: bool = True) -> str:
    """Markdown of the draft-model panel: acceptance, time split, measured c and the suggested K.

    Args:
        stats: the draft_model run's ``RunStats.as_dict()``; None before a run.
        k: the K the run used.
        verify_cost: relative cost of verifying n tokens (measured or the fallback table).
        advised: whether the Advisor tab weighs this draft (False for a draft as large as its
            target, the Models tab's "the target itself", which the Advisor leaves out).
    """
    if not stats:
        return "_Run the draft model to see its time split and a suggested K._"
    draft_s, verify_s = stats.get("draft_s", 0.0), stats.get("verify_s", 0.0)
    total = draft_s + verify_s
    lines = [f"**Time split** (decode steps): drafting {draft_s:.2f} s ({100 * draft_s / total:.0f}%), "
             f"verifying {verify_s:.2f} s ({100 * verify_s / total:.0f}%)" if total > 0 else "**Time split:** –"]
    m = measure_draft(stats, k, verify_cost)  # the advisor's K comes from the same function
    if m is None:
        return "\n\n".join(lines + ["_Nothing was drafted: no suggestion._"])
    sug, cost = m.suggestion, verify_cost.monotone()
    lines.append(f"**Measured:** α = {100 * m.alpha:.0f}%; c = (draft seconds per drafted token) / (verify seconds per "
                 f"step) = {m.c_step:.3f}, i.e. {m.c:.3f} of a single-token target forward "
                 f"(× verify cost of {m.k + 1} tokens = {cost(m.k + 1):.2f}).")
    verdict = "" if sug.pays_off else " — even the best K is expected to be slower than plain decoding here"
    lines.append(f"**Suggested K = {sug.k}** (expected {sug.speedup:.2f}×, τ {sug.tokens_per_step:.2f}); "
                 f"K = {m.k} as run: expected {m.speedup_as_run:.2f}×{verdict}. "
                 + ("The Advisor tab uses this K. " if advised else
                    "The Advisor tab leaves this draft out: it is as large as the target (a check of the "
                    "machinery, not a speed-up). ") +
                 "These expectations come from Leviathan et al.'s formula with the α and c above (it takes every "
                 "position as accepted alike), so they can differ from the speedup this run measured, which is the "
                 "one in the Draft model panel's stats line. "
                 f"Verify cost: {html.escape(verify_cost_source(verify_cost))}.")
    return "\n\n".join(lines)


def build_draft_panel() -> list:
    """The draft-model panel's insight: a Markdown (``#draft-insight``). Its acceptance by draft position
    is one line of the run charts' ``#position-chart`` (each chart is shown once)."""
    with gr.Accordion("Draft model: time split and suggested K", open=True, elem_id="draft-insight-box"):
        md = gr.Markdown(draft_panel_markdown(None, None, theory.FALLBACK), elem_id="draft-insight")
    return [md]


def after_run(summary: dict | None, engine_key: str) -> tuple:
    """Outputs after a run: the four per-run figures and the draft panel's Markdown."""
    figs = run_figures(summary)
    d = (summary or {}).get("methods", {}).get("draft_model")
    if d is None:
        return (*figs, gr.skip())
    engine = worker.ENGINES.get(engine_key)
    advised = engine is None or not wording.target_sized_draft(engine)  # the Advisor's own test
    return (*figs, draft_panel_markdown(d["stats"], (d.get("params") or {}).get("k"), verify_cost_for(engine_key),
                                        advised))


# ----- Lookahead's settings -------------------------------------------------------------------
def lookahead_pass_markdown(window, ngram_size, guess_set_size) -> str:
    """``Tokens per forward pass: 1 + W(N-1) + G(N-1) = n`` for the sliders' values."""
    try:
        n = theory.lookahead_tokens_per_pass(int(window), int(ngram_size), int(guess_set_size))
    except (TypeError, ValueError) as e:
        return f"Tokens per forward pass: – ({e})"
    return (f"**Tokens per forward pass:** 1 + W·(N−1) + G·(N−1) = 1 + {int(window)}·{int(ngram_size) - 1} + "
            f"{int(guess_set_size)}·{int(ngram_size) - 1} = **{n}** (the target scores all of them in one pass)")


def preset_of(window, ngram_size, guess_set_size) -> str:
    """The name of the LOOKAHEAD_PRESETS entry equal to these values, else :data:`CUSTOM`."""
    now = {"window": window, "ngram_size": ngram_size, "guess_set_size": guess_set_size}
    return next((name for name, p in LOOKAHEAD_PRESETS.items() if all(p[k] == now[k] for k in p)), CUSTOM)


def lookahead_controls(knobs: dict) -> None:
    """Add a preset dropdown (``#lookahead-preset``) and the tokens-per-pass line (``#lookahead-pass``)
    next to the W/N/G sliders, and wire them.

    Args:
        knobs: knob name (``window``, ``ngram_size``, ``guess_set_size``) -> its slider.
    """
    w, n, g = knobs["window"], knobs["ngram_size"], knobs["guess_set_size"]
    labels = {"cpu": "CPU (small)", "7b": "7B on a GPU (paper)", "13b": "13B on a GPU (paper)",
              "33b": "33B on a GPU (paper)"}
    choices = [(f"{labels.get(k, k)}: W {p['window']}, N {p['ngram_size']}, G {p['guess_set_size']}", k)
               for k, p in LOOKAHEAD_PRESETS.items()] + [("custom", CUSTOM)]
    preset = gr.Dropdown(choices, value=preset_of(w.value, n.value, g.value), label="Lookahead preset",
                         info="Sets W, N and G.", elem_id="lookahead-preset", interactive=w.interactive)
    line = gr.Markdown(lookahead_pass_markdown(w.value, n.value, g.value), elem_id="lookahead-pass")

    def apply(name):
        p = LOOKAHEAD_PRESETS.get(name)
        if p is None:
            return gr.skip(), gr.skip(), gr.skip()
        return p["window"], p["ngram_size"], p["guess_set_size"]

    preset.input(apply, preset, [w, n, g], api_visibility="private", queue=False)
    for s in (w, n, g):
        s.change(lambda a, b, c: (lookahead_pass_markdown(a, b, c), preset_of(a, b, c)), [w, n, g], [line, preset],
                 api_visibility="private", queue=False)
