"""Sampling: the logits transform, and speculative sampling keeps the target's distribution
exactly (toy verifier tests with negative controls, and end to end with tiny models).

Statistics: Pearson chi-square goodness-of-fit against the exact distribution (cells with an
expected count under 5 pooled), p-value from the regularised incomplete gamma function
(``helpers.chi2_sf``; scipy is not a dependency). Every test rejects at ALPHA = 1e-4, so a
correct implementation fails a given check for a fresh seed with odds 1 in 10,000; the seeds
are fixed, so on a given machine the outcome is deterministic.
"""

from __future__ import annotations

import pytest
import torch

from helpers import (buggy_verify_sampling, chain_proposer, chi_square_gof, chi_square_two_sample, exact_first_three,
                     sample_first_three,
                     count_samples, exact_chain_verdict, iid_tree_proposer, noisy_copy, onehot_tree_proposer,
                     tiny_llama, toy_exact_joint, toy_first_tokens, toy_table)
from playground.engine.autoregressive import AutoregressiveDrafter
from playground.engine.draft_model import DraftModelDrafter
from playground.engine.prompt_lookup import PromptLookupDrafter
from playground.engine import SamplingConfig, logits_to_probs
from playground.engine.sampling import sample
from playground.engine.target import CausalLM
from playground.engine import Candidates
from playground.engine.verify import verify_reference_chain, verify_sampling

pytestmark = pytest.mark.usefixtures("torch_single_thread")

ALPHA = 1e-4
VOCAB = 6
P_TABLE = toy_table(VOCAB, seed=1)  # the toy target (order-1 Markov chain over 6 tokens)
Q_TABLE = toy_table(VOCAB, seed=2)  # the toy draft, quite different from the target
N_TOY = 10_000
N_CONTROL = 4_000  # the negative controls are detected with enormous margins


# ----------------------------------------------------------------------------------------------
# logits_to_probs: hand-computed cases
# ----------------------------------------------------------------------------------------------

LOGITS = torch.log(torch.tensor([1.0, 2.0, 3.0, 4.0]))  # softmax = [0.1, 0.2, 0.3, 0.4]


@pytest.mark.parametrize("cfg, expected", [
    (SamplingConfig(temperature=1.0), [0.1, 0.2, 0.3, 0.4]),
    (SamplingConfig(temperature=0.5), [1 / 30, 4 / 30, 9 / 30, 16 / 30]),  # p^(1/T), renormalised
    (SamplingConfig(temperature=2.0), [x / sum([1, 2 ** .5, 3 ** .5, 2]) for x in [1, 2 ** .5, 3 ** .5, 2]]),
    (SamplingConfig(temperature=1.0, top_k=2), [0, 0, 3 / 7, 4 / 7]),
    (SamplingConfig(temperature=1.0, top_k=4), [0.1, 0.2, 0.3, 0.4]),  # k >= vocab: no-op
    (SamplingConfig(temperature=1.0, top_k=100), [0.1, 0.2, 0.3, 0.4]),
    (SamplingConfig(temperature=1.0, top_p=0.35), [0, 0, 0, 1]),  # 0.4 alone reaches 0.35
    (SamplingConfig(temperature=1.0, top_p=0.5), [0, 0, 3 / 7, 4 / 7]),  # 0.4 < 0.5: keep the crossing 0.3
    (SamplingConfig(temperature=1.0, top_p=0.75), [0, 2 / 9, 3 / 9, 4 / 9]),
    (SamplingConfig(temperature=1.0, top_p=0.95), [0.1, 0.2, 0.3, 0.4]),
    # top-k first (renormalised to [2/9, 3/9, 4/9]), then top-p 0.5 on that: 4/9 < 0.5 -> keep 3/9 too
    (SamplingConfig(temperature=1.0, top_k=3, top_p=0.5), [0, 0, 3 / 7, 4 / 7]),
    # temperature first: T=0.5 gives [1, 4, 9, 16]/30; top-p 0.5 keeps 16/30 only
    (SamplingConfig(temperature=0.5, top_p=0.5), [0, 0, 0, 1]),
])
def test_logits_to_probs_hand_computed(cfg, expected):
    """Temperature, then top-k, then top-p (smallest top set whose mass reaches top_p, the
    crossing token kept), then renormalisation, on hand-computed 4-token cases, per row of a
    batch."""
    probs = logits_to_probs(torch.stack([LOGITS, LOGITS]), cfg)
    assert probs.dtype == torch.float32
    torch.testing.assert_close(probs, torch.tensor([expected, expected], dtype=torch.float32), atol=1e-6, rtol=0)


def test_logits_to_probs_and_sample_reject_bad_input():
    """Greedy settings have no distribution (argmax instead); sample() wants one row;
    SamplingConfig checks its bounds with messages naming them."""
    with pytest.raises(ValueError, match="temperature > 0"):
        logits_to_probs(LOGITS, SamplingConfig())
    with pytest.raises(ValueError, match=r"shape \(vocab_size,\), got \(2, 4\)"):
        sample(torch.ones(2, 4) / 4, None)
    with pytest.raises(ValueError, match=r"temperature must be in \[0.0, 2.0\], got 3.0"):
        SamplingConfig(temperature=3.0)
    with pytest.raises(ValueError, match=r"top_p must be in \[0.01, 1.0\], got 0.0"):
        SamplingConfig(temperature=1.0, top_p=0.0)
    with pytest.raises(ValueError, match=r"top_k must be in \[0, 1000\], got -1"):
        SamplingConfig(temperature=1.0, top_k=-1)


def test_seeded_generator_is_reproducible():
    """The same seed gives the same generator stream; a different seed gives a different one."""
    a = SamplingConfig(temperature=1.0, seed=7).generator("cpu")
    b = SamplingConfig(temperature=1.0, seed=7).generator("cpu")
    c = SamplingConfig(temperature=1.0, seed=8).generator("cpu")
    ra, rb, rc = torch.rand(8, generator=a), torch.rand(8, generator=b), torch.rand(8, generator=c)
    assert torch.equal(ra, rb) and not torch.equal(ra, rc)


# ----------------------------------------------------------------------------------------------
# verify_sampling on a toy vocabulary
# ----------------------------------------------------------------------------------------------


def _first_two(propose, verify, seed: int, n: int = N_TOY) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return count_samples([toy_first_tokens(2, propose, verify, P_TABLE, g) for _ in range(n)], VOCAB)


def _assert_matches_target(counts: torch.Tensor, label: str) -> None:
    exact = toy_exact_joint(P_TABLE, 2)
    first, joint = chi_square_gof(counts.sum(1), exact.sum(1)), chi_square_gof(counts, exact)
    assert first.p_value > ALPHA, f"{label}: first token differs from p: {first}"
    assert joint.p_value > ALPHA, f"{label}: first two tokens differ from p: {joint}"


@pytest.mark.parametrize("chain_len", [1, 2, 3])
def test_chain_speculative_sampling_preserves_target(chain_len):
    """Drafting a chain of 1..3 tokens from a toy draft q and verifying with verify_sampling,
    the first emitted token is distributed as p, and the first two tokens jointly as
    p(a) p(b | a) (10,000 samples; chi-square at alpha = 1e-4, false alarm odds 1e-4 each)."""
    counts = _first_two(chain_proposer(Q_TABLE, chain_len, seed=100 + chain_len), verify_sampling, seed=chain_len)
    _assert_matches_target(counts, f"chain of {chain_len}")


def test_negative_control_wrong_residual_is_detected():
    """Negative control: the same test, with a verifier that samples the correction token from
    p instead of norm(max(0, p - q)), rejects with p-value < 1e-10 (so the test above has the
    power to catch a wrong residual)."""
    counts = _first_two(chain_proposer(Q_TABLE, 2, seed=102), buggy_verify_sampling("resample_target"), seed=2,
                        n=N_CONTROL)
    exact = toy_exact_joint(P_TABLE, 2)
    assert chi_square_gof(counts.sum(1), exact.sum(1)).p_value < 1e-10
    assert chi_square_gof(counts, exact).p_value < 1e-10


@pytest.mark.parametrize("kind", ["one-hot", "iid-from-q"])
def test_tree_speculative_sampling_preserves_target(kind):
    """With several children per node the multi-candidate rule keeps p: the one-hot rule
    (draft_probs None; children are the two likeliest target tokens, a duplicate of the first,
    and a grandchild under each) and SpecInfer's rule (3 children drawn i.i.d. from q, with
    draft_probs). First token and first two tokens match p (10,000 samples; alpha = 1e-4)."""
    propose = onehot_tree_proposer(P_TABLE) if kind == "one-hot" else iid_tree_proposer(Q_TABLE, 3, seed=110)
    counts = _first_two(propose, verify_sampling, seed=10)
    _assert_matches_target(counts, kind)


def test_negative_control_unnormalised_residual_is_detected():
    """Negative control for the multi-child rule: a verifier that does not renormalise the
    residual before trying the next sibling is rejected by the same tree test (p < 1e-10)."""
    counts = _first_two(onehot_tree_proposer(P_TABLE), buggy_verify_sampling("unnormalised"), seed=10, n=N_CONTROL)
    exact = toy_exact_joint(P_TABLE, 2)
    assert chi_square_gof(counts.sum(1), exact.sum(1)).p_value < 1e-10


@pytest.mark.parametrize("with_q", [True, False], ids=["draft_probs", "one-hot"])
def test_verify_sampling_agrees_with_reference_chain(with_q):
    """For a fixed 3-token chain, the distribution of (number accepted, bonus token) from the fast
    tree verifier and from the slow reference (Leviathan et al. Alg. 1) both match the exact
    distribution, and match each other (two-sample chi-square); 10,000 samples each, alpha =
    1e-4 per check."""
    g = torch.Generator().manual_seed(3)
    target_probs = torch.softmax(torch.randn(4, VOCAB, generator=g) * 1.5, -1)  # p at root, x1, x2, x3
    q = 0.5 * target_probs[:3] + 0.5 * torch.softmax(torch.randn(3, VOCAB, generator=g) * 1.5, -1)
    xs = q.argmax(-1).tolist()  # the draft's likeliest tokens: p/q ratios about 0.6 to 1
    draft_probs = q if with_q else None
    exact = exact_chain_verdict(xs, target_probs, draft_probs)
    accept_first = float(exact[1:].sum())
    assert 0.05 < accept_first < 0.95  # the chain is neither always accepted nor always rejected
    cand = Candidates.chain(xs, "draft", draft_probs)
    fast, slow = torch.zeros_like(exact), torch.zeros_like(exact)
    g_fast, g_slow = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
    for _ in range(N_TOY):
        v = verify_sampling(cand, target_probs, g_fast)
        fast[len(v.path), v.bonus_token] += 1
        assert v.path == list(range(len(v.path)))
        r = verify_reference_chain(xs, target_probs, draft_probs, g_slow)
        slow[len(r.path), r.bonus_token] += 1
    for name, counts in (("verify_sampling", fast), ("verify_reference_chain", slow)):
        result = chi_square_gof(counts, exact)
        assert result.p_value > ALPHA, f"{name}: {result}"
    together = chi_square_two_sample(fast, slow)
    assert together.p_value > ALPHA, f"fast vs reference: {together}"


def test_verify_sampling_extreme_cases():
    """q == p accepts every drafted token (the ratio is 1); a drafted token the target gives
    probability 0 is always rejected and the correction never equals it; shapes are checked."""
    g = torch.Generator().manual_seed(0)
    p = P_TABLE[[VOCAB, 0, 1]]
    same = Candidates.chain([0, 1], "draft", p[:2].clone())
    assert all(verify_sampling(same, p, g).path == [0, 1] for _ in range(200))
    p_zero = p.clone()
    p_zero[0, 3] = 0.0
    p_zero[0] /= p_zero[0].sum()
    for q in (None, Q_TABLE[[VOCAB, 3]]):
        cand = Candidates.chain([3, 1], "draft", q)
        for _ in range(200):
            v = verify_sampling(cand, p_zero, g)
            assert v.path == [] and v.bonus_token != 3
    with pytest.raises(ValueError, match=r"\(3, V\), got \(2, 6\)"):
        verify_sampling(same, p[:2], g)


# ----------------------------------------------------------------------------------------------
# End to end: the decoding loop with tiny models at temperature > 0
# ----------------------------------------------------------------------------------------------

E2E_PROMPT = [0, 1, 2, 3, 4, 5, 0, 1]


@pytest.fixture(scope="module")
def e2e_models():
    """A 6-token tiny target with fairly flat next-token distributions and a noisy copy as draft
    (acceptance rate about 0.4 at temperature 1)."""
    target = tiny_llama(7, vocab_size=VOCAB, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                        intermediate_size=32, head_std=0.3)
    return target, noisy_copy(target, 0.3, 8)


@pytest.mark.parametrize("method, cfg, runs", [
    ("autoregressive", SamplingConfig(temperature=1.0), 600),
    ("draft_model", SamplingConfig(temperature=1.0), 1200),
    ("draft_model", SamplingConfig(temperature=0.8, top_k=4, top_p=0.9), 800),
    ("prompt_lookup", SamplingConfig(temperature=1.0), 600),
], ids=["autoregressive-T1", "draft_model-T1", "draft_model-T0.8-topk4-topp0.9", "prompt_lookup-T1"])
def test_sampled_decoding_matches_exact_target_distribution(e2e_models, method, cfg, runs):
    """End to end through decode(): over many seeds (one run per seed), the first new tokens of
    autoregressive sampling, of draft-model speculative sampling (K = 2, so the first decode
    step verifies a 2-token chain drawn from q) and of prompt lookup (one-hot rule) follow the
    target's exact distribution after the same temperature/top-k/top-p transform: first two
    tokens jointly and first three jointly (chi-square, alpha = 1e-4 each). For the speculative
    methods, drafts were both accepted and rejected."""
    target, draft = e2e_models
    if method == "autoregressive":
        factory = lambda seed: AutoregressiveDrafter()  # noqa: E731
    elif method == "prompt_lookup":
        factory = lambda seed: PromptLookupDrafter(2, 4)  # noqa: E731
    else:
        draft_lm = CausalLM(draft)
        factory = lambda seed: DraftModelDrafter(draft_lm, 2)  # noqa: E731
    counts, accepted, proposed = sample_first_three(target, factory, E2E_PROMPT, cfg, runs, VOCAB)
    exact = exact_first_three(target, E2E_PROMPT, cfg, VOCAB)
    two, three = chi_square_gof(counts.sum(2), exact.sum(2)), chi_square_gof(counts, exact)
    assert two.p_value > ALPHA, f"first two tokens: {two}"
    assert three.p_value > ALPHA, f"first three tokens: {three}"
    if method != "autoregressive":
        assert 0 < accepted < proposed
