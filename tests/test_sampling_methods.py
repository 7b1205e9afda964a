"""Every lossless method keeps the target's distribution under sampling (issue 21, item 3), run
through the Engine (each method's own build, knobs and budget), on one small random target.

For each method the first two and the first three new tokens over many seeds (one run per seed)
are compared with the target's exact joint distribution after the same temperature / top-k /
top-p transform, by Pearson's chi-square (cells with expected count < 5 pooled). Each check uses
alpha = 1e-4: a correct implementation fails one check with odds 1 in 10,000 for a fresh seed
(the seeds are fixed, so a pass is reproducible); with 2 checks for 10 cases the odds that some
check fails by chance are at most 0.2 %. The negative control is a sampler that accepts every
drafted token (no min(1, p/q) test): the same checks flag it.

Per-method tests with more seeds or settings live beside each method (test_engine_sampling,
test_engine_lookahead, test_eagle, test_drafter_failure_modes); this one runs them all the same way.
"""

from __future__ import annotations

import pytest
import torch

import playground.engine.decoding as decoding
from helpers import TEST_DEVICE, TEST_DTYPE, FakeLoaded, chi_square_gof, exact_first_three, noisy_copy, sample_first_three, tiny_llama
from playground.engine import METHODS as REGISTRY
from playground.engine import Engine, MethodSpec, SamplingConfig
from playground.engine.rest import Datastore
from playground.engine.verify import Verdict
from test_eagle import tiny_head
from test_medusa import random_heads

pytestmark = pytest.mark.usefixtures("torch_single_thread")

VOCAB = 12
PROMPT = [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 0, 1]
ALPHA = 1e-4
RUNS = 500
CFG = SamplingConfig(temperature=1.0)

METHODS = {
    "draft_model": {"k": 2},
    "prompt_lookup": {"max_ngram_size": 2, "num_pred_tokens": 3},
    "lookahead": {},
    "medusa": {"acceptance": "exact", "tree_choices": "[[0], [1], [0, 0], [0, 1], [1, 0]]"},
    "eagle": {"depth": 2, "top_k": 3, "total_tokens": "6"},
    "suffix": {},
    "recycling": {},
    "rest": {"min_match": 1},
    "mixture": {},
    "mixture[eagle]": {"members": "eagle,suffix,prompt_lookup"},  # the mixture with the EAGLE head as a member
}


@pytest.fixture(scope="module")
def engine():
    """A 12-token target with fairly flat next-token distributions, a noisy copy as draft, random
    Medusa heads and a random EAGLE head (drafts are both accepted and rejected)."""
    target = tiny_llama(7, vocab_size=VOCAB, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1,
                        intermediate_size=32, head_std=0.3)
    where = {"device": TEST_DEVICE, "dtype": TEST_DTYPE}  # the GPU check's device and dtype (else CPU, fp32)
    heads = random_heads(target.float().cpu(), 2, scale=0.05)
    eagle = tiny_head(target, 0, draft_vocab=8, layers=(0, 1, 2))
    target.to(**where)
    g = torch.Generator().manual_seed(4)  # REST's datastore: random "earlier answers"
    store = Datastore(torch.randint(0, VOCAB, (8, 60), generator=g).tolist())
    return Engine(FakeLoaded(target), FakeLoaded(noisy_copy(target, 0.3, 8)), medusa=heads.to(**where),
                  eagle=eagle.to(**where), datastore=store)


@pytest.fixture(scope="module")
def exact(engine):
    return exact_first_three(engine.target.model, PROMPT, CFG, VOCAB)


def _checks(engine, method: str, params: dict, exact):
    has_budget = any(k.name == "budget" for k in REGISTRY[method].knobs)  # off: every candidate verified
    spec = MethodSpec(method, {**params, "budget": "off"} if has_budget else params)
    counts, accepted, proposed = sample_first_three(engine.target.model, lambda seed: engine.make_drafter(spec),
                                                    PROMPT, CFG, RUNS, VOCAB)
    return chi_square_gof(counts.sum(2), exact.sum(2)), chi_square_gof(counts, exact), accepted, proposed


@pytest.mark.parametrize("method", METHODS)
def test_sampling_keeps_the_target_distribution(engine, exact, method):
    two, three, accepted, proposed = _checks(engine, method.partition("[")[0], METHODS[method], exact)
    assert two.p_value > ALPHA, f"{method}: first two tokens: {two}"
    assert three.p_value > ALPHA, f"{method}: first three tokens: {three}"
    assert 0 < accepted < proposed, (method, accepted, proposed)


def test_negative_control_accept_everything_is_detected(engine, exact, monkeypatch):
    """A sampler that accepts every drafted token (and samples the bonus from the target) is not
    lossless; with the same seeds and checks as above the test rejects it (p far below alpha)."""
    def accept_all(cand, logits, sampling, generator, typical=None):
        path, node = [], -1
        children = cand.children()
        while children[node + 1]:
            node = children[node + 1][0]
            path.append(node)
        probs = torch.softmax(logits[node + 1].float() / sampling.temperature, -1)
        return Verdict(path, int(torch.multinomial(probs, 1, generator=generator)))
    monkeypatch.setattr(decoding, "verify", accept_all)
    two, three, _, _ = _checks(engine, "draft_model", METHODS["draft_model"], exact)
    assert min(two.p_value, three.p_value) < 1e-10, (two, three)
