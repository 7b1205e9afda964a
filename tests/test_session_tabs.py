"""Every tab follows the models a browser session chose on the Models tab (no model loads here).

Property checked, per tab: its handler, given the session's engine key (the Models tab's ``gr.State``),
works on that session's engine, not on the server's startup engine; and what a tab built from the
server's models (methods offered, saved knob defaults, sizes) is refreshed after a load. Engines are
fakes: the handlers only ask them what they hold.
"""

from __future__ import annotations

from types import SimpleNamespace

import gradio as gr
import pytest

from playground.engine import METHODS
from playground.ui import advisor_tab, bench_tab, insight, medusa_panel, models_tab, theory_tab, worker


class FakeEngine:
    """An Engine as the tabs see it: availability and saved knobs follow its draft and heads."""

    def __init__(self, name: str, draft: bool = False, heads: int = 0, saved_k: int | None = None,
                 params: float = 135e6):
        self.name, self.params = name, params
        self.target = SimpleNamespace(name=name, device="cpu", dtype="float32", spec=name)
        self.draft = SimpleNamespace(name=f"{name}-draft", knob_defaults={"k": saved_k} if saved_k else {}) \
            if draft else None
        self.medusa = SimpleNamespace(num_heads=heads) if heads else None
        self.eagle = None

    def describe(self) -> dict:
        return {"target": self.name, "draft": self.draft.name if self.draft else None,
                "medusa_heads": self.medusa.num_heads if self.medusa else 0, "eagle": False, "device": "cpu",
                "dtype": "float32"}

    def unavailable_reason(self, method: str):
        if method in ("draft_model", "mixture") and self.draft is None:
            return "no draft model is loaded"
        if method == "medusa" and self.medusa is None:
            return "no Medusa heads are loaded"
        if method == "eagle":
            return "no EAGLE head is loaded"
        return None

    def knob_defaults(self, method: str) -> dict:
        return dict(self.draft.knob_defaults) if method == "draft_model" and self.draft is not None else {}

    def knob_choices(self, method: str, knob: str):
        return None

    def parameter_count(self, part: str) -> int:
        return int(self.params if part == "target" else self.params / 2)

    def generation_defaults(self) -> dict:
        return {"applied": {}}


@pytest.fixture
def panel(monkeypatch):
    """A Models panel over a server engine without a draft, and a session key whose engine has one."""
    monkeypatch.setattr(models_tab, "load_choice",
                        lambda choice, device="auto", dtype="auto", progress=None:
                        FakeEngine("session", draft=True, saved_k=3, heads=2, params=360e6))
    server = FakeEngine("server")
    models = models_tab.ModelsPanel(server, locked=False)
    key = models.cache.load(models_tab.ModelChoice("session", models_tab.SAME))
    return models, server, key


def handler(demo: gr.Blocks, elem_id: str, event: str = "click"):
    """The function wired to ``event`` of the component with ``elem_id``."""
    ids = [b._id for b in demo.blocks.values() if getattr(b, "elem_id", None) == elem_id]
    return next(f.fn for f in demo.fns.values() if any(t == (ids[0], event) for t in f.targets))


def follower(demo: gr.Blocks, models, outputs) -> object:
    """The function wired to the session key's change whose outputs are ``outputs``."""
    want = [o._id for o in outputs]
    return next(f.fn for f in demo.fns.values() if (models.key._id, "change") in f.targets
                and [o._id for o in f.outputs] == want)


def test_benchmark_runs_on_the_sessions_engine_and_its_methods_follow(panel, monkeypatch):
    """The Benchmark tab's run gets the session's engine (its draft model can be benchmarked); after a
    load its methods box offers and ticks the draft model and K takes the draft's saved value."""
    models, server, key = panel
    seen = []

    def fake_bench(engine_key, questions, specs, settings, warmup):
        seen.append((worker.ENGINES[engine_key], [s["name"] for s in specs]))
        yield {"type": "warning", "message": "stopped by the test"}
    monkeypatch.setattr(worker, "BENCH", fake_bench)
    with gr.Blocks() as demo:
        bench_tab.build(server, models)
    run = next(f.fn for f in demo.fns.values() if f.api_name == "benchmark")  # after Run's button update
    knob_values = [k.default for _, k in bench_tab.knob_keys()]
    args = ["Spec-Bench dev (bundled)", None, ["writing"], ["draft_model"], 1, 4, False, *knob_values]
    list(run(*args, key))
    assert seen == [(models.cache.get(key), ["autoregressive", "draft_model"])]
    list(run(*args, models.cache.default_key))  # the server's engine has no draft: the runner refuses it
    assert seen[-1][0] is server
    methods = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "bench-methods")
    knobs = [b for b in demo.blocks.values() if str(getattr(b, "elem_id", "")).startswith("bench-")
             and any(getattr(b, "elem_id", "") == f"bench-{m}-{k.name}" for m, k in bench_tab.knob_keys())]
    updates = follower(demo, models, [methods, *knobs])(key)
    assert "draft_model" in updates[0]["value"] and ("Draft model", "draft_model") in updates[0]["choices"]
    i = [(m, k.name) for m, k in bench_tab.knob_keys()].index(("draft_model", "k"))
    assert updates[1 + i]["value"] == 3 and updates[1 + i]["interactive"] is True


def test_a_benchmark_run_marks_the_session_busy_until_its_event_ends(panel):
    """Run on the Benchmark tab puts the session in ``bench_tab.RUNS`` (the Models tab loads nothing
    then: the method list would follow other models than the run's) and the run's end takes it out;
    a Run the tab refuses (no method) marks nothing."""
    models, server, _ = panel
    with gr.Blocks() as demo:
        bench_tab.build(server, models)
    arm, request = handler(demo, "bench-run"), SimpleNamespace(session_hash="s1")
    idle = next(f.fn for f in demo.fns.values() if f.fn.__name__ == "idle")
    assert arm("Spec-Bench dev (bundled)", None, ["writing"], [], 1, 4, request) == (gr.skip(),) * 8
    assert not bench_tab.RUNS.armed("s1")
    arm("Spec-Bench dev (bundled)", None, ["writing"], ["prompt_lookup"], 1, 4, request)
    assert bench_tab.RUNS.armed("s1") and not bench_tab.RUNS.armed("s2")
    idle(bench_tab.progress_html(0, 2, "running", running=True), request)
    assert not bench_tab.RUNS.armed("s1") and len(bench_tab.RUNS) == 0


def test_theory_measures_the_sessions_engine(panel, monkeypatch):
    """The Theory tab measures the verify cost on the session's engine and caches it under its key, where
    the draft panel's lookup after a run (insight.after_run with the same key) finds it."""
    models, server, key = panel
    measured = []

    def fake_measure(engine_key, sizes=None, force=False):
        measured.append(worker.ENGINES[engine_key])
        sizes = sizes or (1, 2, 4, 8)
        return {"table": {str(n): 1.0 + 0.1 * (n - 1) for n in sizes}, "source": "measured by the test"}
    monkeypatch.setattr(worker, "MEASURE", fake_measure)
    monkeypatch.setattr(insight, "VERIFY_COSTS", {})
    with gr.Blocks() as demo:
        last_run = gr.State(None)
        with gr.Tab("Theory") as tab:
            theory_tab.build(server, last_run, tab, models)
    again = handler(demo, "theory-measure")
    out = list(again(0.7, 0.05, [2], [0.05], theory_tab.MEASURED, None, key))
    assert measured == [models.cache.get(key)] and key in insight.VERIFY_COSTS
    assert "measured by the test" in out[-1][1]
    assert insight.verify_cost_for(key).source.startswith("measured by the test")
    assert models.cache.default_key not in insight.VERIFY_COSTS  # the server's engine was not measured


def test_advisor_describes_and_applies_the_sessions_models(panel):
    """The Advisor's Apply ticks what the session's engine can run (the draft model), and after a load
    its size and "loaded" inputs describe the session's models."""
    models, server, key = panel
    with gr.Blocks() as demo:
        use = {m: gr.Checkbox() for m in METHODS}
        knobs = {(m, k.name): gr.Number() for m, info in METHODS.items() for k in info.knobs}
        advisor_tab.build(server, use, knobs, None, models)
    apply = handler(demo, "advisor-apply")
    advice = {"methods": ["autoregressive", "draft_model"], "params": {}, "primary": "draft_model"}
    ticked = dict(zip(METHODS, apply(advice, key)))
    assert ticked["draft_model"] is True
    assert dict(zip(METHODS, apply(advice, models.cache.default_key)))["draft_model"] is False
    ids = ("advisor-target-b", "advisor-draft-b", "advisor-loaded-draft", "advisor-loaded-medusa", "advisor-device",
           "advisor-loaded-eagle")
    inputs = [next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == i) for i in ids]
    assert follower(demo, models, inputs)(key) == (0.36, 0.18, True, True, "cpu", False)  # no EAGLE head loaded
    go = handler(demo, "advisor-go")
    md, adv, _ = go(0.36, 0.18, False, "chat", "default", "cpu", True, False, key)
    assert adv is not None and "Cannot advise" not in md


def test_opening_the_advisor_reads_the_measurements_made_since_the_page_was_built(panel, monkeypatch):
    """The advice built with the page said the device was not measured; the app times it right after it
    starts, so opening the tab advises again from this device's curve (found by a user)."""
    models, server, key = panel
    monkeypatch.setattr(insight, "VERIFY_COSTS", {})
    with gr.Blocks() as demo:
        use = {m: gr.Checkbox() for m in METHODS}
        knobs = {(m, k.name): gr.Number() for m, info in METHODS.items() for k in info.knobs}
        with gr.Tab("Advisor", elem_id="tab-advisor") as tab:
            advisor_tab.build(server, use, knobs, None, models, tab)
    first = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "advisor-output").value
    assert "not on this device" in first
    insight.VERIFY_COSTS[key] = {"table": {str(n): 1.0 + 0.05 * (n - 1) for n in (1, 2, 4, 8, 16, 32, 64)},
                                 "source": "measured by the test", "origin": "steps"}
    md, adv = handler(demo, "tab-advisor", "select")(0.36, 0.18, False, "chat", "default", "cpu", True, False,
                                                      False, key)
    assert adv is not None, md
    assert "not on this device" not in md and "this device" in md


def test_medusa_tree_checks_use_the_sessions_heads(panel):
    """The custom tree editor checks a tree against the session's Medusa heads (2 here: depth 3 is
    refused), while the server's engine without heads accepts it."""
    models, server, key = panel
    with gr.Blocks() as demo:
        knobs = {k.name: gr.Textbox(value=k.default, elem_id=f"medusa-{k.name}") for k in METHODS["medusa"].knobs}
        medusa_panel.build(server, knobs, models)
    apply = handler(demo, "medusa-tree-apply")
    tree = "[[0], [0, 0], [0, 0, 0]]"
    assert "Not applied" in apply(tree, key)[2]
    assert "(valid)" in apply(tree, models.cache.default_key)[2]


def test_playground_knobs_take_the_drafts_saved_defaults(panel):
    """After a load the Playground's K takes the value saved with the session's draft, and going back to
    the server's models returns it to the knob's own default."""
    models, server, key = panel
    engine = models.cache.get(key)
    k_knob = next(k for k in METHODS["draft_model"].knobs if k.name == "k")
    assert models_tab.knob_update(engine, server, "draft_model", "k")["value"] == 3
    assert models_tab.knob_update(server, engine, "draft_model", "k")["value"] == k_knob.default
    assert "value" not in models_tab.knob_update(server, server, "draft_model", "k")


def test_the_theory_tab_times_the_device_in_a_thread_that_ends(monkeypatch):
    """The Theory tab's verify-cost measurement runs in a thread of its own that has ended when the
    curve is drawn, never in Gradio's reused handler thread (an OpenMP team kept there slows every
    later run)."""
    import threading

    from playground.engine import theory

    seen = []

    def measure(key, ns, force):
        seen.append(threading.current_thread())
        return theory.FALLBACK.as_dict()
    monkeypatch.setattr(worker, "MEASURE", measure)
    monkeypatch.setattr(insight, "VERIFY_COSTS", {})
    out = list(theory_tab.measure_then_render(0.7, 0.05, [2], [0.05], theory_tab.MEASURED, None, "some engine"))
    assert len(out) == 2 and "Cannot compute" not in out[-1][1] and "Could not measure" not in out[-1][1]
    assert seen and seen[0] is not threading.current_thread() and not seen[0].is_alive()
