"""playground.bench.weather: step times measured in the baseline's contemporaneous steps cancel the
machine's changing speed, which raw seconds do not."""

from __future__ import annotations

import pytest

from playground.bench.weather import StepTime, steady_steps


def round_robin(costs: dict[str, list[float]], speed, prefill: float = 0.0) -> list[StepTime]:
    """Steps of methods run one each in turn; a step of cost c at time t takes c * speed(t) seconds.

    Each method's first step also pays ``prefill`` (in the same units)."""
    clock, log = 0.0, []
    done = {label: 0 for label in costs}
    while any(done[x] < len(c) for x, c in costs.items()):
        for label, c in costs.items():
            i = done[label]
            if i == len(c):
                continue
            duration = (c[i] + (prefill if i == 0 else 0.0)) * speed(clock)
            clock += duration
            log.append(StepTime(label, clock, duration, i == 0))
            done[label] = i + 1
    return log


def raw_seconds(log: list[StepTime]) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in log:
        out[s.label] = out.get(s.label, 0.0) + s.duration_s
    return out


def test_steady_machine_gives_the_cost_in_baseline_steps():
    log = round_robin({"base": [1.0] * 64, "fast": [1.2] * 30}, lambda t: 0.03)
    steady = steady_steps(log, "base")
    assert steady["base"] == pytest.approx(64.0)
    assert steady["fast"] == pytest.approx(36.0)


def test_slow_spell_after_the_fast_method_finished_is_cancelled():
    # The spell (5x slower) begins after the fast method's 30 steps: raw seconds make it look
    # three times faster than it is; the steady measure still gives 64 / 36 = 1.78.
    costs = {"base": [1.0] * 64, "fast": [1.2] * 30}
    spell = lambda t: 0.03 if t < 2.0 else 0.15  # noqa: E731
    log = round_robin(costs, spell)
    assert max(s.end_s for s in log if s.label == "fast") < 2.0
    raw = raw_seconds(log)
    assert raw["base"] / raw["fast"] > 5.0  # both answer 64 tokens: a 5x speedup in raw seconds
    steady = steady_steps(log, "base")
    assert steady["fast"] == pytest.approx(36.0)
    # The baseline's first step of the spell is measured against the steps before it (its own is
    # left out of its window): 4 units too many, of 64.
    assert steady["base"] == pytest.approx(68.0)
    assert steady["base"] / steady["fast"] == pytest.approx(64 / 36, rel=0.07)


def test_weather_that_changes_step_by_step_cancels_within_the_window():
    """A machine slowing down threefold over the run, with a 20 % wobble every dozen steps, while the fast
    method runs only early on: raw seconds are off by a third or more, steady steps by a few per cent."""
    import math
    speed = lambda t: 0.03 * (1 + t) * (1 + 0.2 * math.sin(t / 0.1))  # noqa: E731
    log = round_robin({"base": [1.0] * 64, "fast": [1.2] * 30}, speed)
    raw = raw_seconds(log)
    assert abs(raw["base"] / raw["fast"] / (64 / 36) - 1) > 0.3
    steady = steady_steps(log, "base")
    assert steady["base"] / steady["fast"] == pytest.approx(64 / 36, rel=0.05)


def test_a_baseline_step_is_left_out_of_its_own_window():
    """With a window of one, each baseline step is measured against its nearest neighbour, not
    itself: the one slow step counts 2 and the step after it (nearest to it) 0.5, 10.5 in all;
    with itself as the yardstick every step would count 1, 10 in all."""
    durations = [0.03] * 10
    durations[5] = 0.06
    log, clock = [], 0.0
    for i, d in enumerate(durations):
        clock += d
        log.append(StepTime("base", clock, d, i == 0))
    assert steady_steps(log, "base", window=1)["base"] == pytest.approx(10.5)


def test_prefill_counts_in_every_method_but_is_not_the_yardstick():
    """Every method's first step pays the prefill (20 units here); with a window of one, a yardstick
    that included the baseline's first step would measure the early steps against it."""
    log = round_robin({"base": [1.0] * 64, "fast": [1.2] * 30}, lambda t: 0.03, prefill=20.0)
    steady = steady_steps(log, "base", window=1)
    assert steady["base"] == pytest.approx(84.0)
    assert steady["fast"] == pytest.approx(56.0)


def test_a_one_step_baseline_is_its_own_yardstick():
    log = [StepTime("base", 1.0, 0.5, True), StepTime("m", 1.2, 0.25, True)]
    assert steady_steps(log, "base") == {"base": 1.0, "m": 0.5}


def test_refusals():
    with pytest.raises(ValueError, match="window must be at least 1"):
        steady_steps([StepTime("base", 1.0, 0.5)], "base", window=0)
    with pytest.raises(ValueError, match="no step of the baseline 'base'"):
        steady_steps([StepTime("m", 1.0, 0.5)], "base")
    with pytest.raises(ValueError, match="took no time"):
        steady_steps([StepTime("base", 1.0, 0.0, True), StepTime("base", 1.0, 0.0), StepTime("m", 1.0, 0.1)], "base")
