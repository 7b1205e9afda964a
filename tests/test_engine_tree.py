"""Candidate trees: the data type, the tree attention buffers, tree forward passes, cache commit,
greedy tree verification, and lossless decoding with a tree drafter."""

from __future__ import annotations

import pytest
import torch

from helpers import RandomTreeDrafter, clear_greedy_baseline, output_ids, run_events, tiny_llama
from playground.engine import GenerationSettings
from playground.engine.target import CausalLM
from playground.engine import Candidates
from playground.engine.tree import tree_attention_inputs, tree_mask_bool
from playground.engine.verify import verify_greedy

pytestmark = pytest.mark.usefixtures("torch_single_thread")

# A small tree with branching at the root and below (parents in topological order):
#   root ─ 0 ─ 2 ─ 5
#        │   └ 3
#        ├ 1 ─ 4
#        └ 6
PARENTS = [-1, -1, 0, 0, 1, 2, -1]
LEAF_PATHS = [[0, 2, 5], [0, 3], [1, 4], [6]]


def _leaf_paths(parents: list[int]) -> list[list[int]]:
    children = Candidates(torch.zeros(len(parents), dtype=torch.long), torch.tensor(parents),
                          [""] * len(parents)).children()
    paths, stack = [], [[c] for c in reversed(children[0])]
    while stack:
        path = stack.pop()
        kids = children[path[-1] + 1]
        if not kids:
            paths.append(path)
        stack += [path + [k] for k in reversed(kids)]
    return paths


def test_candidates_structure_and_validation():
    """Chains and trees are one type: depths and children follow ``parents``; bad shapes or
    parents that are not in topological order raise ValueError naming what was received."""
    cand = Candidates(torch.arange(7), torch.tensor(PARENTS), ["s"] * 7)
    assert cand.depths() == [1, 1, 2, 2, 2, 3, 1]
    assert cand.children() == [[0, 1, 6], [2, 3], [4], [5], [], [], [], []]
    assert not cand.is_chain
    assert _leaf_paths(PARENTS) == LEAF_PATHS
    chain = Candidates.chain([5, 6, 7], "draft")
    assert chain.is_chain and chain.parents.tolist() == [-1, 0, 1] and chain.depths() == [1, 2, 3]
    assert len(Candidates.empty()) == 0
    with pytest.raises(ValueError, match=r"parents\[i\] < i"):
        Candidates(torch.arange(3), torch.tensor([-1, 2, 0]), ["s"] * 3)
    with pytest.raises(ValueError, match=r"\(3,\), \(2,\)"):
        Candidates(torch.arange(3), torch.tensor([-1, 0]), ["s"] * 3)
    with pytest.raises(ValueError, match=r">= -1"):
        Candidates(torch.arange(2), torch.tensor([-2, 0]), ["s"] * 2)
    with pytest.raises(ValueError, match=r"draft_probs must have shape \(num_nodes, vocab_size\), got \(2, 5\)"):
        Candidates.chain([1, 2, 3], "draft", torch.rand(2, 5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tree_attention_inputs_match_hand_computed_mask(dtype):
    """The additive mask lets each query see the whole prefix, the root, its ancestors and
    itself (a hand-written dense matrix), blocks everything else with finfo.min in the model
    dtype, and position ids are prefix length + depth."""
    parents = torch.tensor([-1, -1, 0, 1, 2])  # root ─ 0 ─ 2 ─ 4 ; root ─ 1 ─ 3
    past_len = 3
    allowed = torch.tensor([
        # R  0  1  2  3  4
        [1, 0, 0, 0, 0, 0],  # root
        [1, 1, 0, 0, 0, 0],  # 0
        [1, 0, 1, 0, 0, 0],  # 1
        [1, 1, 0, 1, 0, 0],  # 2 (parent 0)
        [1, 0, 1, 0, 1, 0],  # 3 (parent 1)
        [1, 1, 0, 1, 0, 1],  # 4 (parent 2)
    ], dtype=torch.bool)
    assert torch.equal(tree_mask_bool(parents), allowed)
    mask, positions = tree_attention_inputs(parents, past_len, dtype, torch.device("cpu"))
    assert mask.shape == (1, 1, 6, past_len + 6) and mask.dtype == dtype
    expected = torch.full((6, past_len + 6), torch.finfo(dtype).min, dtype=dtype)
    expected[:, :past_len] = 0
    expected[:, past_len:][allowed] = 0
    assert torch.equal(mask[0, 0], expected)
    assert positions.tolist() == [[3, 4, 4, 5, 5, 6]]


def _prefix_cache(lm: CausalLM, prefix: list[int]):
    cache = lm.new_cache()
    if prefix:
        lm.forward(cache, torch.tensor(prefix))
    return cache


def _chain_logits(lm: CausalLM, prefix: list[int], tokens: list[int]) -> torch.Tensor:
    """Logits of ``tokens`` run as a plain chain after ``prefix`` (fresh cache)."""
    return lm.forward(_prefix_cache(lm, prefix), torch.tensor(tokens))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("prefix_len", [0, 9])
def test_tree_forward_equals_each_path_run_alone(attn, prefix_len):
    """One tree-attention forward over the root plus a branching tree gives, for every
    root-to-leaf path, the same logits (fp32, atol 1e-4) as running that path alone as a chain
    after the same prefix; with sdpa and eager attention, with and without a cached prefix."""
    lm = CausalLM(tiny_llama(3, attn=attn))
    g = torch.Generator().manual_seed(11)
    prefix = torch.randint(0, 64, (prefix_len,), generator=g).tolist()
    root = 7
    tokens = torch.randint(0, 64, (len(PARENTS),), generator=g)
    cache = _prefix_cache(lm, prefix)
    tree_logits = lm.forward(cache, torch.cat([torch.tensor([root]), tokens]), torch.tensor(PARENTS))
    assert tree_logits.shape == (len(PARENTS) + 1, 64)
    assert cache.get_seq_length() == prefix_len + 1 + len(PARENTS)
    for path in LEAF_PATHS:
        chain = _chain_logits(lm, prefix, [root] + tokens[path].tolist())
        rows = [0] + [n + 1 for n in path]
        torch.testing.assert_close(tree_logits[rows], chain, atol=1e-4, rtol=0)


def test_keep_non_contiguous_path_then_continue_equals_chain():
    """After two successive tree steps whose accepted paths are not contiguous node runs,
    ``CausalLM.keep`` leaves a cache from which a further forward gives the same logits
    (atol 1e-4) as running prefix + accepted tokens as a plain chain; the cache length is
    prefix + root + path each time. A contiguous path (plain crop) is checked too."""
    lm = CausalLM(tiny_llama(4))
    g = torch.Generator().manual_seed(5)
    prefix = torch.randint(0, 64, (6,), generator=g).tolist()
    committed = list(prefix)
    cache = _prefix_cache(lm, prefix)
    root = 9
    for path in ([1, 4], [0, 3], [0, 2]):  # non-contiguous, non-contiguous, contiguous
        tokens = torch.randint(0, 64, (len(PARENTS),), generator=g)
        past_len = cache.get_seq_length()
        lm.forward(cache, torch.cat([torch.tensor([root]), tokens]), torch.tensor(PARENTS))
        CausalLM.keep(cache, past_len, [0] + [n + 1 for n in path])
        committed += [root] + tokens[path].tolist()
        assert cache.get_seq_length() == len(committed)
        root = int(torch.randint(0, 64, (), generator=g))
    after = lm.forward(cache, torch.tensor([root, 3, 5]))
    reference = _chain_logits(lm, committed, [root, 3, 5])
    torch.testing.assert_close(after, reference, atol=1e-4, rtol=0)
    whole = _chain_logits(lm, [], committed + [root, 3, 5])[len(committed):]
    torch.testing.assert_close(after, whole, atol=1e-4, rtol=0)


@pytest.mark.parametrize("offsets", [[0], [0, 1, 2], [0, 2], [0, 1, 3], [0, 3, 5, 6], [0, 1, 4, 6], [0, 6]])
def test_keep_moves_exactly_the_kept_queries(offsets):
    """``CausalLM.keep`` leaves, in every layer, the prefix followed by the kept queries' keys and
    values, bit for bit as a plain gather would (a run in place, one query moved, several moved)."""
    from transformers import DynamicCache

    g = torch.Generator().manual_seed(len(offsets) * 7 + offsets[-1])
    cache, whole = DynamicCache(), []
    for i in range(3):
        k, v = torch.randn(1, 2, 12, 4, generator=g), torch.randn(1, 2, 12, 4, generator=g)
        cache.update(k, v, i)
        whole.append((k.clone(), v.clone()))
    past_len = 5
    CausalLM.keep(cache, past_len, offsets)
    rows = list(range(past_len)) + [past_len + o for o in offsets]
    assert cache.get_seq_length() == len(rows)
    for layer, (k, v) in zip(cache.layers, whole):
        assert torch.equal(layer.keys, k[:, :, rows]) and torch.equal(layer.values, v[:, :, rows])


def test_forward_rejects_bad_shapes():
    """CausalLM.forward checks shapes on entry: empty or 2-D input ids and parents of the
    wrong length raise ValueError showing the shape received."""
    lm = CausalLM(tiny_llama(0))
    cache = lm.new_cache()
    with pytest.raises(ValueError, match=r"got \(0,\)"):
        lm.forward(cache, torch.tensor([], dtype=torch.long))
    with pytest.raises(ValueError, match=r"got \(1, 3\)"):
        lm.forward(cache, torch.tensor([[1, 2, 3]]))
    for parents in ([-1, 0], [-1], [-1, -1, 0, 1]):  # 4 input ids need 3 parents
        with pytest.raises(ValueError, match=r"parents must have shape \(3,\)"):
            lm.forward(cache, torch.tensor([1, 2, 3, 4]), torch.tensor(parents))


def _logits_with_argmax(argmax: list[int], vocab: int = 10) -> torch.Tensor:
    logits = torch.zeros(len(argmax), vocab)
    logits[torch.arange(len(argmax)), torch.tensor(argmax)] = 5.0
    return logits


def test_verify_greedy_picks_right_path_and_bonus():
    """On a hand-made tree, greedy verification accepts the longest path whose every token is
    the target's argmax at its parent (whichever sibling order), and the bonus token is the
    argmax after it; with no matching child at the root the path is empty."""
    #   root ─ 0:3 ─ 5:9
    #        ├ 1:5 ─ 2:7
    #        │     └ 3:2 ─ 4:4
    #        └ 6:5  (duplicate of node 1; the first matching sibling is taken)
    cand = Candidates(torch.tensor([3, 5, 7, 2, 4, 9, 5]), torch.tensor([-1, -1, 1, 1, 3, 0, -1]), ["s"] * 7)
    # rows: root, node0..node6
    full = verify_greedy(cand, _logits_with_argmax([5, 9, 2, 0, 4, 6, 0, 0]))
    assert (full.path, full.bonus_token) == ([1, 3, 4], 6)
    mid = verify_greedy(cand, _logits_with_argmax([5, 9, 2, 0, 1, 6, 0, 0]))
    assert (mid.path, mid.bonus_token) == ([1, 3], 1)
    other = verify_greedy(cand, _logits_with_argmax([3, 9, 2, 0, 4, 6, 8, 0]))
    assert (other.path, other.bonus_token) == ([0, 5], 8)
    none = verify_greedy(cand, _logits_with_argmax([8, 9, 2, 0, 4, 6, 0, 0]))
    assert (none.path, none.bonus_token) == ([], 8)
    empty = verify_greedy(Candidates.empty(), _logits_with_argmax([4]))
    assert (empty.path, empty.bonus_token) == ([], 4)
    with pytest.raises(ValueError, match=r"\(8, V\), got \(7, 10\)"):
        verify_greedy(cand, torch.zeros(7, 10))


def test_random_tree_drafter_decoding_is_lossless():
    """Greedy decoding with a drafter proposing random trees (the target's true continuation in
    one branch, sometimes corrupted, plus distractors sharing prefixes, in random node order)
    equals the autoregressive baseline token for token, over several prompts and models; the
    sweep really accepted tokens and committed non-contiguous paths (the gather in keep)."""
    accepted = proposed = non_contiguous = 0
    for seed in range(6):
        target = CausalLM(tiny_llama(seed % 3))
        g = torch.Generator().manual_seed(100 + seed)
        prompt, baseline, _ = clear_greedy_baseline(target, g, 10, 8, 40)
        settings = GenerationSettings(max_new_tokens=40)
        drafter = RandomTreeDrafter(baseline, 64, g, max_depth=1 + seed % 6, branches=3)
        events = run_events(target, drafter, prompt, settings=settings)
        assert output_ids(events) == baseline, f"seed {seed}"
        stats = events[-1].stats
        accepted += stats.accepted
        proposed += stats.proposed
        non_contiguous += sum(1 for p in drafter.paths if p != list(range(len(p))))
        for e in events[1:]:
            assert e.sources[-1] == "target" and all(s == "tree" for s in e.sources[:-1])
    assert 0 < accepted < proposed
    assert non_contiguous > 10
