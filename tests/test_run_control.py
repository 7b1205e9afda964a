"""Stop answers at once, whatever the engine is doing: :class:`playground.ui.run_control.EventPump`
pulls a run's events in a helper thread, and the page's run handler ends on Stop while the engine is
still inside one long call (the first run's step-cost calibration takes a minute on a 2-core CPU);
while it waits for the first event the status says what the engine is doing.
"""

from __future__ import annotations

import html
import threading
import time

import pytest

from playground.ui.run_control import POLL_S, EventPump, in_joined_thread, waiting_status


def _blocking_events(release: threading.Event, log: list, n_after: int = 3):
    """A run whose first ``next()`` blocks until ``release`` (a calibration), then yields ``n_after`` events."""
    try:
        log.append("started")
        release.wait(30)
        for i in range(n_after):
            log.append(f"event {i}")
            yield {"i": i}
    finally:
        log.append("closed")


def test_pump_yields_every_event_in_order_then_ends():
    items = [x for x in EventPump(iter([{"i": i} for i in range(5)]), None, poll_s=0.01) if x is not None]
    assert items == [{"i": i} for i in range(5)]


def test_pump_ends_on_stop_while_the_engine_is_inside_one_call_and_closes_the_run_after_it():
    release, stop, log = threading.Event(), threading.Event(), []
    pump = EventPump(_blocking_events(release, log), stop, poll_s=0.02)
    waits, t0 = 0, time.perf_counter()
    for item in pump:
        assert item is None  # nothing arrives while the engine is busy
        waits += 1
        if waits == 3:
            stop.set()
    assert time.perf_counter() - t0 < 2.0, "Stop waited for the engine's call"
    pump.close()
    assert log == ["started"]  # still inside its call: not resumed, not closed under it
    release.set()  # the call returns: the helper closes the run instead of going on
    pump._thread.join(5)
    assert not pump._thread.is_alive()
    assert log == ["started", "event 0", "closed"]


def test_pump_raises_the_runs_exception_in_the_consumer():
    def failing():
        yield {"i": 0}
        raise ValueError("bad knob")

    pump = EventPump(failing(), None, poll_s=0.01)
    with pytest.raises(ValueError, match="bad knob"):
        list(pump)


def test_pump_close_ends_an_endless_run():
    log = []

    def endless():
        try:
            while True:
                yield {}
                time.sleep(0.001)
        finally:
            log.append("closed")

    pump = EventPump(endless(), None, poll_s=0.01)
    next(iter(pump))
    pump.close()
    pump._thread.join(5)
    assert not pump._thread.is_alive() and log == ["closed"]


def _logged_events(log: list, n: int = 4):
    try:
        for i in range(n):
            log.append(("made", i))
            yield {"i": i}
    finally:
        log.append(("closed",))


def _consume(pump, log: list) -> None:
    for item in pump:
        if item is None:
            continue
        time.sleep(0.03)  # the page renders an update meanwhile
        log.append(("handled", item["i"]))


def test_lockstep_pump_makes_no_event_while_the_consumer_handles_one():
    """In lockstep the engine steps only when the page asks for the next event, never while it
    renders the last one (a render beside a step slowed it, the baseline's most: docs in EventPump)."""
    log = []
    _consume(EventPump(_logged_events(log), None, poll_s=0.01, lockstep=True), log)
    assert log == [("made", 0), ("handled", 0), ("made", 1), ("handled", 1), ("made", 2), ("handled", 2),
                   ("made", 3), ("handled", 3), ("closed",)]


def test_free_pump_runs_ahead_of_the_consumer():
    """Without lockstep (the vLLM tab: the server decodes at its own pace) the helper pulls ahead."""
    log = []
    pump = EventPump(_logged_events(log), None, poll_s=0.01)
    _consume(pump, log)
    pump._thread.join(5)
    assert log.index(("made", 1)) < log.index(("handled", 0))
    assert [e for e in log if e[0] == "handled"] == [("handled", i) for i in range(4)]


def test_lockstep_pump_closed_between_events_makes_no_more_and_closes_the_run():
    log = []
    pump = EventPump(_logged_events(log), None, poll_s=2.0, lockstep=True)
    assert next(iter(pump)) == {"i": 0}
    time.sleep(0.05)
    t0 = time.perf_counter()
    pump.close()  # wakes the helper waiting to be asked, well before its poll_s
    pump._thread.join(5)
    assert not pump._thread.is_alive() and time.perf_counter() - t0 < 1.0
    assert log == [("made", 0), ("closed",)]


def test_lockstep_helper_ends_on_stop_even_unclosed():
    """A consumer that stops iterating on Stop and never closes the pump leaves no helper waiting."""
    log, stop = [], threading.Event()
    pump = EventPump(_logged_events(log), stop, poll_s=0.02, lockstep=True)
    assert next(iter(pump)) == {"i": 0}
    stop.set()
    pump._thread.join(5)
    assert not pump._thread.is_alive() and log == [("made", 0), ("closed",)]


def test_lockstep_pump_still_ends_on_stop_inside_a_long_call():
    release, stop, log = threading.Event(), threading.Event(), []
    pump = EventPump(_blocking_events(release, log), stop, poll_s=0.02, lockstep=True)
    waits = 0
    for item in pump:
        assert item is None
        waits += 1
        if waits == 3:
            stop.set()
    pump.close()
    release.set()
    pump._thread.join(5)
    assert not pump._thread.is_alive() and log == ["started", "event 0", "closed"]


def test_joined_thread_work_returns_raises_and_sees_the_callers_context():
    """in_joined_thread runs the work in another thread, which has ended on return; the result comes
    back, an exception is raised in the caller, and the caller's context variables (Gradio's
    progress tracking) are seen by the work."""
    import contextvars

    var = contextvars.ContextVar("var", default="unset")
    var.set("the caller's")
    ran = []

    def work():
        ran.append(threading.current_thread())
        return var.get()
    assert in_joined_thread(work) == "the caller's"
    assert ran[0] is not threading.current_thread() and not ran[0].is_alive()

    def fail():
        raise ValueError("bad model spec")
    with pytest.raises(ValueError, match="bad model spec"):
        in_joined_thread(fail)


def test_pump_runs_the_events_in_the_callers_context():
    """The helper thread sees the caller's context variables (Gradio's request, which a ZeroGPU
    Space's GPU call reads; an empty context there raised LookupError)."""
    import contextvars

    var = contextvars.ContextVar("request")
    var.set("the page's request")

    def events():
        yield var.get()
    assert list(EventPump(events())) == ["the page's request"]


def test_waiting_status_names_the_engines_one_time_work():
    assert "step-cost" not in waiting_status(None, 3)
    assert "per-step budget" in waiting_status("step_cost", 12.4) and "12 s" in waiting_status("step_cost", 12.4)
    assert "REST's datastore" in waiting_status("datastore/data/selfgen/default", 3)
    assert "Medusa" in waiting_status("medusa_auto_tree", 3)
    assert "the first step" in waiting_status("learned/suffix/cache", 3)
    assert "Stop ends it now" in waiting_status(None, 3)


def test_page_run_stops_at_once_during_a_calibration_and_says_what_it_waits_for(real_target):
    """The run handler with a stream that sits in a 'calibration' (``engine.making`` set) for as long
    as the test likes: the status names the calibration after ``WAITING_STATUS_S``; Stop then ends
    the page's run within a poll, every panel stopped before its first token."""
    from playground.engine import Engine
    from playground.ui import app
    from playground.ui.app import run_arguments, run_comparison

    engine = Engine(real_target)
    release, stop, log = threading.Event(), threading.Event(), []

    def stream(engine_key, prompt, specs, settings, scope=None):
        engine.making = "step_cost"
        try:
            release.wait(30)
        finally:
            engine.making = None
        yield from _blocking_events(threading.Event(), log, 0)

    args = run_arguments("Hello", ["autoregressive", "prompt_lookup"], max_new_tokens=8)
    updates, t0, stopped_at = [], time.perf_counter(), None
    try:
        for values in run_comparison(engine, *args, stream=stream, stop=stop):
            updates.append(values)
            status = html.unescape(str(values[0]))
            if "per-step budget" in status and stopped_at is None:
                stop.set()
                stopped_at = time.perf_counter()
    finally:
        release.set()
    assert stopped_at is not None, "the status never said the engine was calibrating"
    assert stopped_at - t0 >= app.WAITING_STATUS_S
    assert time.perf_counter() - stopped_at < 10 * POLL_S + 1.0, "Stop waited for the calibration"
    final = html.unescape(" ".join(str(v) for v in updates[-1]))
    assert "Stopped after 0 tokens" in final and "stopped before the first token" in final


def test_stream_says_start_before_the_first_method_reads_the_prompt():
    """The page times a run and names the method reading the prompt from the "start" event, so it
    comes once the checks pass and before the first step (the first method's prefill) runs; a
    ValueError of that first step still reaches the page as a warning."""
    from playground.engine import GenerationSettings
    from playground.ui import worker

    log = []

    class _Engine:
        def encode_prompt(self, prompt):
            return [1, 2, 3]

        def run(self, prompt_ids, specs, settings, cancel=None, scope=None):
            log.append("checked")

            def steps():
                log.append("first step")
                if specs[0].name == "bad":
                    raise ValueError("the first step refused")
                yield from ()
            return steps()

    key = worker.register(_Engine())
    try:
        settings = worker.settings_dict(GenerationSettings(max_new_tokens=4))
        stream = worker.stream_run(key, "hi", [{"name": "autoregressive", "params": {}}], settings)
        assert next(stream) == {"type": "start", "prompt_tokens": 3} and log == ["checked"]
        assert list(stream) == [] and log == ["checked", "first step"]
        bad = list(worker.stream_run(key, "hi", [{"name": "bad", "params": {}}], settings))
        assert bad == [{"type": "start", "prompt_tokens": 3}, {"type": "warning", "message": "the first step refused"}]
    finally:
        del worker.ENGINES[key]


def test_page_status_returns_to_reading_after_the_timing_and_a_late_warning_clears_the_panels(real_target):
    """After the start event the engine times this device first (``engine.making``): the status names the
    timing, and once it is over goes back to "Reading the prompt" without waiting for the first step; a
    warning at the first step then ends the run with no panel still waiting for its first token."""
    from playground.engine import Engine
    from playground.ui import app
    from playground.ui.app import run_arguments, run_comparison

    engine = Engine(real_target)

    def stream(engine_key, prompt, specs, settings, scope=None):
        yield {"type": "start", "prompt_tokens": 3}
        engine.making = "step_cost"
        try:
            time.sleep(app.WAITING_STATUS_S + 1.5)
        finally:
            engine.making = None
        time.sleep(1.0)  # the first step (prefill) is slow: the status must not wait for it
        yield {"type": "warning", "message": "the first step refused"}

    args = run_arguments("Hello", ["autoregressive", "prompt_lookup"], max_new_tokens=8)
    statuses = []
    for values in run_comparison(engine, *args, stream=stream):
        statuses.append(html.unescape(str(values[0])))
        final = html.unescape(" ".join(str(v) for v in values))
    timing = next(i for i, s in enumerate(statuses) if "per-step budget" in s)
    assert any("Reading the prompt" in s for s in statuses[timing + 1:-1]), statuses
    assert "the first step refused" in statuses[-1]
    assert "waiting for the first token" not in final and final.count("not run: see the status line above") == 2


def test_a_long_run_asks_the_browser_for_a_bounded_amount_of_redrawing_per_second(real_target):
    """The browser redraws a panel whole on every update, so a fixed update interval made its work grow
    with the output squared (a 2,048-token run fell seconds behind and took Stop late). The run handler
    spaces its updates by the panels' size: over a stream whose panels grow to about 0.7 MB, the panel
    HTML it sends in its spaced updates (all but the page's first, each method's first and last, and the
    run's last, which always go out) stays within ``UI_HTML_CHARS_PER_S`` per second of the run."""
    from playground.engine import METHODS, Engine
    from playground.ui import app, worker
    from playground.ui.app import run_arguments, run_comparison

    engine = Engine(real_target)
    names = ["autoregressive", "prompt_lookup"]
    events, piece = 1000, ("word " * 100, "target")  # each step adds about 700 characters of HTML to a panel

    def stream(engine_key, prompt, specs, settings, scope=None):
        real = worker.stream_run(engine_key, prompt, [s for s in specs if s["name"] == "autoregressive"], settings)
        yield next(real)  # "start"
        template = next(e for e in real if e["type"] == "event")
        real.close()
        for i in range(events):
            time.sleep(0.003)
            last = i >= events - 2
            yield {**template, "method": names[i % 2], "step": i // 2 + 1, "pieces": [piece], "finished": last,
                   "finish_reason": "length" if last else None,
                   "point": (i * 0.01, i // 2 + 1)}

    args = run_arguments("Hello", names, max_new_tokens=8)
    updates, t0 = [], time.perf_counter()
    for values in run_comparison(engine, *args, stream=stream):
        updates.append(values)
    elapsed = time.perf_counter() - t0
    panels = [1 + 3 * list(METHODS).index(m) for m in names]
    sizes = [sum(len(str(values[p])) for p in panels) for values in updates]
    assert max(sizes) > 600_000
    spaced = sizes[3:-3]  # the page's first update and each method's first; both methods' last and the run's
    assert sum(spaced) <= app.UI_HTML_CHARS_PER_S * elapsed, (len(updates), elapsed, spaced)
    assert len(spaced) >= 2  # it still streams


def test_a_run_refused_before_its_first_step_clears_the_last_runs_panels(real_target):
    """The engine refuses the run before any step (a prompt longer than the context): the panels of
    the chosen methods say they did not run, instead of keeping the last run's answers under the new
    prompt (found by a user); the charts are emptied and the last-run state is left alone."""
    import gradio as gr

    from playground.engine import Engine
    from playground.engine.methods import METHODS
    from playground.ui.app import run_arguments, run_comparison

    engine = Engine(real_target)

    def stream(engine_key, prompt, specs, settings, scope=None):
        yield {"type": "warning", "message": "the prompt is 9000 tokens; it exceeds the model's context"}

    args = run_arguments("Hello", ["autoregressive", "prompt_lookup"], max_new_tokens=8)
    values = list(run_comparison(engine, *args, stream=stream))[-1]
    assert "exceeds the model's context" in html.unescape(str(values[0]))
    names = list(METHODS)
    panels = {m: values[1 + 3 * names.index(m)] for m in names}
    assert all("not run: see the status line above" in panels[m] for m in ("autoregressive", "prompt_lookup"))
    assert panels["eagle"] == "" and values[-1] == gr.skip()  # the last-run state (History, insight) kept
    stats_and_badges = [values[2 + 3 * i + j] for i in range(len(names)) for j in (0, 1)]
    assert all(v == "" for v in stats_and_badges)  # no "checked once both have finished" for a run that never ran
    assert values[-2] == gr.skip()  # the step inspector stays on the last run that ran
    bars = values[-3]
    assert all(len(trace.x or ()) == 0 for trace in bars.data)  # no 0.0 bar for methods that did not run


def test_stop_signals_say_which_sessions_have_a_run_and_forget_them_when_it_ends():
    """``armed`` is what the Models tab asks before a load; ``forget`` (the page's handler once a run's
    event has ended) clears a session whose run never started, which no ``release`` would."""
    from playground.ui.run_control import StopSignals

    stops = StopSignals()
    first = stops.arm("a")
    assert stops.armed("a") and not stops.armed("b") and not stops.armed(None)
    stops.release("a", stops.arm("a"))  # a newer run's release leaves nothing behind; the old flag is gone
    assert not stops.armed("a") and not first.is_set()
    stops.arm("a")
    stops.forget("a")
    stops.forget("never armed")
    assert not stops.armed("a") and len(stops) == 0


def test_overlaps_tell_a_run_whether_another_was_in_flight_at_any_moment_of_it():
    """Two tabs' runs at once distort each other's timings (a user saw prompt lookup at 0.68x instead of
    1.0x): a run learns whether another was in flight when it began or began while it ran."""
    from playground.ui.run_control import Overlaps

    overlaps = Overlaps()
    a = overlaps.begin()
    assert not overlaps.shared(a)  # alone so far
    b = overlaps.begin()  # begins while a runs
    assert overlaps.shared(a) and overlaps.shared(b)
    assert overlaps.end(b) and overlaps.end(a)
    c = overlaps.begin()  # after both ended: alone again
    assert not overlaps.shared(c)
    assert not overlaps.end(c)


@pytest.mark.real_model
def test_a_page_run_that_shared_the_machine_says_so_after_its_speeds(real_target):
    """The same run alone and with another run in flight (a second tab's, checked in on the server's
    record): only the second's status line and toast say its speeds are less reliable."""
    from playground.engine import Engine
    from playground.ui import app as ui_app
    from playground.ui.app import run_arguments, run_comparison
    from playground.ui.run_control import OVERLAPS, SHARED_NOTE

    engine = Engine(real_target)
    args = run_arguments("Say hello.", ["autoregressive"], max_new_tokens=4)
    alone = html.unescape(str(list(run_comparison(engine, *args))[-1][0]))
    assert "Done in" in alone and SHARED_NOTE not in alone
    other = OVERLAPS.begin()
    try:
        shared = html.unescape(str(list(run_comparison(engine, *args))[-1][0]))
    finally:
        OVERLAPS.end(other)
    assert "Done in" in shared and SHARED_NOTE in shared
    assert ui_app.OVERLAPS is OVERLAPS
    again = html.unescape(str(list(run_comparison(engine, *args))[-1][0]))
    assert SHARED_NOTE not in again  # the record forgets runs that ended
