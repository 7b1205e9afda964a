"""Token recycling: the adjacency table and its breadth-first fill against a slow reference, the
static tree, then the checks every method passes (greedy equal to the baseline, EOS inside a block,
the token limit, no EOS id, streaming, sampling exactness)."""

from __future__ import annotations

import random

import pytest
import torch

import drafter_checks as checks
from playground.engine.recycling import AdjacencyTable, RecyclingDrafter, reference_fill, static_tree

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def factory(vocab_size, budget_cost):
    d = RecyclingDrafter(vocab_size)
    d.budget_cost = budget_cost
    return d


def test_static_tree_is_topological_and_breadth_first():
    """The template has the requested size, parents before children, depths non-decreasing, ranks
    below top_k, and siblings distinct ranks."""
    for nodes, k in ((1, 1), (24, 8), (64, 16), (10, 2)):
        tree = static_tree(nodes, k)
        assert len(tree) == nodes
        depth = []
        for i, (p, r) in enumerate(tree):
            assert p < i and 0 <= r < k
            depth.append(1 if p < 0 else depth[p] + 1)
        assert depth == sorted(depth)
        assert len({(p, r) for p, r in tree}) == nodes


def test_fill_equals_reference_and_update_replaces_rows():
    """On 100 random tables (with unseen rows) and templates, the breadth-first fill equals walking
    every template path through a dict (the slow reference); update replaces whole rows, the later of
    two rows for one token winning."""
    rng = random.Random(1)
    for _ in range(100):
        vocab, k = 12, rng.randint(1, 4)
        table = AdjacencyTable(vocab, k)
        ref = {}
        for t in rng.sample(range(vocab), rng.randint(0, vocab)):
            row = rng.sample(range(vocab), k)
            table.update(torch.tensor([t]), torch.tensor([row]))
            ref[t] = row
        template = static_tree(rng.randint(1, 20), k)
        root = rng.randrange(vocab)
        assert table.fill(root, template) == reference_fill(ref, root, template)
        assert table.rows == len(ref) == int((table.table[:, 0] >= 0).sum())
    table = AdjacencyTable(5, 2)
    table.update(torch.tensor([1, 1]), torch.tensor([[2, 3], [4, 0]]))
    assert table.table[1].tolist() == [4, 0] and table.table[2].tolist() == [-1, -1] and table.rows == 1


def test_update_recycles_the_pass_top_k():
    """After one step, every token scored in the pass has its row set to the target's top-k there."""
    drafter = RecyclingDrafter(64, top_k=3)
    target = checks.CausalLM(checks.tiny_llama(0))
    events = checks.run_events(target, drafter, [1, 2, 3, 4], 6)
    assert sum(1 for e in events if e.proposed) > 0
    assert drafter.info()["table_rows"] == int((drafter.table.table[:, 0] >= 0).sum()) >= 3


def test_greedy_equals_baseline_over_many_seeds():
    """24 prompts on 4 tiny models, budget off and on, the table carried across a model's prompts:
    greedy recycling equals the baseline token for token; tokens were accepted and rejected."""
    checks.greedy_sweep(factory)
