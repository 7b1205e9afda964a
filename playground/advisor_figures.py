"""The measured figures that the advisor and the page's own suggestions read.

Two kinds: the project's benchmark figures and verify cost in ``assets/measurements.json``
(:func:`measured_speedups`, :func:`fallback_verify_record`), and the figures of the draft model
measured in a run on this page (:func:`measure_draft`). :func:`measure_draft` is the one place
that turns a run's draft-model statistics into a suggested K: the draft panel under the method
panels and the advisor both call it, so they cannot disagree. This module imports no UI code.
"""

from __future__ import annotations

from dataclasses import dataclass

from playground.engine import theory
from playground.measure import load as load_measurements


def measured_speedups(data: dict | None = None) -> dict[str, dict[str, dict]]:
    """CPU instruction set (``"avx2"``, ``"avx512"``) -> method -> its newest benchmark figures in the
    measurements file (``speedup``, ``tau``, ``alpha``, ``params``, ``lossless``, plus the run's
    ``machine`` label, ``questions``, ``command``, ``when``, ``dtype``, ``threads``). A variant
    (``mixture:members=...``) also holds ``base_speedup``: its method's speedup at its defaults in the
    same run, None when that run left it out (figures of two runs are not compared)."""
    data = load_measurements() if data is None else data
    out: dict[str, dict[str, dict]] = {}
    for run in data["benchmarks"]:  # newest first: the first figure of a method on an ISA wins
        machine = data["machines"].get(run.get("machine"), {})
        context = {k: run.get(k) for k in ("questions", "command", "when", "dtype", "threads")}
        for method, fig in run.get("methods", {}).items():
            same_run = {}
            if ":" in method:
                same_run["base_speedup"] = run["methods"].get(method.split(":", 1)[0], {}).get("speedup")
            out.setdefault(machine.get("isa"), {}).setdefault(
                method, {**fig, **context, **same_run, "machine": machine.get("label", run.get("machine"))})
    return out


def fallback_verify_record(data: dict | None = None) -> tuple[dict, str] | None:
    """``(record, machine label)`` of the verify cost ``theory.FALLBACK`` holds (``theory.fallback_record``:
    the newest CPU measurement on a machine with this CPU's instruction set, else the newest)."""
    found = theory.fallback_record(load_measurements() if data is None else data)
    if found is None:
        return None
    record, machine = found
    return record, machine.get("label", record.get("machine", "another machine"))


MEASURED = measured_speedups()
"""The figures the advisor quotes, read once from ``assets/measurements.json``."""


def figure(isa: str | None, method: str) -> dict | None:
    """A method's measured figure on CPUs with instruction set ``isa`` (None when there is none)."""
    return MEASURED.get(isa, {}).get(method)


def describe_figure(method: str, fig: dict) -> str:
    """``"1.28x (K = 2, τ 1.42, α 21.5%)"``: one measured figure with the settings it ran with; a variant
    also names its method's figure at its defaults in the same run and the run's date (``against 1.46x
    at its defaults in the same run, 2026-12-04``)."""
    p = fig.get("params") or {}
    knobs = []
    if "k" in p:
        knobs.append(f"K = {p['k']}")
    if p.get("confidence"):
        knobs.append(f"confidence {p['confidence']:g}")
    if method == "lookahead" and "window" in p:
        knobs.append(f"W, N, G = {p['window']}, {p['ngram_size']}, {p['guess_set_size']}")
    knobs.append(f"τ {fig['tau']:.2f}")
    if fig.get("alpha") is not None:
        knobs.append(f"α {100 * fig['alpha']:.1f}%")
    if fig.get("base_speedup") is not None:
        knobs.append(f"against {fig['base_speedup']:.2f}x at its defaults in the same run, {fig.get('when') or 'undated'}")
    return f"{fig['speedup']:.2f}x ({', '.join(knobs)})"


# ----- the draft model measured on this page -----------------------------------------------------
@dataclass(frozen=True)
class DraftMeasurement:
    """The draft model's figures from one run and the K they suggest.

    Attributes:
        alpha: acceptance rate (accepted / drafted tokens).
        k: the K the run used.
        c_step: (draft seconds per drafted token) / (verify seconds per step), as measured.
        c: the same draft cost per single-token target forward: ``c_step * verify_cost(k + 1)``.
        suggestion: ``theory.suggest_k(alpha, c, verify_cost)``: the suggested K, its expected
            speedup and tau.
        speedup_as_run: expected speedup at the K the run used.
    """

    alpha: float
    k: int
    c_step: float
    c: float
    suggestion: theory.KSuggestion
    speedup_as_run: float


def measure_draft(stats: dict | None, k, verify_cost) -> DraftMeasurement | None:
    """The draft model's measured alpha and draft cost in a run, and the K they suggest.

    Args:
        stats: the draft model's ``RunStats.as_dict()`` (``alpha``, ``draft_s``, ``verify_s``,
            ``proposed``, ``steps``); None before a run.
        k: the K the run used (None: unknown).
        verify_cost: this device's ``theory.VerifyCost`` (measured on the Theory tab, else the fallback
            table); made non-decreasing here, as the Theory tab shows it.

    Returns:
        the measurement, or None when nothing was drafted or timed (no suggestion then).
    """
    if not stats or stats.get("alpha") is None or k is None:
        return None
    c_step = theory.draft_cost_ratio(stats.get("draft_s", 0.0), stats.get("proposed", 0),
                                     stats.get("verify_s", 0.0), max(0, stats.get("steps", 0) - 1))
    if c_step is None:
        return None
    cost = verify_cost.monotone() if hasattr(verify_cost, "monotone") else verify_cost
    k = int(k)
    c = c_step * cost(k + 1)  # c_step is per verification pass (K + 1 tokens)
    alpha = float(stats["alpha"])
    return DraftMeasurement(alpha, k, c_step, c, theory.suggest_k(alpha, c, cost),
                            theory.expected_speedup(alpha, k, c, cost))


def fastest_measured(isa: str | None, available) -> list[tuple[str, dict]]:
    """The project's measured figures on CPUs with instruction set ``isa`` of the methods in
    ``available``, fastest first: ``[(method, figure), ...]`` (empty when there are none)."""
    figs = [(m, f) for m, f in MEASURED.get(isa, {}).items() if m in available]
    return sorted(figs, key=lambda mf: -mf[1]["speedup"])


def fastest_variant(isa: str | None, method: str, can_run) -> dict | None:
    """The fastest measured variant of ``method`` (a record ``method:knob=value``, e.g. the mixture with
    EAGLE-3 as a member) on CPUs with instruction set ``isa`` that measured faster than ``method`` at its
    defaults in the same run (``base_speedup``), and faster than the figure quoted for ``method`` (its
    newest run's: a variant that beat its defaults in an older run, but not the newer figure, is not
    advised over it), and whose mixture members ``can_run(member)`` allows: its figure, or None. Only
    variants that set ``members`` count; the figure's ``params`` are the knob values to set."""
    best, figs = None, MEASURED.get(isa, {})
    headline = (figs.get(method) or {}).get("speedup", 0.0)
    for name, fig in figs.items():
        if not name.startswith(method + ":") or fig.get("base_speedup") is None \
                or fig["speedup"] <= max(fig["base_speedup"], headline):
            continue
        members = (fig.get("params") or {}).get("members")
        if not isinstance(members, str) or not members or not all(can_run(m) for m in members.split(",")):
            continue  # only variants of the members, all of them runnable here
        if best is None or fig["speedup"] > best["speedup"]:
            best = fig
    return best
