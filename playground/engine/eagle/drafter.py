"""The ``eagle`` drafter: EAGLE-3 features in, an EAGLE-2 dynamic tree out.

Per step:

1. **Catch up**: the positions committed since the previous step (the whole prompt at the first
   step, then the previous root and its accepted path) become draft entries: the target's features
   there (``DecodeState.features``) with the token after each; the draft cache first drops the
   previous step's tree entries.
2. **Expand and rerank** (:mod:`.tree`): ``depth`` levels, ``top_k`` children per expanded node,
   the best ``total_tokens`` nodes by cumulative draft log-probability (``auto``: as many as pay for
   their verification on this device's measured cost curve). With ``auto`` the expansion also stops
   early once another level is not expected to pay for itself (:func:`.tree.next_level_pays`: the
   frontier's children guessed from the draft's mean sorted child probabilities, a level priced at
   this drafter's running mean seconds of one level over the target's one-token seconds): on a CPU
   a level is several per cent of a target step, and most steps keep the root's children only.
3. The nodes go out as :class:`~playground.engine.tree.Candidates` with sources ``eagle_d<depth>``
   and ``accept_probs`` = each node's draft probability given its parent.

The tree is a deterministic function of the prefix, so greedy verification is lossless and under
sampling the one-hot speculative rule keeps the target's distribution exactly.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from ..budget import DraftGate, GateMemory, StepCost
from ..drafter import DecodeState, Drafter, StepResult
from ..tree import Candidates
from .head import EagleHead
from .tree import choose_size, expand, next_level_pays, rerank

AUTO = "auto"


def depth_source(d: int) -> str:
    """Source tag of a token drafted at depth ``d`` (1 = the root's child)."""
    return f"eagle_d{d}"


class EagleDrafter(Drafter):
    """EAGLE drafting (see the module docstring).

    Args:
        head: an :class:`EagleHead` on the target's device, embedding attached.
        depth: draft levels per step; top_k: children per expanded node.
        total_tokens: nodes verified per step, or ``"auto"``.
        verify_cost: ``cost(q)``, relative time of a target forward over q tokens, or the engine's
            :class:`~playground.engine.budget.StepCost` (priced at each step's context length) (for ``auto``;
            None: constant, i.e. keep ``max_total`` nodes).
        max_total: most nodes ``auto`` may keep.
    """

    name = "eagle"
    source = depth_source(1)

    def __init__(self, head: EagleHead, depth: int = 4, top_k: int = 4, total_tokens: int | str = AUTO,
                 verify_cost: Callable[[int], float] | None = None, max_total: int = 64):
        self.head = head
        self.depth, self.top_k, self.total_tokens = int(depth), int(top_k), total_tokens
        self.verify_cost = verify_cost
        self.max_total = int(max_total)
        self.feature_layers = tuple(head.feature_layers)
        self.last_sizes: list[int] = []
        self.last_tree: dict | None = None
        seconds = getattr(getattr(verify_cost, "chain", verify_cost), "seconds", None) or {}
        self.target_step_s = float(seconds.get(1, 0.0))  # 0: unknown, no early stop
        self.level_s = 0.0  # running mean seconds of one draft level (expansion call)
        self.child_probs: torch.Tensor | None = None  # (top_k,) running mean of the sorted top child probabilities
        self.context = 0  # tokens in the context at the current step
        self.gate_memory = GateMemory()  # the engine may share a persistent one (eagle's build)
        self.begin([])

    def begin(self, prompt_ids: list[int]) -> None:
        self.cache = self.head.new_cache()
        self.committed = 0  # draft entries for positions 0 .. committed - 1
        self.last_tree = None
        self.skipped_feats: list[torch.Tensor] = []  # features of steps that skipped drafting
        self.gate = DraftGate(prior=self.gate_memory.prior())

    def finish(self, tokens: list[int], prompt_len: int) -> None:
        self.gate_memory.remember(self.gate)

    def _cost(self, queries: int) -> float:
        """The verify cost of ``queries`` queries at the current context (a StepCost is priced at it)."""
        if isinstance(self.verify_cost, StepCost):
            return self.verify_cost(queries, False, self.context)
        return float(self.verify_cost(queries))

    def _step_costs(self) -> Callable[[int], float]:
        """:meth:`_cost` at this step's context, each size priced once."""
        memo: dict[int, float] = {}

        def cost(queries: int) -> float:
            if queries not in memo:
                memo[queries] = self._cost(queries)
            return memo[queries]
        return cost

    def _observe_children(self, logits: torch.Tensor) -> None:
        """Fold the sorted top ``top_k`` child probabilities of ``(f, draft_vocab_size)`` logits into
        :attr:`child_probs` (a running mean: what :func:`.tree.next_level_pays` expects of a level)."""
        k = min(self.top_k, logits.shape[-1])
        top = torch.softmax(logits.float(), -1).topk(k, -1).values.mean(0).cpu()
        self.child_probs = top if self.child_probs is None else 0.9 * self.child_probs + 0.1 * top

    def _gate_open(self) -> bool:
        """With ``total_tokens=auto``: whether drafting can pay this step (:class:`DraftGate`; its
        break-even two head calls, the catch-up and one level, over a plain target step, plus one
        more verified query)."""
        if self.total_tokens != AUTO or not (self.target_step_s > 0 and self.level_s > 0):
            return True
        extra = max(0.0, float(self._cost(2)) - 1.0) if self.verify_cost is not None else 0.0
        self.gate.pay_at = 2 * self.level_s / self.target_step_s + extra
        return self.gate.draft_now()

    @torch.inference_mode()
    def _catch_up(self, state: DecodeState) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Step 1: entries for the newly committed positions; the last one's logits and output."""
        head = self.head
        n = len(state.tokens) - 1  # the root's position
        feats = state.features
        if self.skipped_feats and feats is not None:
            feats = torch.cat(self.skipped_feats + [feats.to(self.skipped_feats[0].device)])
        self.skipped_feats = []
        want = n - self.committed
        if feats is None or feats.dim() != 2 or feats.shape[0] != want:
            raise ValueError(f"EagleDrafter needs the target's features of the {want} positions committed since "
                             f"its previous step, shape ({want}, "
                             f"{len(self.feature_layers) * head.target_hidden_size}), "
                             f"got {None if feats is None else tuple(feats.shape)}")
        self.cache.crop(self.committed)
        dev = head.fc.weight.device
        hidden = head.project(feats.to(dev))
        ids = torch.tensor(state.tokens[self.committed + 1:n + 1], dtype=torch.long, device=dev)
        positions = torch.arange(self.committed, n, device=dev)
        attend = torch.ones(want, self.committed + want, dtype=torch.bool, device=dev)
        attend[:, self.committed:] = torch.ones(want, want, dtype=torch.bool, device=dev).tril()
        logits, out = head.step(self.cache, hidden, ids, positions, attend, last_only=True)
        self.committed = n
        return logits[-1], out[-1], n - 1

    @torch.inference_mode()
    def propose(self, state: DecodeState) -> Candidates:
        depth = min(self.depth, state.budget)
        self.last_tree = None
        self.context = len(state.tokens)
        if depth > 0 and state.features is not None and not self._gate_open():
            self.skipped_feats.append(state.features)  # caught up at the next step that drafts
            return Candidates.empty(state.device)
        root_logits, root_h, root_pos = self._catch_up(state)
        if depth <= 0:
            return Candidates.empty(state.device)
        head, committed = self.head, self.committed
        dev = head.fc.weight.device

        cost = self._step_costs() if self.verify_cost is not None else (lambda q: 1.0)
        self._observe_children(root_logits[None])

        def step(states, tokens, ancestors, level):
            # Frontier node i's entry sees every committed entry, its ancestors' entries and itself.
            f = tokens.shape[0]
            tree_len = len(self.cache) - committed
            attend = torch.zeros(f, len(self.cache) + f, dtype=torch.bool)
            attend[:, :committed] = True
            for i, anc in enumerate(ancestors):
                attend[i, [committed + a for a in anc]] = True
                attend[i, committed + tree_len + i] = True
            positions = torch.full((f,), root_pos + level - 1, dtype=torch.long, device=dev)
            t0 = time.perf_counter()
            logits, out = head.step(self.cache, states, tokens.to(dev), positions, attend.to(dev))
            out = (torch.log_softmax(logits, -1), out)
            spent = time.perf_counter() - t0
            self.level_s = spent if not self.level_s else 0.9 * self.level_s + 0.1 * spent
            self._observe_children(out[0])
            return out

        keep_expanding = None
        if self.total_tokens == AUTO and self.target_step_s > 0 and self.level_s > 0:
            level_cost = self.level_s / self.target_step_s

            def keep_expanding(values, frontier):
                return next_level_pays(values, frontier, self.child_probs, cost, self.max_total, level_cost)
        pool = expand(step, torch.log_softmax(root_logits, -1), root_h, depth, self.top_k, head.draft_ids,
                      keep_expanding=keep_expanding)
        if self.total_tokens == AUTO:
            n = choose_size(pool.scores.exp(), cost, self.max_total)
            n = max(n, 1)
        else:
            n = int(self.total_tokens)
        kept, parents = rerank(pool, n)
        self.last_sizes.append(len(kept))
        depths = pool.depths[kept].tolist()
        self.last_tree = {"tokens": pool.tokens[kept].tolist(), "parents": parents, "depths": depths}
        return Candidates(pool.tokens[kept].to(state.device), torch.tensor(parents, dtype=torch.long,
                                                                               device=state.device),
                          [depth_source(d) for d in depths], None,
                          accept_probs=pool.logp[kept].exp().float())

    def update(self, result: StepResult) -> None:
        if self.last_tree is None:  # drafted nothing this step
            return
        self.last_tree["accepted"] = list(result.path)
        # The gate learns whether this head's first token was the target's (the root's children are
        # always tested). In a mixture the verified tree also holds other drafters' nodes: the
        # accepted first token counts only if this head proposed it.
        first = int(result.candidates.tokens[result.path[0]]) if result.path else result.bonus_token
        mine = {t for t, d in zip(self.last_tree["tokens"], self.last_tree["depths"]) if d == 1}
        self.gate.observe(first in mine)

    def info(self) -> dict[str, int | float]:
        if not self.last_sizes:
            return {}
        return {"tree_nodes": self.last_sizes[-1],
                "mean_tree_nodes": round(sum(self.last_sizes) / len(self.last_sizes), 2)}
