"""Step times corrected for the machine's changing speed, measured against the baseline's own steps.

A shared machine (a cloud VM with two vCPUs) does not run at one speed: on a 2-vCPU AMD EPYC
(Zen 5) one plain decoding step of the default target took anywhere from 20 to 38 ms from one
sample to the next (every 2.5 s), and for spells of a minute or more four to five times as long
(2026-12-06). Running every method round-robin, one step each in turn, puts the methods in the
same weather while all of them are still running; but a fast method finishes its answer first,
and a spell that starts after that slows only the methods still running, the baseline always among
them. Summing raw seconds also weights each question by the weather it met: two questions in a
slow spell outweighed the other twenty-four.

So each step of every method is measured in the baseline's contemporaneous decoding steps: its
duration divided by the median duration of the ``window`` baseline decoding steps around it in
time. A method's sum over a question (``steady_steps``) is its time in baseline steps, whatever
the weather; its ``tokens / steady_steps`` over a run, divided by the baseline's own (a little
under one token per unit: its prefill, and steps slower than their neighbours' median), is its
speedup. The baseline's first step holds the prompt's prefill, so it is not used as a yardstick;
it is measured like every other step.
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass

DEFAULT_WINDOW = 5
"""Baseline decoding steps (nearest in time) whose median measures the weather at a step."""


@dataclass(frozen=True)
class StepTime:
    """One decoding step as the benchmark saw it.

    Attributes:
        label: the method (as labelled in the run) that took the step.
        end_s: when the step ended, in seconds on any monotonic clock (``time.perf_counter``).
        duration_s: how long the step took, in seconds.
        first: True for the method's first step of the answer (it holds the prompt's prefill).
    """

    label: str
    end_s: float
    duration_s: float
    first: bool = False


def steady_steps(steps: list[StepTime], baseline: str, window: int = DEFAULT_WINDOW) -> dict[str, float]:
    """Each method's time over one question in the baseline's contemporaneous decoding steps.

    Args:
        steps: every step of every method over one question, any order (:class:`StepTime`).
        baseline: the label of the plain autoregressive run among them.
        window: how many baseline decoding steps measure the weather at a step (>= 1).

    Returns:
        ``{label: sum over its steps of duration / weather}``. A step's weather is the median
        duration of ``window`` consecutive baseline decoding steps centred on the one whose end
        is nearest to the step's end (slid inward at either end of the answer, so a step after
        the baseline's last is measured against its last ``window``). The baseline's first step,
        with the prefill, is left out unless it is the only one, and a baseline step is left out
        of its own window (a slow step would otherwise shrink its own measure).

    Raises:
        ValueError: ``window`` below 1, no step of ``baseline`` in ``steps``, or a window whose
            median duration is not positive.
    """
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    ruler = sorted((s.end_s, s.duration_s) for s in steps if s.label == baseline and not s.first)
    if not ruler:
        ruler = sorted((s.end_s, s.duration_s) for s in steps if s.label == baseline)
    if not ruler:
        raise ValueError(f"no step of the baseline {baseline!r} to measure the others against")
    out: dict[str, float] = {}
    for s in steps:
        own = s.label == baseline and len(ruler) > 1 and (s.end_s, s.duration_s) in ruler
        others = [r for r in ruler if r != (s.end_s, s.duration_s)] if own else ruler
        times = [t for t, _ in others]
        width = min(window, len(others))
        i = bisect.bisect_left(times, s.end_s)
        if i == len(times) or (i > 0 and s.end_s - times[i - 1] <= times[i] - s.end_s):
            i -= 1  # the nearest in time is the one before
        lo = min(max(0, i - width // 2), len(others) - width)
        weather = statistics.median(d for _, d in others[lo:lo + width])
        if weather <= 0:
            raise ValueError(f"the baseline's steps near {s.end_s:.3f} s took no time: no yardstick there")
        out[s.label] = out.get(s.label, 0.0) + s.duration_s / weather
    return out


def speed_clock(records: list[dict]) -> str:
    """The record field speedups are read from: ``"steady_steps"`` where every record has it (round-robin
    runs), else ``"wall_s"`` (seconds)."""
    return "steady_steps" if records and all("steady_steps" in r for r in records) else "wall_s"
