"""One method failing during a side-by-side run ends that method alone: the others run to their end,
the failing one's last event says why (finish reason "error"), and the page says so in its panel,
badge, a toast and the verdict line, while the server keeps serving."""

from __future__ import annotations

import html

import pytest

from helpers import FakeLoaded, tiny_llama
from playground.engine import Engine, GenerationSettings, MethodSpec
from playground.engine.events import RunStats, StepEvent, round_robin
from playground.engine.prompt_lookup import PromptLookupDrafter

PL = MethodSpec("prompt_lookup", {"budget": "off"})


def _event(method, step, finished=False):
    stats = RunStats(new_tokens=step + 1, steps=step + 1)
    return StepEvent(method, step, [step], ["target"], [(str(step), "target")], 0, 0, 0.01, [1.0], stats,
                     finished=finished, finish_reason="length" if finished else None)


def test_round_robin_ends_a_failing_stream_alone():
    def good():
        for i in range(4):
            yield _event("a", i, finished=i == 3)

    def bad():
        yield _event("b", 0)
        yield _event("b", 1)
        raise RuntimeError("boom")

    events = list(round_robin([("a", good()), ("b", bad())]))
    assert [e.step for e in events if e.method == "a"] == [0, 1, 2, 3]
    last = [e for e in events if e.method == "b"][-1]
    assert last.finished and last.finish_reason == "error" and last.error == "RuntimeError: boom"
    assert last.step == 2 and last.tokens == [] and last.stats.new_tokens == 2  # the statistics of its last step


def test_a_stream_failing_at_its_first_step_ends_with_empty_statistics():
    def bad():
        raise MemoryError("out of memory")
        yield  # noqa: unreachable - makes this a generator

    (event,) = list(round_robin([("b", bad())]))
    assert event.finish_reason == "error" and event.step == 0 and event.stats.new_tokens == 0
    assert event.error == "MemoryError: out of memory"


@pytest.fixture
def failing_prompt_lookup(monkeypatch):
    """Prompt lookup raises at its second proposal (a bug met on some model)."""
    calls = []
    propose = PromptLookupDrafter.propose

    def broken(self, state):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("a bug in the drafter")
        return propose(self, state)
    monkeypatch.setattr(PromptLookupDrafter, "propose", broken)


def test_engine_run_goes_on_when_one_method_fails(torch_single_thread, failing_prompt_lookup):
    engine = Engine(FakeLoaded(tiny_llama(0)))
    settings = GenerationSettings(max_new_tokens=12)
    prompt = [5, 6, 7, 8, 5, 6, 7, 9]
    alone = [t for e in engine.run(prompt, [MethodSpec("autoregressive")], settings) for t in e.tokens]
    events = list(engine.run(prompt, [MethodSpec("autoregressive"), PL], settings))
    assert [t for e in events if e.method == "autoregressive" for t in e.tokens] == alone
    last = [e for e in events if e.method == "prompt_lookup"][-1]
    assert last.finish_reason == "error" and last.error == "RuntimeError: a bug in the drafter"


@pytest.mark.real_model
def test_the_page_says_which_method_failed(real_target, failing_prompt_lookup, monkeypatch):
    from playground.engine.methods import METHODS
    from playground.ui import app
    from playground.ui.app import run_arguments, run_comparison

    toasts = []
    monkeypatch.setattr(app, "warning", toasts.append)
    engine = Engine(real_target)
    args = run_arguments("Repeat: the cat sat on the mat. The cat sat on the mat.",
                         ["autoregressive", "prompt_lookup"], {"prompt_lookup": {"budget": "off"}}, max_new_tokens=32)
    values = list(run_comparison(engine, *args))[-1]
    names = list(METHODS)
    panel = {m: html.unescape(str(values[1 + 3 * names.index(m)])) for m in names}
    badge = {m: html.unescape(str(values[3 + 3 * names.index(m)])) for m in names}
    status = html.unescape(str(values[0]))
    assert "Prompt lookup failed here: RuntimeError: a bug in the drafter" in panel["prompt_lookup"]
    assert "failed: its output is not checked" in badge["prompt_lookup"]
    assert "Done in" in status and "Prompt lookup failed (see its panel)" in status
    assert "Fastest" not in status  # the baseline is the only method that finished
    assert toasts == ["Prompt lookup failed: RuntimeError: a bug in the drafter"]
    assert "failed" not in panel["autoregressive"] and len(panel["autoregressive"]) > 100
