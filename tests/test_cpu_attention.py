"""Folded grouped-query attention (playground/engine/cpu_attention.py): the same logits as
transformers' ``sdpa`` for chains, candidate trees and explicit masks over a cache, over seeds, and
lossless decoding on top; switched on only where it applies."""

from __future__ import annotations

import copy

import pytest
import torch

from helpers import clear_greedy_baseline, noisy_copy, run_events, tiny_llama
from playground.engine import cpu_attention
from playground.engine.autoregressive import AutoregressiveDrafter
from playground.engine.cpu_attention import ATTENTION_NAME, use_gqa_attention
from playground.engine.draft_model import DraftModelDrafter
from playground.engine.lookahead import LookaheadDrafter
from playground.engine.target import CausalLM

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def _pair(seed: int, heads: int = 6, kv_heads: int = 2):
    """The same tiny GQA model twice: transformers' sdpa, and folded."""
    plain = tiny_llama(seed, vocab_size=80, hidden_size=48, num_heads=heads, num_kv_heads=kv_heads)
    folded = copy.deepcopy(plain)
    assert use_gqa_attention(folded) and folded.config._attn_implementation == ATTENTION_NAME
    assert plain.config._attn_implementation == "sdpa"
    return CausalLM(plain), CausalLM(folded)


@pytest.mark.parametrize("seed", range(6))
def test_folded_attention_matches_sdpa_over_a_cache(seed):
    """After a prefill of 40 tokens: a chain of 7, a candidate tree of 9 and an explicit mask of 6
    queries (a Lookahead-like pass) give logits within 1e-5 of sdpa's, and the caches agree."""
    plain, folded = _pair(seed)
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, 80, (40,), generator=g)
    caches = [plain.new_cache(), folded.new_cache()]
    for lm, cache in zip((plain, folded), caches):
        lm.forward(cache, prompt, last_only=True)
    chain = torch.randint(0, 80, (7,), generator=g)
    tree_ids = torch.randint(0, 80, (9,), generator=g)
    parents = torch.tensor([-1, 0, 0, 1, 1, 2, 4, 6])
    ids6 = torch.randint(0, 80, (6,), generator=g)
    allowed = torch.tril(torch.ones(6, 6, dtype=torch.bool))
    allowed[3:, 1:3] = False
    offsets = torch.tensor([0, 1, 2, 1, 2, 3])
    results = []
    for lm, cache in zip((plain, folded), caches):
        out = [lm.forward(cache, chain)]
        CausalLM.crop(cache, 40)
        out.append(lm.forward(cache, tree_ids, parents=parents))
        CausalLM.crop(cache, 40)
        out.append(lm.forward_masked(cache, ids6, allowed, offsets))
        results.append(out)
    for a, b in zip(*results):
        assert a.shape == b.shape
        assert (a - b).abs().max().item() <= 1e-5 * max(1.0, a.abs().max().item())
    for la, lb in zip(caches[0].layers, caches[1].layers):
        assert torch.equal(la.keys, lb.keys) and torch.equal(la.values, lb.values)


@pytest.mark.parametrize("seed", range(4))
def test_lossless_decoding_with_folded_attention(seed):
    """Greedy draft-model and Lookahead decoding on the folded target equal the sdpa baseline."""
    plain, folded = _pair(seed)
    g = torch.Generator().manual_seed(100 + seed)
    prompt, baseline, _ = clear_greedy_baseline(plain, g, length=12, token_range=80, max_new_tokens=24)
    assert [t for e in run_events(folded, AutoregressiveDrafter(), prompt, 24) for t in e.tokens] == baseline
    draft = CausalLM(noisy_copy(folded.model, 0.05, seed))
    for drafter in (DraftModelDrafter(draft, k=4), LookaheadDrafter(window=3, ngram_size=3, guess_set_size=3)):
        assert [t for e in run_events(folded, drafter, prompt, 24) for t in e.tokens] == baseline


def test_only_where_it_applies(monkeypatch):
    """Not switched without GQA, for eager attention, or with PLAYGROUND_GQA_ATTENTION=0."""
    assert not use_gqa_attention(tiny_llama(0, num_heads=4, num_kv_heads=4))
    assert not use_gqa_attention(tiny_llama(0, attn="eager"))
    monkeypatch.setenv(cpu_attention.ENV_SWITCH, "0")
    model = tiny_llama(0)
    assert not use_gqa_attention(model) and model.config._attn_implementation == "sdpa"


def test_tiled_mask_is_made_once_per_pass_and_afresh_for_a_new_mask():
    """Every layer of a pass gets the same mask object: its tiled copy is reused; a different mask of
    the same shape (the next pass, perhaps at a freed mask's address) is tiled from its own values."""
    import gc

    from playground.engine.cpu_attention import _tiled_mask

    reused = 0
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        mask = torch.where(torch.rand(1, 1, 5, 12, generator=g) < 0.5, 0.0, torch.finfo(torch.float32).min)
        tiled = _tiled_mask(mask, 3)
        assert torch.equal(tiled, mask.repeat(1, 1, 3, 1))
        assert _tiled_mask(mask, 3) is tiled  # the next layer of the same pass
        assert torch.equal(_tiled_mask(mask, 2), mask.repeat(1, 1, 2, 1))  # another group size
        mask[..., 0] = 0.0  # changed in place
        assert torch.equal(_tiled_mask(mask, 2), mask.repeat(1, 1, 2, 1))
        fresh = mask.clone()  # version 0, like the next pass's new mask
        assert torch.equal(_tiled_mask(fresh, 3), fresh.repeat(1, 1, 3, 1))
        address = id(fresh)
        del mask, tiled, fresh
        gc.collect()
        other = torch.where(torch.rand(1, 1, 5, 12, generator=g) < 0.5, 0.0, torch.finfo(torch.float32).min)
        reused += id(other) == address  # same identity number, same group size and version: only the
        assert torch.equal(_tiled_mask(other, 3), other.repeat(1, 1, 3, 1))  # weak reference tells them apart
    # Whether or not an address was reused above (reused counts it), deterministically: a remembered
    # entry whose mask is gone (a dead weak reference) under the key the next mask has is never handed out.
    import weakref

    from playground.engine import cpu_attention
    gone = torch.zeros(1, 1, 5, 12)
    cpu_attention._last_tiled.entry = (weakref.ref(gone), (3, 0), torch.full((1, 1, 15, 12), 7.0))
    del gone
    following = torch.full((1, 1, 5, 12), -1.0)
    assert following._version == 0 and torch.equal(_tiled_mask(following, 3), following.repeat(1, 1, 3, 1))
