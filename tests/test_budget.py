"""The per-step budget: the chosen subtree is the best one (against exhaustive enumeration), pruning
keeps the proposal's structure, the acceptance estimator counts only tested nodes, and greedy
output with the budget on equals the baseline."""

from __future__ import annotations

import random

import pytest
import torch

from helpers import FakeLoaded, clear_greedy_baseline, tiny_llama
from playground.engine.step_cost import measure_step_cost
from playground.engine.budget import (AcceptanceEstimator, StepCost, apply_budget, best_subtree,
                                      best_subtree_reference, node_paths, subset)
from playground.engine import Engine, MethodSpec
from playground.engine.drafter import StepResult
from playground.engine.decoding import GenerationSettings
from playground.engine.prompt_lookup import PromptLookupDrafter
from playground.engine.target import CausalLM
from playground.engine.theory import VerifyCost
from playground.engine.tree import Candidates, ExtraQueries

pytestmark = pytest.mark.usefixtures("torch_single_thread")

CPU_LIKE = StepCost(VerifyCost({1: 1.0, 2: 1.08, 5: 1.3, 9: 1.6, 17: 2.2, 33: 3.5}),
                    VerifyCost({1: 1.0, 2: 1.1, 5: 1.35, 9: 1.7, 17: 2.4, 33: 3.8}))
"""A CPU-like cost curve: about 8 % of a plain step per extra query (trees a little dearer)."""


def _random_tree(rng: random.Random, n: int) -> tuple[list[int], list[float]]:
    parents = [rng.randrange(-1, i) for i in range(n)]
    probs = [rng.choice([0.0, 0.05, 0.3, 0.6, 0.9, 1.0, rng.random()]) for _ in range(n)]
    return parents, probs


def test_best_subtree_equals_exhaustive_reference():
    """On 400 random trees of 0..11 nodes (random acceptance estimates, ties and zeros included) and
    three cost curves (CPU-like, GPU-like flat, steep), with and without extra queries, the fast
    best_subtree (a prefix of the nodes by path probability) reaches the same best ratio of
    expected tokens to step cost as trying every parent-closed subset, and its choice is
    parent-closed."""
    rng = random.Random(0)
    costs = [CPU_LIKE, VerifyCost({1: 1.0, 64: 1.05}), VerifyCost({1: 1.0, 2: 1.5, 9: 5.0})]
    for trial in range(400):
        parents, probs = _random_tree(rng, rng.randrange(0, 12))
        cost, extra = costs[trial % 3], (0, 0, 3)[trial % 3 == 0 and trial % 2]
        for rate in (None, 1.0, 1.7, 3.0):  # each step's ratio, and Dinkelbach's rule at three rates
            fast, value = best_subtree(parents, probs, cost, extra, rate=rate)
            _, ref_value = best_subtree_reference(parents, probs, cost, extra, rate=rate)
            assert value == pytest.approx(ref_value, rel=1e-9, abs=1e-12), (parents, probs, trial, rate)
            assert all(parents[i] < 0 or parents[i] in fast for i in fast)


def test_run_rate_keeps_confident_chains_that_the_step_ratio_cuts():
    """Dinkelbach's rule at the run's rate keeps a long confident chain's tail, which the step's own
    ratio cuts (its next token pays only at the step's high ratio), and decides a lone weak token
    as the ratio does (both against a plain step); RunRate starts at 1 and follows the run."""
    cost = VerifyCost({1: 1.0, 2: 1.08, 9: 1.2, 17: 3.0})
    parents = list(range(-1, 15))
    probs = [0.95] * 16
    by_ratio, _ = best_subtree(parents, probs, cost)
    by_rate, _ = best_subtree(parents, probs, cost, rate=1.2)
    assert len(by_rate) == 16 > len(by_ratio)
    for p in (0.05, 0.1):
        assert best_subtree([-1], [p], cost)[0] == best_subtree([-1], [p], cost, rate=1.0)[0] == ([0] if p > 0.08 else [])
    from playground.engine.budget import RATE_PRIOR_STEPS, RunRate
    rate = RunRate()
    assert rate.value == 1.0
    rate.observe(5, Candidates.chain([1, 2, 3, 4], "x"), cost)
    assert rate.value == pytest.approx((RATE_PRIOR_STEPS + 5) / (RATE_PRIOR_STEPS + cost(5)))


def test_budget_prunes_to_what_pays_and_proposes_nothing_when_nothing_does():
    """A chain of likely tokens is kept while the next token's path probability pays for its cost; a
    proposal of unlikely tokens becomes empty (a plain step); with a flat (GPU-like) cost every
    node with a positive estimate is kept; without estimates or without a cost nothing changes."""
    chain = Candidates.chain([5, 6, 7, 8, 9], "x", accept_probs=[0.9, 0.9, 0.9, 0.2, 0.9])
    kept = apply_budget(chain, CPU_LIKE)
    assert kept.tokens.tolist() == [5, 6, 7]
    weak = Candidates.chain([5, 6], "x", accept_probs=[0.05, 0.5])
    assert len(apply_budget(weak, CPU_LIKE)) == 0
    assert len(apply_budget(weak, VerifyCost({1: 1.0}))) == 2
    assert apply_budget(Candidates.chain([5, 6], "x"), CPU_LIKE).tokens.tolist() == [5, 6]
    assert apply_budget(weak, None) is weak


def test_subset_reindexes_tree_extras_and_estimates():
    """subset keeps tokens, sources, estimates and the extras' attention columns of the kept nodes,
    re-indexed in order; a set not closed under parents is refused."""
    cand = Candidates(torch.tensor([10, 11, 12, 13]), torch.tensor([-1, -1, 0, 2]), ["a", "b", "c", "d"],
                      accept_probs=torch.tensor([0.9, 0.1, 0.8, 0.7]))
    att = torch.zeros(2, 4 + 1 + 2, dtype=torch.bool)
    att[:, 0] = True
    att[0, 3] = True  # extra 0 sees node 2 (column 3)
    att[1, 5:] = True
    cand.extras = ExtraQueries(torch.tensor([1, 2]), torch.tensor([1, 2]), att)
    out = subset(cand, [0, 2, 3])
    assert out.tokens.tolist() == [10, 12, 13] and out.parents.tolist() == [-1, 0, 1]
    assert out.sources == ["a", "c", "d"] and out.accept_probs.tolist() == pytest.approx([0.9, 0.8, 0.7])
    assert out.extras.attention.shape == (2, 3 + 1 + 2)
    assert out.extras.attention[0].tolist() == [True, False, True, False, False, False]
    assert out.extras.attention[1].tolist() == [True, False, False, False, True, True]
    with pytest.raises(ValueError, match="closed under parents"):
        subset(cand, [2, 3])


def test_estimator_counts_only_tested_nodes_by_token_path():
    """A node counts as tested only when the target reached it (its parent is the root or was
    accepted), and as a hit when accepted; nodes are found by their token paths even after the
    proposal was pruned; the estimate moves from the prior towards the observed rate."""
    est = AcceptanceEstimator(strength=2.0)
    cand = Candidates(torch.tensor([1, 2, 3, 4]), torch.tensor([-1, 0, 1, -1]), ["s"] * 4)
    prior = est.estimate(cand, ["a", "b", "c", "d"], [0.5, 0.5, 0.5, 0.5])
    assert prior.tolist() == [0.5] * 4
    pruned = subset(cand, [0, 1, 2])  # node 3 (key d) pruned away
    est.observe(StepResult(pruned, [0], bonus_token=9))  # 1 accepted, 2 rejected, 3 never reached
    assert est.tests == {"a": 1.0, "b": 1.0} and est.hits == {"a": 1.0}
    after = est.estimate(cand, ["a", "b", "c", "d"], [0.5] * 4)
    assert after.tolist() == pytest.approx([(1 + 1) / 3, 1 / 3, 0.5, 0.5])
    assert node_paths(cand) == [(1,), (1, 2), (1, 2, 3), (4,)]


def test_measure_step_cost_times_the_sizes_asked():
    """Every probe step verifies exactly the q - 1 nodes asked for, to the last timed round (the loop
    caps proposals at the tokens left, so the runs must be long enough)."""
    from playground.engine import step_cost as B

    seen = []
    real = B._FixedDrafter.propose

    def spy(self, state):
        cand = real(self, state)
        seen.append((self.n, len(cand)))
        return cand
    B._FixedDrafter.propose = spy
    try:
        measure_step_cost(CausalLM(tiny_llama(0)), [1, 2, 3], sizes=(9, 33), rounds=3)
    finally:
        B._FixedDrafter.propose = real
    assert seen and all(n == got for n, got in seen)


def test_measure_step_cost_is_relative_and_non_decreasing():
    """The measured step-cost curves (chain and tree) are 1 at one query and never decrease from two
    queries on (by at least MIN_COST_SLOPE of a plain step a query)."""
    from playground.engine.step_cost import MIN_COST_SLOPE

    cost = measure_step_cost(CausalLM(tiny_llama(0)), [1, 2, 3, 4, 5], sizes=(2, 5, 9), rounds=3)
    for curve in (cost.chain, cost.tree):
        assert curve.origin == "steps"
        table = [curve.table[q] for q in sorted(curve.table)]
        assert table[0] == 1.0 and table[1:] == sorted(table[1:]) and set(curve.table) == {1, 2, 3, 4, 5, 8, 9, 17, 33, 65}
        assert set(curve.seconds) == {1, 2, 5, 9}
        assert all(curve.table[q] >= curve.table[2] + MIN_COST_SLOPE * (q - 2) - 1e-9 for q in curve.table if q >= 2)


def test_fit_step_cost_follows_the_knee():
    """The fit keeps a flat start and a steep end (one line through both misprices each), caps a
    lone spike, pools a dip, rises at least MIN_COST_SLOPE a query and extrapolates the last segment."""
    from playground.engine.step_cost import CURVE_SIZES, MIN_COST_SLOPE, fit_step_cost

    timed = [(2, 1.08), (3, 1.09), (5, 1.10), (9, 1.17), (17, 1.37), (33, 1.84)]
    fit = dict(zip(CURVE_SIZES, fit_step_cost(timed)))
    assert fit[2] == pytest.approx(1.08) and fit[9] == pytest.approx(1.17) and fit[33] == pytest.approx(1.84)
    assert fit[65] == pytest.approx(1.84 + (1.84 - 1.37) / 16 * 32)
    spiky = dict(zip(CURVE_SIZES, fit_step_cost([(2, 1.08), (3, 1.09), (5, 1.6), (9, 1.17), (17, 1.37)])))
    assert spiky[5] == pytest.approx(1.17) and spiky[9] == pytest.approx(1.17 + 4 * MIN_COST_SLOPE)
    dip = fit_step_cost([(2, 1.1), (3, 1.14), (5, 1.12), (9, 1.3)], sizes=(2, 3, 5, 9))
    assert dip == sorted(dip) and dip[0] == pytest.approx(1.1) and dip[-1] == pytest.approx(1.3)
    flat = fit_step_cost([(2, 1.05), (9, 1.05)], sizes=(2, 9))
    assert flat[1] == pytest.approx(1.05 + 7 * MIN_COST_SLOPE)
    assert fit_step_cost([], sizes=(2, 5)) == pytest.approx([1 + MIN_COST_SLOPE, 1 + 4 * MIN_COST_SLOPE])


@pytest.mark.parametrize("method", ["prompt_lookup", "lookahead", "suffix", "recycling", "mixture", "draft_model"])
def test_budget_auto_is_lossless_through_the_engine(method):
    """Through Engine.run with budget auto (the measured cost of this machine) and off, greedy output of
    each method equals the autoregressive baseline on 8 prompts of a tiny model."""
    from helpers import noisy_copy
    model = tiny_llama(3)
    engine = Engine(FakeLoaded(model), FakeLoaded(noisy_copy(model, 0.03, 1)))
    g = torch.Generator().manual_seed(5)
    for budget in ("auto", "off"):
        for _ in range(4):
            prompt, baseline, _ = clear_greedy_baseline(engine.target_lm, g, 10, 5, 24)
            out = [t for e in engine.run_one(prompt, MethodSpec(method, {"budget": budget}),
                                             GenerationSettings(max_new_tokens=24)) for t in e.tokens]
            assert out == baseline, (method, budget)


def test_estimator_counts_fade():
    """Each observed step fades every count by ``memory``: after a run of misses, a run of hits moves
    the estimate back up faster than pooled counts would; memory 1 never forgets; bad values raise."""
    cand = Candidates(torch.tensor([1]), torch.tensor([-1]), ["s"])
    est, pooled = AcceptanceEstimator(memory=0.9), AcceptanceEstimator(memory=1.0)
    for hit in [False] * 40 + [True] * 10:
        for e in (est, pooled):
            e.estimate(cand, ["a"], [0.5])
            e.observe(StepResult(cand, [0] if hit else [], bonus_token=9))
    assert pooled.tests["a"] == 50.0 and pooled.hits["a"] == 10.0
    assert est.tests["a"] < 10.0
    assert est.estimate(cand, ["a"], [0.5])[0] > 0.5 > pooled.estimate(cand, ["a"], [0.5])[0]
    with pytest.raises(ValueError, match="memory"):
        AcceptanceEstimator(memory=0.0)


def test_draft_gate_skips_below_break_even_and_probes():
    """DraftGate: drafts while the first token's moving acceptance is at least ``pay_at``; below it,
    drafts only to probe, every ``probe_every``-th step, less often after failed probes; verdicts move
    the rate; ``pay_at`` 0 never skips."""
    from playground.engine.budget import DraftGate
    gate = DraftGate(pay_at=0.5, prior=0.6, rate=0.5, probe_every=4)
    assert gate.draft_now()
    gate.observe(False)  # 0.3
    assert [gate.draft_now() for _ in range(8)] == [False, False, False, True] * 2
    gate.observe(True)
    gate.observe(True)  # 0.825
    assert all(gate.draft_now() for _ in range(5))
    never = DraftGate()
    for _ in range(20):
        never.observe(False)
    assert all(never.draft_now() for _ in range(5))
    # Failed probes double the period (4, 8, 16, then 16); an accepted probe resets it to 4.
    gate = DraftGate(pay_at=0.9, prior=0.0, rate=0.01, probe_every=4, max_probe_every=16)
    gaps = []
    for verdict in [False, False, False, False, True, False]:
        steps = 1
        while not gate.draft_now():
            steps += 1
        gaps.append(steps)
        gate.observe(verdict)
    assert gaps == [4, 8, 16, 16, 16, 4]


def test_draft_model_skipping_steps_stays_lossless():
    """A draft model whose passes look as dear as target steps skips drafting (a plain step) for
    three steps in four and catches its cache up when it drafts again: greedy output still equals the
    baseline on 8 prompts, and some steps were plain."""
    from helpers import noisy_copy
    model = tiny_llama(3)
    engine = Engine(FakeLoaded(model), FakeLoaded(noisy_copy(model, 0.03, 1)))
    g = torch.Generator().manual_seed(6)
    plain = 0
    for _ in range(8):
        prompt, baseline, _ = clear_greedy_baseline(engine.target_lm, g, 10, 5, 24)
        drafter = engine.make_drafter(MethodSpec("draft_model", {"budget": "auto"}))
        drafter.draft_s = 1e3  # the gate's break-even above 1: it opens only to probe
        from playground.engine.decoding import decode
        events = list(decode(engine.target_lm, drafter, prompt, GenerationSettings(max_new_tokens=24)))
        assert [t for e in events for t in e.tokens] == baseline
        plain += sum(e.proposed == 0 for e in events)
    assert plain > 0


def test_prompt_lookup_estimates_follow_match_length():
    """Prompt lookup's estimates start higher for longer matches and deeper in a copy, and come with
    every proposal."""
    d = PromptLookupDrafter(3, 4)
    from playground.engine.drafter import DecodeState
    from playground.engine.sampling import SamplingConfig
    st = lambda toks: DecodeState(toks, 2, SamplingConfig(), None, 8, torch.device("cpu"), 64)  # noqa: E731
    long = d.propose(st([1, 2, 3, 4, 5, 1, 2, 3]))
    short = d.propose(st([7, 8, 9, 7]))
    assert long.accept_probs[0] > short.accept_probs[0]
    assert long.accept_probs[1] >= long.accept_probs[0]


def test_find_match_counts_how_long_the_copy_has_held():
    """copy_len: the matched suffix followed backwards past the n-gram (the most recent occurrence
    still chosen, capped at MAX_COPY_LEN); a shorter n-gram cannot extend."""
    from playground.engine.prompt_lookup import MAX_COPY_LEN, find_match
    seq = torch.tensor([9, 1, 2, 3, 4, 5, 6, 8, 1, 2, 3, 4, 5])  # [1..5] held 5 tokens since the 8
    assert find_match(seq, 3, 4) == ([6, 8, 1, 2], 3, 5)
    seq = torch.tensor([7, 3, 4, 5, 6, 1, 2, 3, 4, 5])  # the 3-gram alone: 7 != 2
    assert find_match(seq, 3, 2) == ([6, 1], 3, 3)
    assert find_match(torch.tensor([1, 2, 3, 5, 2]), 3, 2) == ([3, 5], 1, 1)
    long = list(range(100, 160))
    assert find_match(torch.tensor(long + [0] + long), 3, 1) == ([0], 3, MAX_COPY_LEN)
    assert find_match(torch.tensor([1, 2, 3]), 3, 2) == ([], 0, 0)


def test_prompt_lookup_trusts_copies_that_held_longer():
    """Prompt lookup's priors rise with how long the copy has held (a long copy's first token above
    a fresh match's), and a new run carries only part of the learnt counts: an answer whose copies
    failed teaches the estimator, the next answer starts nearer the prior again."""
    from playground.engine.budget import RUN_CARRY
    from playground.engine.drafter import DecodeState
    from playground.engine.sampling import SamplingConfig
    st = lambda toks: DecodeState(toks, 2, SamplingConfig(), None, 8, torch.device("cpu"), 64)  # noqa: E731
    d = PromptLookupDrafter(3, 4)
    d.begin([1])
    held = d.propose(st([9, 1, 2, 3, 4, 5, 6, 8, 1, 2, 3, 4, 5]))
    fresh = d.propose(st([7, 3, 4, 5, 6, 1, 2, 3, 4, 5]))
    assert held.accept_probs[0] > fresh.accept_probs[0]
    assert list(held.accept_probs) == sorted(held.accept_probs)
    toks = [7, 3, 4, 5, 6, 1, 2, 3, 4, 5]
    first = float(d.propose(st(toks)).accept_probs[0])
    for _ in range(20):  # every copy rejected at its first token
        cand = d.propose(st(toks))
        d.update(StepResult(cand, [], 0, toks))
    failed = float(d.propose(st(toks)).accept_probs[0])
    assert failed < 0.5 * first
    tests = dict(d.estimator.tests)
    d.begin([1])
    assert all(abs(d.estimator.tests[k] - RUN_CARRY * v) < 1e-9 for k, v in tests.items())
    assert failed < float(d.propose(st(toks)).accept_probs[0]) < first


def test_estimator_calibrates_hopeful_priors_from_pooled_verdicts():
    """Priors that claim 0.8 for nodes the target accepts a fifth of the time: with many keys, each
    seen once or twice (so a key's own counts cannot correct it), the pooled scale brings a fresh
    key's estimate near the real rate; an honest prior keeps a scale near 1; bad values raise."""
    rng = random.Random(0)
    est = AcceptanceEstimator(memory=1.0)
    cand = Candidates(torch.tensor([1]), torch.tensor([-1]), ["s"])
    for step in range(300):
        est.estimate(cand, [("k", step)], [0.8])  # a new key every step
        est.observe(StepResult(cand, [0] if rng.random() < 0.2 else [], bonus_token=9))
    assert 0.15 < est.prior_scale(0.8) * 0.8 < 0.26
    assert 0.15 < float(est.estimate(cand, [("fresh",)], [0.8])[0]) < 0.26
    honest = AcceptanceEstimator(memory=1.0)
    for step in range(300):
        honest.estimate(cand, [("k", step)], [0.2])
        honest.observe(StepResult(cand, [0] if rng.random() < 0.2 else [], bonus_token=9))
    assert 0.8 < honest.prior_scale(0.2) < 1.25
    assert AcceptanceEstimator().prior_scale(0.5) == 1.0
    # Priors in different bins are calibrated apart: hopeful first tokens (0.5, hit a tenth of the
    # time) do not drag down honest deep ones (0.8, hit 80 %).
    mixed = AcceptanceEstimator(memory=1.0)
    chain = Candidates(torch.tensor([1, 2]), torch.tensor([-1, 0]), ["s", "s"])
    for step in range(400):
        mixed.estimate(chain, [("first", step), ("deep", step)], [0.5, 0.8])
        first = rng.random() < 0.1
        mixed.observe(StepResult(chain, ([0, 1] if rng.random() < 0.8 else [0]) if first else [], bonus_token=9))
    assert 0.1 < mixed.prior_scale(0.5) * 0.5 < 0.2
    assert 0.85 < mixed.prior_scale(0.8) < 1.15
    with pytest.raises(ValueError, match="calibration"):
        AcceptanceEstimator(calibration=0.0)


def test_step_cost_follows_the_context_length():
    """With curves timed after 50 and 800 tokens, the cost is the short curve at 50 (and with no
    context given), the long one at 800, linear in between, extrapolated at most 3 spans on; a steeper
    long curve makes the budget keep fewer nodes of the same proposal; the measurement fills both."""
    from playground.engine.budget import MAX_CONTEXT_EXTRAPOLATION
    short = VerifyCost({1: 1.0, 2: 1.05, 5: 1.1, 9: 1.2})
    long = VerifyCost({1: 1.0, 2: 1.2, 5: 1.45, 9: 1.9})
    cost = StepCost(short, short, 50, long, long, 800)
    assert cost(5) == cost(5, context=50) == pytest.approx(1.1)
    assert cost(5, context=800) == pytest.approx(1.45)
    assert cost(5, context=425) == pytest.approx(1.275)
    far = 50 + (1 + MAX_CONTEXT_EXTRAPOLATION) * 750
    assert cost(5, context=10 ** 6) == pytest.approx(cost(5, context=far))
    assert cost(5, context=far) > 1.45
    parents, probs = [-1, 0, 1, 2, 3, 4, 5, 6], [0.5] * 8
    assert len(best_subtree(parents, probs, cost, context=800)[0]) < len(best_subtree(parents, probs, cost, context=50)[0])
    measured = measure_step_cost(CausalLM(tiny_llama(1)), list(range(1, 9)), sizes=(2, 3), rounds=2,
                                 long_prompt_ids=list(range(1, 41)))
    assert (measured.short_context, measured.long_context) == (8, 40) and measured.long_tree is not None
    assert set(measured.as_dict()) >= {"chain", "tree", "long_chain", "long_tree", "long_context"}


def test_long_context_curve_keeps_the_short_curves_steps():
    """The long-context curve is timed at a few sizes only; between them it follows the short curve's
    shape (a kernel switch at four queries, timed on a Sapphire Rapids Xeon: 1.10x at three, 1.34x at
    four after 48 tokens or 768 alike) shifted by the timed difference, so a four-query step after a
    long passage is not priced between the two- and eight-query costs."""
    from playground.engine.step_cost import shifted_curve
    short = VerifyCost({1: 1.0, 2: 1.06, 3: 1.10, 4: 1.34, 5: 1.38, 8: 1.54, 9: 1.59, 17: 1.92})
    # Timed at 2, 8 and 17 queries after the long prompt; fitted through those three only.
    timed = VerifyCost({1: 1.0, 2: 1.08, 8: 1.58, 17: 2.00}, {1: 0.035, 2: 0.0378, 8: 0.0553, 17: 0.070})
    long = shifted_curve(short, timed)
    assert set(long.table) == set(short.table) and long.seconds == timed.seconds
    assert long(2) == pytest.approx(1.08) and long(8) == pytest.approx(1.58) and long(17) == pytest.approx(2.00)
    assert long(4) == pytest.approx(1.34 + 0.02 + (0.04 - 0.02) * 2 / 6)  # the jump kept, shifted
    assert timed(4) < 1.25 < long(4)  # what the three points alone said
    table = [long.table[q] for q in sorted(long.table)]
    assert table == sorted(table) and table[0] == 1.0
    cost = StepCost(short, short, 48, long, long, 512)
    assert cost(4, context=768) > 1.34  # extrapolated past the long context: still above the short cost
    # A long context that costs less (noise) than the short one is shifted down, never below 1.
    cheaper = shifted_curve(short, VerifyCost({1: 1.0, 2: 1.01, 8: 1.40}, {1: 1.0, 2: 1.01, 8: 1.40}))
    assert cheaper(4) < short(4) and min(cheaper.table.values()) == 1.0


def test_gate_memory_carries_the_rate_into_the_next_run():
    """GateMemory: a fresh run's gate starts halfway between its prior and the rate the previous run
    ended at; the engine keeps one per method and knobs (learned/, so the benchmark forgets it after
    warm-up), and a gated run stays lossless."""
    from playground.engine.budget import DEFAULT_GATE_PRIOR, DraftGate, GateMemory
    mem = GateMemory()
    assert mem.prior() == DEFAULT_GATE_PRIOR and mem.prior(1.0) == 1.0
    gate = DraftGate(pay_at=0.5)
    for _ in range(10):
        gate.observe(False)
    mem.remember(gate)
    assert mem.prior() == pytest.approx(0.5 * (DEFAULT_GATE_PRIOR + gate.first_rate))
    model = tiny_llama(3)
    engine = Engine(FakeLoaded(model))
    g = torch.Generator().manual_seed(2)
    for method in ("lookahead",):
        first = engine.make_drafter(MethodSpec(method, {"budget": "auto"}))
        prompt, baseline, _ = clear_greedy_baseline(engine.target_lm, g, 10, 5, 24)
        from playground.engine.decoding import decode
        events = list(decode(engine.target_lm, first, prompt, GenerationSettings(max_new_tokens=24)))
        assert [t for e in events for t in e.tokens] == baseline
        second = engine.make_drafter(MethodSpec(method, {"budget": "auto"}))
        assert second.gate_memory is first.gate_memory and first.gate_memory.rate == first.gate.first_rate
        second.begin(prompt)
        assert second.gate.first_rate == pytest.approx(first.gate_memory.prior(1.0))
        engine.forget("learned/")
        assert engine.make_drafter(MethodSpec(method, {"budget": "auto"})).gate_memory.rate is None


def test_time_in_background_measures_once_and_the_first_run_uses_it():
    """The app starts the step-cost timing right after loading (``time_in_background``); a run with
    budget auto afterwards reuses that curve instead of timing again, and names it while it runs
    (``engine.making``); its greedy output still equals the baseline."""
    from playground.engine import time_in_background

    model = tiny_llama(3)
    engine = Engine(FakeLoaded(model))
    seen = []
    original = engine.persistent

    def watch(key, factory):  # what engine.making says while the timing runs
        return original(key, lambda: (seen.append(engine.making), factory())[1])

    engine.persistent = watch
    thread = time_in_background(engine)
    thread.join(120)
    assert not thread.is_alive() and engine.has_persistent("step_cost")
    assert seen == ["step_cost"] and engine.making is None
    prompt, baseline, _ = clear_greedy_baseline(engine.target_lm, torch.Generator().manual_seed(4), 10, 5, 24)
    out = [t for e in engine.run_one(prompt, MethodSpec("prompt_lookup", {"budget": "auto"}),
                                     GenerationSettings(max_new_tokens=24)) for t in e.tokens]
    assert out == baseline and engine.calibrations["step_cost"] == 1


def test_draft_model_timing_leaves_out_the_catch_up_pass(monkeypatch):
    """The gate's break-even reads the draft's time per drafted token: the first proposal's pass over
    the whole prompt (the draft's catch-up) is not one, so it is not averaged in. A stand-in clock
    makes each draft pass take 1 ms a token fed."""
    from playground.engine import draft_model
    from playground.engine.drafter import DecodeState
    from playground.engine.sampling import SamplingConfig

    model = tiny_llama(3)
    engine = Engine(FakeLoaded(model), FakeLoaded(model))
    drafter = engine.make_drafter(MethodSpec("draft_model", {"budget": "off", "k": 3}))
    clock = [0.0]
    real_forward = drafter.draft.forward

    def forward(cache, ids, **kw):
        clock[0] += 1e-3 * len(ids)
        return real_forward(cache, ids, **kw)
    monkeypatch.setattr(drafter.draft, "forward", forward)
    monkeypatch.setattr(draft_model.time, "perf_counter", lambda: clock[0])
    prompt = list(range(3, 43))  # 40 tokens: the first pass feeds all of them
    drafter.begin(prompt)
    state = DecodeState(prompt, len(prompt), SamplingConfig(), None, 8, torch.device("cpu"), model.config.vocab_size)
    with torch.inference_mode():
        cand = drafter.propose(state)
    assert len(cand) == 3 and drafter.draft_s == pytest.approx(1e-3)
