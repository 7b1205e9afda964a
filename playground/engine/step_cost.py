"""Measuring this device's step-cost curve for the per-step budget, and wiring drafters to it.

The budget itself (:mod:`.budget`) is pure arithmetic on candidates; this module runs real decoding
steps to time it (so it imports the loop, which the budget's own module must not) and builds each
method's drafter with its ``budget`` knob (:func:`build_with_budget`).
"""

from __future__ import annotations

import logging
import threading
from typing import Sequence

import numpy as np
import torch

from .budget import BUDGET_AUTO, BUDGET_OFF, STEP_COST_SIZES, AcceptanceEstimator, GateMemory, StepCost
from .theory import ORIGIN_STEPS, VerifyCost, robust_monotone
from .drafter import Drafter
from .tree import Candidates

log = logging.getLogger(__name__)


class _FixedDrafter(Drafter):
    """Proposes ``n`` nodes of one fixed token (a chain, or a binary tree) every step: timing only."""

    name = "step_cost_probe"
    source = "probe"

    def __init__(self, n: int, chain: bool, token: int):
        self.n, self.token = n, token
        self.parents = torch.arange(-1, n - 1) if chain else torch.tensor([(i - 1) // 2 for i in range(n)])

    def propose(self, state) -> Candidates:
        n = min(self.n, state.budget)
        if n <= 0:
            return Candidates.empty(state.device)
        # Node i of a binary tree sits at depth floor(log2(i + 1)) + 1 <= budget: trim to fit.
        parents = self.parents[:n]
        depths = Candidates(torch.zeros(n, dtype=torch.long), parents, [""] * n).depths()
        n = sum(1 for d in depths if d <= state.budget)
        return Candidates(torch.full((n,), self.token, dtype=torch.long), parents[:n].clone(), [self.source] * n)


PLAIN_RUNS = 3
"""Plain decodes timed beside the speculative ones in :func:`measure_step_cost` (their steps pooled)."""

MIN_COST_SLOPE = 0.01
"""Floor on the cost of each query beyond two, relative to a plain step: a pass over more tokens is
never free on a CPU, and a loaded machine's timing noise must not make big trees look so (the
default model's timed rise from two to nine queries: 0.010-0.012 a query, 2-vCPU AVX-512 EPYC)."""


def measure_step_cost(target, prompt_ids: list[int], sizes: Sequence[int] = STEP_COST_SIZES,
                      rounds: int = 10, seed: int = 0, long_prompt_ids: list[int] | None = None) -> StepCost:
    """Time real decoding steps that verify q - 1 candidate nodes, against plain decoding steps.

    Steps (as ``medusa_trees.measure_step_cost`` does for Medusa trees, made robust to a shared,
    loaded machine): 1. start one greedy decode of ``prompt_ids`` per (q, shape), the candidates
    fixed tokens (rejected almost always, so every step commits one token, as a failed speculation
    does), plus one plain decode; 2. step them for ``rounds`` rounds, in a freshly shuffled order each
    round (the first two steps untimed), so that drift in the machine's speed hits all alike;
    3. per size the lower quartile of its step times (load only ever adds time); 4. cost(q) =
    t(q) / t_plain, fitted per shape by :func:`fit_step_cost` (non-decreasing, piecewise linear,
    rising at least ``MIN_COST_SLOPE`` a query).

    Args:
        target: the target :class:`~playground.engine.target.CausalLM`.
        prompt_ids: ``(prompt_len,)`` a prompt to decode from (the cache grows by one token a step).
        sizes: query counts q >= 2 to time (root included).
        rounds: timed steps per size.
        seed: seeds the order shuffles.
        long_prompt_ids: optional longer prompt: the same steps are timed after it too, for the
            long-context curves (:class:`StepCost` interpolates by context length).

    Returns:
        :class:`StepCost` (chain and tree curves at q = 1, 2, 3, 4, 5, 8, 9, 17, 33, 65; ``seconds`` hold the
        measured lower quartiles in seconds; ``short_context`` = ``len(prompt_ids)``).

    Raises:
        ValueError: an empty prompt or ``rounds`` below 1.
    """
    if not prompt_ids or (long_prompt_ids is not None and not long_prompt_ids):
        raise ValueError("measure_step_cost needs a non-empty prompt")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    chain, tree = _step_curves(target, list(prompt_ids), sizes, rounds, seed)
    few = sorted({int(s) for s in sizes if s >= 2})
    if long_prompt_ids is None or len(long_prompt_ids) <= len(prompt_ids) or not few:
        return StepCost(chain, tree, len(prompt_ids))
    # Every timed run prefills its prompt once: after a long one, three sizes fix the shift of the short curve.
    few = sorted({few[0], few[len(few) // 2], few[-1]})
    long_chain, long_tree = _step_curves(target, list(long_prompt_ids), few, rounds, seed)
    return StepCost(chain, tree, len(prompt_ids), shifted_curve(chain, long_chain),
                    shifted_curve(tree, long_tree), len(long_prompt_ids))


def shifted_curve(short: VerifyCost, long: VerifyCost) -> VerifyCost:
    """The long-context curve: the short-context curve's shape, shifted by what the context adds.

    The long context is timed at a few sizes only (each run prefills the long prompt), and a curve
    interpolated through those few misses the steps of the short curve: on a CPU the cost jumps where
    the linear kernels switch (here 1.10x at three queries, 1.34x at four, after 48 or after 768
    tokens alike), so a long curve timed at 2, 8 and 33 queries priced four queries at 1.22x, and
    :class:`~playground.engine.budget.StepCost`, extrapolating past 512 tokens, at 1.16x after 768
    (2-vCPU Sapphire Rapids Xeon): trees of four queries looked cheap exactly where passages are long.
    What the context adds is attention over it, smooth in the number of queries, so the difference
    ``long(q) - short(q)`` at the timed sizes is interpolated linearly in q (held beyond the ends,
    0 at q = 1) and added to the short curve at every size; the result is made non-decreasing
    (:func:`~playground.engine.theory.robust_monotone`).

    Args:
        short: the curve timed at every size after the short prompt.
        long: the curve timed after the long prompt; its ``seconds`` name the sizes actually timed.

    Returns:
        A :class:`VerifyCost` at the short curve's sizes, with ``long``'s seconds (``long`` itself
        when it names no timed size).
    """
    timed = sorted(q for q in long.seconds if q >= 2)
    if not timed:
        return long
    xs = [1.0] + [float(q) for q in timed]
    ds = [0.0] + [long(q) - short(q) for q in timed]
    sizes = sorted(short.table)
    shifted = robust_monotone([max(1e-3, short(q) + float(np.interp(q, xs, ds))) for q in sizes])
    return VerifyCost(dict(zip(sizes, shifted)), long.seconds,
                      f"{long.source}; between the sizes timed, the short context's curve shifted by their "
                      f"difference" if long.source else "", long.origin)


CURVE_SIZES = (2, 3, 4, 5, 8, 9, 17, 33, 65)
"""Query counts at which a measured step-cost curve is tabulated (interpolated in between)."""


def fit_step_cost(points: Sequence[tuple[int, float]], sizes: Sequence[int] = CURVE_SIZES,
                  min_slope: float = MIN_COST_SLOPE) -> list[float]:
    """The relative step cost at ``sizes`` from timed ``(q, cost relative to a plain step)`` points.

    Steps: 1. the points in increasing q, with (1, 1.0) first, made non-decreasing
    (:func:`~playground.engine.theory.robust_monotone`: a spike above both neighbours is capped, then
    dips are pooled), so one noisy size moves only its neighbourhood; 2. linear interpolation
    between them, beyond the largest q along the last segment; 3. from q = 2 on, rising at least
    ``min_slope`` a query.

    A monotone piecewise fit, not one straight line: on a CPU the cost is nearly flat while the
    pass is bound by reading the weights and rises once the extra queries' arithmetic and attention
    dominate. One line through both parts priced a single extra query too cheap and mid-sized
    proposals too dear (2-vCPU AVX-512 EPYC, 2 threads, after 48 tokens: two queries timed 1.11x
    and nine 1.17x a plain step, where the line said 1.05x and 1.22x).

    Args:
        points: timed sizes q >= 2 and their costs relative to a plain step (q = 1).
        sizes: increasing sizes (each >= 2) to return costs at.
        min_slope: the least rise per extra query from q = 2 on.

    Returns:
        One cost per size, non-decreasing (without points: ``1 + min_slope (q - 1)``).
    """
    pts = sorted((int(q), float(c)) for q, c in points if q >= 2)
    if not pts:
        return [1.0 + min_slope * (q - 1) for q in sizes]
    curve = VerifyCost(dict(zip([1] + [q for q, _ in pts], robust_monotone([1.0] + [c for _, c in pts]))))
    out: list[float] = []
    for i, q in enumerate(sizes):
        out.append(max(curve(q), out[-1] + min_slope * (q - sizes[i - 1])) if out else curve(q))
    return out


def _step_curves(target, prompt_ids: list[int], sizes: Sequence[int], rounds: int, seed: int):
    """Steps 1-5 of :func:`measure_step_cost` after one prompt: ``(chain, tree)`` curves."""
    import random

    from .autoregressive import AutoregressiveDrafter
    from .decoding import GenerationSettings, decode

    token = int(prompt_ids[-1])
    sizes = sorted({int(s) for s in sizes if s >= 2})
    # Room for every step's new token and, at the last step, the largest proposal (the loop caps a
    # proposal at the tokens left: a short run would time smaller passes than asked).
    settings = GenerationSettings(max_new_tokens=rounds + 4 + max(sizes, default=1))
    # Every cost is relative to the plain step, so it gets PLAIN_RUNS decodes (a noisy base would
    # shift the whole curve: one run's lower quartile of 10 steps moved it by up to 8 % here).
    runs = {(f"plain{i}", 1): decode(target, AutoregressiveDrafter(), prompt_ids, settings) for i in range(PLAIN_RUNS)}
    for q in sizes:
        for shape in ("chain", "tree"):
            runs[(shape, q)] = decode(target, _FixedDrafter(q - 1, shape == "chain", token), prompt_ids, settings)
    times: dict = {key: [] for key in runs}
    rng = random.Random(seed)
    order = list(runs)
    for _ in range(rounds + 2):
        rng.shuffle(order)
        for key in order:
            event = next(runs[key], None)
            if event is not None and event.step > 1 and not event.finished:
                times[key].append(event.seconds)

    def low(ts: list[float]) -> float:
        ts = sorted(ts)
        return ts[(len(ts) - 1) // 4]

    base = low([t for i in range(PLAIN_RUNS) for t in times[(f"plain{i}", 1)]])
    curves = {}
    for shape in ("chain", "tree"):
        points = sorted((q, low(t)) for (s, q), t in times.items() if s == shape and t)
        seconds = {1: base, **dict(points)}
        table = {1: 1.0, **dict(zip(CURVE_SIZES, fit_step_cost([(q, t / base) for q, t in points])))}
        curves[shape] = VerifyCost(table, seconds, source=f"decoding steps verifying a {shape} of q - 1 nodes "
                                                          "(lower quartiles, a monotone piecewise-linear fit), "
                                                          "relative to plain steps", origin=ORIGIN_STEPS)
    return curves["chain"], curves["tree"]


# ----- wiring a drafter to the budget ------------------------------------------------------------
CALIBRATION_PROMPT = "Explain, step by step, how a bicycle works and why riding one is good exercise."
"""Chat prompt whose decoding steps :func:`engine_step_cost` times."""


LONG_CALIBRATION_TOKENS = 512
"""Context length (tokens) of the long-context step-cost curves."""


def engine_step_cost(engine) -> StepCost:
    """This engine's step-cost curve, measured once (``engine.persistent("step_cost", ...)``) on
    :data:`CALIBRATION_PROMPT` (or fixed ids for a bare model without a tokenizer)."""
    def measure() -> StepCost:
        target = engine.target_lm
        ids = [1 + i % (target.vocab_size - 1) for i in range(16)]  # a bare model (tests, API users)
        if getattr(engine.target, "tokenizer", None) is not None:
            try:
                ids = engine.encode_prompt(CALIBRATION_PROMPT)
            except ValueError:  # a context too small for the calibration prompt: the fixed ids
                pass
        # Fit the context: the prompt, the steps' new tokens and the largest pass.
        ctx = int(getattr(engine.target, "context_length", 0) or 1 << 30)
        rounds = 10
        ids = ids[:max(1, min(len(ids), ctx // 2))]
        sizes = [q for q in STEP_COST_SIZES if len(ids) + rounds + 4 + 2 * q <= ctx] or [2]
        # The long-context curves: the same prompt repeated to LONG_CALIBRATION_TOKENS (a passage
        # to summarise or answer from is this long), where the context allows.
        long_len = min(LONG_CALIBRATION_TOKENS, ctx - rounds - 4 - 2 * max(sizes))
        long_ids = (ids * (long_len // len(ids) + 1))[:long_len] if long_len > 2 * len(ids) else None
        return measure_step_cost(target, ids, sizes, rounds, long_prompt_ids=long_ids)
    return engine.persistent("step_cost", measure)


def time_in_background(engine) -> threading.Thread:
    """Start measuring ``engine``'s step-cost curve (:func:`engine_step_cost`) in a daemon thread.

    The app calls it right after loading, so that the first run on the page does not wait for the
    one-time timing (about a minute on a 2-core CPU) while the user types a prompt. The timing holds
    the engine's lock as it always does; a run started meanwhile waits for it (the page says so)
    and then uses the same curve. An error is logged, not raised: the first run then measures again.

    Returns:
        The started thread (``join`` it to wait).
    """
    def work() -> None:
        try:
            engine_step_cost(engine)
        except Exception:  # noqa: BLE001 - a background warm-up must not take the app down
            log.exception("timing this device's decoding steps in the background failed")

    thread = threading.Thread(target=work, name="step-cost-timing", daemon=True)
    thread.start()
    return thread


def learned_key(params: dict) -> str:
    """The part of a ``learned/<owner>/...`` key that names a method's knobs (sorted ``k=v`` pairs)."""
    return ",".join(f"{k}={params[k]}" for k in sorted(params))


def build_with_budget(engine, params: dict, make, owner: str | None = None):
    """``make(params without budget)``, with ``budget_cost`` set when the ``budget`` knob is ``auto``,
    and its acceptance estimator (an ``estimator`` attribute) replaced by the engine's one for this
    ``owner`` and these params (``learned/<owner>/acceptance/...``): the calibration keeps learning
    across runs instead of starting from the priors every run (the benchmark forgets ``learned/``
    after warm-up, so it learns from earlier questions only). A ``gate_memory``
    (:class:`~playground.engine.budget.GateMemory`) is replaced the same way (``learned/<owner>/gate/...``).

    Every method's ``build`` goes through here, so the knob means the same for all."""
    key = learned_key(params)
    params = dict(params)
    mode = params.pop("budget", BUDGET_OFF)  # a method without the knob (the baseline) has no budget
    drafter = make(params)
    if mode == BUDGET_AUTO and engine is not None:
        drafter.budget_cost = engine_step_cost(engine)
    if owner and engine is not None and isinstance(getattr(drafter, "estimator", None), AcceptanceEstimator):
        drafter.estimator = engine.persistent(f"learned/{owner}/acceptance/{key}", AcceptanceEstimator)
    if owner and engine is not None and isinstance(getattr(drafter, "gate_memory", None), GateMemory):
        drafter.gate_memory = engine.persistent(f"learned/{owner}/gate/{key}", GateMemory)
    return drafter
