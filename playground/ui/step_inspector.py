"""The step inspector: what one step of one method verified, and why each method runs at its speed.

Each step event carries the candidate tree the target verified (``StepEvent.tree`` as
``StepTree.as_dict()``: token ids, parents, sources, depths, the accepted path, the rejected nodes,
the bonus token, draft and verify seconds). During a run, :class:`RunSteps` keeps the last
:data:`MAX_STEPS_KEPT` of them per method (the last run only: a new run starts a new store) and
wraps each step's text in the panels in a ``<span class="step">`` with the step number, so step
boundaries show as alternating underlines and a click on a token picks its step.

The inspector (:func:`build`) shows, for the chosen method and step, the tree drawn as a nested
list (each node's token text and source colour; the accepted path highlighted, rejected nodes
greyed and struck through, the bonus token), the step's draft and verify time, a per-step chart
whose bars pick a step too, and one "why this speed" line per method (:func:`why_line`): its τ
and α, its step cost in plain steps (drafting, measured; verifying, from this device's verify-cost
curve at the pass's size), and the speedup they imply.

This module builds HTML and figures from plain data; it runs no model.
"""

from __future__ import annotations

import html
import threading
from collections import Counter, OrderedDict

import gradio as gr
import plotly.graph_objects as go

from playground.engine import BASELINE, SOURCE_TARGET, source_labels

from . import charts, guide, insight, render
from .knobs import KnobSlider
from .wording import method_label

MAX_STEPS_KEPT = 512
"""Steps kept per method for the inspector (the most recent; older ones are dropped)."""
MAX_NODES_DRAWN = 160
"""Most tree nodes drawn for one step (the rest are counted)."""

STEP_CSS = """
.tokens .step { border-bottom: 2px solid rgba(100,116,139,0.55); cursor: pointer; }
.tokens .step.odd { border-bottom-color: rgba(217,119,6,0.6); }
.tokens .step:hover { outline: 1px dashed #64748b; }
#step-tree .tree, #step-tree .tree * { font-size: 14px; line-height: 1.5; }
#step-tree ul { list-style: none; margin: 0; padding-left: 1.4em; border-left: 1px dotted #9ca3af; }
#step-tree > .tree > ul { border-left: none; padding-left: 0; }
#step-tree li { margin: 2px 0; }
#step-tree .chip { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; border-radius: 3px;
                   padding: 0 4px; color: #111827; white-space: pre; }
#step-tree .node-accepted > .node .chip { outline: 2px solid #15803d; font-weight: 700; }
#step-tree .node-rejected > .node { opacity: 0.5; }
#step-tree .node-rejected > .node .chip { text-decoration: line-through; }
#step-tree .node-bonus > .node .chip { outline: 2px dashed #1d4ed8; font-weight: 700; }
#step-tree .tree-note { font-size: 13px; color: #b45309; margin-bottom: 4px; }
#step-tree .tree .why, #step-tree .why { font-size: 12px; color: var(--body-text-color-subdued, #6b7280); }
#why-speed p { margin: 2px 0; font-size: 0.92em; }
"""
"""Page CSS of the step boundaries in the panels and of the drawn tree (added to the page's CSS)."""

PICK_JS = """
window.__stepPick = (method, step) => trigger('click', {method: method, step: step});
if (!window.__stepPickInstalled) {
  window.__stepPickInstalled = true;
  document.addEventListener('click', (ev) => {
    const s = ev.target.closest ? ev.target.closest('.tokens .step[data-step]') : null;
    if (s && window.__stepPick) {
      window.__stepPick(s.dataset.method, Number(s.dataset.step));
      // The inspector sits below the panels and charts: bring its step picker and tree into view.
      const target = document.getElementById('inspect-method') || document.getElementById('step-inspector');
      if (target) target.scrollIntoView({behavior: 'smooth', block: 'start'});
    }
  });
  setInterval(() => {
    const plot = document.querySelector('#inspect-chart .js-plotly-plot');
    if (plot && plot.on && !plot.__stepPick) {
      plot.__stepPick = true;
      plot.on('plotly_click', (d) => {
        const p = d && d.points && d.points[0];
        if (p && p.customdata && window.__stepPick) window.__stepPick(p.customdata[0], Number(p.customdata[1]));
      });
    }
  }, 600);
}
"""
"""Runs once in the tree view: a click on a token of a panel (or on a bar of the per-step chart)
triggers the view's ``click`` event with ``{method, step}``; a click on a token also scrolls the page
to the inspector's method and step pickers (with the chart and the tree under them)."""


# ----- the store of one run ------------------------------------------------------------------------
class RunSteps:
    """The last run's steps per method, for the inspector: bounded, filled while the run streams.

    Args:
        methods: the methods of the run, in panel order.
        max_steps: steps kept per method (the most recent).
    """

    def __init__(self, methods: list[str], max_steps: int = MAX_STEPS_KEPT):
        self.methods = list(methods)
        self.max_steps = max_steps
        self._steps: dict[str, OrderedDict] = {m: OrderedDict() for m in self.methods}
        self._last_token: dict[str, int | None] = {m: None for m in self.methods}
        self.pass_sizes: dict[str, Counter] = {m: Counter() for m in self.methods}
        """Decode steps by the size of their target pass (every step, not only the kept ones)."""
        self.chain_steps: dict[str, list[int]] = {m: [0, 0] for m in self.methods}
        """Decode steps whose candidates formed one chain, and the others."""
        self.stats: dict[str, dict] = {}
        self._lock = threading.Lock()

    def add(self, event: dict, spans: str = "") -> str:
        """Take one step's plain data (``worker.event_dict``); return ``spans`` (the step's coloured
        text) wrapped in a ``<span class="step">`` naming the method and step (empty stays empty)."""
        m, step, tree = event["method"], event["step"], event.get("tree")
        with self._lock:
            self.stats[m] = event.get("stats") or {}
            if tree is not None and m in self._steps:
                steps = self._steps[m]
                steps[step] = {"tree": tree, "root": self._last_token.get(m), "emitted": list(event["tokens"]),
                               "finished": bool(event.get("finished"))}
                while len(steps) > self.max_steps:
                    steps.popitem(last=False)
                if step > 0:
                    self.pass_sizes[m][1 + len(tree["tokens"]) + tree.get("extra_queries", 0)] += 1
                    is_chain = all(p == i - 1 for i, p in enumerate(tree["parents"]))
                    self.chain_steps[m][0 if is_chain else 1] += 1
            if event["tokens"]:
                self._last_token[m] = event["tokens"][-1]
        if not spans:
            return ""
        parity = "odd" if step % 2 else "even"
        return (f'<span class="step {parity}" data-method="{html.escape(m, quote=True)}" data-step="{int(step)}" '
                f'title="step {int(step)}">{spans}</span>')

    def kept(self, method: str) -> list[int]:
        """Step numbers kept for ``method``, oldest first."""
        with self._lock:
            return list(self._steps.get(method, {}))

    def get(self, method: str, step: int) -> dict | None:
        """The kept record of one step (``tree``, ``root`` token id or None, ``emitted`` ids), or None."""
        with self._lock:
            return self._steps.get(method, {}).get(step)

    def records(self, method: str) -> list[tuple[int, dict]]:
        with self._lock:
            return list(self._steps.get(method, {}).items())


# ----- token text ------------------------------------------------------------------------------------
def token_text(engine, token: int | None) -> str:
    """A token's text made visible (spaces ``␣``, newlines ``↵``, tabs ``⇥``); a special token's name; ``#id``
    when it has neither (no tokenizer)."""
    if token is None:
        return "–"
    try:
        text = engine.decode_text([int(token)])
        if not text:  # a special token (end of turn, ...): its name
            text = str(engine.target.tokenizer.convert_ids_to_tokens(int(token)) or "")
    except Exception:  # no tokenizer (a bare model): the id
        text = ""
    if not text:
        return f"#{int(token)}"
    return text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥")


def _chip(text: str, source: str) -> str:
    return (f'<span class="chip" style="background:{render.source_color(source)}">'
            f"{html.escape(text)}</span>")


# ----- the tree ---------------------------------------------------------------------------------------
def tree_html(engine, method: str, step: int, record: dict | None, kept: list[int]) -> str:
    """HTML of one step's verified tree (``#step-tree``'s value).

    Args:
        engine: gives token texts (``decode_text``).
        method: the method's name; step: the step number (0 = the prefill).
        record: :meth:`RunSteps.get`'s record, None when the step is not kept.
        kept: the method's kept step numbers (to say which are there).
    """
    label = method_label(method)
    if record is None:
        where = (f"steps {kept[0]} to {kept[-1]} are kept" if kept else "no step of it is kept")
        return (f'<div class="tree-empty">No step {int(step)} of {html.escape(label)} to show: {where} '
                f"(the last {MAX_STEPS_KEPT} steps of each method in the last run).</div>")
    tree, labels = record["tree"], source_labels()
    tokens, parents, sources, path = tree["tokens"], tree["parents"], tree["sources"], tree["path"]
    on_path, n = set(path), len(tokens)
    bonus = _chip(token_text(engine, tree["bonus_token"]), SOURCE_TARGET)
    ms = lambda s: f"{1000 * s:.1f} ms"  # noqa: E731
    pass_size = 1 + n + tree.get("extra_queries", 0)
    if step == 0:
        head = (f"<b>Step 0 of {html.escape(label)}</b> is the prefill: one pass over the prompt gave the first "
                f"token {bonus} ({ms(tree['verify_s'])}).")
        return f'<div class="tree-head">{head}</div>'
    extra = (f", plus {render.plural(tree['extra_queries'], 'token')} the method scores for its next guesses"
             if tree.get("extra_queries") else "")
    head = (f"<b>Step {int(step)} of {html.escape(label)}:</b> {render.plural(n, 'candidate')} proposed, "
            f"{len(path)} accepted, then the target's own token {bonus} → "
            f"{render.plural(len(path) + 1, 'token')}. Drafting {ms(tree['draft_s'])}, verifying "
            f"{ms(tree['verify_s'])} (one target pass over {render.plural(pass_size, 'token')}: the last "
            f"token{' and the candidates' if n else ''}{extra}).")
    if not n:
        head += " Nothing was proposed: a plain step (the drafter or the per-step budget judged no guess worth its cost)."
    if record.get("finished") and len(record["emitted"]) < len(path) + 1:
        head += f" The output ended within this step: {render.plural(len(record['emitted']), 'token')} kept."
    if n == 0:
        return (f'<div class="tree-head">{head}</div><div class="tree-empty">Nothing was proposed at this step '
                "(a plain step): the target alone gave the token.</div>")
    children: list[list[int]] = [[] for _ in range(n + 1)]
    for i, p in enumerate(parents):
        children[p + 1].append(i)
    drawn = [0]

    def node(i: int) -> str:
        drawn[0] += 1
        src = sources[i]
        if i in on_path:
            cls, mark, why = "node-accepted", "✓", "accepted"
        elif parents[i] < 0 or parents[i] in on_path:
            cls, mark, why = "node-rejected", "✗", "rejected by the target"
        else:
            cls, mark, why = "node-rejected", "✗", "not reached: its parent was rejected"
        title = html.escape(f"{render.source_label(src, labels)}, depth {tree['depths'][i]}: {why}", quote=True)
        sub = "".join(node(c) for c in _path_first(children[i + 1], on_path) if drawn[0] < MAX_NODES_DRAWN)
        if i == (path[-1] if path else None):
            sub = _bonus_li(bonus) + sub
        return (f'<li class="{cls}" data-node="{i}"><span class="node" title="{title}">{mark} '
                f'{_chip(token_text(engine, tokens[i]), src)} <span class="why">'
                f"{html.escape(render.source_label(src, labels))}</span></span>"
                + (f"<ul>{sub}</ul>" if sub else "") + "</li>")

    top = "".join(node(c) for c in _path_first(children[0], on_path) if drawn[0] < MAX_NODES_DRAWN)
    if not path:
        top = _bonus_li(bonus) + top
    more = f'<div class="why">… {n - drawn[0]} more nodes not drawn</div>' if drawn[0] < n else ""
    root = _chip(token_text(engine, record.get("root")), SOURCE_TARGET)
    legend = ('<div class="why">✓ accepted path (bold, green outline) · ✗ rejected (struck through) · '
              "the dashed blue token is the target's own (bonus or correction) token</div>")
    return (f'<div class="tree-head">{head}</div>{legend}<div class="tree"><ul><li class="node-root">'
            f'<span class="node">root: {root} <span class="why">the last token before this step</span></span>'
            f"<ul>{top}</ul></li></ul></div>{more}")


def _path_first(nodes: list[int], on_path: set[int]) -> list[int]:
    """Siblings with the accepted one first (so a tree drawn in part always shows the path)."""
    return sorted(nodes, key=lambda c: c not in on_path)


def _bonus_li(bonus: str) -> str:
    return (f'<li class="node-bonus"><span class="node">+ {bonus} <span class="why">the target\'s own token '
            "(bonus or correction)</span></span></li>")


# ----- why this speed -------------------------------------------------------------------------------
def _cost_curve(engine, engine_key: str):
    """``(cost(q, is_chain) -> plain steps, the curve)``: the page's one verify-cost curve
    (``insight.verify_cost_for``: the engine's kept ``Engine.verify_cost``, else the budget's step-cost
    curve timed on this device, else the project's measurement), fitted as the Theory tab shows it (``.monotone()``)."""
    vc = insight.verify_cost_for(engine_key).monotone()
    return (lambda q, chain: vc(q)), vc


def speed_figures(stats: dict, pass_sizes: Counter, chain_steps: list[int], cost, baseline_stats: dict | None):
    """The numbers of a "why this speed" line, or None before two steps.

    Args:
        stats: the method's ``RunStats.as_dict()``.
        pass_sizes: decode steps by target pass size (root, candidates and extra queries).
        chain_steps: ``[chain steps, tree steps]``.
        cost: ``cost(q, is_chain)``: a pass over q tokens in plain steps (this device's curve).
        baseline_stats: the baseline's stats in the same run (its step time converts seconds into
            plain steps), or None.

    Returns:
        ``{"overall", "tau_overall", "tau", "alpha", "per_step", "pass", "verify", "draft", "step",
        "expected", "measured"}``: the run's speedup and τ as the stats line and the verdict give them
        (``guide.overall_figures``; speedup None without a baseline); then decoding steps only (the
        first token and the prompt excluded): τ, α, candidates per step, mean pass size, verify and
        draft cost per step in plain steps, their sum, τ / step cost, and the measured decode-only
        speedup over the baseline (None without it).
    """
    steps = stats.get("steps", 0) - 1
    if steps < 1 or not pass_sizes:
        return None
    total = sum(pass_sizes.values())
    chain = chain_steps[0] >= chain_steps[1]
    verify = sum(n * cost(q, chain) for q, n in pass_sizes.items()) / total
    decode_s = stats.get("elapsed_s", 0.0) - stats.get("ttft_s", 0.0)
    draft_s, verify_s = stats.get("draft_s", 0.0), stats.get("verify_s", 0.0)
    plain_s, measured = None, None
    if baseline_stats and baseline_stats.get("steps", 0) > 1:
        base_decode = baseline_stats.get("elapsed_s", 0.0) - baseline_stats.get("ttft_s", 0.0)
        plain_s = base_decode / (baseline_stats["steps"] - 1)
        if decode_s > 0 and base_decode > 0:
            measured = ((stats["new_tokens"] - 1) / decode_s) / ((baseline_stats["new_tokens"] - 1) / base_decode)
    if plain_s is None or plain_s <= 0:  # no baseline: the verify time stands for the curve's cost
        plain_s = verify_s / steps / verify if verify_s > 0 else None
    draft = draft_s / steps / plain_s if plain_s else 0.0
    tau = (stats.get("new_tokens", 1) - 1) / steps
    overall, tau_overall = guide.overall_figures(stats, (baseline_stats or {}).get("tokens_per_s"))
    return {"overall": overall, "tau_overall": tau_overall, "tau": tau, "alpha": stats.get("alpha"), "per_step": stats.get("proposed", 0) / steps,
            "pass": sum(q * n for q, n in pass_sizes.items()) / total, "verify": verify, "draft": draft,
            "step": verify + draft, "expected": tau / (verify + draft), "measured": measured}


def why_line(label: str, f: dict | None, is_baseline: bool = False) -> str:
    """One Markdown line: why this method runs at its speed (from :func:`speed_figures`)."""
    if f is None:
        return f"**{label}:** – (too few steps to tell)"
    if is_baseline:
        return f"**{label}:** the baseline: one token per step, each step one plain target pass."
    alpha = "" if f["alpha"] is None else f" (α {100 * f['alpha']:.0f}% of {f['per_step']:.1f} candidates a step)"
    whole = [] if f.get("overall") is None else [f"{f['overall']:.2f}× the baseline"]
    if f.get("tau_overall") is not None:
        whole.append(f"τ {f['tau_overall']:.2f}")
    line = f"**{label}:** " + (", ".join(whole) + " over the whole run (as in the verdict). " if whole else "")
    line += (f"Decoding steps only (prompt and first token excluded): τ {f['tau']:.2f} tokens per step{alpha}; "
             f"each step costs {f['step']:.2f} plain steps (drafting {f['draft']:.2f}, verifying {f['verify']:.2f} "
             f"for a pass over {f['pass']:.1f} tokens) → {f['expected']:.2f}× expected")
    if f["measured"] is not None:
        line += f", {f['measured']:.2f}× measured (decoding only)"
    if f["expected"] < 1:
        gain, loss = f["tau"] - 1, f["step"] - 1
        if f["per_step"] == 0:
            why = "nothing was proposed, so every step was a plain step"
        elif f["draft"] > max(gain, f["verify"] - 1):
            why = "drafting costs more than the accepted tokens save"
        elif gain < 0.5 * loss:
            why = "too few candidates are accepted to pay for the larger pass"
        else:
            why = "verifying the larger pass costs more than the accepted tokens save"
        if f["measured"] is not None and f["measured"] >= 1:
            line += (f": slower than plain decoding by the cost curve ({why}), faster as measured: the curve timed at "
                     "load does not fit this run's clocks (other work on the same cores, such as a browser on this "
                     "machine, slows the baseline's many steps most)")
        else:
            line += f": slower than plain decoding, because {why}"
    return line + "."


def why_markdown(engine, engine_key: str, store: RunSteps | None) -> str:
    """The "why this speed" lines of every method of the last run (``#why-speed``)."""
    if store is None or not store.stats:
        return "_Run some methods: each gets a line on why it runs at its speed._"
    cost, curve = _cost_curve(engine, engine_key)
    base = store.stats.get(BASELINE)
    lines = []
    for m in store.methods:
        label = method_label(m)
        f = speed_figures(store.stats.get(m, {}), store.pass_sizes[m], store.chain_steps[m], cost,
                          base if m != BASELINE else None)
        lines.append(why_line(label, f, m == BASELINE))
    where = insight.verify_cost_source(curve)
    if not insight.measured_here(curve):
        where += "; the Theory tab measures this device"
    return ("**Why this speed** (one plain step = one target pass over one token; verify cost "
            f"{where}):\n\n" + "\n\n".join(lines))


# ----- the per-step chart ----------------------------------------------------------------------------
def steps_figure(store: RunSteps | None, method: str | None, chosen: int | None) -> go.Figure:
    """Accepted candidates and the target's token of each kept step of ``method`` (stacked bars,
    the chosen step outlined); a click on a bar picks its step."""
    records = store.records(method) if store is not None and method else []
    if not records:
        return charts.empty_figure("Tokens per step", "run a method to see its steps here", height=220)
    label = method_label(method)
    xs = [s for s, _ in records]
    acc = [len(r["tree"]["path"]) for _, r in records]
    custom = [[method, s] for s in xs]
    width = [2.5 if s == chosen else 0 for s in xs]
    fig = go.Figure([
        go.Bar(x=xs, y=acc, name="accepted candidates", marker=dict(color=charts.method_color(method),
               line=dict(width=width, color="#111827")), customdata=custom,
               hovertemplate="step %{x}: %{y} accepted<extra></extra>"),
        go.Bar(x=xs, y=[1] * len(xs), name="the target's token", customdata=custom,
               marker=dict(color=render.source_color(SOURCE_TARGET), line=dict(width=width, color="#111827")),
               hovertemplate="step %{x}: + the target's token<extra></extra>"),
    ])
    fig.update_layout(barmode="stack", template="none", height=230, bargap=0.15,
                      title=dict(text=f"Tokens per step: {label} (click a bar to inspect that step)", x=0.02,
                                 font=dict(size=14)),
                      margin=dict(l=50, r=10, t=40, b=60), paper_bgcolor="rgba(0,0,0,0)",
                      plot_bgcolor="rgba(0,0,0,0)", font=dict(family="sans-serif", size=12, color="#6b7280"),
                      legend=dict(orientation="h", y=-0.35, x=0))
    fig.update_xaxes(title_text="step", showgrid=False)
    fig.update_yaxes(title_text="tokens", rangemode="tozero", gridcolor="rgba(128,128,128,0.25)", dtick=1)
    return fig


# ----- the inspector on the page ---------------------------------------------------------------------
def _default_step(store: RunSteps, method: str) -> int | None:
    """The latest kept step that verified candidates, else the latest kept step."""
    records = store.records(method)
    with_nodes = [s for s, r in records if r["tree"]["tokens"]]
    return with_nodes[-1] if with_nodes else records[-1][0] if records else None


def view(engine, engine_key: str, store: RunSteps | None, method: str | None = None, step=None) -> tuple:
    """Every inspector output for ``method`` and ``step`` (the defaults: the first method that drafted,
    its latest step with candidates): why-lines, method dropdown, step slider, chart, tree."""
    why = why_markdown(engine, engine_key, store)
    if store is None or not store.methods:
        return why, gr.update(choices=[], value=None), gr.update(), steps_figure(None, None, None), \
            '<div class="tree-empty">Run some methods, then pick a step: click a token in a panel.</div>'
    if method not in store.methods:
        drafting = [m for m in store.methods if any(r["tree"]["tokens"] for _, r in store.records(m))]
        method = (drafting or store.methods)[0]
    kept = store.kept(method)
    try:
        step = int(step) if step is not None else _default_step(store, method)
    except (TypeError, ValueError):
        step = _default_step(store, method)
    choices = [(method_label(m), m) for m in store.methods]
    dropdown = gr.update(choices=choices, value=method)
    if not kept or step is None:
        return why, dropdown, gr.update(), steps_figure(store, method, None), tree_html(engine, method, 0, None, [])
    note = ""
    if not kept[0] <= step <= kept[-1]:  # typed in the slider's box: the nearest step kept, as the page's knobs clamp
        shown = min(max(step, kept[0]), kept[-1])
        note = (f'<div class="tree-note">Step {step} is outside the steps kept of '
                f"{html.escape(choices[store.methods.index(method)][0])} ({kept[0]} to {kept[-1]}): showing step "
                f"{shown}.</div>")  # in the tree, not a toast: this event is not queued (a toast needs the queue)
        step = shown
    slider = gr.update(minimum=kept[0], maximum=max(kept[-1], kept[0] + 1), value=step, interactive=True)
    return (why, dropdown, slider, steps_figure(store, method, step),
            note + tree_html(engine, method, step, store.get(method, step), kept))


class Inspector:
    """The inspector's components (made by :func:`build`); :meth:`wire` connects them to a run event."""

    def __init__(self, engine, engine_key: str, state: gr.State, models=None):
        self.engine, self.key, self.state, self.models = engine, engine_key, state, models
        with gr.Accordion("Step inspector: what each step verified, and why each method runs at its speed",
                          open=True, elem_id="step-inspector"):
            self.why = gr.Markdown(why_markdown(engine, engine_key, None), elem_id="why-speed")
            gr.Markdown("Pick a step: click a token in a panel (steps are underlined in alternating colours), "
                        "a bar of the chart, or choose the method and step here.")
            with gr.Row():
                self.method = gr.Dropdown(choices=[], value=None, label="Method", elem_id="inspect-method",
                                          interactive=True, scale=1)
                # The range is checked in view (gr.Slider refused a typed 999 with an error on every output).
                self.step = KnobSlider(0, 1, value=0, step=1, label="Step", elem_id="inspect-step", scale=3)
            self.chart = gr.Plot(steps_figure(None, None, None), show_label=False, elem_id="inspect-chart")
            self.tree = gr.HTML(view(engine, engine_key, None)[-1], elem_id="step-tree", js_on_load=PICK_JS)
        outputs = self.outputs = [self.why, self.method, self.step, self.chart, self.tree]
        key = [models.key] if models is not None else []  # the session's models (the Models tab)

        def pick(evt: gr.EventData, store, *k):  # (Gradio passes the event to a positional parameter)
            data = getattr(evt, "_data", None) or {}
            return view(*self._session(k), store, data.get("method"), data.get("step"))

        self.tree.click(pick, [state, *key], outputs, api_visibility="private", queue=False)
        self.method.input(lambda store, m, *k: view(*self._session(k), store, m), [state, self.method, *key],
                          outputs, api_visibility="private", queue=False)
        self.step.input(lambda store, m, s, *k: view(*self._session(k), store, m, s),
                        [state, self.method, self.step, *key], outputs, api_visibility="private", queue=False,
                        trigger_mode="always_last")

    def _session(self, key: tuple) -> tuple:
        """``(engine, engine key)`` of the session's models (its key from the Models tab), else the server's."""
        if self.models is None or not key or key[0] is None:
            return self.engine, self.key
        return self.models.engine_for(key[0]), key[0]

    def wire(self, run_event) -> None:
        """Refresh the inspector when ``run_event`` (the Playground's run) ends."""
        key = [self.models.key] if self.models is not None else []
        run_event.then(lambda store, *k: view(*self._session(k), store), [self.state, *key], self.outputs,
                       api_visibility="private", queue=False)


def build(engine, engine_key: str, state: gr.State, models=None) -> Inspector:
    """Lay the inspector out here (``#step-inspector``: ``#why-speed``, ``#inspect-method``,
    ``#inspect-step``, ``#inspect-chart``, ``#step-tree``); ``state`` holds the run's :class:`RunSteps`;
    with ``models`` (the Models tab's panel) token texts and costs come from the session's models."""
    return Inspector(engine, engine_key, state, models)
