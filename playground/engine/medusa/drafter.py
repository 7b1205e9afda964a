"""Medusa's drafter: the target's own heads fill a candidate tree (Medusa-1); and per-head statistics.
(Medusa as a draft, a draft's heads extending its next token, is the draft model's ``medusa_heads``
proposer: :class:`~playground.engine.draft_model.MedusaDraftDrafter`.)

Source: Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with Multiple
Decoding Heads" (ICML), and its reference implementation (FasterDecoding/Medusa), read for facts.
"""

from __future__ import annotations

import time

import torch

from ..budget import AcceptanceEstimator, DraftGate, GateMemory, StepCost
from ..drafter import DecodeState, Drafter, StepResult
from ..limits import POSTERIOR_ALPHA_KNOB, POSTERIOR_THRESHOLD_KNOB
from ..tree import Candidates
from ..verify import TypicalAcceptance
from .heads import MedusaHeads, head_source
from .trees import TreeBuffers, parse_tree_choices, rank_probs_from_accuracy, tree_buffers


# ----- drafters ----------------------------------------------------------------------------------
class MedusaDrafter(Drafter):
    """Medusa-1 decoding: the heads' top-k tokens on the target's last hidden state fill a tree.

    With the budget on (``budget_cost`` set) a :class:`~playground.engine.budget.DraftGate` skips
    the heads (a plain step) while head 1's recent hit rate is below their measured share of a
    plain target step plus one more verified query; the tree is pruned per step by the budget.

    Args:
        heads: Medusa heads attached to the target's ``lm_head`` (on the target's device).
        tree_choices: index paths (see :func:`~playground.engine.tree.parse_tree_choices`); paths
            deeper than the number of heads are an error.
        acceptance: ``"exact"`` (greedy: argmax match, lossless; sampling: the one-hot
            speculative rule, exact in distribution) or ``"typical"`` (typical acceptance).
        posterior_threshold, posterior_alpha: typical acceptance's knobs.

    Raises:
        ValueError: a malformed tree or a knob out of range.
    """

    name = "medusa"
    source = "medusa_head_1"
    feature_layers = (-1,)  # the last layer's output after the final norm (what lm_head reads)

    def __init__(self, heads: MedusaHeads, tree_choices, acceptance: str = "exact",
                 posterior_threshold: float = POSTERIOR_THRESHOLD_KNOB.default,
                 posterior_alpha: float = POSTERIOR_ALPHA_KNOB.default):
        if acceptance not in ("exact", "typical"):
            raise ValueError(f"acceptance must be 'exact' or 'typical', got {acceptance!r}")
        self.heads = heads
        self.buffers: TreeBuffers = tree_buffers(parse_tree_choices(tree_choices, num_heads=heads.num_heads))
        self.top_k = int(self.buffers.ranks.max()) + 1
        self.typical = TypicalAcceptance(POSTERIOR_THRESHOLD_KNOB.check(posterior_threshold),
                                         POSTERIOR_ALPHA_KNOB.check(posterior_alpha)) if acceptance == "typical" else None
        self.sources = [head_source(int(d)) for d in self.buffers.depths]
        # Acceptance estimate per tree node: the heads' recorded rank accuracy (else a guess), then
        # this run's verdicts at that node (the budget prunes the tree per step with it).
        acc = getattr(heads, "top_k_accuracy", None)
        ranks = rank_probs_from_accuracy(acc) if acc else None
        self.priors = [ranks[d - 1][r] if ranks and d - 1 < len(ranks) else 0.3 / (r + 1) * 0.8 ** (d - 1)
                       for d, r in zip(self.buffers.depths.tolist(), self.buffers.ranks.tolist())]
        self.estimator = AcceptanceEstimator()
        self.gate_memory = GateMemory()
        self.gate = DraftGate()
        self.heads_s = 0.0  # running mean seconds of one call of the heads
        self.first_tokens: set[int] | None = None  # head 1's tokens proposed this step (None: none)

    def begin(self, prompt_ids: list[int]) -> None:
        self.gate = DraftGate(prior=self.gate_memory.prior())
        self.first_tokens = None

    def finish(self, tokens: list[int], prompt_len: int) -> None:
        self.gate_memory.remember(self.gate)

    def _gate_open(self, context: int | None = None) -> bool:
        """With the budget on: whether running the heads can pay this step (:class:`DraftGate`; its
        break-even the heads' share of a plain target step plus one more verified query, priced at
        this ``context`` length)."""
        cost = self.budget_cost
        step_s = float((getattr(getattr(cost, "chain", cost), "seconds", None) or {}).get(1, 0.0))
        if cost is None or not (step_s > 0 and self.heads_s > 0):
            return True
        self.gate.pay_at = self.heads_s / step_s + max(0.0, float(cost(2, True, context) if isinstance(cost, StepCost) else cost(2)) - 1.0)
        return self.gate.draft_now()

    @torch.inference_mode()
    def propose(self, state: DecodeState) -> Candidates:
        # 1. Only the part of the tree that fits the budget (nodes are sorted by depth: a prefix).
        self.first_tokens = None
        n = self.buffers.nodes_within(state.budget)
        if n == 0 or not self._gate_open(len(state.tokens)):
            return Candidates.empty(state.device)
        if state.features is None or state.features.dim() != 2 or state.features.shape[1] != self.heads.hidden_size:
            raise ValueError(f"MedusaDrafter needs the target's last hidden states of shape "
                             f"(n, {self.heads.hidden_size}), got "
                             f"{None if state.features is None else tuple(state.features.shape)}")
        hidden = state.features[-1]  # at the root's parent: the position whose output predicted the root
        # 2. The top-k tokens of every head the tree reaches, from the hidden state at the root's parent.
        depth = int(self.buffers.depths[n - 1])
        t0 = time.perf_counter()
        top = self.heads.top_tokens(hidden, depth, self.top_k, state.vocab_size).cpu()  # (depth, top_k)
        spent = time.perf_counter() - t0
        self.heads_s = spent if not self.heads_s else 0.9 * self.heads_s + 0.1 * spent
        # 3. Node i's token: head depths[i]'s ranks[i]-th token.
        depths, ranks = self.buffers.depths[:n], self.buffers.ranks[:n]
        tokens = top[depths - 1, ranks]
        cand = Candidates(tokens.to(state.device), self.buffers.parents[:n].to(state.device), self.sources[:n])
        cand.accept_probs = self.estimator.estimate(cand, list(range(n)), self.priors[:n])
        self.first_tokens = {int(t) for t, d in zip(tokens.tolist(), depths.tolist()) if d == 1}
        return cand

    def update(self, result: StepResult) -> None:
        self.estimator.observe(result)
        if self.first_tokens is not None:  # the gate learns whether head 1 had the target's next token
            first = int(result.candidates.tokens[result.path[0]]) if result.path else result.bonus_token
            self.gate.observe(first in self.first_tokens)


# ----- statistics --------------------------------------------------------------------------------
def head_acceptance(stats: dict) -> list[dict]:
    """Per-head acceptance of a Medusa run from its statistics (``RunStats.as_dict()``).

    Depth d of the tree is head d, so the per-position counts are per-head counts.

    Returns:
        One dict per head ``k`` (1-based): ``rate`` = fraction of steps in which a token of head k
        was accepted (among steps that proposed that depth); ``conditional`` = the same among
        steps in which head k - 1's token was accepted (head 1: same as ``rate``).
    """
    rates = list(stats.get("per_position_acceptance") or [])
    out = []
    for i, rate in enumerate(rates):
        prev = 1.0 if i == 0 else rates[i - 1]
        out.append({"head": i + 1, "rate": rate, "conditional": rate / prev if prev > 0 else 0.0})
    return out
