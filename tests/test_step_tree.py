"""Each step event carries the tree it verified (``StepEvent.tree``), consistent with what it emitted.

Every registered method runs through the engine on tiny random models (a noisy copy of the target
as the draft, random Medusa heads, a random EAGLE head), greedy and sampled, budget on and off, and
each step's tree must agree with the step: the accepted path's tokens are the emitted tokens minus
the bonus token (a prefix of path plus bonus at the last step, which EOS or the limit may cut), the
parents are valid and in topological order, depths follow the parents, the node count equals
``proposed``, the path is a root-to-node chain, and the rejected nodes are exactly the others.
"""

from __future__ import annotations

import pickle

import pytest
import torch

from helpers import FakeLoaded, low_entropy_prompt, noisy_copy, tiny_llama
from test_eagle import tiny_head
from test_medusa import random_heads
from playground.engine import METHODS, Datastore, Engine, GenerationSettings, MethodSpec, SamplingConfig, StepTree

pytestmark = pytest.mark.usefixtures("torch_single_thread")

EOS = 63
MAX_NEW = 40


@pytest.fixture(scope="module")
def engine():
    model = tiny_llama(0, num_layers=3)
    store = Datastore(torch.randint(0, 64, (16, 80), generator=torch.Generator().manual_seed(6)).tolist())
    return Engine(FakeLoaded(model, eos_token_ids=(EOS,)), draft=FakeLoaded(noisy_copy(model, 0.02, 1)),
                  medusa=random_heads(model, 3, scale=0.05, seed=2), eagle=tiny_head(model, 5), datastore=store)


def check_tree(event) -> None:
    """The step's tree agrees with the step (see the module docstring)."""
    tree = event.tree
    assert isinstance(tree, StepTree), (event.method, event.step)
    n = len(tree.tokens)
    assert len(tree.parents) == len(tree.sources) == len(tree.depths) == n
    assert n == event.proposed, (event.method, event.step, n, event.proposed)
    for i, (p, d) in enumerate(zip(tree.parents, tree.depths)):
        assert -1 <= p < i
        assert d == (1 if p < 0 else tree.depths[p] + 1)
    # The path is a chain from the root: each node's parent is the node before it.
    for k, node in enumerate(tree.path):
        assert 0 <= node < n
        assert tree.parents[node] == (tree.path[k - 1] if k else -1)
    assert sorted(tree.path + tree.rejected) == list(range(n))
    assert set(tree.path).isdisjoint(tree.rejected)
    verified = [tree.tokens[c] for c in tree.path] + [tree.bonus_token]
    verified_sources = [tree.sources[c] for c in tree.path] + ["target"]
    if event.finished:  # EOS, max new tokens or a stop string may cut the last step short
        assert 1 <= len(event.tokens) <= len(verified)
        assert event.tokens == verified[:len(event.tokens)]
    else:
        assert event.tokens == verified, (event.method, event.step)
        assert event.accepted == len(tree.path)
    assert event.sources == verified_sources[:len(event.sources)]
    assert tree.draft_s >= 0 and tree.verify_s >= 0
    assert abs(tree.draft_s + tree.verify_s - event.seconds) < 1e-6
    assert tree.pass_size >= 1 + n
    if event.step == 0:  # the prefill: no candidates, the first token is the target's
        assert n == 0 and tree.draft_s == 0.0 and event.tokens == [tree.bonus_token]


@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_tree_is_consistent(engine, method):
    """Greedy and sampled, budget auto and off, three prompts: every step's tree is consistent,
    some step proposes candidates (except the baseline), and some step rejects one or accepts one."""
    assert engine.unavailable_reason(method) is None
    g = torch.Generator().manual_seed(11)
    budgets = ("auto", "off") if any(k.name == "budget" for k in METHODS[method].knobs) else (None,)
    proposed = accepted = rejected = steps = 0
    for budget in budgets:
        for temperature in (0.0, 0.8):
            for seed in range(3):
                prompt = low_entropy_prompt(g, 8 + 3 * seed, 5 + seed)
                params = {"budget": budget} if budget else {}
                settings = GenerationSettings(MAX_NEW, SamplingConfig(temperature=temperature, seed=seed))
                events = list(engine.run_one(prompt, MethodSpec(method, params), settings))
                for e in events:
                    check_tree(e)
                    proposed += len(e.tree.tokens)
                    accepted += len(e.tree.path)
                    rejected += len(e.tree.rejected)
                    steps += 1
                assert sum(len(e.tree.path) for e in events) >= events[-1].stats.accepted
    if method == "autoregressive":
        assert proposed == 0
    else:
        assert proposed > 0, method
        assert accepted + rejected == proposed


def test_lookahead_counts_its_window_in_the_pass(engine):
    """Lookahead's Jacobi window rides in the pass: the tree's pass size counts its extra queries."""
    prompt = low_entropy_prompt(torch.Generator().manual_seed(3), 12, 6)
    events = list(engine.run_one(prompt, MethodSpec("lookahead", {"budget": "off"}), GenerationSettings(24)))
    assert any(e.tree.extra_queries > 0 for e in events[1:])
    for e in events[1:]:
        assert e.tree.pass_size == 1 + len(e.tree.tokens) + e.tree.extra_queries


def test_tree_is_plain_data():
    """The tree holds only Python ints, floats and strings: it pickles (ZeroGPU) and its dict has
    the rejected nodes."""
    from playground.engine import Candidates

    cand = Candidates(torch.tensor([5, 6, 7, 8]), torch.tensor([-1, 0, 0, -1]), ["a", "b", "c", "d"])
    tree = StepTree.of(cand, [0, 2], 9, 0.01, 0.02)
    assert tree.depths == [1, 2, 2, 1] and tree.rejected == [1, 3] and tree.pass_size == 5
    d = tree.as_dict()
    assert d["rejected"] == [1, 3] and d["path"] == [0, 2] and d["bonus_token"] == 9
    assert all(type(t) is int for t in d["tokens"] + d["parents"] + d["depths"])
    assert pickle.loads(pickle.dumps(d)) == d


def test_drafters_work_on_the_prompt_counts_as_reading_it():
    """A drafter's ``begin()`` (suffix trees, n-gram pools, caches over the prompt) is timed inside the
    prefill step, whose drafting time stays 0: it shows in the time to first token, not in step 1."""
    import time

    from playground.engine import decode
    from playground.engine.autoregressive import AutoregressiveDrafter
    from playground.engine.target import CausalLM

    class SlowToBegin(AutoregressiveDrafter):
        def begin(self, prompt_ids):
            time.sleep(0.2)
            super().begin(prompt_ids)

    events = list(decode(CausalLM(tiny_llama(0)), SlowToBegin(), [1, 2, 3, 4],
                         GenerationSettings(max_new_tokens=3, stop_on_eos=False)))
    prefill, first = events[0], events[1]
    assert prefill.step == 0 and prefill.seconds >= 0.2 and prefill.tree.draft_s == 0.0
    assert prefill.stats.ttft_s >= 0.2
    assert first.step == 1 and first.tree.draft_s < 0.2
