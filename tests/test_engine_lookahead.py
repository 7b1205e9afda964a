"""Lookahead decoding (Fu et al. 2024): the attention layout of its one pass, the n-gram pool's
rules, the window's update, greedy losslessness against the autoregressive baseline, and the
exact target distribution under sampling."""

from __future__ import annotations

import pytest
import torch

from helpers import (FakeLoaded, chi_square_gof, clear_greedy_baseline, exact_first_three, run_events,
                     sample_first_three, tiny_llama)
from playground.engine import METHODS, Engine, MethodSpec, check_lossless
from playground.engine import source_labels
from playground.engine import DecodeState, StepResult
from playground.engine import SOURCE_LOOKAHEAD, SOURCE_TARGET
from playground.engine import LOOKAHEAD_PRESETS
from playground.engine.lookahead import LookaheadDrafter, NgramPool, candidate_tree
from playground.engine import SamplingConfig
from playground.engine.target import CausalLM
from playground.engine import Candidates
from playground.engine.tree import pass_attention

pytestmark = pytest.mark.usefixtures("torch_single_thread")

EOS = 63


def _state(tokens: list[int], budget: int = 8) -> DecodeState:
    return DecodeState(tokens, 1, SamplingConfig(), None, budget, torch.device("cpu"), 64)


# ----------------------------------------------------------------------------------------------
# The pass: attention matrix and position ids
# ----------------------------------------------------------------------------------------------


def test_attention_and_positions_hand_worked_w3_n3_g2():
    """W=3, N=3, G=2: pool continuations (8, 9) then (10, 11) of root 7, window levels [1, 2, 3]
    and [4, 5, 6]. The pass is [root, 10, 11, 8, 9, L0c0..2, L1c0..2]: candidates (most recent
    n-gram first) see the root and their ancestors; level-0 column j sees the root and level-0
    columns <= j; level-1 column j also sees itself; no candidate sees the window and no window
    token sees a candidate. Positions: depth for candidates, 1 + j + level for the window."""
    d = LookaheadDrafter(window=3, ngram_size=3, guess_set_size=2, seed_pool_from_prompt=False)
    d.begin([0])
    d.pool.add([7, 8, 9])
    d.pool.add([7, 10, 11])
    d.levels = [[1, 2, 3], [4, 5, 6]]
    cand = d.propose(_state([0, 7]))
    assert cand.tokens.tolist() == [10, 11, 8, 9] and cand.parents.tolist() == [-1, 0, -1, 2]
    assert cand.sources == [SOURCE_LOOKAHEAD] * 4
    assert cand.extras.tokens.tolist() == [1, 2, 3, 4, 5, 6]
    allowed, offsets = pass_attention(cand)
    expected = torch.tensor([
        # r  10 11  8  9 L0c0 c1 c2 L1c0 c1 c2
        [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # root
        [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # 10
        [1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0],  # 11
        [1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0],  # 8
        [1, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0],  # 9
        [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0],  # level 0, column 0
        [1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0],  # level 0, column 1
        [1, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0],  # level 0, column 2
        [1, 0, 0, 0, 0, 1, 0, 0, 1, 0, 0],  # level 1, column 0
        [1, 0, 0, 0, 0, 1, 1, 0, 0, 1, 0],  # level 1, column 1
        [1, 0, 0, 0, 0, 1, 1, 1, 0, 0, 1],  # level 1, column 2
    ], dtype=torch.bool)
    assert torch.equal(allowed, expected)
    assert offsets.tolist() == [0, 1, 2, 1, 2, 1, 2, 3, 2, 3, 4]


def test_budget_cuts_candidates_but_not_the_window():
    """Candidates are never deeper than the budget (the loop raises otherwise); budget 0 gives
    no candidates, and the window still rides along."""
    d = LookaheadDrafter(window=2, ngram_size=4, guess_set_size=3, seed_pool_from_prompt=False)
    d.begin([0])
    d.pool.add([7, 8, 9, 10])
    d.pool.add([7, 8, 5, 6])
    cand = d.propose(_state([0, 7], budget=2))
    assert cand.tokens.tolist() == [8, 5, 9] and cand.parents.tolist() == [-1, 0, 0]
    cand = d.propose(_state([0, 7], budget=0))
    assert len(cand) == 0 and len(cand.extras) == 2


def test_window_logits_equal_the_trajectories_run_alone():
    """One pass with candidates and a 3-level window: every window token's logits equal those of
    a plain causal forward over prefix + root + its trajectory (level-0 columns 0..j, then its
    own column's levels 1..l), and every candidate's logits equal the tree-only pass's, to 1e-4
    (fp32): the mask and position ids are what the paper's layout needs, and the window does
    not leak into verification."""
    lm = CausalLM(tiny_llama(3))
    prefix, root = [5, 9, 2, 7, 7, 1], 4
    d = LookaheadDrafter(window=4, ngram_size=4, guess_set_size=3, seed_pool_from_prompt=False)
    d.begin([0])
    d.pool.add([root, 3, 8, 8])
    d.pool.add([root, 3, 1, 2])
    d.levels = [[11, 12, 13, 14], [21, 22, 23, 24], [31, 32, 33, 34]]
    cand = d.propose(_state(prefix + [root]))
    cache = lm.new_cache()
    lm.forward(cache, torch.tensor(prefix))
    allowed, offsets = pass_attention(cand)
    inputs = torch.cat([torch.tensor([root]), cand.tokens, cand.extras.tokens])
    logits = lm.forward_masked(cache, inputs, allowed, offsets)
    n = len(cand)
    for level in range(3):
        for j in range(4):
            traj = d.levels[0][:j + 1] + [d.levels[k][j] for k in range(1, level + 1)]
            ref = lm.forward(lm.new_cache(), torch.tensor(prefix + [root] + traj))[-1]
            assert torch.allclose(logits[n + 1 + level * 4 + j], ref, atol=1e-4), (level, j)
    tree_cache = lm.new_cache()
    lm.forward(tree_cache, torch.tensor(prefix))
    tree_logits = lm.forward(tree_cache, torch.cat([torch.tensor([root]), cand.tokens]), cand.parents)
    assert torch.allclose(logits[:n + 1], tree_logits, atol=1e-4)


# ----------------------------------------------------------------------------------------------
# Pool and window rules
# ----------------------------------------------------------------------------------------------


def test_pool_keyed_by_first_token_max_g_most_recent_kept():
    """Keys are first tokens; each key keeps at most G continuations, the most recent; a repeated
    n-gram is not duplicated but becomes the most recent; lookups list the most recent first;
    seeding from a prompt adds each of its n-grams in order."""
    pool = NgramPool(ngram_size=3, guess_set_size=2)
    pool.add([1, 2, 3])
    pool.add([1, 4, 5])
    pool.add([2, 9, 9])
    assert pool.lookup(1) == [(4, 5), (2, 3)] and pool.lookup(2) == [(9, 9)] and pool.lookup(7) == []
    pool.add([1, 2, 3])  # dedup: moves to the newest slot
    assert pool.lookup(1) == [(2, 3), (4, 5)] and len(pool) == 3
    pool.add([1, 6, 7])  # over G: the oldest, (4, 5), goes
    assert pool.lookup(1) == [(6, 7), (2, 3)] and len(pool) == 3
    with pytest.raises(ValueError, match="3 tokens, got 2"):
        pool.add([1, 2])
    seeded = NgramPool(ngram_size=2, guess_set_size=3)
    seeded.add_sequence([5, 6, 5, 7, 5, 6, 5, 8])
    assert seeded.lookup(5) == [(8,), (6,), (7,)] and seeded.lookup(6) == [(5,)] and len(seeded) == 5
    d = LookaheadDrafter(window=2, ngram_size=3, guess_set_size=2)
    d.begin([1, 2, 3, 1, 2, 4])
    assert d.pool.lookup(1) == [(2, 4), (2, 3)] and d.pool_size == 4
    assert all(t in (1, 2, 3, 4) for level in d.levels for t in level)


def test_candidate_tree_merges_shared_prefixes():
    """Continuations become one prefix tree (siblings distinct), in the order given, each cut to
    the budget."""
    cand = candidate_tree([(1, 2, 3), (1, 2, 4), (5, 6, 7), (1, 9, 9)], budget=3)
    assert cand.tokens.tolist() == [1, 2, 3, 4, 5, 6, 7, 9, 9]
    assert cand.parents.tolist() == [-1, 0, 1, 1, -1, 4, 5, 0, 7]
    assert candidate_tree([(1, 2, 3), (1, 2, 4)], budget=2).tokens.tolist() == [1, 2]
    assert len(candidate_tree([(1, 2)], budget=0)) == 0


def test_update_warms_up_then_harvests_and_shifts():
    """W=3, N=3. Warm-up: the window's outputs become level 1 and no n-gram is harvested; the
    window shifts one column (the root moved one position). Full window: each column (level 0,
    level 1, output) enters the pool keyed by its level-0 token, the oldest level is dropped,
    and after accepting one pool token (two emitted) the columns shift by one more; fresh columns
    are prompt tokens."""
    prompt = [40, 41, 42]
    d = LookaheadDrafter(window=3, ngram_size=3, guess_set_size=4, seed_pool_from_prompt=False)
    d.begin(prompt)
    d.levels = [[1, 2, 3]]

    def logits_for(levels: int, outputs: list[int]) -> torch.Tensor:
        z = torch.zeros(levels * 3, 64)
        z[torch.arange((levels - 1) * 3, levels * 3), torch.tensor(outputs)] = 1.0
        return z

    empty = Candidates.empty()
    d.update(StepResult(empty, [], 0, [], logits_for(1, [4, 5, 6])))
    assert d.pool_size == 0
    assert [lv[:2] for lv in d.levels] == [[2, 3], [5, 6]] and all(lv[2] in prompt for lv in d.levels)
    d.levels = [[1, 2, 3], [4, 5, 6]]
    cand = Candidates.chain([99], SOURCE_LOOKAHEAD)
    d.update(StepResult(cand, [0], 0, [], logits_for(2, [7, 8, 9])))
    assert d.pool.lookup(1) == [(4, 7)] and d.pool.lookup(2) == [(5, 8)] and d.pool.lookup(3) == [(6, 9)]
    assert [lv[:2] for lv in d.levels] == [[5, 6], [8, 9]] and all(lv[2] in prompt for lv in d.levels)
    assert d.pool_hits == 1 and d.pool_tokens_accepted == 1


def test_window_gate_credits_only_ngrams_the_window_made():
    """The window's gate earns the accepted pool tokens only when they continue an n-gram the Jacobi
    window generated: a hit on a prompt n-gram earns 0, a hit on a window n-gram its length (also a
    prefix of one), a step with no accepted token 0."""
    prompt = [40, 41, 42, 43]
    d = LookaheadDrafter(window=2, ngram_size=3, guess_set_size=4)
    d.begin(prompt)
    d.levels = [[1, 2], [3, 4]]
    z = torch.zeros(4, 64)
    z[2, 5] = z[3, 6] = 1.0
    d.update(StepResult(Candidates.empty(), [], 0, prompt + [9], z))  # columns (1, 3, 5), (2, 4, 6) pooled
    assert d.window_ngrams == {1: {(3, 5)}, 2: {(4, 6)}}
    on_prompt = Candidates.chain([41, 42], SOURCE_LOOKAHEAD)  # the prompt's n-gram (40, 41, 42)
    d.root = 40
    assert d._window_credit(StepResult(on_prompt, [0, 1], 7, prompt + [40, 41, 42, 7])) == 0
    from_window = Candidates.chain([3, 5], SOURCE_LOOKAHEAD)
    d.root = 1
    assert d._window_credit(StepResult(from_window, [0, 1], 7, prompt + [1, 3, 5, 7])) == 2
    assert d._window_credit(StepResult(from_window, [0], 8, prompt + [1, 3, 8])) == 1
    assert d._window_credit(StepResult(from_window, [], 8, prompt + [1, 8])) == 0


def test_update_harvests_the_committed_output_ngrams():
    """With harvest_output (the default), every N-gram of the committed text that ends in this
    step's tokens enters the pool once; with it off, none does."""
    prompt = [40, 41, 42]
    for harvest in (True, False):
        d = LookaheadDrafter(window=1, ngram_size=3, guess_set_size=4, seed_pool_from_prompt=False,
                             harvest_output=harvest)
        d.begin(prompt)
        d.update(StepResult(Candidates.empty(), [], 7, prompt + [5, 6, 7]))
        d.update(StepResult(Candidates.empty(), [], 8, prompt + [5, 6, 7, 8]))
        if harvest:
            assert d.pool.lookup(41) == [(42, 5)] and d.pool.lookup(42) == [(5, 6)]
            assert d.pool.lookup(5) == [(6, 7)] and d.pool.lookup(6) == [(7, 8)] and d.pool_size == 4
        else:
            assert d.pool_size == 0


# ----------------------------------------------------------------------------------------------
# Greedy: lossless
# ----------------------------------------------------------------------------------------------

CONFIGS = [(w, n, g) for w, n, g in ((1, 2, 1), (3, 3, 2), (5, 3, 5), (4, 4, 3), (2, 5, 4), (7, 2, 7),
                                     (3, 6, 2), (6, 8, 1), (5, 5, 5), (20, 3, 20))]


@pytest.fixture(scope="module")
def sweep():
    """Three tiny targets, 30 low-entropy prompts with clear greedy baselines (no near-ties)."""
    targets = [CausalLM(tiny_llama(seed)) for seed in range(3)]
    g = torch.Generator().manual_seed(77)
    cases = []
    for seed in range(30):
        target = targets[seed % 3]
        prompt, baseline, margins = clear_greedy_baseline(target, g, 6 + seed % 12, 3 + seed % 5, 32, (EOS,))
        cases.append((seed, target, prompt, baseline, margins))
    return cases


@pytest.mark.parametrize("seed_pool", [True, False], ids=["pool-from-prompt", "pool-from-window-only"])
def test_greedy_lookahead_equals_baseline(sweep, seed_pool):
    """For 30 prompts on 3 tiny models and ten (W, N, G) settings from (1, 2, 1) to (20, 3, 20),
    greedy lookahead output equals the autoregressive baseline token for token (runs also end at
    EOS or max tokens, so the budget cut is exercised). Pool tokens were accepted and rejected
    (0 < alpha < 1), some steps accepted several; with the pool not seeded from the prompt, the
    hits come from n-grams the Jacobi window generated."""
    failures, accepted, proposed, multi, hits = [], 0, 0, 0, 0
    for seed, target, prompt, baseline, margins in sweep:
        w, n, g = CONFIGS[seed % len(CONFIGS)]
        drafter = LookaheadDrafter(w, n, g, seed_pool_from_prompt=seed_pool, seed=seed)
        events = run_events(target, drafter, prompt, 32, eos_token_ids=(EOS,))
        out = [t for e in events for t in e.tokens]
        verdict = check_lossless(baseline, margins, out)
        if not verdict.matched:
            failures.append(f"seed={seed} W,N,G={w, n, g}: {verdict.message()}")
        accepted += events[-1].stats.accepted
        proposed += events[-1].stats.proposed
        multi += sum(1 for e in events if e.accepted > 1)
        hits += drafter.pool_hits
        assert all(s in (SOURCE_TARGET, SOURCE_LOOKAHEAD) for e in events for s in e.sources)
    assert failures == []
    assert 0 < accepted < proposed, (accepted, proposed)
    assert multi > 0 and hits > 0


def test_pool_size_and_hits_reach_the_run_statistics(sweep):
    """Every event's statistics carry the drafter's pool size (equal to the n-grams the pool
    holds, counted from its table) and pool hits (steps that accepted a pool token, counted from
    the events), for the UI's stats line; the pool's running size matches a recount after
    every kind of insert (new, repeated, evicting)."""
    seed, target, prompt, _, _ = sweep[0]
    drafter = LookaheadDrafter(2, 3, 3, seed=seed)
    events = run_events(target, drafter, prompt, 32, eos_token_ids=(EOS,))
    for i, e in enumerate(events):
        assert set(e.stats.drafter) == {"pool_ngrams", "pool_hits"}
        assert e.stats.drafter["pool_hits"] == sum(1 for x in events[1:i + 1] if x.accepted > 0)
    assert events[-1].stats.drafter["pool_ngrams"] == sum(len(v) for v in drafter.pool.table.values()) > 0
    assert events[-1].stats.as_dict()["drafter"] == events[-1].stats.drafter
    pool = NgramPool(3, 2)
    for ngram in ([1, 2, 3], [1, 2, 3], [1, 4, 5], [1, 6, 7], [2, 3, 4]):
        pool.add(ngram)
        assert len(pool) == sum(len(v) for v in pool.table.values())
    assert len(pool) == 3


def test_engine_registers_lookahead():
    """The registry lists lookahead as lossless without a draft, with the knobs window,
    ngram_size, guess_set_size (bounds [1, 20], [2, 8], [1, 20]) and the per-step budget; the engine
    builds it; the presets hold the paper's (W, N, G) and are within bounds."""
    info = METHODS["lookahead"]
    assert info.lossless and not info.needs_draft and SOURCE_LOOKAHEAD in info.sources
    assert [(k.name, k.minimum, k.maximum) for k in info.knobs if k.name != "budget"] == [
        ("window", 1, 20), ("ngram_size", 2, 8), ("guess_set_size", 1, 20)]
    assert info.knobs[-1].name == "budget"
    assert SOURCE_LOOKAHEAD in source_labels()
    assert LOOKAHEAD_PRESETS["7b"] == dict(window=15, ngram_size=5, guess_set_size=15)
    assert LOOKAHEAD_PRESETS["13b"] == dict(window=10, ngram_size=5, guess_set_size=10)
    assert LOOKAHEAD_PRESETS["33b"] == dict(window=7, ngram_size=5, guess_set_size=7)
    for preset in LOOKAHEAD_PRESETS.values():
        MethodSpec("lookahead", preset).checked_params()
    with pytest.raises(ValueError, match=r"ngram_size must be in \[2, 8\], got 1"):
        MethodSpec("lookahead", {"ngram_size": 1}).checked_params()
    with pytest.raises(ValueError, match=r"window must be in \[1, 20\], got 21"):
        LookaheadDrafter(window=21)
    engine = Engine(FakeLoaded(tiny_llama(0)))
    drafter = engine.make_drafter(MethodSpec("lookahead", {"window": 4}))
    assert isinstance(drafter, LookaheadDrafter) and (drafter.window, drafter.ngram_size) == (4, 3)


# ----------------------------------------------------------------------------------------------
# Sampling: the target's exact distribution
# ----------------------------------------------------------------------------------------------

VOCAB = 6
ALPHA = 1e-4
E2E_PROMPT = [0, 1, 2, 3, 4, 5, 0, 1, 2, 0, 1]


def test_sampled_lookahead_matches_exact_target_distribution():
    """At temperature 1, over 600 seeds (one run each), the first two and first three new tokens
    of lookahead decoding (W=3, N=3, G=3, pool seeded from a repetitive prompt; one-hot rule)
    follow the target's exact joint distribution (chi-square goodness of fit; a false alarm has
    probability 1e-4 per test); pool tokens were both accepted and rejected."""
    target = tiny_llama(7, vocab_size=VOCAB, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                        intermediate_size=32, head_std=0.3)
    cfg = SamplingConfig(temperature=1.0)
    counts, accepted, proposed = sample_first_three(target, lambda seed: LookaheadDrafter(3, 3, 3, seed=seed),
                                                    E2E_PROMPT, cfg, 600, VOCAB)
    exact = exact_first_three(target, E2E_PROMPT, cfg, VOCAB)
    two, three = chi_square_gof(counts.sum(2), exact.sum(2)), chi_square_gof(counts, exact)
    assert two.p_value > ALPHA, f"first two tokens: {two}"
    assert three.p_value > ALPHA, f"first three tokens: {three}"
    assert 0 < accepted < proposed


def test_window_rides_only_while_the_pool_pays_and_output_stays_lossless():
    """With the budget on and a window made dear (a steep step cost), a pool that hits nothing drops
    the Jacobi window except to probe; the levels keep following the root; greedy output equals the
    baseline on 8 prompts. With the budget off the window rides every step."""
    from playground.engine.budget import StepCost
    from playground.engine.decoding import GenerationSettings, decode
    from playground.engine.theory import VerifyCost
    steep = VerifyCost({1: 1.0, 2: 1.5, 5: 3.0, 9: 5.0})
    model = tiny_llama(2)
    target = CausalLM(model)
    g = torch.Generator().manual_seed(4)
    for budget in (StepCost(steep, steep), None):
        rides = []
        for _ in range(8):
            prompt, baseline, _ = clear_greedy_baseline(target, g, 10, 5, 24)
            d = LookaheadDrafter(window=3, ngram_size=3)
            d.budget_cost = budget
            propose = d.propose
            d.propose = lambda state, p=propose: (lambda c: rides.append(c.extras is not None) or c)(p(state))
            out = [t for e in decode(target, d, prompt, GenerationSettings(max_new_tokens=24)) for t in e.tokens]
            assert out == baseline
            assert all(len(level) == d.window for level in d.levels)
        if budget is None:
            assert all(rides)
        else:
            assert 0 < sum(rides) < len(rides) / 2, (sum(rides), len(rides))
