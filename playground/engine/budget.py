"""The per-step candidate budget: keep the part of a proposal that pays for its verification.

On a CPU one target pass over n tokens costs noticeably more than over one (here about 8 % of a
plain step per extra token), so a drafter that proposes blindly loses to plain decoding. Every
drafter attaches to each candidate node i an estimate ``accept_probs[i]`` that node i is accepted
given that its parent is (:class:`~playground.engine.tree.Candidates`). With path probability
``P_i = prod(accept_probs along the root-to-i path)``, a kept subtree S (closed under parents)
yields in expectation

    E[tokens](S) = 1 + sum_{i in S} P_i            (1 = the bonus / correction token)

and costs ``cost(1 + |S| + m)`` relative to a plain step, where m counts the drafter's extra
queries (Lookahead's window) and ``cost`` is this device's measured step-cost curve. What counts
is the run's throughput, not one step's ratio: by Dinkelbach's method for fractional programs
(Dinkelbach 1967, "On nonlinear fractional programming") the steps that maximise the run's rate
lambda each maximise ``E[tokens](S) - lambda cost(1 + |S| + m)``, lambda estimated by
:class:`RunRate`; the empty S, a plain step, scores ``1 - lambda cost(1 + m)``. Maximising each
step's own ratio E / cost instead cut long confident copies short (docs/budget.md, item 3).

Because every ``accept_probs`` is at most 1, a child's P never exceeds its parent's, so for each
size k the best subtree of size k is the k nodes of largest P (ties broken parents-first): the
optimum is a prefix of the nodes sorted by P (:func:`best_subtree`). :func:`best_subtree_reference`
enumerates every parent-closed subset (slow, obvious) and is what the tests compare against.

The same idea is Sequoia's and Medusa's tree search (Chen et al. 2024, "Sequoia"; Cai et al. 2024,
section 2.3.3) and EAGLE-2's dynamic tree (Li et al. 2024), there with a GPU's nearly flat cost.

:class:`AcceptanceEstimator` turns a drafter's raw signal (a match length, a draft probability, a
pool hit, a tree position) into calibrated ``accept_probs``: a Beta posterior per key, learnt
from the verdicts of the nodes the target actually tested.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable

import torch

from .limits import ChoiceKnob
from .theory import VerifyCost
from .tree import Candidates, ExtraQueries

BUDGET_AUTO = "auto"
BUDGET_OFF = "off"
BUDGET_KNOB = ChoiceKnob(
    "budget", "Per-step budget", (BUDGET_AUTO, BUDGET_OFF), BUDGET_AUTO,
    info="auto: keep only the candidates whose expected accepted tokens pay for their verification cost on this "
         "device (measured once at load), and take a plain step when nothing pays. off: verify every candidate.")
"""The ``budget`` knob every method has (:func:`with_budget_knob`)."""

STEP_COST_SIZES = (2, 3, 4, 5, 8, 9, 17, 33)
"""Query counts (root included) whose step cost :func:`measure_step_cost` times (4, 8: kernels switch, cpu_linear)."""


# ----- the step-cost curve ----------------------------------------------------------------------
@dataclass(frozen=True)
class StepCost:
    """This device's cost of one decoding step over q queries, relative to a plain step (q = 1).

    Each extra query attends to the whole context, so on a CPU its relative cost grows with the
    context (measured here: two queries 1.08x a plain step after 50 tokens, 1.19x after 800). With
    a second pair of curves timed after ``long_context`` tokens, the cost at a context of L tokens
    is interpolated linearly in L between the two (attention's work is linear in L), and
    extrapolated beyond ``long_context`` up to :data:`MAX_CONTEXT_EXTRAPOLATION` times its span.

    Attributes:
        chain: cost when the candidates form one chain (ordinary causal attention);
        tree: cost when they form a tree (a custom attention mask, usually a little dearer);
        short_context: the context length (tokens) the two curves were timed at;
        long_chain, long_tree: the same timed after ``long_context`` tokens (None: one context only).
    """

    chain: VerifyCost
    tree: VerifyCost
    short_context: int = 0
    long_chain: VerifyCost | None = None
    long_tree: VerifyCost | None = None
    long_context: int = 0

    def __call__(self, queries: int, is_chain: bool = False, context: int | None = None) -> float:
        """Relative cost of a step over ``queries`` queries after ``context`` tokens (None: the short
        context's curve)."""
        short = (self.chain if is_chain else self.tree)(queries)
        long = self.long_chain if is_chain else self.long_tree
        if context is None or long is None or self.long_context <= self.short_context:
            return short
        w = (context - self.short_context) / (self.long_context - self.short_context)
        w = min(max(w, 0.0), MAX_CONTEXT_EXTRAPOLATION)
        return max(1e-3, short + w * (long(queries) - short))

    def as_dict(self) -> dict:
        out = {"chain": self.chain.as_dict(), "tree": self.tree.as_dict(), "short_context": self.short_context}
        if self.long_chain is not None and self.long_tree is not None:
            out.update(long_chain=self.long_chain.as_dict(), long_tree=self.long_tree.as_dict(),
                       long_context=self.long_context)
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "StepCost":
        """The inverse of :meth:`as_dict` (raises KeyError or ValueError on a malformed dict)."""
        long = "long_chain" in d
        return cls(VerifyCost.from_dict(d["chain"]), VerifyCost.from_dict(d["tree"]), int(d.get("short_context", 0)),
                   VerifyCost.from_dict(d["long_chain"]) if long else None,
                   VerifyCost.from_dict(d["long_tree"]) if long else None, int(d.get("long_context", 0)))


MAX_CONTEXT_EXTRAPOLATION = 3.0
"""How far past the long curve (in spans long_context - short_context) :class:`StepCost` extrapolates."""


CostLike = StepCost | VerifyCost | Callable[[int], float]


def _cost(cost: CostLike, queries: int, is_chain: bool, context: int | None = None) -> float:
    if isinstance(cost, StepCost):
        return cost(queries, is_chain, context)
    return float(cost(queries))


# ----- choosing the subtree ----------------------------------------------------------------------
def path_probs(parents: list[int], accept_probs: list[float]) -> list[float]:
    """``P_i``: the product of ``accept_probs`` along the root-to-i path (parents before children)."""
    out: list[float] = []
    for p, a in zip(parents, accept_probs):
        out.append(a if p < 0 else out[p] * a)
    return out


def _score(gain: float, time: float, rate: float | None) -> float:
    return gain / time if rate is None else gain - rate * time


def best_subtree(parents: list[int], accept_probs: list[float], cost: CostLike,
                 extra_queries: int = 0, context: int | None = None,
                 rate: float | None = None) -> tuple[list[int], float]:
    """The parent-closed subset of nodes worth verifying: the most expected tokens less ``rate``
    times the step's cost (or, with ``rate`` None, the most expected tokens per unit of step time).

    Steps: 1. P_i along every path; 2. order the nodes by P descending (ties: lower index first,
    so a parent precedes its children); 3. for each prefix size k, E = 1 + the prefix sum of P and
    time = cost(1 + k + extra_queries) (chain cost while the prefix is one chain); 4. the same for
    every root-to-node path at the chain cost (a chain can beat the best tree of its size when a
    tree mask costs more); 5. keep the best ``E - rate * time`` (or ``E / time``); the empty set is
    plain decoding.

    Args:
        parents: ``num_nodes`` parent indices (-1 = root), topological order.
        accept_probs: ``num_nodes`` estimates in [0, 1].
        cost: step cost relative to a plain step, by query count.
        extra_queries: the drafter's extra queries riding in the pass (their cost is counted).
        context: tokens already in the context (a :class:`StepCost` with a long-context curve
            prices the queries at this length); None: the short context's curve.
        rate: lambda, the run's tokens per plain-step time (:class:`RunRate`; see the module
            docstring); None: each step's own ratio.

    Returns:
        ``(kept node indices in increasing order, the best objective)``.
    """
    n = len(parents)
    P = path_probs(parents, [min(1.0, max(0.0, float(a))) for a in accept_probs])
    order = sorted(range(n), key=lambda i: (-P[i], i))
    best_k, best = 0, _score(1.0, _cost(cost, 1 + extra_queries, True, context), rate)
    gain, chain, last, kept_set = 1.0, True, -1, set()
    for k, i in enumerate(order, start=1):
        if parents[i] >= 0 and parents[i] not in kept_set:  # only with P_i == 0 ties; never better
            break
        kept_set.add(i)
        chain = chain and parents[i] == last
        last = i
        gain += P[i]
        value = _score(gain, _cost(cost, 1 + k + extra_queries, chain, context), rate)
        if value > best + 1e-12:
            best_k, best = k, value
    kept = sorted(order[:best_k])
    # Every root-to-node path at the chain cost (no tree mask), which can beat the best tree of its size.
    path_gain: list[float] = []
    depth: list[int] = []
    for i in range(n):
        path_gain.append(P[i] + (path_gain[parents[i]] if parents[i] >= 0 else 0.0))
        depth.append(1 + (depth[parents[i]] if parents[i] >= 0 else 0))
        value = _score(1.0 + path_gain[i], _cost(cost, 1 + depth[i] + extra_queries, True, context), rate)
        if value > best + 1e-12:
            best, node, kept = value, i, []
            while node >= 0:
                kept.append(node)
                node = parents[node]
            kept.sort()
    return kept, best


def best_subtree_reference(parents: list[int], accept_probs: list[float], cost: CostLike,
                           extra_queries: int = 0, rate: float | None = None) -> tuple[list[int], float]:
    """Slow obvious reference of :func:`best_subtree`: try every parent-closed subset (2^n)."""
    n = len(parents)
    P = path_probs(parents, [min(1.0, max(0.0, float(a))) for a in accept_probs])
    best_set, best = [], _score(1.0, _cost(cost, 1 + extra_queries, True), rate)
    for mask in range(1, 1 << n):
        nodes = [i for i in range(n) if mask >> i & 1]
        if any(parents[i] >= 0 and not mask >> parents[i] & 1 for i in nodes):
            continue
        chain = all(parents[i] == (nodes[j - 1] if j else -1) for j, i in enumerate(nodes))
        value = _score(1 + sum(P[i] for i in nodes), _cost(cost, 1 + len(nodes) + extra_queries, chain), rate)
        if value > best + 1e-12:
            best_set, best = nodes, value
    return best_set, best


RATE_PRIOR_STEPS = 4.0  # weight, in plain steps of one token each, of RunRate's starting rate of 1


class RunRate:
    """lambda for :func:`best_subtree`: ``(RATE_PRIOR_STEPS + tokens) / (RATE_PRIOR_STEPS + step
    costs)`` over the run so far, each step priced on the budget's curve (not the noisy wall clock);
    from 1, a plain step's rate, over the run's whole history (Dinkelbach's lambda is the run's)."""

    def __init__(self):
        self.tokens = self.time = RATE_PRIOR_STEPS

    @property
    def value(self) -> float:
        return self.tokens / self.time

    def observe(self, tokens: int, candidates: Candidates, cost: CostLike, context: int | None = None) -> None:
        """Count a step that emitted ``tokens`` after verifying ``candidates`` at ``context``."""
        m = len(candidates.extras) if candidates.extras is not None else 0
        self.tokens += tokens
        self.time += _cost(cost, 1 + len(candidates) + m, candidates.is_chain, context)


def subset(candidates: Candidates, keep: list[int]) -> Candidates:
    """The candidates restricted to the parent-closed, increasing node indices ``keep`` (re-indexed;
    ``draft_probs``, ``accept_probs`` and the extras' attention columns follow).

    Raises:
        ValueError: ``keep`` is not increasing or not closed under parents.
    """
    if keep == list(range(len(candidates))):
        return candidates
    new_index = {old: new for new, old in enumerate(keep)}
    parents = candidates.parents.tolist()
    if any(b <= a for a, b in zip(keep, keep[1:])):
        raise ValueError(f"keep must be increasing node indices, got {keep}")
    if any(parents[i] >= 0 and parents[i] not in new_index for i in keep):
        raise ValueError(f"keep must be closed under parents, got {keep} for parents {parents}")
    idx = torch.tensor(keep, dtype=torch.long)
    dev = candidates.tokens.device
    new_parents = torch.tensor([new_index[parents[i]] if parents[i] >= 0 else -1 for i in keep],
                               dtype=torch.long, device=dev)
    extras = candidates.extras
    if extras is not None:
        n, m = len(candidates), len(extras)
        cols = torch.cat([torch.zeros(1, dtype=torch.long), idx + 1, torch.arange(n + 1, n + 1 + m)])
        extras = ExtraQueries(extras.tokens, extras.positions, extras.attention[:, cols])
    return Candidates(candidates.tokens[idx.to(dev)], new_parents, [candidates.sources[i] for i in keep],
                      None if candidates.draft_probs is None else candidates.draft_probs[idx.to(candidates.draft_probs.device)],
                      extras, None if candidates.accept_probs is None else candidates.accept_probs[idx])


def apply_budget(candidates: Candidates, cost: CostLike | None, context: int | None = None,
                 rate: float | None = None) -> Candidates:
    """The part of ``candidates`` worth verifying on this device (the loop calls it after propose).

    Args:
        candidates: the drafter's proposal; without ``accept_probs`` it is returned unchanged.
        cost: this device's step cost (:class:`StepCost`, or any n -> relative cost); None: unchanged.
        context: tokens in the context before this step's queries (see :func:`best_subtree`).
        rate: the run's rate so far (:class:`RunRate`); None: each step's own ratio.

    Returns:
        The kept subtree (:func:`best_subtree`), its extras kept; empty candidates when no
        proposal beats a plain step.
    """
    if cost is None or candidates.accept_probs is None or len(candidates) == 0:
        return candidates
    m = len(candidates.extras) if candidates.extras is not None else 0
    keep, _ = best_subtree(candidates.parents.tolist(), candidates.accept_probs.tolist(), cost, m, context, rate)
    return subset(candidates, keep)


# ----- acceptance estimates ------------------------------------------------------------------------
def node_paths(candidates: Candidates) -> list[tuple[int, ...]]:
    """The token path (root excluded) of every node: a node's identity across pruning and merging."""
    tokens, out = candidates.tokens.tolist(), []
    for i, p in enumerate(candidates.parents.tolist()):
        out.append((out[p] if p >= 0 else ()) + (tokens[i],))
    return out


PRIOR_GROUPS = 5
"""Bins of the prior (0-0.2, ..., 0.8-1) whose scales :class:`AcceptanceEstimator` calibrates apart."""


RUN_CARRY = 0.3
"""Share of an estimator's counts carried into a new run (:meth:`AcceptanceEstimator.new_run`)."""


class AcceptanceEstimator:
    """Calibrated ``accept_probs`` from a drafter's raw signal: a Beta posterior per key.

    A drafter maps each node to a hashable ``key`` (a bin of its draft probability, a match length
    and depth, a tree position) with a ``prior`` probability. The estimate is
    ``(hits[key] + strength * prior) / (tests[key] + strength)``, where a node is *tested* when the
    target reached it (its parent is the root or was accepted) and a *hit* when it was accepted.
    Nodes are recognised in the verdict by their token paths (:func:`node_paths`), so pruning by
    the budget or merging into a mixture tree loses nothing.

    Counts fade: each observed step first multiplies every count by ``memory``, so an estimate
    follows the current stretch of the answer (about ``1 / (1 - memory)`` steps: a copied passage,
    then free text) rather than the pooled history of every earlier question.

    The priors themselves are calibrated (two-level shrinkage, as in empirical Bayes): with many
    keys and fading counts each key holds only a few observations, so its estimate stays near its
    prior, and a drafter's hand-set priors are often too hopeful (on untuned questions suffix
    decoding's were about 1.5x its real rate). The estimator therefore also pools, over the tested
    nodes of every key whose prior falls in the same one of :data:`PRIOR_GROUPS` equal bins, the
    priors' sum and the hits, and scales each prior by ``(pooled hits + calibration) / (pooled
    priors + calibration)`` of its bin (1 before any verdict) before using it: a histogram-binning
    calibration of the priors. Per bin, not one scale for all: a drafter's priors mean different
    things (prompt lookup's first token of a match, 0.35-0.65, fails far more often than its 0.8
    for a token deeper in a copy that has held so far), and one pooled scale, dragged down by the
    many failed first tokens, cut the copies short.

    A drafter whose acceptance differs much from one answer to the next (prompt lookup: a passage
    being copied against free text) calls :meth:`new_run` when a run begins, which scales every
    count by :data:`RUN_CARRY`: the earlier answers' verdicts stay a prior, and this answer's own
    soon outweigh them (on the dev set, pooled history had prompt lookup's deep-copy tokens at 0.74
    on translation, where 0.9 of them were accepted).

    Args:
        strength: weight of the prior, in pseudo-observations.
        memory: the fading factor per observed step, in (0, 1] (1: never forget).
        calibration: weight of the unscaled prior in the pooled scale, in pseudo-observations
            (0 < calibration; large: the priors are trusted as set).
    """

    def __init__(self, strength: float = 4.0, memory: float = 0.98, calibration: float = 2.0):
        if not 0.0 < memory <= 1.0:
            raise ValueError(f"memory must be in (0, 1], got {memory}")
        if not calibration > 0.0:
            raise ValueError(f"calibration must be positive, got {calibration}")
        self.strength, self.memory, self.calibration = float(strength), float(memory), float(calibration)
        self.carry = RUN_CARRY
        self.hits: dict[Hashable, float] = {}
        self.tests: dict[Hashable, float] = {}
        self.pending: dict[tuple[int, ...], tuple[Hashable, float]] = {}
        self.pooled_priors = [0.0] * PRIOR_GROUPS  # per prior bin: the (unscaled) priors of tested nodes
        self.pooled_hits = [0.0] * PRIOR_GROUPS  # and their hits, faded like the counts

    def prior_scale(self, prior: float) -> float:
        """The factor a prior of this value is multiplied by: its bin's pooled hits over pooled
        priors, shrunk to 1."""
        g = probability_bin(prior, PRIOR_GROUPS)
        return (self.pooled_hits[g] + self.calibration) / (self.pooled_priors[g] + self.calibration)

    def estimate(self, candidates: Candidates, keys: list[Hashable], priors: list[float]) -> torch.Tensor:
        """``(num_nodes,)`` float32 estimates for ``candidates`` (one key and prior per node); the
        nodes are remembered until the next :meth:`observe`."""
        if len(keys) != len(candidates) or len(priors) != len(candidates):
            raise ValueError(f"keys and priors need one entry per node ({len(candidates)}), "
                             f"got {len(keys)} and {len(priors)}")
        self.pending = dict(zip(node_paths(candidates), zip(keys, priors)))
        return torch.tensor([self.value(k, p) for k, p in zip(keys, priors)], dtype=torch.float32)

    def value(self, key: Hashable, prior: float) -> float:
        """The estimate for one node of ``key`` and ``prior``."""
        s, prior = self.strength, float(prior)
        return (self.hits.get(key, 0.0) + s * min(1.0, self.prior_scale(prior) * prior)) / (self.tests.get(key, 0.0) + s)

    def new_run(self, carry: float | None = None) -> None:
        """A new run (question) starts: scale every count by ``carry`` (default ``self.carry``), so
        what earlier questions taught stays a prior and this answer's own verdicts soon outweigh it."""
        c = self.carry if carry is None else float(carry)
        for counts in (self.hits, self.tests):
            for k in counts:
                counts[k] *= c
        self.pooled_priors = [v * c for v in self.pooled_priors]
        self.pooled_hits = [v * c for v in self.pooled_hits]
        self.pending = {}

    def observe(self, result) -> None:
        """Count the tests and hits of the remembered nodes in a step's verdict (``StepResult``)."""
        if not self.pending:
            return
        if self.memory < 1.0:
            for counts in (self.hits, self.tests):
                for k in counts:
                    counts[k] *= self.memory
            self.pooled_priors = [v * self.memory for v in self.pooled_priors]
            self.pooled_hits = [v * self.memory for v in self.pooled_hits]
        cand = result.candidates
        parents = cand.parents.tolist()
        accepted = set(result.path)
        for i, path in enumerate(node_paths(cand)):
            entry = self.pending.get(path)
            if entry is None or not (parents[i] < 0 or parents[i] in accepted):
                continue
            key, prior = entry
            hit = float(i in accepted)
            self.tests[key] = self.tests.get(key, 0.0) + 1.0
            if hit:
                self.hits[key] = self.hits.get(key, 0.0) + 1.0
            g = probability_bin(prior, PRIOR_GROUPS)
            self.pooled_priors[g] += float(prior)
            self.pooled_hits[g] += hit
        self.pending = {}


DEFAULT_GATE_PRIOR = 0.6
"""A draft gate's starting rate when nothing is known yet (:class:`DraftGate`)."""


class DraftGate:
    """Whether a costly drafter should draft at all this step (the budget's step-level half).

    The per-node budget prunes what a proposal holds, but a draft model or an EAGLE head has
    already paid its drafting passes by then. A drafter that asks this gate first skips drafting
    (a plain step) while the recent acceptance of its first token is below ``pay_at``, the share of
    a target step that drafting one token and verifying it costs: its expected gain is that
    acceptance, in tokens, so below ``pay_at`` a drafted token loses time on average. The rate is an
    exponential moving average (weight ``rate`` per observation, starting at ``prior``) of the first
    token's verdicts; while skipping, every ``period``-th step drafts anyway (a probe), so a rise in
    acceptance (a new part of the answer) is seen again. The period starts at ``probe_every`` and
    doubles after each failed probe, up to ``max_probe_every`` (a probe costs a drafting pass, and
    where the drafter keeps failing, such as a passage it cannot copy, probing every 4th step costs
    several per cent); an accepted probe resets it.

    Skipping changes which tokens are verified, never which are accepted: output is unchanged.

    Args:
        pay_at: the break-even acceptance, in [0, 1) (0: never skip).
        prior: the starting rate; rate: the moving average's weight; probe_every: a skipped run's
            first probing period, in steps; max_probe_every: the longest period.
    """

    def __init__(self, pay_at: float = 0.0, prior: float = DEFAULT_GATE_PRIOR, rate: float = 0.15, probe_every: int = 4,
                 max_probe_every: int = 16):
        self.pay_at, self.first_rate = float(pay_at), float(prior)
        self.rate, self.probe_every = float(rate), int(probe_every)
        self.max_probe_every = max(int(max_probe_every), self.probe_every)
        self.period = self.probe_every
        self.skipped = 0
        self.probing = False  # the last step drafted only to probe

    def draft_now(self) -> bool:
        """True to draft this step (counts a skip otherwise)."""
        self.probing = False
        if self.first_rate >= self.pay_at:
            self.skipped, self.period = 0, self.probe_every
            return True
        if self.skipped + 1 >= self.period:
            self.skipped, self.probing = 0, True
            return True
        self.skipped += 1
        return False

    def observe(self, accepted: bool | float) -> None:
        """One verdict on a drafted first token (accepted or not); or a number, for a gate whose rate
        is tokens gained per step (Lookahead's window: the pool's accepted tokens)."""
        self.first_rate += self.rate * (float(accepted) - self.first_rate)
        if self.probing:
            self.period = self.probe_every if accepted else min(self.max_probe_every, 2 * self.period)
            self.probing = False


class GateMemory:
    """A draft gate's rate carried from one run to the next (the engine keeps one per method and knobs).

    A fresh gate starts at a hopeful prior, so each run drafts for its first several steps before
    the rate falls below the break-even, which on a short answer where the drafter fails
    (summaries for EAGLE, free text for Lookahead's window) costs a few per cent. A drafter that
    holds a memory starts each run's gate halfway between its own prior and the rate the gate ended
    the previous run at (:meth:`prior`), and stores that rate when the run finishes (:meth:`remember`).
    """

    def __init__(self):
        self.rate: float | None = None

    def prior(self, default: float = DEFAULT_GATE_PRIOR) -> float:
        """The starting rate of the next run's gate."""
        return default if self.rate is None else 0.5 * (default + self.rate)

    def remember(self, gate: "DraftGate") -> None:
        """Keep the rate ``gate`` ended its run at."""
        self.rate = float(gate.first_rate)


def probability_bin(p: float, bins: int = 10) -> int:
    """The bin of a probability in [0, 1] (``bins`` equal bins), a key for :class:`AcceptanceEstimator`."""
    return min(bins - 1, max(0, int(float(p) * bins)))


def with_budget_knob(knobs: tuple) -> tuple:
    """``knobs`` plus :data:`BUDGET_KNOB` (every method but the baseline and EAGLE has it)."""
    return tuple(knobs) + (BUDGET_KNOB,)


__all__ = ["BUDGET_KNOB", "BUDGET_AUTO", "BUDGET_OFF", "StepCost", "DraftGate", "best_subtree", "RunRate",
           "best_subtree_reference", "subset", "apply_budget", "AcceptanceEstimator", "node_paths", "GateMemory",
           "probability_bin", "path_probs", "with_budget_knob"]
