"""The benchmark runner steps every method round-robin on each (question, turn).

Fake runners (no model) check the order of steps, the ``steady_steps`` each record gets, the
ticks and what closing at one drops, and the fall-back to one method after another; the tiny
models check that the command line's records are the same either way, but for ``steady_steps``.
"""

from __future__ import annotations

import json

import pytest

from playground.bench import runner
from playground.bench.questions import Question
from playground.bench.weather import StepTime, steady_steps

from test_bench import tiny_bench, tiny_models  # noqa: F401 - fixtures


class _Target:
    context_length = 1000


class _Engine:
    """What :func:`runner.iter_runs` needs of an engine: the target's context and prompts."""

    target = _Target()

    def encode_prompt(self, messages):
        return [len(m["content"]) for m in messages]


def _runner(name: str, durations: list[float], trace: list[str], stepping: bool = True) -> runner.Runner:
    """A method whose answer takes ``len(durations)`` steps of those durations (seconds)."""
    def fields():
        return {"new_tokens": 2 * len(durations), "steps": len(durations), "wall_s": sum(durations),
                "output_text": f"{name} answer"}

    def steps(ids):
        for d in durations:
            trace.append(name)
            yield d
        return fields()

    def run(ids):
        trace.extend([name] * len(durations))
        return fields()
    return runner.Runner(name, {}, run, steps if stepping else None)


QUESTIONS = [Question(1, "qa", ["first", "second"]), Question(2, "rag", ["third"])]


def test_methods_step_in_turn_and_records_carry_steady_steps(monkeypatch):
    """Each (question, turn) interleaves the methods' steps (the fast one finishing first), and each
    record's ``steady_steps`` is the weather module's figure for the round's step log."""
    monkeypatch.setattr(runner, "TICK_S", 1e9)  # no ticks
    trace: list[str] = []
    base = [0.05, 0.01, 0.01, 0.012, 0.011]
    fast = [0.05, 0.013, 0.012]
    items = list(runner.iter_runs(_Engine(), QUESTIONS, [_runner("autoregressive", base, trace),
                                                          _runner("suffix", fast, trace)], 64))
    assert trace[:6] == ["autoregressive", "suffix"] * 3 and trace[6:8] == ["autoregressive"] * 2
    records = [item for kind, item, _ in items if kind == "record"]
    assert [(r["question_id"], r["turn"], r["method"]) for r in records] == [
        (1, 0, "autoregressive"), (1, 0, "suffix"), (1, 1, "autoregressive"), (1, 1, "suffix"),
        (2, 0, "autoregressive"), (2, 0, "suffix")]
    # The figure is the weather module's over these durations (the clock's instants only pick neighbours).
    log = [StepTime("autoregressive", i, d, i == 0) for i, d in enumerate(base)] + \
          [StepTime("suffix", i + 0.5, d, i == 0) for i, d in enumerate(fast)]
    expected = steady_steps(log, "autoregressive")
    for r in records:
        assert r["steady_steps"] == pytest.approx(expected[r["method"]], rel=1e-9)
        assert r["wall_s"] == pytest.approx(sum(base if r["method"] == "autoregressive" else fast))
    # The second turn's prompt holds each method's own first answer.
    assert records[2]["prompt_tokens"] == 3 and records[3]["prompt_tokens"] == 3


def test_ticks_come_during_a_question_and_closing_at_one_drops_its_records(monkeypatch):
    monkeypatch.setattr(runner, "TICK_S", 0.0)  # a tick after every step
    trace: list[str] = []
    runs = runner.iter_runs(_Engine(), QUESTIONS[1:], [_runner("autoregressive", [0.01] * 4, trace),
                                                       _runner("suffix", [0.01] * 2, trace)], 64)
    kinds = []
    for kind, item, count in runs:
        kinds.append(kind)
        if kind == "tick":
            assert item == {"question_id": 2, "turn": 0} and count == 0
        if len(kinds) == 3:
            runs.close()
            break
    assert kinds == ["tick"] * 3 and len(trace) == 3  # stopped at once; no record of the unfinished question
    kinds = [kind for kind, *_ in runner.iter_runs(_Engine(), QUESTIONS[1:], [
        _runner("autoregressive", [0.01] * 4, []), _runner("suffix", [0.01] * 2, [])], 64)]
    assert kinds == ["tick"] * 6 + ["record"] * 2


@pytest.mark.parametrize("round_robin_runs,suffix_steps", [(False, True), (True, False)])
def test_one_after_another_when_asked_or_when_a_runner_cannot_step(round_robin_runs, suffix_steps):
    """``round_robin_runs=False`` (the CLI's ``--sequential``), or a runner that cannot step (a backend's
    whole-answer call): each method runs to the end before the next, and records have no ``steady_steps``."""
    trace: list[str] = []
    items = list(runner.iter_runs(_Engine(), QUESTIONS[1:], [_runner("autoregressive", [0.01] * 3, trace),
                                                             _runner("suffix", [0.01] * 2, trace, suffix_steps)],
                                  64, round_robin_runs=round_robin_runs))
    assert trace == ["autoregressive"] * 3 + ["suffix"] * 2
    assert [kind for kind, *_ in items] == ["record", "record"]
    assert not any("steady_steps" in item for _, item, _ in items)


def test_command_line_records_are_the_same_round_robin_or_sequential(tiny_bench):
    """On the tiny models: the default run (round-robin) and ``--sequential`` write the same records
    (methods and output ids; steps may differ: the budget prices steps with each engine's timing) in
    the same order; only the round-robin ones carry ``steady_steps``."""
    methods = ["--methods", "autoregressive,prompt_lookup,draft_model,suffix"]
    a = tiny_bench(methods, turns=("Hi there", "Say more about it"))
    rr = [json.loads(line) for line in a.results.read_text().splitlines()]
    b = tiny_bench(methods + ["--sequential"], turns=("Hi there", "Say more about it"))
    seq = [json.loads(line) for line in b.results.read_text().splitlines()]
    assert a.code == b.code == 0, a.err + b.err
    assert len(rr) == len(seq) == 8
    for x, y in zip(rr, seq):
        assert (x["question_id"], x["method"], x["output_ids"]) == (y["question_id"], y["method"], y["output_ids"])
        assert x["steady_steps"] > 0 and "steady_steps" not in y
    base = {r["question_id"]: r["output_ids"] for r in rr if r["method"] == "autoregressive"}
    assert all(r["output_ids"] == base[r["question_id"]] for r in rr)
    assert "== overall ==" in a.out and "== overall ==" in b.out
