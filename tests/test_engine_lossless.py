"""Greedy losslessness: prompt lookup and draft-model decoding equal the autoregressive baseline
token for token, over many seeds and knob values, with real acceptances and rejections."""

from __future__ import annotations

import pytest
import torch

from helpers import TEST_DTYPE, GreedyBiasedDraftLM, clear_greedy_baseline, noisy_copy, run_events, tiny_llama
from playground.engine import check_lossless
from playground.engine import GenerationSettings, generate
from playground.engine.draft_model import DraftModelDrafter
from playground.engine.prompt_lookup import PromptLookupDrafter, find_candidate
from playground.engine.target import CausalLM

pytestmark = pytest.mark.usefixtures("torch_single_thread")

NUM_SEEDS = 36
MAX_NEW = 32
EOS = 63  # an id the models emit now and then, so some runs also end at EOS
NOISE_SCALES = (0.01, 0.03, 0.1)  # per-weight noise of the noisy-copy drafts (greedy alpha ~0.7, ~0.2, ~0.07)


@pytest.fixture(scope="module")
def sweep():
    """Four tiny targets; for each, three noisy copies and one smaller unrelated random model as
    drafts; NUM_SEEDS low-entropy prompts with their greedy autoregressive baselines (prompts
    whose baseline passes within MIN_BASELINE_MARGIN of a tie are redrawn)."""
    targets = [tiny_llama(seed) for seed in range(4)]
    drafts = [[CausalLM(noisy_copy(t, scale, 100 + 10 * i + j)) for j, scale in enumerate(NOISE_SCALES)]
              + [CausalLM(tiny_llama(200 + i, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                                     intermediate_size=32))]
              for i, t in enumerate(targets)]
    g = torch.Generator().manual_seed(2024)
    cases = []
    for seed in range(NUM_SEEDS):
        target = CausalLM(targets[seed % 4])
        prompt, baseline, margins = clear_greedy_baseline(target, g, 6 + seed % 14, 4 + seed % 5, MAX_NEW, (EOS,))
        cases.append((seed, target, drafts[seed % 4], prompt, baseline, margins))
    return cases


def _check(name, seed, knobs, baseline, margins, out):
    verdict = check_lossless(baseline, margins, out, TEST_DTYPE)
    return None if verdict.matched else f"{name} seed={seed} {knobs}: {verdict.message()}"


def test_prompt_lookup_greedy_equals_baseline(sweep):
    """For 36 prompts on 4 models and every max_ngram_size in 1..4 and num_pred_tokens in
    1..10, greedy prompt lookup output equals the autoregressive baseline token for token;
    across the sweep some drafted tokens were accepted and some rejected (0 < alpha < 1), and
    some steps accepted a whole multi-token proposal."""
    failures, accepted, proposed, full_multi = [], 0, 0, 0
    settings = GenerationSettings(max_new_tokens=MAX_NEW)
    for seed, target, _, prompt, baseline, margins in sweep:
        ngram, num_pred = 1 + seed % 4, 1 + seed % 10
        events = run_events(target, PromptLookupDrafter(ngram, num_pred), prompt, settings=settings,
                            eos_token_ids=(EOS,))
        out = [t for e in events for t in e.tokens]
        failures.append(_check("prompt_lookup", seed, dict(max_ngram_size=ngram, num_pred_tokens=num_pred),
                               baseline, margins, out))
        accepted += events[-1].stats.accepted
        proposed += events[-1].stats.proposed
        full_multi += sum(1 for e in events if e.proposed > 1 and e.accepted == e.proposed)
    assert [f for f in failures if f] == []
    assert 0 < accepted < proposed, (accepted, proposed)
    assert full_multi > 0


def test_draft_model_greedy_equals_baseline(sweep):
    """For 36 prompts on 4 models, K in 1..8 (and K = 16 once), with drafts that are noisy copies
    of the target (three noise levels) or a smaller unrelated model, greedy draft-model output
    equals the autoregressive baseline token for token; across the sweep drafted tokens were
    both accepted and rejected (0 < alpha < 1), including whole-block acceptances and
    rejections of the first drafted token."""
    failures, accepted, proposed, full, first_rejected = [], 0, 0, 0, 0
    settings = GenerationSettings(max_new_tokens=MAX_NEW)
    # (case, K, which draft): every (target, draft) pair occurs; K = 16 once, with the closest draft.
    runs = [(case, 1 + case[0] % 8, (case[0] // 4) % 4) for case in sweep] + [(sweep[0], 16, 0)]
    for (seed, target, drafts, prompt, baseline, margins), k, which in runs:
        events = run_events(target, DraftModelDrafter(drafts[which], k), prompt, settings=settings,
                            eos_token_ids=(EOS,))
        out = [t for e in events for t in e.tokens]
        failures.append(_check("draft_model", seed, dict(k=k, draft=which), baseline, margins, out))
        accepted += events[-1].stats.accepted
        proposed += events[-1].stats.proposed
        full += sum(1 for e in events[1:] if e.proposed > 1 and e.accepted == e.proposed)
        first_rejected += sum(1 for e in events[1:] if e.proposed and e.accepted == 0)
    assert [f for f in failures if f] == []
    assert 0 < accepted < proposed, (accepted, proposed)
    assert full > 0 and first_rejected > 0


def test_draft_with_larger_padded_vocabulary_is_lossless():
    """A draft whose embedding table is padded past the target's vocabulary (80 vs 64 rows, as
    many checkpoints are) never proposes an id the target does not have, and greedy output
    still equals the baseline, even though the draft's own argmax often falls in the padding."""
    target = CausalLM(tiny_llama(1))
    draft = GreedyBiasedDraftLM(tiny_llama(1, vocab_size=80), limit=64)
    g = torch.Generator().manual_seed(3)
    settings = GenerationSettings(max_new_tokens=24)
    for _ in range(4):
        prompt, baseline, _ = clear_greedy_baseline(target, g, 10, 6, 24)
        out, _ = generate(target, DraftModelDrafter(draft, 4), prompt, settings)
        assert out == baseline
    assert draft.argmax_outside > 0


def test_find_candidate_prefers_longest_most_recent_match():
    """Prompt lookup proposes the tokens after the most recent earlier occurrence of the longest
    suffix n-gram (up to max_ngram_size), at most num_pred_tokens of them, and nothing when no
    suffix recurs."""
    seq = torch.tensor([1, 2, 3, 9, 1, 2, 4, 7, 2, 3, 5, 1, 2])
    # suffix [1, 2]: earlier at 0 and 4; the most recent (4) is followed by 4, 7, 2
    assert find_candidate(seq, 2, 3) == [4, 7, 2]
    # suffix [2] alone: most recent earlier 2 is at 8, followed by 3, 5, 1
    assert find_candidate(seq, 1, 3) == [3, 5, 1]
    # suffix [5, 1, 2] never occurred before; falls back to [1, 2]
    assert find_candidate(seq, 3, 10) == [4, 7, 2, 3, 5, 1, 2]
    assert find_candidate(torch.tensor([1, 2, 3, 4]), 3, 5) == []
    assert find_candidate(torch.tensor([5]), 3, 5) == []
    assert find_candidate(torch.tensor([6, 6]), 2, 5) == [6]
