"""The Models tab's engine cache and choices, and the History tab's records (no model loads here).

Properties checked: the engine cache is bounded (least recently used dropped, from the worker's
registry too), shared by sessions that chose the same models and never drops the server's own
engine; a session's run resolves its own key; load progress is shown in page terms; the history
keeps the last 10 runs; a run's download reads back with the benchmark's readers and summarises
like a benchmark file; user text in the history is escaped.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import app
from playground import bench
from playground.engine import RunStats
from playground.ui import history, models_tab, worker


# ----- the engine cache -------------------------------------------------------------------------
class FakeEngine:
    """Stands in for an Engine: the cache only keeps it; availability follows ``parts``."""

    def __init__(self, name: str, draft: bool = False):
        self.name, self.has_draft = name, draft
        self.target = SimpleNamespace(name=name, device="cpu", dtype="float32")
        self.draft = SimpleNamespace(name="d") if draft else None

    def describe(self) -> dict:
        return {"target": self.name, "draft": self.draft.name if self.draft else None, "medusa_heads": 0,
                "eagle": False, "device": "cpu", "dtype": "float32"}

    def unavailable_reason(self, method: str):
        return "no draft model is loaded" if method == "draft_model" and not self.has_draft else None


@pytest.fixture
def loads(monkeypatch):
    """Replace the loader: every load makes a FakeEngine and is recorded."""
    calls = []

    def fake_load(choice, device="auto", dtype="auto", progress=None):
        if choice.target == "broken":
            raise models_tab.ModelLoadError("could not load model 'broken': no such folder")
        calls.append(choice)
        if progress is not None:
            progress(0.0, f"locating model {choice.target!r}")
        return FakeEngine(choice.target, draft=choice.draft == models_tab.SAME)
    monkeypatch.setattr(models_tab, "load_choice", fake_load)
    return calls


def test_cache_is_bounded_shared_and_keeps_the_default(loads):
    """Three choices in a cache of 2: the least recently used one is dropped (from worker.ENGINES
    too); asking again for a loaded choice loads nothing; the default is never dropped."""
    default = FakeEngine("server")
    cache = models_tab.EngineCache(default, capacity=2)
    a, b, c = (models_tab.ModelChoice(t) for t in ("a", "b", "c"))
    ka = cache.load(a)
    assert cache.load(models_tab.ModelChoice("a", "  ")) == ka and len(loads) == 1  # same choice: shared
    kb = cache.load(b)
    engine_b = cache.get(kb)
    worker.register(engine_b)  # what run_comparison does with the engine it runs
    assert cache.get(ka).name == "a"  # a is now the most recently used
    kc = cache.load(c)
    assert cache.keys() == [ka, kc] and cache.get(kb) is None
    assert kb not in worker.ENGINES and engine_b not in worker.ENGINES.values()
    assert cache.get(None) is default and cache.get(cache.default_key) is default
    assert worker.ENGINES[cache.default_key] is default
    # A dropped choice loads again when its session runs (the key encodes the choice).
    assert cache.ensure(kb).name == "b" and len(loads) == 4 and len(cache.keys()) == 2


def test_failed_load_leaves_the_cache_as_it_was(loads):
    cache = models_tab.EngineCache(FakeEngine("server"))
    with pytest.raises(models_tab.ModelLoadError, match="no such folder"):
        cache.load(models_tab.ModelChoice("broken"))
    assert cache.keys() == []
    with pytest.raises(ValueError, match="choose a target"):
        cache.load(models_tab.ModelChoice(" "))
    with pytest.raises(ValueError, match="cannot be the target itself"):
        models_tab.ModelChoice("default", medusa=models_tab.SAME).checked()
    with pytest.raises(ValueError, match="capacity"):
        models_tab.EngineCache(FakeEngine("x"), capacity=0)


def test_choice_key_round_trips():
    choice = models_tab.ModelChoice("default", models_tab.SAME, models_tab.NONE, models_tab.AUTO)
    assert models_tab.ModelChoice.from_key(choice.key) == choice
    with pytest.raises(ValueError, match="not a model choice"):
        models_tab.ModelChoice.from_key("engine-123")


def test_each_session_runs_on_its_own_key(loads):
    """Two sessions (two keys in their gr.State): the run of each gets its own engine."""
    panel = models_tab.ModelsPanel(FakeEngine("server"), locked=False)
    mine = panel.cache.load(models_tab.ModelChoice("default", models_tab.SAME))

    def fake_run(engine, *values):
        yield engine.name, values

    assert list(panel.run(fake_run, "prompt", True, mine)) == [("default", ("prompt", True))]
    assert list(panel.run(fake_run, "prompt", True, panel.cache.default_key)) == [("server", ("prompt", True))]
    # A run whose engine is dropped while it runs leaves nothing registered behind.
    engine = panel.cache.get(mine)

    def dropped_meanwhile(engine, *values):
        worker.register(engine)  # as run_comparison does
        panel.cache.load(models_tab.ModelChoice("x"))
        panel.cache.load(models_tab.ModelChoice("y"))  # capacity 2: `mine` is dropped
        yield "done"

    assert list(panel.run(dropped_meanwhile, mine)) == ["done"]
    assert engine not in worker.ENGINES.values() and panel.cache.default in worker.ENGINES.values()


def test_load_handler_updates_follow_the_new_engine(loads):
    """After a load, the draft model's checkbox is enabled and ticked (it was unavailable), its
    reason is hidden, and the message says the models are for this browser tab only; the progress
    bar got page terms."""
    panel = models_tab.ModelsPanel(FakeEngine("server"), locked=False)
    panel.knob_keys, panel._n_updates = [("draft_model", "k")], 2 * len(models_tab.METHODS) + 1
    shown = []
    out = panel.load("default", models_tab.SAME, "auto", "auto", panel.cache.default_key,
                     progress=lambda f, desc="": shown.append((f, desc)))
    key, status, current, header = out[:4]
    assert key.startswith(models_tab.KEY_PREFIX) and "this browser tab only" in status
    methods = list(models_tab.METHODS)
    i = methods.index("draft_model")
    box, reason = out[4 + i], out[4 + len(methods) + i]
    assert box["interactive"] is True and box["value"] is True
    assert reason["visible"] is False and out[-1]["interactive"] is True
    assert shown and shown[0][1].startswith("Target: looking for it") and "'" not in shown[0][1]
    # A failed load keeps the session's key and says so.
    out = panel.load("broken", "auto", "auto", "auto", key, progress=lambda *a, **k: None)
    assert out[0] == key and "Could not load these models" in out[1]
    # Locked: nothing loads.
    locked = models_tab.ModelsPanel(FakeEngine("server"), locked=True)
    locked.knob_keys, locked._n_updates = [], 2 * len(methods)
    assert "fixed on this server" in locked.load("default", "auto", "auto", "auto", None,
                                                 progress=lambda *a, **k: None)[1]


def test_no_load_or_reset_while_the_sessions_run_streams(loads):
    """Loading models (or going back to the server's) while the session's Playground run streams is
    refused with a message that says what to do: after a load mid-run the run ended on the old models
    and its verdict crowned a method whose panel the new models had hidden. Other sessions load."""
    from playground.ui.run_control import StopSignals

    stops = StopSignals()
    panel = models_tab.ModelsPanel(FakeEngine("server"), locked=False, running=stops.armed)
    panel.knob_keys, panel._n_updates = [], 2 * len(models_tab.METHODS)
    flag = stops.arm("mine")
    mine, other = SimpleNamespace(session_hash="mine"), SimpleNamespace(session_hash="other")
    quiet = dict(progress=lambda *a, **k: None)
    out = panel.load("default", models_tab.SAME, "auto", "auto", None, mine, **quiet)
    assert out[0] is None and "press Stop there or wait for it to end" in out[1] and not loads
    assert all(u == models_tab.gr.skip() for u in out[2:])
    key = panel.load("default", models_tab.SAME, "auto", "auto", None, other, **quiet)[0]
    assert key.startswith(models_tab.KEY_PREFIX) and len(loads) == 1
    back = panel.reset(key, mine)
    assert back[0] == key and "Not now" in back[1] and len(back) == 2 + panel._n_updates + 7
    stops.release("mine", flag)
    assert panel.reset(key, mine)[0] == panel.cache.default_key
    assert panel.load("default", models_tab.SAME, "auto", "auto", None, mine, **quiet)[0] == key
    # A Run pressed while the models loaded: the session keeps its models; the loaded ones are kept for later.
    started = lambda *a, **k: stops.arm("mine") and None  # noqa: E731 - the load's progress, mid-load
    out = panel.load("x", "auto", "auto", "auto", key, mine, progress=started)
    assert out[0] == key and "a run started while they loaded" in out[1] and len(loads) == 2
    stops.forget("mine")
    assert not stops.armed("mine")
    assert panel.load("x", "auto", "auto", "auto", key, mine, **quiet)[0] != key and len(loads) == 2


def test_progress_in_page_terms():
    """Engine.load's stage messages become 'Target: …' / 'Draft: …' with a growing fraction, no paths."""
    shown = []
    show = models_tab.page_progress(lambda f, desc="": shown.append((f, desc)), started=0.0)
    for f, msg in [(0.0, "locating model 'default'"), (0.7, "loading X weights (float32)"),
                   (1.0, "X ready on cpu"), (0.0, "locating model '/secret/path/draft'"),
                   (0.9, "moving default to cpu"), (0.0, "loading Medusa heads /secret/path/medusa")]:
        show(f, msg)
    fractions = [f for f, _ in shown]
    assert fractions == sorted(fractions) and fractions[-1] < 1.0
    texts = [d for _, d in shown]
    assert texts[1].startswith("Target: reading its weights") and texts[3].startswith("Draft: looking for it")
    assert texts[5].startswith("Loading the Medusa heads") and not any("/secret" in t for t in texts)


def test_local_models_and_choices(tmp_path, monkeypatch):
    """A models folder's checkpoint folders and .gguf files are offered; hub presets only with a hub."""
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text("{}")
    (tmp_path / "empty").mkdir()
    (tmp_path / "m.gguf").write_bytes(b"")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no-cache"))
    found = models_tab.local_models(tmp_path)
    assert ("tiny", str(tmp_path / "tiny")) in found and ("m.gguf", str(tmp_path / "m.gguf")) in found
    assert not any(name == "empty" for name, _ in found)
    offline = models_tab.choice_lists(tmp_path, hub=False)
    assert [v for _, v in offline["preset"]] == ["default"]
    assert "HuggingFaceTB/SmolLM2-1.7B-Instruct" not in [v for _, v in offline["target"]]
    online = models_tab.choice_lists(tmp_path, hub=True)
    assert "HuggingFaceTB/SmolLM2-1.7B-Instruct" in [v for _, v in online["target"]]
    assert models_tab.preset_values("vicuna-7b-medusa")[2] == "FasterDecoding/medusa-vicuna-7b-v1.3"


def test_lock_flag(monkeypatch):
    """--lock-models is off by default here and on by default on Hugging Face Spaces."""
    monkeypatch.delenv("SPACE_ID", raising=False)
    assert app.parse_args([]).lock_models is False
    assert app.parse_args(["--lock-models"]).lock_models is True
    monkeypatch.setenv("SPACE_ID", "someone/playground")
    monkeypatch.setattr(app.importlib.util, "find_spec", lambda name: object())  # the GGUF package is there
    assert app.parse_args([]).lock_models is True
    assert app.parse_args(["--no-lock-models"]).lock_models is False


# ----- the history ------------------------------------------------------------------------------
def _stats(steps: int, tokens_per_step: int, seconds: float, proposed: int = 0) -> dict:
    s = RunStats()
    for i in range(steps):
        s.record_step(seconds=seconds, emitted=tokens_per_step, proposed=proposed,
                      accepted=tokens_per_step - 1 if i else 0, prefill=i == 0)
    return s.as_dict()


def summary(prompt: str = "Tell me a <b>story</b>", scale: float = 1.0) -> dict:
    """A run summary shaped as RunView.summary() gives it."""
    base = _stats(8, 1, 0.05 * scale)
    fast = _stats(4, 2, 0.06 * scale, proposed=3)
    return {"target": "SmolLM2", "draft": None, "dtype": "float32", "prompt": prompt,
            "settings": {"max_new_tokens": 8, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0,
                         "stop_strings": []},
            "baseline_tokens_per_s": base["tokens_per_s"],
            "methods": {"autoregressive": {"label": "Autoregressive", "params": {}, "stats": base,
                                           "tokens_per_step": [1] * 8, "output_ids": list(range(8)),
                                           "output_text": "a, b \"c\"\nd", "margins": [1.0] * 8,
                                           "finish_reason": "length"},
                        "prompt_lookup": {"label": "Prompt lookup", "params": {"num_tokens": 3},
                                          "stats": fast, "tokens_per_step": [2] * 4, "output_ids": list(range(8)),
                                          "output_text": "a, b \"c\"\nd", "margins": [1.0] * 8,
                                          "finish_reason": "length"}}}


def test_history_keeps_the_last_ten_and_skips_repeats():
    h = []
    for i in range(12):
        h = history.add_run(h, summary(f"prompt {i}", scale=1 + i))
    assert len(h) == history.MAX_RUNS and [e["number"] for e in h] == list(range(3, 13))
    assert history.add_run(h, h[-1]["summary"]) == h  # the same run again (e.g. a refused input)
    assert history.add_run(h, None) == h
    assert history.add_run(h, {"methods": {"autoregressive": {"stats": {}}}}) == h
    with pytest.raises(TypeError, match="a run summary is a dict"):
        history.add_run(h, "run")


def test_download_reads_back_with_the_benchmark_readers(tmp_path):
    """JSON lines and CSV of one run: complete records (the contract's fields), equal after reading
    back with bench.read_records / bench.from_csv, and bench.summarize gives the run's speedup."""
    entry = history.add_run([], summary())[0]
    jsonl, csv_path = history.write_files(entry, tmp_path)
    recs = bench.read_records(jsonl)
    assert [r["method"] for r in recs] == ["autoregressive", "prompt_lookup"]
    assert all(bench.missing_fields(r) == [] for r in recs)
    assert recs == history.records(entry)
    assert bench.from_csv(Path(csv_path).read_text(encoding="utf-8")) == recs
    r = recs[1]
    assert r["question_id"] == "playground-run-1" and r["category"] == history.CATEGORY and r["turn"] == 0
    assert r["mean_accepted_tokens"] == pytest.approx(2.0) and r["prompt"] == "Tell me a <b>story</b>"
    rows = {row["method"]: row for row in bench.summarize(recs) if row["category"] == "overall"}
    s = entry["summary"]["methods"]
    expected = s["prompt_lookup"]["stats"]["tokens_per_s"] / s["autoregressive"]["stats"]["tokens_per_s"]
    assert rows["prompt_lookup"]["speedup"] == pytest.approx(expected)
    assert rows["prompt_lookup"]["lossless"] == "yes"


def test_table_and_comparison_escape_user_text():
    """A prompt with markup is shown as text, in the table, its tooltip and the comparison."""
    evil = '<img src=x onerror="alert(1)"> & "quotes"'
    h = history.add_run(history.add_run([], summary()), summary(evil, scale=2))
    table = history.table_html(h)
    assert "<img" not in table and html.escape(evil[:history.PROMPT_CHARS]) in table
    assert table.index('data-run="2"') < table.index('data-run="1"')  # newest first
    assert "Prompt lookup" in table and "×" in table and "τ 2.00" in table
    cmp = history.compare_html(h, 1, 2)
    assert "<img" not in cmp and "Run 1" in cmp and "Run 2" in cmp
    assert cmp.count('data-method="prompt_lookup"') == 1
    assert "<td>25%</td>" in cmp  # alpha as a percentage, as on the stats line (3 of 12 drafted accepted)
    assert "Pick two runs" in history.compare_html(h, 1, 99)
    assert history.settings_text({"max_new_tokens": 64, "temperature": 0.7, "top_p": 0.9, "top_k": 0,
                                  "seed": 3, "stop_strings": ["###"]}) == \
        "64 new tokens, temperature 0.7, top-p 0.9, top-k 0, seed 3, 1 stop string"
    # A repetition penalty changes the output: two runs that differ in it must not read the same.
    assert history.settings_text({"max_new_tokens": 24, "temperature": 0.0, "repetition_penalty": 1.3}) == \
        "24 new tokens, greedy, repetition penalty 1.3"
    assert history.settings_text({"max_new_tokens": 24, "temperature": 0.0, "repetition_penalty": 1.0}) == \
        "24 new tokens, greedy"
    assert history.table_html([]) == history.EMPTY


def test_after_run_fills_pickers_with_the_two_newest():
    panel = history.HistoryPanel.__new__(history.HistoryPanel)  # handlers only; no components needed
    out = panel.after_run([], summary())
    assert len(out[0]) == 1 and out[3]["value"] == 1
    out = panel.after_run(out[0], summary("second", scale=2))
    new, table, a, b, cmp, pick = out
    assert (a["value"], b["value"], pick["value"]) == (1, 2, 2) and "Run 2" in cmp
    assert panel.after_run(new, new[-1]["summary"]) == (history.gr.skip(),) * 6
    json.dumps(new)  # plain data (a gr.State value)


def test_unavailable_reasons_after_a_load_are_in_page_terms():
    """After a load, a method the new models cannot serve says why without a command line."""
    from types import SimpleNamespace

    from playground.ui.models_tab import method_updates

    engine = SimpleNamespace(unavailable_reason=lambda m: None if m not in ("medusa", "draft_model") else
                             "no Medusa heads are loaded: start with --medusa PATH_OR_HUB_ID, or train heads with "
                             "`python -m playground.training.medusa`", target=SimpleNamespace(name="t"),
                             loaded_parts=lambda: {"target": True})
    updates = method_updates(engine, None, [])
    texts = [u.get("value", "") for u in updates if isinstance(u, dict) and isinstance(u.get("value"), str)]
    assert texts and not any("--" in t or "python -m" in t for t in texts), texts


def test_a_choice_loads_in_a_thread_that_ends(monkeypatch):
    """The Models tab's load runs Engine.load in a thread of its own that has ended when it returns:
    Gradio reuses the handler's worker thread, and a team of OpenMP threads kept there slowed every
    later run by a third (29-31 against 42-48 tokens/s, the default model, 2-core Zen 5 EPYC)."""
    import threading

    from playground.engine import Engine

    seen = []
    monkeypatch.setattr(Engine, "load", classmethod(lambda cls, *a, **k: seen.append(threading.current_thread())
                                                     or "an engine"))
    assert models_tab.load_choice(models_tab.ModelChoice("a")) == "an engine"
    assert seen[0] is not threading.current_thread() and not seen[0].is_alive()
