"""The Gradio page: prompt, methods and their knobs, one streaming panel per method, charts.

:func:`build_demo` lays the page out for a loaded :class:`~playground.engine.Engine`;
:func:`launch_options` gives the theme and CSS that Gradio 6 takes in ``launch()``.

The run handler is a plain generator over plain values: its arguments are the input
components' values in :func:`input_names` order. The model runs in :mod:`.worker`, whose
functions take and yield plain data only (ZeroGPU's ``@spaces.GPU`` runs them in a forked
process and pickles both ways); this module turns their dicts into HTML and figures. All
per-run state lives in local variables of one call; the module keeps none, so concurrent
sessions cannot see each other's runs. The page has four tabs: Playground (this module, with
the insight charts of :mod:`.insight`), Benchmark (:mod:`.bench_tab`), Theory
(:mod:`.theory_tab`) and Advisor (:mod:`.advisor_tab`).
"""

from __future__ import annotations

import hashlib
import html
import inspect
import json
import logging
import time
from pathlib import Path
from typing import Any, Iterator

import gradio as gr

from playground.engine import METHODS, Engine, source_labels
from playground.engine import GENERATION_KNOBS, REPETITION_PENALTY_KNOB

from . import advisor_tab, bench_tab, charts, guide, history, insight, medusa_panel, models_tab, render
from . import step_inspector, theory_tab, wording, worker
from .inputs import STOP_INPUT, _parse, input_names, model_settings_note, run_arguments, stop_lines  # noqa: F401
from .knobs import KEEP_ON_CLEAR_JS, knob_input
from .legend import legend_sources  # noqa: F401  (read as app.legend_sources)
from .run_control import OVERLAPS, SHARED_NOTE, EventPump, StopSignals, reading_status, waiting_status
from .run_view import RunView
from .toast import warning

log = logging.getLogger(__name__)

TITLE = "Speculative Decoding Playground"
EXAMPLES_PATH = Path(__file__).resolve().parents[2] / "assets" / "examples.json"
UI_REFRESH_S = 0.08
"""Least time between two streamed updates of the text panels (the last one is always sent)."""
UI_HTML_CHARS_PER_S = 400_000
"""Most panel HTML (characters) the page is asked to redraw per second while streaming: the browser
redraws a panel whole on each update, so with a fixed interval its work grows with the output
squared and a long run (thousands of tokens) fell seconds behind, Stop with it."""
CHART_REFRESH_S = 0.4
"""Least time between two chart updates while streaming (a figure is resent whole)."""
CHART_POINTS_PER_S = 4_000
"""Most chart points (steps of all methods) the page is asked to redraw per second while streaming."""
WAITING_STATUS_S = 2.0
"""Seconds a run waits for its first event before the status says what the engine is doing."""
CONCURRENT_RUNS = 2
"""Runs served at once (more wait in the queue)."""
QUEUE_SIZE = 32
"""Runs allowed to wait in the queue before new ones are turned away."""
STOPS = StopSignals()
"""Stop flags of the page's runs in flight, one per browser session."""


def refresh_interval(least_s: float, size: int, per_s: float) -> float:
    """Seconds between two streamed updates of something of ``size`` units that the browser redraws
    whole: ``least_s``, or longer once ``size / per_s`` is (the redrawing per second stays bounded)."""
    return max(least_s, size / per_s)


PAGE_CSS = """
#status { min-height: 1.5em; }
.method-panel .panel-title p { margin: 0; font-size: 1.05em; }
.stats-line p { margin: 2px 0; font-size: 0.92em; }
.unavailable-reason p { font-size: 0.9em; color: var(--body-text-color-subdued); margin: 0 0 6px 0; }
#method-panels { display: grid; grid-template-columns: repeat(auto-fit, minmax(300px, 1fr)); align-items: start; }
#method-panels > .method-panel { min-width: 0; }
#method-list { max-height: 460px; overflow-y: auto; flex-wrap: nowrap; padding: 4px 6px 4px 4px;
               border: 1px solid var(--border-color-primary); border-radius: 8px; }
#method-list > * { flex-shrink: 0; }
#method-list [data-testid="block-info"] { font-size: 0.85em; }
"""
"""Page CSS. ``#method-panels`` lays the method panels out as a grid of equal columns, at least 300 px
(about 34 characters of code): as many as fit, so few chosen methods get wide panels; wrapping
ones keep the same width (a wrapped flex row would stretch a lone last panel)."""


def launch_options() -> dict[str, Any]:
    """Keyword arguments for ``demo.launch()``: theme, CSS and the page script (Gradio 6 takes them there), the
    upload size limit of the Benchmark tab and ``show_error`` (see ``bench_tab.launch_options``).

    The theme names only system fonts, so the page makes no request outside the server.
    """
    theme = gr.themes.Default(primary_hue="blue", font=["ui-sans-serif", "system-ui", "sans-serif"],
                              font_mono=["ui-monospace", "SFMono-Regular", "monospace"])
    return {"theme": theme, "css": PAGE_CSS + step_inspector.STEP_CSS + guide.GUIDE_CSS, "js": KEEP_ON_CLEAR_JS,
            **bench_tab.launch_options()}


def load_examples(path: Path = EXAMPLES_PATH) -> list[dict]:
    """Example prompts (``label``, ``category``, ``source``, ``prompt``); empty when the file is missing."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        log.warning("no example prompts: %s", e)
        return []


# ----- one run ----------------------------------------------------------------------------

def _message_only(text: str) -> tuple:
    """Output values that change the status line only."""
    return (text,) + (gr.skip(),) * (3 * len(METHODS) + 4)


def _ended(view: RunView | None, status: str) -> tuple:
    """Output values of a run that ended on a warning or an error: the status line, and every chosen
    method's panel saying it did not run (or keeping the text it had): a run the engine refused
    before its first step (a prompt longer than the context) clears the last run's panels, which
    would otherwise sit under the new prompt as if they answered it. Without a view (input the page
    refused before a run was set up), the status line only."""
    if view is None:
        return _message_only(status)
    view.status = status
    view.abandon()
    return view.values()


def run_comparison(engine: Engine, *values, stream=None, stop=None, scope=None) -> Iterator[tuple]:
    """The ``/run`` handler: stream every chosen method's text, stats, badge and the charts.

    The model runs in ``stream`` (default :data:`worker.RUN`: :func:`worker.stream_run`, on a
    ZeroGPU slice when ``spaces`` is installed), which takes and yields plain data only; this
    generator turns its dicts into the page's HTML and figures.

    Args:
        engine: the loaded engine.
        values: the input values in :func:`input_names` order (see :func:`run_arguments`).
        stream: the plain-data run function (tests pass a decorated one).
        stop: a ``threading.Event`` (see :mod:`.run_control`): once set, the page's run ends at
            once (within :data:`~.run_control.POLL_S`), every unfinished panel is marked stopped
            and the last update says "Stopped after N tokens"; the engine run ends after its
            current step (a one-time calibration in progress finishes in the background and is
            kept). While the first step has not come (a calibration, another run holding the
            engine), the status says what the engine is doing.
        scope: whose learned state the methods read and add to (``Engine.run``): the browser
            session, so one visitor's outputs never feed another's drafts; None: the unscoped state.

    Yields:
        Tuples of output values (status, then per method: tokens HTML, stats line, badge;
        then the timeline and throughput figures); after bad input, the status alone changes.
        Bad input yields one status message (and a warning toast) and ends; it never raises.
    """
    stream = stream or worker.RUN
    events = view = ticket = None
    try:
        try:
            prompt, specs, settings = _parse(values)
        except ValueError as e:
            warning(str(e))
            yield _message_only(render.status_html("warning", str(e)))
            return
        view = RunView(engine, specs, settings, prompt)
        ticket = OVERLAPS.begin()
        labels = ", ".join(METHODS[s.name].label for s in specs)
        start = last = last_chart = time.perf_counter()
        # Pulled in a helper thread, so Stop answers at once even inside a long engine call; in
        # lockstep, so no step runs while an update is rendered (it would slow that step unevenly).
        events = EventPump(stream(worker.register(engine), prompt, worker.spec_dicts(specs),
                                  worker.settings_dict(settings), scope), stop, lockstep=True)
        stopped, prompt_tokens, preparing = False, 0, False
        for event in events:
            if event is None:  # nothing yet: say what the engine is doing before the first step
                waited = time.perf_counter() - start
                waiting = not prompt_tokens or (engine.making and all(view.outputs[m].last is None for m in view.chosen))
                if waiting and waited >= WAITING_STATUS_S and time.perf_counter() - last >= 1.0:
                    yield _message_only(render.status_html("running", waiting_status(engine.making, waited)))
                    last, preparing = time.perf_counter(), True
                elif preparing and not waiting:  # the one-time timing is over: back to "Reading the prompt"
                    yield _message_only(view.status)
                    preparing = False
                continue
            if stop is not None and stop.is_set():
                stopped = True
                break
            if event["type"] == "warning":  # the engine's checks before the first step
                warning(event["message"])
                yield _ended(view, render.status_html("warning", event["message"]))
                return
            if event["type"] == "start":
                prompt_tokens = event["prompt_tokens"]
                view.status = render.status_html("running", reading_status(view, prompt_tokens, labels))
                view.shown = True
                yield view.values()
                start = last = last_chart = time.perf_counter()
                continue
            first = view.outputs[event["method"]].last is None
            view.add(event)
            if event.get("error"):  # one method failed; the others run on
                warning(f"{METHODS[event['method']].label} failed: {event['error']}")
            if first:  # prefill progress: which method reads the prompt now
                view.status = render.status_html("running", reading_status(view, prompt_tokens, labels))
            now = time.perf_counter()
            # The panels still changing (Gradio sends a finished panel no more) and the charts are
            # redrawn whole by the browser: space the updates by their size.
            chars = sum(len(view.html[m]) for m in view.chosen if view.reasons[m] is None or m == event["method"])
            if first or event["finished"] or now - last >= refresh_interval(UI_REFRESH_S, chars, UI_HTML_CHARS_PER_S):
                points = sum(len(view.timelines.get(m, ())) for m in view.chosen)
                if event["finished"] or now - last_chart >= refresh_interval(CHART_REFRESH_S, points,
                                                                             CHART_POINTS_PER_S):
                    view.refresh_figures()
                    last_chart = now
                yield view.values()
                last = now
        stopped = stopped or (stop is not None and stop.is_set() and any(r is None for r in view.reasons.values()))
        if stopped:
            events.close()  # ends the engine run after its current call, before the last update is sent
            view.status = render.status_html("stopped", view.stop())
        else:
            view.status = render.status_html(
                "done", f"Done in {time.perf_counter() - start:.1f} s (methods run side by side, one step each "
                        "in turn; each method's speed counts only its own steps).")
        view.status += guide.verdict_html(view.summary())  # "Fastest: ..., 1.24× the baseline, ..."
        if OVERLAPS.shared(ticket):
            warning(SHARED_NOTE)
            view.status += f'<div id="run-shared" style="margin-top:4px;font-size:14px">⚠ {html.escape(SHARED_NOTE)}</div>'
        view.refresh_figures()
        yield view.values(final=True)
    except ValueError as e:  # the engine's checks before the first step
        warning(str(e))
        yield _ended(view, render.status_html("warning", str(e)))
    except Exception as e:  # never let a run take the server down
        log.exception("run failed")
        warning(f"Unexpected error: {type(e).__name__}: {e}")
        yield _ended(view, render.status_html(
            "error", f"Unexpected error: {type(e).__name__}: {e}. The server is still running: "
                     "try again or change the settings."))
    finally:
        if events is not None:
            events.close()  # cancels the run after its current step
        if ticket is not None:
            OVERLAPS.end(ticket)


# ----- the page ---------------------------------------------------------------------------
def session_scope(session_hash: str | None) -> str | None:
    """The learning scope of a browser session (``Engine.run``'s ``scope``): a digest of its session
    hash (any client's hash then makes a valid scope); None without one."""
    return hashlib.sha256(session_hash.encode()).hexdigest()[:16] if session_hash else None


def forget_session(request: gr.Request) -> None:
    """The page's unload handler: a closed or reloaded tab's learned state (its suffix caches, recycling
    tables, estimates) is dropped from every engine it may have used, instead of waiting for eviction."""
    scope = session_scope(getattr(request, "session_hash", None))
    if scope is not None:
        for engine in list(worker.ENGINES.values()):
            forget = getattr(engine, "forget_learned", None)
            if forget is not None:
                forget(scope)


def build_demo(engine: Engine, vllm=None, lock_models: bool | None = None, models_dir=None) -> gr.Blocks:
    """Build the playground page for ``engine`` (launch it with ``**launch_options()``).

    The page has: a header naming the models, device and dtype; the prompt (``#prompt``) with
    example prompts; one checkbox per method (an unavailable method is disabled, with the
    reason) and its knobs; generation settings; Run (``#run``) and Stop (``#stop``); a status
    line (``#status``); one panel per method (``#panel-<method>``, tokens coloured by source,
    a stats line and a lossless badge); the tokens-over-time chart (``#chart``) and the
    throughput bars (``#bars``). The run is served at ``api_name="run"``. With ``vllm`` (a
    :class:`.vllm_panel.VLLMSession`) a vLLM tab serves the same prompt through vLLM. The Models tab
    (:mod:`.models_tab`; ``lock_models``, default on Spaces, fixes them) and History tab (:mod:`.history`).
    """
    examples = load_examples()
    available = {m: engine.unavailable_reason(m) is None for m in METHODS}

    with gr.Blocks(title=TITLE) as demo:
        header = gr.Markdown(models_tab.header(engine, TITLE), elem_id="header")
        last_run = gr.State(None)  # plain data of the last finished run (see RunView.summary)
        run_steps = gr.State(None)  # the last run's step_inspector.RunSteps (filled while it streams)
        engine_key = worker.register(engine)
        # The session's models (key); no load while the session's run (Playground or Benchmark) streams.
        models = models_tab.ModelsPanel(engine, lock_models, models_dir, TITLE,
                                        lambda session: STOPS.armed(session) or bench_tab.RUNS.armed(session))
        with gr.Tabs(elem_id="tabs"):
            with gr.Tab("Playground", id="playground", elem_id="tab-playground"):
                with gr.Row(equal_height=False):
                    with gr.Column(scale=3):
                        prompt = gr.Textbox(label="Prompt", lines=6, max_lines=14, elem_id="prompt",
                                            placeholder="Type a prompt, or pick an example below")
                        if examples:
                            gr.Examples([[e["prompt"]] for e in examples], inputs=[prompt],
                                        example_labels=[e["label"] for e in examples], label="Examples",
                                        examples_per_page=len(examples))
                        with gr.Row():
                            run_btn = gr.Button("Run", variant="primary", elem_id="run")
                            stop_btn = gr.Button("Stop", variant="stop", elem_id="stop", interactive=False)
                        status = gr.HTML("", elem_id="status", label="status")
                    with gr.Column(scale=2, elem_id="method-list"):  # scrolls inside a capped height
                        # First in the method list, not at its foot below every method (a new user missed it).
                        with gr.Accordion("Generation settings", open=False, elem_id="gen-settings"):
                            gen = [knob_input(k, f"gen-{k.name}") for k in GENERATION_KNOBS]
                            gen.append(gr.Textbox(label="Stop strings", lines=2, elem_id="gen-stop",
                                                  placeholder="one per line, e.g. ###",
                                                  info="Each output ends at the first of these texts (kept)."))
                            model_gen = engine.generation_defaults()
                            gen.append(knob_input(REPETITION_PENALTY_KNOB, "gen-repetition_penalty",
                                                  value=model_gen["applied"].get("repetition_penalty", 1.0)))
                            gr.Markdown(model_settings_note(model_gen), elem_id="gen-from-model")
                        gr.Markdown("### Methods")
                        use, knobs, reasons = {}, [], {}
                        for m, info in METHODS.items():
                            reason = wording.unavailable_text(engine, m)
                            use[m] = gr.Checkbox(value=available[m], label=info.label, info=info.description,
                                                 interactive=available[m], elem_id=f"use-{m}")
                            reasons[m] = gr.Markdown(f"**Unavailable:** {reason}" if reason else "", visible=bool(
                                reason), elem_id=f"reason-{m}", elem_classes=["unavailable-reason"])
                            if info.knobs:
                                with gr.Accordion(f"{info.label} settings", open=False):
                                    knobs += [knob_input(k, f"{m}-{k.name}", available[m],
                                                          engine.knob_defaults(m).get(k.name),
                                                          choices=engine.knob_choices(m, k.name))
                                              for k in info.knobs]
                                    if m == "medusa":  # tree presets, custom tree editor, tree picture
                                        medusa_panel.build(engine, dict(zip([k.name for k in info.knobs],
                                                                            knobs[-len(info.knobs):])), models)
                                    if m == "lookahead":  # tokens per pass next to W/N/G, and presets
                                        insight.lookahead_controls(dict(zip([k.name for k in info.knobs],
                                                                            knobs[-len(info.knobs):])))

                def legend_html(e: Engine) -> str:
                    return guide.legend_with_guide_html(legend_sources(e), source_labels())
                legend = gr.HTML(legend_html(engine), elem_id="legend")
                # The legend lists what the session's models produce: it follows a load on the Models tab.
                models.follow(lambda e, _key: legend_html(e), [], [legend])
                panel_cols, panel_outputs = {}, []
                with gr.Row(equal_height=False, elem_id="method-panels"):
                    for m, info in METHODS.items():
                        with gr.Column(visible=bool(use[m].value), elem_classes=["method-panel"],
                                       elem_id=f"col-{m}", min_width=300) as col:
                            gr.Markdown(f"**{info.label}**", elem_classes=["panel-title"])
                            # The value only grows during a run (spans appended), so it streams as diffs;
                            # the wrapper and its CSS live in the template.
                            tokens = gr.HTML(render.placeholder("press Run to generate"), elem_id=f"panel-{m}",
                                             label=f"{m} text", html_template='<div class="tokens">${value}</div>',
                                             css_template=render.TOKENS_CSS, max_height=420, autoscroll=True)
                            stats = gr.Markdown("", elem_id=f"stats-{m}", elem_classes=["stats-line"],
                                                label=f"{m} stats")
                            badge = gr.HTML("", elem_id=f"badge-{m}", elem_classes=["badge-line"],
                                            label=f"{m} lossless check")
                        panel_cols[m] = col
                        panel_outputs += [tokens, stats, badge]
                # The draft model's per-position acceptance, time split and suggested K: below the
                # panel grid (inside it, it would make the draft column taller than the others).
                with gr.Column(visible=bool(use["draft_model"].value), elem_id="col-draft-insight") as insight_col:
                    draft_insight = insight.build_draft_panel()
                with gr.Row():
                    # Before the first run: an empty figure with a note (an empty gr.Plot shows a broken image).
                    chart = gr.Plot(charts.empty_figure("Tokens generated over time", "press Run to see each "
                                                        "method's tokens over time"),
                                    label="Tokens over time", show_label=False, elem_id="chart", scale=3)
                    bars = gr.Plot(charts.empty_figure("Throughput", "press Run to compare tokens per second"),
                                   label="Tokens per second", show_label=False, elem_id="bars", scale=2)

                inspector = step_inspector.build(engine, engine_key, run_steps, models)
                run_charts = insight.build_run_charts()
            with gr.Tab("Models", id="models", elem_id="tab-models"):
                models.build(header, use, reasons, knobs, _knob_keys())
            with gr.Tab("History", id="history", elem_id="tab-history"):
                runs = history.HistoryPanel()
            with gr.Tab("Benchmark", id="benchmark", elem_id="tab-benchmark"):
                bench_tab.build(engine, models)
            with gr.Tab("Theory", id="theory", elem_id="tab-theory") as theory:
                theory_tab.build(engine, last_run, theory, models)
            with gr.Tab("Advisor", id="advisor", elem_id="tab-advisor") as advisor_page:
                advisor_tab.build(engine, use, dict(zip(_knob_keys(), knobs)), last_run, models, advisor_page)
            if vllm is not None:  # a vllm_panel.VLLMSession (app.py --vllm / --vllm-url)
                from . import vllm_panel
                with gr.Tab("vLLM", id="vllm", elem_id="tab-vllm"):
                    vllm_panel.build(vllm, engine)

        for m in METHODS:
            use[m].change(lambda on: gr.Column(visible=bool(on)), use[m], panel_cols[m],
                          api_visibility="private", queue=False)
        use["draft_model"].change(lambda on: gr.Column(visible=bool(on)), use["draft_model"], insight_col,
                                  api_visibility="private", queue=False)

        def run(request: gr.Request, *values):  # the last value: this session's engine key (the Models tab)
            key = getattr(request, "session_hash", None)
            flag = STOPS.flag(key)  # armed by the Run click; a fresh one for an API call
            try:
                # What methods learn across runs (suffix decoding's cache, ...) stays this session's.
                yield from models.run(lambda chosen, *v: run_comparison(chosen, *v, stop=flag, scope=session_scope(key)),
                                      *values)
            finally:
                STOPS.release(key, flag)

        # Named parameters in the API (``client.submit(prompt=..., use_prompt_lookup=True, ...)``).
        # (Gradio passes the request to a positional parameter annotated gr.Request; it is not an input.)
        run.__signature__ = inspect.Signature(
            [inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=gr.Request)]
            + [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in input_names() + ["engine_key"]])

        # While a run streams, the method ticks are locked (changed mid-run, a running method's panel vanished
        # and a new one stood empty) and come back as the session's models allow.
        def arm(request: gr.Request):
            STOPS.arm(getattr(request, "session_hash", None))
            return gr.Button(interactive=False), gr.Button(interactive=True), *(gr.Checkbox(interactive=False),) * len(use)

        def idle(key, request: gr.Request):
            STOPS.forget(getattr(request, "session_hash", None))  # also for a run that never started (queue full)
            e = models.cache.get(key) or engine
            return (gr.Button(interactive=True), gr.Button(interactive=False),
                    *(gr.Checkbox(interactive=e.unavailable_reason(m) is None) for m in use))

        armed = run_btn.click(arm, None, [run_btn, stop_btn, *use.values()], api_visibility="private", queue=False)
        run_event = armed.then(run, [prompt, *use.values(), *knobs, *gen, models.key],
                               [status, *panel_outputs, chart, bars, run_steps, last_run], api_name="run",
                               concurrency_id="engine")
        inspector.wire(run_event)
        for ended in (run_event.then, run_event.failure):  # .then skips a run that raised (gr.Error: models gone)
            ended(idle, models.key, [run_btn, stop_btn, *use.values()], api_visibility="private", queue=False)
        # The per-run charts and the draft panel's insight, from the finished run's plain data.
        run_event.then(insight.after_run, [last_run, models.key], [*run_charts, *draft_insight],
                       api_visibility="private", queue=False)
        runs.follow(run_event, last_run)  # the History tab
        # Stop sets this session's flag; the run ends at once (the engine after its current step) and says so itself.
        def stop(request: gr.Request):
            STOPS.stop(getattr(request, "session_hash", None))

        stop_btn.click(stop, None, None, api_visibility="private", queue=False)
        demo.unload(forget_session)  # a closed tab's learned state goes with it
    # Two runs may be in flight at once: the engine serialises their steps with its lock and
    # each run keeps its own caches, so both stream (interleaved) instead of one waiting.
    # On Hugging Face Spaces (shared CPU or one ZeroGPU slice) one run at a time.
    demo.queue(default_concurrency_limit=1 if worker.on_spaces() else CONCURRENT_RUNS, max_size=QUEUE_SIZE)
    return demo


def _knob_keys() -> list[tuple[str, str]]:
    """``(method, knob name)`` of each method knob input, in :func:`input_names` order."""
    return [(m, k.name) for m, info in METHODS.items() for k in info.knobs]
