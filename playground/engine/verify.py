"""The one verifier: walk the candidate tree and accept the longest path the target agrees with.

Every step emits the accepted candidates plus one token sampled from the target at the
last accepted node (the bonus token, or the correction token after a rejection), so a
step always yields at least one token.

* Greedy: a child is accepted when it equals the target's argmax at its parent.
* Sampling: speculative sampling (Leviathan et al. 2023, Alg. 1; Chen et al. 2023,
  Alg. 2) generalised to several children per node as in SpecInfer (Miao et al.
  2024, multi-step speculative sampling): at a node with target distribution p, try
  the children in order; child x drafted from q is accepted with probability
  min(1, p(x) / q(x)); on rejection p becomes norm(max(0, p - q)) and the next child is
  tried; when all are rejected the correction token is sampled from the final p.
  A deterministic drafter (prompt lookup, n-gram pools, greedy drafts) has q = one-hot
  on x, which gives the one-hot rule: accept x with probability p(x), else zero p(x)
  and renormalise. Both keep the output distribution exactly the target's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .limits import POSTERIOR_ALPHA_KNOB, POSTERIOR_THRESHOLD_KNOB
from .sampling import logits_to_probs
from .tree import Candidates


@dataclass
class Verdict:
    """Result of verifying one candidate set.

    Attributes:
        path: accepted candidate indices, root to leaf (empty when none was accepted).
        bonus_token: the token sampled from the target after the last accepted node.
        margins: under greedy verification, the target's top-1 minus top-2 logit at the root and
            at each accepted node (rows ``[0] + [i + 1 for i in path]``), read in the same pass as
            its choice there; None from the other rules (the loop then reads them itself).
    """

    path: list[int]
    bonus_token: int
    margins: list[float] | None = None


def _check(candidates: Candidates, target: torch.Tensor, name: str) -> None:
    n = len(candidates)
    if target.dim() != 2 or target.shape[0] != n + 1:
        raise ValueError(f"{name} must have shape (num_nodes + 1, vocab_size) = ({n + 1}, V), got {tuple(target.shape)}")


def verify_greedy(candidates: Candidates, target_logits: torch.Tensor) -> Verdict:
    """Greedy verification (exact argmax match).

    Args:
        candidates: the proposal, ``num_nodes`` tokens.
        target_logits: ``(num_nodes + 1, vocab_size)``; row 0 scores the root, row i + 1
            scores candidate i (it predicts the token after it).

    Returns:
        The longest path whose every token equals the target's argmax at its parent (the first
        index among equal maxima, as ``argmax``), the target's argmax after that path as the
        bonus token, and the top-1 minus top-2 margin of each row read (``Verdict.margins``).

    Only the rows on the way are read (the root's and each accepted node's), one top-2 each,
    which also gives the margins the page shows: on the 2-vCPU AMD EPYC a row of the default
    target's 49,152 logits takes about 0.06 ms to scan, and a tree step verifies 4-10 rows.
    """
    _check(candidates, target_logits, "target_logits")
    tokens = candidates.tokens.tolist()
    children = candidates.children()
    path: list[int] = []
    margins: list[float] = []
    row = 0
    while True:
        best, margin = _choice(target_logits[row])
        margins.append(margin)
        # 1. Among the current node's children, find the one the target would pick.
        nxt = next((c for c in children[row] if tokens[c] == best), None)
        if nxt is None:
            # 2. None: the target's own choice is the bonus / correction token.
            return Verdict(path, best, margins)
        # 3. Accept it and descend.
        path.append(nxt)
        row = nxt + 1


def _choice(row: torch.Tensor) -> tuple[int, float]:
    """``(argmax, top-1 minus top-2)`` of one ``(vocab_size,)`` row of logits; the argmax is the
    first index among equal maxima (top-k does not promise an order among ties)."""
    if row.shape[0] < 2:
        return int(row.argmax()), 0.0
    values, indices = torch.topk(row, 2)
    top, second = values.tolist()
    return (int(indices[0]) if top > second else int(row.argmax())), top - second


def verify_sampling(candidates: Candidates, target_probs: torch.Tensor,
                    generator: torch.Generator | None) -> Verdict:
    """Speculative sampling over a candidate tree (multi-candidate rule, see module doc).

    Args:
        candidates: the proposal; ``candidates.draft_probs`` ``(num_nodes, vocab_size)`` is
            the distribution each token was drawn from, or None for deterministic drafters.
        target_probs: ``(num_nodes + 1, vocab_size)`` float32, after the same temperature /
            top-k / top-p transform as the draft's.
        generator: the run's seeded generator (on the probabilities' device).

    Returns:
        The accepted path and the bonus (or correction) token. The emitted tokens are
        distributed exactly as if sampled from the target one at a time.
    """
    _check(candidates, target_probs, "target_probs")
    tokens = candidates.tokens.tolist()
    children = candidates.children()
    q_all = candidates.draft_probs
    path: list[int] = []
    row = 0
    while True:
        p = target_probs[row]
        accepted = None
        for c in children[row]:
            x = tokens[c]
            # 1. q: the draft's distribution for this child (one-hot when deterministic).
            q_x = float(q_all[c, x]) if q_all is not None else 1.0
            p_x = float(p[x])
            # 2. Accept with probability min(1, p(x) / q(x)).
            u = float(torch.rand((), generator=generator, device=p.device))
            if q_x > 0 and u < min(1.0, p_x / q_x):
                accepted = c
                break
            # 3. Rejected: continue from the residual norm(max(0, p - q)).
            if q_all is not None:
                residual = torch.clamp(p - q_all[c].to(p.dtype), min=0.0)
            else:
                residual = p.clone()
                residual[x] = 0.0
            mass = float(residual.sum())
            if mass <= 0.0:  # p <= q everywhere: only possible when p == q up to rounding
                break
            p = residual / mass
        if accepted is None:
            # 4. No child accepted (or a leaf): sample the bonus / correction token from p.
            bonus = int(torch.multinomial(p, 1, generator=generator).item())
            return Verdict(path, bonus)
        path.append(accepted)
        row = accepted + 1


def verify_reference_chain(draft_tokens: list[int], target_probs: torch.Tensor,
                           draft_probs: torch.Tensor | None, generator: torch.Generator | None) -> Verdict:
    """Slow, obvious speculative sampling for a chain, written straight from Leviathan et al. Alg. 1.

    Args:
        draft_tokens: K drafted tokens.
        target_probs: ``(K + 1, vocab_size)``.
        draft_probs: ``(K, vocab_size)`` or None (one-hot drafts).

    Used by tests to cross-check :func:`verify_sampling` on chains.
    """
    vocab = target_probs.shape[-1]
    for i, x in enumerate(draft_tokens):
        q = draft_probs[i] if draft_probs is not None else torch.nn.functional.one_hot(
            torch.tensor(x), vocab).to(target_probs.dtype)
        p = target_probs[i]
        r = float(torch.rand((), generator=generator, device=p.device))
        if q[x] > 0 and r < min(1.0, float(p[x] / q[x])):
            continue
        residual = torch.clamp(p - q, min=0)
        residual = residual / residual.sum() if residual.sum() > 0 else p
        return Verdict(list(range(i)), int(torch.multinomial(residual, 1, generator=generator).item()))
    k = len(draft_tokens)
    return Verdict(list(range(k)), int(torch.multinomial(target_probs[k], 1, generator=generator).item()))


@dataclass(frozen=True)
class TypicalAcceptance:
    """Medusa's typical acceptance (Cai et al. 2024, section 2.3.1; the reference's
    ``evaluate_posterior`` with ``posterior_threshold`` and ``posterior_alpha``).

    A candidate x is accepted when ``p(x) > min(posterior_threshold, posterior_alpha * exp(-H(p)))``
    with p the target's distribution at its parent and H its entropy (nats). It accepts plausible
    tokens, not only the target's choice, so the output is no longer exactly the target's.
    """

    posterior_threshold: float = POSTERIOR_THRESHOLD_KNOB.default
    posterior_alpha: float = POSTERIOR_ALPHA_KNOB.default

    def __post_init__(self):
        """Raises ``ValueError`` for a threshold or alpha outside their knobs' bounds (both > 0)."""
        object.__setattr__(self, "posterior_threshold", POSTERIOR_THRESHOLD_KNOB.check(self.posterior_threshold))
        object.__setattr__(self, "posterior_alpha", POSTERIOR_ALPHA_KNOB.check(self.posterior_alpha))

    def thresholds(self, target_probs: torch.Tensor) -> torch.Tensor:
        """``(rows,)`` acceptance thresholds for ``target_probs`` ``(rows, vocab_size)``."""
        p = target_probs.float()
        entropy = -(p * torch.log(p.clamp_min(1e-10))).sum(-1)
        return torch.clamp(self.posterior_alpha * torch.exp(-entropy), max=self.posterior_threshold)


def verify_typical(candidates: Candidates, target_probs: torch.Tensor, rule: TypicalAcceptance,
                   generator: torch.Generator | None) -> Verdict:
    """Typical acceptance over a candidate tree: the longest path of typical tokens.

    Args:
        candidates: the proposal (``num_nodes`` tokens).
        target_probs: ``(num_nodes + 1, vocab_size)`` float32, the target's distribution at the
            root and after each candidate (softmax of the logits at temperature 1 under greedy
            decoding, else after the run's temperature / top-k / top-p).
        rule: the threshold and alpha.
        generator: None under greedy decoding: the bonus token is then the target's argmax;
            otherwise the bonus token is sampled from p restricted to its typical tokens (p(x)
            above the threshold, the argmax always kept), as the reference does.

    Returns:
        The deepest path whose every token is typical under its parent's distribution (the
        first such path in node order on ties), and the bonus token after it.
    """
    _check(candidates, target_probs, "target_probs")
    n = len(candidates)
    tokens, parents = candidates.tokens.cpu(), candidates.parents.cpu()
    threshold = rule.thresholds(target_probs)  # (num_nodes + 1,)
    # 1. Each candidate is typical when p_parent(x) > threshold_parent.
    rows = (parents + 1).to(target_probs.device)
    p_x = target_probs[rows, tokens.to(target_probs.device)] if n else torch.zeros(0)
    ok = (p_x > threshold[rows]).tolist() if n else []
    # 2. Depth of the typical run ending at each node (0 when the node or an ancestor is not typical).
    run: list[int] = []
    for i, p in enumerate(parents.tolist()):
        run.append((1 + (run[p] if p >= 0 else 0)) if ok[i] and (p < 0 or run[p] > 0) else 0)
    # 3. The deepest such node (first on ties) gives the accepted path.
    path: list[int] = []
    if n and max(run) > 0:
        node = max(range(n), key=lambda i: (run[i], -i))
        while node >= 0:
            path.append(node)
            node = int(parents[node])
        path.reverse()
    # 4. The bonus token from the last accepted node's distribution.
    p = target_probs[path[-1] + 1 if path else 0]
    if generator is None:
        return Verdict(path, int(p.argmax()))
    kept = torch.where(p > threshold[path[-1] + 1 if path else 0], p, torch.zeros_like(p))
    kept[p.argmax()] = p.max()
    return Verdict(path, int(torch.multinomial(kept / kept.sum(), 1, generator=generator).item()))


def verify_typical_reference(candidates: Candidates, target_probs: torch.Tensor,
                             rule: TypicalAcceptance) -> list[int]:
    """Slow, obvious typical acceptance: try every root-to-leaf path, keep the longest accepted
    prefix, as the reference's ``evaluate_posterior`` does over its candidate sequences (on ties,
    the path ending at the lowest node index). Returns the accepted path; tests compare
    :func:`verify_typical` with it."""
    children = candidates.children()
    tokens, parents = candidates.tokens.tolist(), candidates.parents.tolist()
    leaves = [i for i in range(len(candidates)) if not children[i + 1]]
    best: list[int] = []
    for leaf in leaves:
        seq, node = [], leaf
        while node >= 0:
            seq.append(node)
            node = parents[node]
        seq.reverse()
        accepted: list[int] = []
        for node in seq:
            p = target_probs[parents[node] + 1]
            if float(p[tokens[node]]) > float(rule.thresholds(p[None])[0]):
                accepted.append(node)
            else:
                break
        if len(accepted) > len(best) or (accepted and len(accepted) == len(best) and accepted[-1] < best[-1]):
            best = accepted
    return best


def verify(candidates: Candidates, logits: torch.Tensor, sampling, generator: torch.Generator | None,
           typical: "TypicalAcceptance | None" = None) -> Verdict:
    """Verify ``candidates`` with the rule that applies: the one choice of rule in the engine.

    Args:
        candidates: the proposal (``num_nodes`` tokens).
        logits: ``(num_nodes + 1, vocab_size)`` float32 target logits at the root and after each node.
        sampling: the run's :class:`~playground.engine.sampling.SamplingConfig`.
        generator: the run's generator (None under greedy decoding).
        typical: the drafter's typical-acceptance rule (Medusa's lossy option), None for the exact rules.

    Returns:
        The :class:`Verdict`: typical acceptance when ``typical`` is given; else exact argmax
        matching under greedy decoding, speculative sampling otherwise.
    """
    if typical is not None:
        probs = torch.softmax(logits, -1) if sampling.greedy else logits_to_probs(logits, sampling)
        return verify_typical(candidates, probs, typical, generator)
    if sampling.greedy:
        return verify_greedy(candidates, logits)
    return verify_sampling(candidates, logits_to_probs(logits, sampling), generator)
