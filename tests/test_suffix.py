"""Suffix decoding: the suffix tree's counts against a slow reference, eviction from the global cache,
speculation best-first, then the checks every method passes (greedy equal to the baseline, EOS
inside a block, the token limit, no EOS id, streaming, sampling exactness), and learning across runs."""

from __future__ import annotations

import random

import pytest

import drafter_checks as checks
from playground.engine.suffix import SuffixCache, SuffixDrafter, SuffixTree, reference_counts

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def factory(vocab_size, budget_cost):
    d = SuffixDrafter()
    d.budget_cost = budget_cost
    return d


def _counts(tree: SuffixTree) -> dict:
    out = {}

    def walk(node, path):
        for t, child in tree.children(node).items():
            out[path + (t,)] = tree.count(child)
            walk(child, path + (t,))
    walk(tree.root, ())
    return out


def test_suffix_tree_counts_equal_reference_with_appends_and_removals():
    """For 200 random sets of sequences (appended in random chunks, some removed again) and depths
    1..6, every node's count equals the number of occurrences of its substring (the slow reference),
    and no substring is missing or extra."""
    rng = random.Random(0)
    for trial in range(200):
        depth = rng.randint(1, 6)
        tree, seqs = SuffixTree(depth), {}
        for k in range(rng.randint(1, 4)):
            seq = [rng.randint(0, 3) for _ in range(rng.randint(1, 15))]
            i = 0
            while i < len(seq):
                j = i + rng.randint(1, 4)
                tree.extend(k, seq[i:j])
                i = j
            seqs[k] = seq
        for k in [k for k in seqs if rng.random() < 0.4]:
            tree.remove(k)
            del seqs[k]
        assert _counts(tree) == reference_counts(list(seqs.values()), depth), trial


def test_longest_match_and_best_first_speculation():
    """The longest suffix seen before is matched (its own occurrence at the end discounted), and the
    speculation grows the most frequent continuation first, with conditional frequencies."""
    seq = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 4, 9, 1, 2, 3]
    tree = SuffixTree(8)
    tree.extend(0, seq)
    assert tree.longest_match(seq, 6, min_count=2) == 3  # [9, 1, 2, 3] only at the end; [1, 2, 3] before too
    assert tree.longest_match(seq, 6, min_count=1) == 6
    tokens, parents, conds, score = tree.speculate(seq, 3, 4, 8, 0.0, discount=1)
    assert tokens[0] == 4 and parents[0] == -1 and conds[0] == pytest.approx(2 / 3)
    assert 5 in tokens and score > 0
    assert tree.speculate(seq, 3, 4, 8, 0.9, discount=1)[0] == []  # nothing that likely


def test_global_cache_is_bounded_and_forgets_the_oldest():
    """The global cache keeps at most max_outputs outputs; the oldest leaves the tree entirely."""
    cache = SuffixCache(max_depth=4, max_outputs=2)
    for out in ([1, 2, 3], [4, 5, 6], [7, 8, 9]):
        cache.add(out)
    assert len(cache) == 2 and cache.tree.node([1]) is None and cache.tree.count(cache.tree.node([7, 8])) == 1


def test_learns_across_runs_from_the_global_cache():
    """A second run of a prompt whose answer appeared only in an earlier output (not in the prompt)
    accepts tokens from the global tree: the drafter says so in info()."""
    script = checks.TOK.encode("the quick brown fox jumps over the lazy dog")
    prompt = checks.TOK.encode("Q? ")
    drafter = SuffixDrafter()
    first = checks.run_events(checks.scripted(script, len(prompt)), drafter, prompt, len(script))
    second = checks.run_events(checks.scripted(script, len(prompt)), drafter, prompt, len(script))
    assert checks.output_ids(second) == checks.output_ids(first) == script
    assert second[-1].stats.tau > first[-1].stats.tau and drafter.info()["global_hits"] > 0


def test_greedy_equals_baseline_over_many_seeds():
    """24 prompts on 4 tiny models, budget off and on: greedy suffix decoding equals the baseline
    token for token; tokens were both accepted and rejected, some steps accepted several."""
    checks.greedy_sweep(factory)


def test_trie_nodes_are_not_garbage_collector_objects():
    """A trie of thousands of nodes adds no object that Python's cyclic collector tracks (its nodes are
    ints in lists and int-only dicts), so full collections do not slow down as the global cache grows."""
    import gc

    tree = SuffixTree(8)
    gc.collect()
    before = len(gc.get_objects())
    rng = random.Random(0)
    tree.extend(0, [rng.randrange(50) for _ in range(2000)])
    assert tree.num_nodes() > 5000
    assert not any(gc.is_tracked(k) for k in tree.kids)
    assert len(gc.get_objects()) - before < 50


def test_speculation_length_grows_with_the_match_by_max_spec_factor():
    """A match of m tokens speculates at most ceil(factor * m + 1) nodes: with a long repeated run in
    the prompt, a 2-token match proposes 3 nodes at factor 1.0 and 5 at the default 2.0; the mixture
    keeps its suffix member at 1.0 (``MIXTURE_SUFFIX_SPEC_FACTOR``)."""
    import torch

    from helpers import FakeLoaded, tiny_llama
    from playground.engine import Engine, MethodSpec
    from playground.engine.drafter import DecodeState
    from playground.engine.mixture import MIXTURE_SUFFIX_SPEC_FACTOR
    from playground.engine.sampling import SamplingConfig
    from playground.engine.suffix import SUFFIX_FACTOR_KNOB

    prompt = list(range(10, 30)) + [5, 10, 11]  # "10 11" was followed by 12 13 14 ... once
    sizes = {}
    for factor in (1.0, 2.0):
        d = SuffixDrafter(max_spec_factor=factor, min_token_prob=0.0)
        d.begin(prompt)
        state = DecodeState(prompt, len(prompt), SamplingConfig(), None, 16, torch.device("cpu"), 64)
        cand = d.propose(state)
        sizes[factor] = len(cand)
        assert cand.tokens.tolist() == list(range(12, 12 + len(cand)))  # the chain that followed
    assert sizes == {1.0: 3, 2.0: 5}
    assert SUFFIX_FACTOR_KNOB.default == 2.0 and MIXTURE_SUFFIX_SPEC_FACTOR == 1.0
    engine = Engine(FakeLoaded(tiny_llama(0)))
    assert engine.make_drafter(MethodSpec("suffix")).max_spec_factor == 2.0
    mixture = engine.make_drafter(MethodSpec("mixture", {"members": "suffix,prompt_lookup"}))
    assert dict(mixture.members)["suffix"].max_spec_factor == MIXTURE_SUFFIX_SPEC_FACTOR
