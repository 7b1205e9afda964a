"""Shared helpers of the engine tests: tiny models, test drafters, toy distributions, chi-square.

Everything random takes an explicit ``torch.Generator`` (or a seed that builds one), so every
test is deterministic on a given machine.
"""

from __future__ import annotations

import bisect
import copy
import json
import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from playground.engine.autoregressive import AutoregressiveDrafter
from playground.engine import GenerationSettings, decode
from playground.engine import DecodeState, Drafter, StepResult
from playground.engine.lossless import NEAR_TIE_MARGIN
from playground.engine.target import CausalLM
from playground.engine import Candidates
from playground.engine.verify import Verdict

# --------------------------------------------------------------------------------------------
# Tiny random-weight Llama models
# --------------------------------------------------------------------------------------------


TEST_DEVICE = os.environ.get("PLAYGROUND_DEVICE", "cpu")
"""Device of the tiny models (``PLAYGROUND_DEVICE``; ``scripts/gpu_check.sh`` sets ``cuda``)."""
TEST_DTYPE = getattr(torch, os.environ.get("PLAYGROUND_DTYPE", "float32"))
"""Dtype of the tiny models (``PLAYGROUND_DTYPE``: float32, the default, or bfloat16, float16)."""


def tiny_llama(seed: int, vocab_size: int = 64, hidden_size: int = 32, num_layers: int = 2,
               num_heads: int = 4, num_kv_heads: int = 2, intermediate_size: int = 64, std: float = 0.2,
               embed_std: float = 1.0, head_std: float = 1.0, attn: str = "sdpa",
               max_positions: int = 512) -> LlamaForCausalLM:
    """A tiny fp32 Llama with random weights from a generator seeded with ``seed``.

    Weights are N(0, std^2) inside the blocks, N(0, embed_std^2) in the embedding and
    N(0, head_std^2) in the output head. The large scales (the usual init is 0.02) give
    peaked next-token distributions, so greedy continuations are repetitive (prompt lookup
    finds matches) and top-2 logit margins stay far above fp32 rounding (~1e-6), so greedy
    comparisons are not decided by near-ties (the smallest margin seen in the sweeps ~1e-3).
    """
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
                         num_hidden_layers=num_layers, num_attention_heads=num_heads,
                         num_key_value_heads=num_kv_heads, max_position_embeddings=max_positions,
                         tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    config._attn_implementation = attn
    model = LlamaForCausalLM(config).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                scale = embed_std if "embed_tokens" in name else head_std if "lm_head" in name else std
                p.copy_(torch.randn(p.shape, generator=g) * scale)
    if TEST_DEVICE != "cpu" or TEST_DTYPE != torch.float32:  # the GPU check (weights drawn on the CPU first)
        model = model.to(device=TEST_DEVICE, dtype=TEST_DTYPE)
    return model


def noisy_copy(model: LlamaForCausalLM, scale: float, seed: int) -> LlamaForCausalLM:
    """A copy of ``model`` with N(0, scale^2) noise added to every weight matrix (a draft
    that agrees with the target often but not always)."""
    draft = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if "norm" not in name:
                p.add_((torch.randn(p.shape, generator=g) * scale).to(p.device, p.dtype))
    return draft


def low_entropy_prompt(generator: torch.Generator, length: int, token_range: int) -> list[int]:
    """``length`` tokens drawn from the first ``token_range`` ids (repetitive, so n-grams recur)."""
    return torch.randint(0, token_range, (length,), generator=generator).tolist()


MIN_BASELINE_MARGIN = 1e-3 if TEST_DTYPE == torch.float32 else NEAR_TIE_MARGIN.get(TEST_DTYPE, 0.5)
"""Smallest top-2 logit margin allowed in a greedy baseline that tests compare against.

Batched and one-token-at-a-time fp32 forwards of the tiny models differ by up to ~1e-5 in
logits, so an argmax decided by less than that may legitimately flip between the baseline and
a speculative run; 1e-3 leaves a factor of 100. Under the GPU check's other dtypes it is that
dtype's near-tie margin (bfloat16: 0.5)."""


def clear_greedy_baseline(target: CausalLM, generator: torch.Generator, length: int, token_range: int,
                          max_new_tokens: int, eos_token_ids: tuple[int, ...] = (), min_new: int = 4):
    """Draw low-entropy prompts until the greedy baseline has no near-tie and at least ``min_new``
    tokens; return ``(prompt, baseline ids, baseline margins)``."""
    while True:
        prompt = low_entropy_prompt(generator, length, token_range)
        events = run_events(target, AutoregressiveDrafter(), prompt, max_new_tokens, eos_token_ids=eos_token_ids)
        ids = [t for e in events for t in e.tokens]
        margins = [m for e in events for m in e.margins]
        if len(ids) >= min_new and min(margins) >= MIN_BASELINE_MARGIN:
            return prompt, ids, margins


# --------------------------------------------------------------------------------------------
# Running the loop
# --------------------------------------------------------------------------------------------


def run_events(target: CausalLM, drafter: Drafter, prompt: list[int], max_new_tokens: int = 32,
               settings: GenerationSettings | None = None, **kwargs) -> list:
    """Every event of one run."""
    settings = settings or GenerationSettings(max_new_tokens=max_new_tokens)
    return list(decode(target, drafter, prompt, settings, **kwargs))


def output_ids(events) -> list[int]:
    return [t for e in events for t in e.tokens]


def streamed_text(events) -> str:
    return "".join(text for e in events for text, _ in e.pieces)


class CountingLM(CausalLM):
    """A :class:`CausalLM` that counts its forward passes."""

    def __init__(self, model, device=None):
        super().__init__(model, device)
        self.forwards = 0

    def forward(self, cache, input_ids, parents=None, **kwargs):
        self.forwards += 1
        return super().forward(cache, input_ids, parents, **kwargs)


class ScriptedModel(torch.nn.Module):
    """A causal LM whose greedy continuation is a fixed script, whatever the input.

    A real tiny Llama runs underneath (so the KV cache is real and grows, crops and gathers
    as usual); its logits are replaced by ``+10`` on the scripted token and ``-10`` elsewhere.
    The query at absolute position ``pos`` predicts new token number ``pos + 1 - prompt_len``:
    ``script[i]`` for ``i < len(script)``, else ``filler``. Next-token = f(position) is a valid
    (if silly) language model, deterministic under greedy decoding.
    """

    def __init__(self, vocab_size: int, prompt_len: int, script: list[int], filler: int, seed: int = 0):
        super().__init__()
        self.inner = tiny_llama(seed, vocab_size=vocab_size, hidden_size=16, num_layers=1, num_heads=2,
                                num_kv_heads=1, intermediate_size=16)
        self.config = self.inner.config
        self.prompt_len = prompt_len
        self.script = list(script)
        self.filler = filler

    def forward(self, input_ids, position_ids, **kwargs):
        self.inner(input_ids=input_ids, position_ids=position_ids, **kwargs)  # fills the cache
        index = (position_ids[0] + 1 - self.prompt_len).tolist()
        want = [self.script[i] if 0 <= i < len(self.script) else self.filler for i in index]
        logits = torch.full((1, len(want), self.config.vocab_size), -10.0, device=input_ids.device)
        logits[0, torch.arange(len(want)), torch.tensor(want)] = 10.0
        return SimpleNamespace(logits=logits)


class ByteTokenizer:
    """Token ``i < 256`` is byte ``i``; ids from 256 on are special tokens (skipped when decoding).

    Multi-byte UTF-8 characters span several tokens, as with byte-level BPE, so it exercises
    incremental detokenisation without any download.
    """

    def __init__(self, vocab_size: int = 260):
        self.vocab_size = vocab_size
        self.eos_token_id = 256

    def decode(self, ids, skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool = False) -> str:
        ids = [int(i) for i in ids]
        data = bytes(i for i in ids if i < 256)
        if not skip_special_tokens and any(i >= 256 for i in ids):
            raise AssertionError("the engine must decode with skip_special_tokens=True")
        return data.decode("utf-8", errors="replace")

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))


@dataclass
class FakeLoaded:
    """Stands in for :class:`playground.engine.models.LoadedModel` around a tiny model."""

    model: torch.nn.Module
    tokenizer: object = None
    name: str = "tiny"
    context_length: int = 512
    eos_token_ids: tuple[int, ...] | list[int] = ()


# --------------------------------------------------------------------------------------------
# Test drafters
# --------------------------------------------------------------------------------------------


class OracleChainDrafter(Drafter):
    """Proposes the next ``k`` tokens of a known continuation (e.g. the baseline's output),
    ignoring EOS, so that everything it proposes is accepted by a greedy target."""

    name = "oracle"
    source = "oracle"

    def __init__(self, continuation: list[int], k: int, respect_budget: bool = True):
        self.continuation = list(continuation)
        self.k = k
        self.respect_budget = respect_budget
        self.calls = 0

    def propose(self, state: DecodeState) -> Candidates:
        self.calls += 1
        done = len(state.tokens) - state.prompt_len
        k = min(self.k, state.budget) if self.respect_budget else self.k
        return Candidates.chain(self.continuation[done:done + k], self.source)


class RandomTreeDrafter(Drafter):
    """Proposes a random tree that contains the target's true greedy continuation in one branch.

    Each step: a *true* branch (the next ``depth`` tokens of ``continuation``, sometimes with
    a wrong token at a random depth so that the walk also stops inside a branch) and several
    random *distractor* branches, some of which share a prefix of the true branch and then
    diverge. Node order is a random topological order, so the accepted path is usually not a
    contiguous run of node indices (the cache commit must gather, not just crop).
    """

    name = "random_tree"
    source = "tree"

    def __init__(self, continuation: list[int], vocab_size: int, generator: torch.Generator,
                 max_depth: int = 5, branches: int = 3):
        self.continuation = list(continuation)
        self.vocab_size = vocab_size
        self.g = generator
        self.max_depth = max_depth
        self.branches = branches
        self.paths: list[list[int]] = []

    def _randint(self, lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi, (), generator=self.g))

    def propose(self, state: DecodeState) -> Candidates:
        done = len(state.tokens) - state.prompt_len
        max_depth = min(self.max_depth, state.budget)
        if max_depth <= 0:
            return Candidates.empty()
        truth = self.continuation[done:done + max_depth]
        # 1. Branches as token lists from the root: the true one (maybe corrupted), then distractors.
        branches = [list(truth)]
        if truth and self._randint(0, 3) == 0:
            at = self._randint(0, len(truth))
            branches[0][at] = (branches[0][at] + 1 + self._randint(0, self.vocab_size - 1)) % self.vocab_size
        for _ in range(self.branches):
            depth = self._randint(1, max_depth + 1)
            shared = self._randint(0, min(depth, len(truth)) + 1)  # prefix shared with the truth
            branches.append(truth[:shared] + [self._randint(0, self.vocab_size) for _ in range(depth - shared)])
        # 2. Merge into a trie (node = (parent node, token)), then number the nodes in a random
        #    topological order.
        nodes: dict[tuple, int] = {}
        order: list[tuple[int, int]] = []  # (parent trie id, token) per trie id
        for branch in branches:
            parent = -1
            for tok in branch:
                key = (parent, tok)
                if key not in nodes:
                    nodes[key] = len(order)
                    order.append(key)
                parent = nodes[key]
        n = len(order)
        priority = torch.rand(n, generator=self.g).tolist()
        placed: list[int] = []
        ready = [i for i in range(n) if order[i][0] == -1]
        while ready:
            ready.sort(key=lambda i: priority[i])
            i = ready.pop(0)
            placed.append(i)
            ready += [j for j in range(n) if order[j][0] == i]
        new_index = {old: new for new, old in enumerate(placed)}
        tokens = [order[old][1] for old in placed]
        parents = [-1 if order[old][0] == -1 else new_index[order[old][0]] for old in placed]
        return Candidates(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long),
                          [self.source] * n)

    def update(self, result: StepResult) -> None:
        self.paths.append(list(result.path))


class GreedyBiasedDraftLM(CausalLM):
    """A draft wrapper that records how often the draft's own argmax fell outside ``limit``."""

    def __init__(self, model, limit: int):
        super().__init__(model)
        self.limit = limit
        self.argmax_outside = 0

    def forward(self, cache, input_ids, parents=None, **kwargs):
        logits = super().forward(cache, input_ids, parents, **kwargs)
        self.argmax_outside += int(logits[-1].argmax()) >= self.limit
        return logits


# --------------------------------------------------------------------------------------------
# Statistics (no scipy: the chi-square tail comes from torch.special.gammaincc)
# --------------------------------------------------------------------------------------------


def chi2_sf(stat: float, dof: int) -> float:
    """P(X >= stat) for X ~ chi-square(dof): the regularised upper incomplete gamma Q(dof/2, stat/2)."""
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def _pool(expected: list[float], min_expected: float = 5.0) -> list[list[int]]:
    """Group cell indices so that every group's expected count is >= ``min_expected``.

    Cells below the threshold are merged into one group; if that group is still too small it
    is merged with the smallest adequate cell.
    """
    big = [[i] for i, e in enumerate(expected) if e >= min_expected]
    small = [i for i, e in enumerate(expected) if e < min_expected]
    if small:
        if sum(expected[i] for i in small) >= min_expected or not big:
            big.append(small)
        else:
            smallest = min(range(len(big)), key=lambda j: sum(expected[i] for i in big[j]))
            big[smallest] = big[smallest] + small
    return big


@dataclass
class ChiSquare:
    stat: float
    dof: int
    p_value: float
    cells: int

    def __str__(self) -> str:
        return f"chi2={self.stat:.2f} dof={self.dof} p={self.p_value:.3g} ({self.cells} pooled cells)"


def chi_square_gof(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> ChiSquare:
    """Pearson goodness-of-fit of observed ``counts`` (any shape) against exact ``probs`` (same shape).

    Cells with expected count under ``min_expected`` are pooled. Observed counts in cells of
    probability zero make the statistic infinite (p = 0).
    """
    counts = counts.reshape(-1).double()
    probs = probs.reshape(-1).double()
    n = float(counts.sum())
    if bool(((probs <= 0) & (counts > 0)).any()):
        return ChiSquare(float("inf"), 0, 0.0, 0)
    expected = (probs / probs.sum() * n).tolist()
    observed = counts.tolist()
    groups = _pool(expected, min_expected=min_expected)
    stat = 0.0
    for g in groups:
        e = sum(expected[i] for i in g)
        o = sum(observed[i] for i in g)
        stat += (o - e) ** 2 / e
    dof = len(groups) - 1
    return ChiSquare(stat, dof, chi2_sf(stat, dof) if dof > 0 else 1.0, len(groups))


def chi_square_two_sample(counts_a: torch.Tensor, counts_b: torch.Tensor, min_expected: float = 5.0) -> ChiSquare:
    """Pearson chi-square test that two samples of counts come from the same distribution."""
    a = counts_a.reshape(-1).double()
    b = counts_b.reshape(-1).double()
    na, nb = float(a.sum()), float(b.sum())
    pooled = (a + b) / (na + nb)
    groups = _pool((pooled * min(na, nb)).tolist(), min_expected=min_expected)
    stat = 0.0
    for g in groups:
        pa, oa, ob = float(pooled[g].sum()), float(a[g].sum()), float(b[g].sum())
        if pa == 0:
            continue
        stat += (oa - na * pa) ** 2 / (na * pa) + (ob - nb * pa) ** 2 / (nb * pa)
    dof = len(groups) - 1
    return ChiSquare(stat, dof, chi2_sf(stat, dof) if dof > 0 else 1.0, len(groups))


# --------------------------------------------------------------------------------------------
# Toy language models for the verifier's distribution tests
# --------------------------------------------------------------------------------------------


def toy_table(vocab: int, seed: int, sharpness: float = 1.5) -> torch.Tensor:
    """``(vocab + 1, vocab)`` rows of next-token probabilities of an order-1 Markov chain;
    row ``vocab`` is the start context (the root of the first step)."""
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(vocab + 1, vocab, generator=g, dtype=torch.float64) * sharpness, -1).float()


def toy_exact_joint(p_table: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """Exact joint distribution ``(vocab,) * n_tokens`` of the first ``n_tokens`` tokens of the chain."""
    vocab = p_table.shape[1]
    p = p_table.double()
    joint = p[vocab]
    for _ in range(n_tokens - 1):
        joint = joint.unsqueeze(-1) * p[:vocab]  # [..., a, b] = joint[..., a] * p(b | a)
    return joint


ProposeFn = Callable[[int, torch.Generator], Candidates]
VerifyFn = Callable[[Candidates, torch.Tensor, torch.Generator], Verdict]


def toy_first_tokens(n_tokens: int, propose: ProposeFn, verify: VerifyFn, p_table: torch.Tensor,
                     generator: torch.Generator) -> tuple[int, ...]:
    """Run the draft-verify loop on a toy Markov target until ``n_tokens`` tokens are emitted.

    Each step: ``propose(last_token, generator)`` gives candidates rooted at the last emitted
    token (the start context first); the target's row for the root is ``p_table[last]`` and
    for candidate i ``p_table[token_i]`` (order-1 Markov, so that is p given the whole path).
    """
    vocab = p_table.shape[1]
    out: list[int] = []
    while len(out) < n_tokens:
        last = out[-1] if out else vocab
        cand = propose(last, generator)
        rows = [last] + cand.tokens.tolist()
        verdict = verify(cand, p_table[rows], generator)
        out += [int(cand.tokens[c]) for c in verdict.path] + [verdict.bonus_token]
    return tuple(out[:n_tokens])


@torch.inference_mode()
def exact_first_three(model, prompt: list[int], cfg, vocab: int) -> torch.Tensor:
    """Exact ``(V, V, V)`` joint of the first three sampled tokens, from the model's logits on
    every prefix after the same transform (temperature, top-k, top-p) the decoder applies."""
    from playground.engine import logits_to_probs

    def next_probs(prefixes: list[list[int]]) -> torch.Tensor:
        ids = torch.tensor(prefixes, device=next(model.parameters()).device)
        return logits_to_probs(model(input_ids=ids).logits[:, -1].float(), cfg).double().cpu()

    p1 = next_probs([prompt])[0]
    p2 = next_probs([prompt + [a] for a in range(vocab)])  # (V, V)
    p3 = next_probs([prompt + [a, b] for a in range(vocab) for b in range(vocab)]).reshape(vocab, vocab, vocab)
    return p1[:, None, None] * p2[:, :, None] * p3


def sample_first_three(target, drafter_factory: Callable[[int], Drafter], prompt: list[int], cfg,
                       runs: int, vocab: int, repetition_penalty: float | None = None) -> tuple[torch.Tensor, int, int]:
    """Decode ``runs`` times (seeds 0..runs-1, a fresh ``drafter_factory(seed)`` each) and count
    the first three new tokens: ``((V, V, V) counts, tokens accepted, tokens proposed)``."""
    from playground.engine import SamplingConfig

    lm = CausalLM(target)
    samples, accepted, proposed = [], 0, 0
    for seed in range(runs):
        settings = GenerationSettings(max_new_tokens=4, sampling=SamplingConfig(
            temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, seed=seed),
            repetition_penalty=repetition_penalty)
        out = []
        for event in decode(lm, drafter_factory(seed), prompt, settings):
            out += event.tokens
            accepted += event.accepted
            proposed += event.proposed
            if len(out) >= 3:
                break
        samples.append(tuple(out[:3]))
    return count_samples(samples, vocab), accepted, proposed


def count_samples(samples: list[tuple[int, ...]], vocab: int) -> torch.Tensor:
    """Counts ``(vocab,) * len(tuple)`` of sampled tuples."""
    n = len(samples[0])
    counts = torch.zeros((vocab,) * n, dtype=torch.float64)
    for s in samples:
        counts[s] += 1
    return counts


class UniformStream:
    """Fast categorical draws for test drafters: uniforms come from a seeded ``torch.Generator``
    in blocks, and a draw is a bisection in a row's cumulative probabilities (a per-draw
    ``torch.multinomial`` costs ~60 us, which dominated the toy tests)."""

    def __init__(self, seed: int, block: int = 8192):
        self.g = torch.Generator().manual_seed(seed)
        self.block = block
        self.buf: list[float] = []

    def uniform(self) -> float:
        if not self.buf:
            self.buf = torch.rand(self.block, generator=self.g, dtype=torch.float64).tolist()
        return self.buf.pop()

    def draw(self, cumulative: list[float]) -> int:
        return min(bisect.bisect_right(cumulative, self.uniform() * cumulative[-1]), len(cumulative) - 1)


def _cumulative_rows(table: torch.Tensor) -> list[list[float]]:
    return table.double().cumsum(-1).tolist()


def chain_proposer(q_table: torch.Tensor, length: int, seed: int) -> ProposeFn:
    """Draft ``length`` tokens one after another from the toy draft ``q_table`` (with draft_probs);
    the draft's randomness comes from its own stream seeded with ``seed``."""
    stream, cum = UniformStream(seed), _cumulative_rows(q_table)

    def propose(last: int, g: torch.Generator) -> Candidates:
        tokens, ctx = [], last
        for _ in range(length):
            ctx = stream.draw(cum[ctx])
            tokens.append(ctx)
        return Candidates.chain(tokens, "draft", q_table[[last] + tokens[:-1]])

    return propose


def onehot_tree_proposer(table: torch.Tensor) -> ProposeFn:
    """A deterministic tree (draft_probs None, the one-hot rule): the root's children are the two
    most likely tokens of ``table[last]`` and a duplicate of the first; each distinct first-level
    child has its own most likely successor as a child. With ``table`` the target's own table
    the first child is often rejected with much mass, so the residual's renormalisation matters."""
    top2 = table.topk(2, dim=-1).indices.tolist()

    def propose(last: int, g: torch.Generator) -> Candidates:
        a, b = top2[last]
        tokens = [a, b, a, top2[a][0], top2[b][0]]
        return Candidates(torch.tensor(tokens), torch.tensor([-1, -1, -1, 0, 1]), ["lookup"] * 5)

    return propose


def iid_tree_proposer(q_table: torch.Tensor, width: int, seed: int) -> ProposeFn:
    """SpecInfer-style tree: ``width`` children of the root drawn i.i.d. from q, each with one
    child drawn from q given it; ``draft_probs`` holds each node's q."""
    stream, cum = UniformStream(seed), _cumulative_rows(q_table)

    def propose(last: int, g: torch.Generator) -> Candidates:
        first = [stream.draw(cum[last]) for _ in range(width)]
        tokens = first + [stream.draw(cum[x]) for x in first]
        parents = [-1] * width + list(range(width))
        return Candidates(torch.tensor(tokens), torch.tensor(parents), ["draft"] * len(tokens),
                          q_table[[last] * width + first])

    return propose


def buggy_verify_sampling(bug: str) -> VerifyFn:
    """The speculative-sampling walk with one deliberate bug, for negative controls only.

    ``bug``:
        ``"resample_target"``: after a rejection the correction token is drawn from p itself
            instead of the residual norm(max(0, p - q)).
        ``"unnormalised"``: the residual is not renormalised before the next sibling is tried
            (harmless for chains, since multinomial normalises; wrong for several children).
    """

    def verify(candidates: Candidates, target_probs: torch.Tensor, g: torch.Generator) -> Verdict:
        tokens, children, q_all = candidates.tokens.tolist(), candidates.children(), candidates.draft_probs
        path, row = [], 0
        while True:
            p, accepted = target_probs[row], None
            for c in children[row]:
                x = tokens[c]
                q_x = float(q_all[c, x]) if q_all is not None else 1.0
                if float(torch.rand((), generator=g)) < min(1.0, float(p[x]) / q_x):
                    accepted = c
                    break
                if bug == "resample_target":
                    continue
                q = q_all[c] if q_all is not None else torch.nn.functional.one_hot(torch.tensor(x), p.shape[0]).float()
                residual = torch.clamp(p - q, min=0.0)
                if float(residual.sum()) <= 0.0:
                    break
                p = residual if bug == "unnormalised" else residual / residual.sum()
            if accepted is None:
                return Verdict(path, int(torch.multinomial(p, 1, generator=g)))
            path.append(accepted)
            row = accepted + 1

    return verify


def exact_chain_verdict(draft_tokens: list[int], target_probs: torch.Tensor,
                        draft_probs: torch.Tensor | None) -> torch.Tensor:
    """Exact distribution ``(K + 1, vocab)`` of (number accepted, bonus token) for a fixed chain
    under speculative sampling (Leviathan et al. 2023, Alg. 1), computed in float64."""
    k, vocab = len(draft_tokens), target_probs.shape[1]
    p_all = target_probs.double()
    out = torch.zeros(k + 1, vocab, dtype=torch.float64)
    reach = 1.0  # probability that the first i drafts were accepted
    for i, x in enumerate(draft_tokens):
        p = p_all[i]
        q = draft_probs[i].double() if draft_probs is not None else \
            torch.nn.functional.one_hot(torch.tensor(x), vocab).double()
        accept = min(1.0, float(p[x] / q[x])) if q[x] > 0 else 0.0
        residual = torch.clamp(p - q, min=0.0)
        residual = residual / residual.sum() if residual.sum() > 0 else p
        out[i] = reach * (1 - accept) * residual
        reach *= accept
    out[k] = reach * p_all[k]
    return out


# --------------------------------------------------------------------------------------------
# Benchmark prompts for the real-model tests
# --------------------------------------------------------------------------------------------

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
ASSET_BENCH = REPO_ROOT / "assets" / "bench"


def _read_jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


BENCH_CATEGORIES = ("translation", "summarization", "qa", "math_reasoning", "writing", "coding", "reasoning")


def bench_prompts(categories: tuple[str, ...] = BENCH_CATEGORIES, humaneval: int = 3) -> list[tuple[str, str, bool]]:
    """``(label, prompt, chat)`` for a mix of benchmark questions, or [] when no data is found.

    From ``shared/data/`` beside the repository, else ``assets/bench/``: the question with the
    shortest first turn in each Spec-Bench category (chat template applied; short prompts keep
    the prefill cheap), and the first ``humaneval`` HumanEval prompts (plain code completion).
    """
    for folder in (SHARED_DATA, ASSET_BENCH):
        spec, human = folder / "spec_bench_dev.jsonl", folder / "humaneval_dev.jsonl"
        if spec.is_file() or human.is_file():
            break
    else:
        return []
    prompts: list[tuple[str, str, bool]] = []
    if spec.is_file():
        rows = _read_jsonl(spec)
        for category in categories:
            found = [r for r in rows if r["category"] == category]
            if found:
                row = min(found, key=lambda r: (len(r["turns"][0]), r["question_id"]))
                prompts.append((f"spec_bench/{row['question_id']}/{category}", row["turns"][0], True))
    if human.is_file():
        for row in _read_jsonl(human)[:humaneval]:
            prompts.append((row["task_id"], row["prompt"], False))
    return prompts


def skip_unless_ci(reason: str) -> None:
    """Skip a test whose prerequisite is missing on a developer's machine; fail it under CI.

    CI (``CI`` set in the environment) installs everything the suite needs (the model
    package, Debian's chromium), so there a missing prerequisite is a broken set-up, not a
    reason to skip. The suite needs nothing beside the repository: ``shared/`` next to a clone
    is a reviewer's aid only (see ``tests/test_bench.py``).
    """
    import os

    import pytest

    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI must provide it)")
    pytest.skip(reason)


def require_vllm() -> None:
    """Skip when no vLLM environment exists (``.venv-vllm``, made by ``scripts/setup.sh --vllm``), or
    fail when ``PLAYGROUND_REQUIRE_VLLM`` is set (CI sets it after installing vLLM), so that CI can
    never pass a vLLM test by skipping it. vLLM cannot share this virtualenv (it pins another
    transformers), hence the guard."""
    import os

    import pytest

    from playground.backends.vllm import server

    if not server.vllm_available():
        message = "vLLM is not installed (.venv-vllm missing: run scripts/setup.sh --vllm)"
        if os.environ.get("PLAYGROUND_REQUIRE_VLLM"):
            pytest.fail(message + " and PLAYGROUND_REQUIRE_VLLM is set")
        pytest.skip(message)
