"""Token recycling: the target's discarded top-k candidates fill an adjacency table that drafts a tree.

Source: Luo, Wang, Zhu, Zhang, Zhang, Yang, Xu 2024, "Turning Trash into Treasure: Accelerating
Inference of Large Language Models with Token Recycling" (arXiv 2408.08696; ACL 2025). Facts
taken from the paper, code written here:

1. An **adjacency table** ``(vocab_size, top_k)`` maps a token to its likely next tokens. After
   every verification pass, the row of each token scored in the pass (the root and every
   candidate, accepted or not) is *replaced* by the target's top-k next tokens at that position:
   the candidates the target computed anyway and a plain decoder throws away.
2. A **static tree** (a fixed template of (parent, rank) nodes) is filled breadth-first from the
   table: a node's token is row ``token(parent)``'s ``rank``-th entry, starting from the root.
3. The tree is verified with tree attention; the table is kept across queries (the paper's hot
   start), a few MB (``vocab_size * top_k`` int64).

The template here is grown greedily by a prior of each rank's acceptance (the paper uses a fixed
80-node GPU tree; on a CPU the per-step budget prunes it to what pays). Deterministic proposals:
under sampling the verifier uses the one-hot rule.
"""

from __future__ import annotations

import heapq

import torch

from .budget import AcceptanceEstimator, with_budget_knob
from .step_cost import build_with_budget
from .drafter import DecodeState, Drafter, StepResult
from .events import SOURCE_TARGET
from .limits import Knob
from .registry import MethodInfo, register
from .tree import Candidates

SOURCE_RECYCLING = "recycling"
"""Tokens accepted from the token-recycling adjacency table."""

MAX_RECYCLING_TOP_K = 16
"""Widest adjacency table row (next-token candidates kept per token)."""
MAX_RECYCLING_TREE_NODES = 64
"""Largest static tree (nodes, root excluded)."""
MAX_RECYCLING_DEPTH = 8
"""Deepest static tree."""

RECYCLING_TOP_K_KNOB = Knob("top_k", "Candidates per token", 1, MAX_RECYCLING_TOP_K, 8,
                            info="Token recycling: next-token candidates kept per token in the adjacency table.")
RECYCLING_NODES_KNOB = Knob("tree_nodes", "Tree nodes", 1, MAX_RECYCLING_TREE_NODES, 24,
                            info="Token recycling: nodes of the static tree filled from the table each step.")
RECYCLING_KNOBS = (RECYCLING_TOP_K_KNOB, RECYCLING_NODES_KNOB)

RANK_PRIOR = (0.45, 0.15, 0.07, 0.04, 0.03, 0.02, 0.015, 0.01)
"""Prior acceptance of a table entry by rank (before this run's own verdicts update it)."""


def _rank_prior(rank: int) -> float:
    return RANK_PRIOR[rank] if rank < len(RANK_PRIOR) else RANK_PRIOR[-1] * 0.8 ** (rank - len(RANK_PRIOR) + 1)


def static_tree(num_nodes: int, top_k: int, max_depth: int = MAX_RECYCLING_DEPTH) -> list[tuple[int, int]]:
    """The static tree template: ``num_nodes`` (parent index, rank) pairs in breadth-first order.

    Grown greedily by path prior (product of :data:`RANK_PRIOR` along the path), the way Medusa's
    and Sequoia's trees are, then sorted by depth so that it fills breadth-first.
    """
    heap = [(-_rank_prior(r), (r,)) for r in range(top_k)]
    heapq.heapify(heap)
    paths = []
    while heap and len(paths) < num_nodes:
        neg, path = heapq.heappop(heap)
        paths.append(path)
        if len(path) < max_depth:
            for r in range(top_k):
                heapq.heappush(heap, (neg * _rank_prior(r), path + (r,)))
    paths.sort(key=lambda p: (len(p), p))
    index = {p: i for i, p in enumerate(paths)}
    return [(index[p[:-1]] if len(p) > 1 else -1, p[-1]) for p in paths]


class AdjacencyTable:
    """Token -> its ``top_k`` likeliest next tokens as the target last saw them (-1 = unseen).

    Args:
        vocab_size: rows; top_k: columns.

    Attributes:
        table: ``(vocab_size, top_k)`` int64.
        rows: how many tokens have a row (counted as rows fill: scanning the table's first column
            for the page's statistics took about a millisecond a step).
    """

    def __init__(self, vocab_size: int, top_k: int):
        self.top_k = top_k
        self.table = torch.full((vocab_size, top_k), -1, dtype=torch.long)
        self.rows = 0

    def update(self, tokens: torch.Tensor, next_ids: torch.Tensor) -> None:
        """Replace the rows of ``tokens`` ``(n,)`` by ``next_ids`` ``(n, k)`` (k >= top_k columns
        used; later rows win when a token repeats)."""
        if tokens.dim() != 1 or next_ids.dim() != 2 or next_ids.shape[0] != tokens.shape[0]:
            raise ValueError(f"tokens (n,) and next_ids (n, k) must agree, got {tuple(tokens.shape)} and "
                             f"{tuple(next_ids.shape)}")
        ids = tokens.tolist()
        self.rows += len({t for t in ids if self.table[t, 0] < 0})
        for t, row in zip(ids, next_ids[:, :self.top_k].cpu()):
            self.table[t, :row.shape[0]] = row

    def fill(self, root: int, template: list[tuple[int, int]]) -> tuple[list[int], list[int], list[int]]:
        """Fill ``template`` breadth-first from ``root``: ``(tokens, parents, template indices)`` of the
        nodes whose table entry exists (a node under a missing one is missing too)."""
        rows = self.table
        tokens, parents, used, where = [], [], [], {}
        for j, (p, rank) in enumerate(template):
            if rank >= self.top_k:
                continue
            if p < 0:
                prev, parent = root, -1
            elif p in where:
                parent = where[p]
                prev = tokens[parent]
            else:
                continue
            t = int(rows[prev, rank])
            if t < 0:
                continue
            where[j] = len(tokens)
            tokens.append(t)
            parents.append(parent)
            used.append(j)
        return tokens, parents, used


def reference_fill(table: dict[int, list[int]], root: int, template: list[tuple[int, int]]):
    """Slow obvious reference of :meth:`AdjacencyTable.fill`: every template path walked from the
    root through a dict table; returns the same ``(tokens, parents, template indices)``."""
    paths = []  # template index -> list of ranks from the root
    for p, rank in template:
        paths.append((paths[p] if p >= 0 else []) + [rank])
    tokens, parents, used, index = [], [], [], {}
    for j, ranks in enumerate(paths):
        prev, ok = root, True
        for r in ranks:
            row = table.get(prev, [])
            if r >= len(row) or row[r] < 0:
                ok = False
                break
            prev = row[r]
        if ok:
            parent_j = template[j][0]
            index[j] = len(tokens)
            tokens.append(prev)
            parents.append(index[parent_j] if parent_j >= 0 else -1)
            used.append(j)
    return tokens, parents, used


class RecyclingDrafter(Drafter):
    """Token recycling as a drafter (see the module docstring).

    Args:
        vocab_size: the target's vocabulary size.
        top_k, tree_nodes: the knobs.
        table: an :class:`AdjacencyTable` kept across runs (the paper's hot start); None: a new one.

    Raises:
        ValueError: a knob out of its bound.
    """

    name = "recycling"
    source = SOURCE_RECYCLING
    wants_logits = True

    def __init__(self, vocab_size: int, top_k: int = RECYCLING_TOP_K_KNOB.default,
                 tree_nodes: int = RECYCLING_NODES_KNOB.default, table: AdjacencyTable | None = None):
        self.top_k = RECYCLING_TOP_K_KNOB.check(top_k)
        self.tree_nodes = RECYCLING_NODES_KNOB.check(tree_nodes)
        self.table = table if table is not None and table.top_k >= self.top_k else AdjacencyTable(vocab_size, self.top_k)
        self.template = static_tree(self.tree_nodes, self.top_k)
        self.depth = Candidates(torch.zeros(len(self.template), dtype=torch.long),
                                torch.tensor([p for p, _ in self.template]), [""] * len(self.template)).depths()
        self.estimator = AcceptanceEstimator()
        self.steps_with_hits = 0

    def propose(self, state: DecodeState) -> Candidates:
        if state.budget <= 0:
            return Candidates.empty(state.device)
        template = [(p, r) if self.depth[j] <= state.budget else (p, self.top_k)  # too deep: skipped
                    for j, (p, r) in enumerate(self.template)]
        tokens, parents, used = self.table.fill(state.tokens[-1], template)
        if not tokens:
            return Candidates.empty(state.device)
        cand = Candidates(torch.tensor(tokens, dtype=torch.long, device=state.device),
                          torch.tensor(parents, dtype=torch.long, device=state.device), [self.source] * len(tokens))
        cand.accept_probs = self.estimator.estimate(cand, used, [_rank_prior(self.template[j][1]) for j in used])
        return cand

    def update(self, result: StepResult) -> None:
        """Recycle the pass's top-k candidates into the table (accepted path last, so it wins)."""
        self.estimator.observe(result)
        if result.path:
            self.steps_with_hits += 1
        if result.logits is None:
            return
        cand = result.candidates
        n = len(cand)
        if result.logits.shape[0] != n + 1:
            raise ValueError(f"StepResult.logits must have shape (num_nodes + 1, vocab_size) = ({n + 1}, V), "
                             f"got {tuple(result.logits.shape)}")
        top = torch.topk(result.logits, min(self.table.top_k, result.logits.shape[-1]), dim=-1).indices  # (n + 1, k)
        root = result.tokens[len(result.tokens) - len(result.path) - 2]
        inputs = torch.cat([torch.tensor([root], dtype=torch.long), cand.tokens.cpu()])
        on_path = [0] + [c + 1 for c in result.path]
        others = [i for i in range(n + 1) if i not in set(on_path)]
        order = torch.tensor(others + on_path, dtype=torch.long)
        self.table.update(inputs[order], top[order])

    def info(self) -> dict[str, int]:
        return {"table_rows": self.table.rows, "steps_with_hits": self.steps_with_hits}


def build_recycling(engine, params: dict, owner: str = "recycling") -> RecyclingDrafter:
    """A :class:`RecyclingDrafter` whose table is the engine's, kept under ``learned/<owner>/`` (each
    method that recycles learns from its own runs only; the benchmark forgets ``learned/`` after
    warm-up)."""
    vocab = engine.target_lm.vocab_size

    key = f"learned/{owner}/recycling/" + ",".join(f"{k}={params[k]}" for k in sorted(params))

    def make(p: dict) -> RecyclingDrafter:
        # One table per owner and settings (the budget included): no two methods share state.
        table = engine.persistent(key, lambda: AdjacencyTable(vocab, p["top_k"]))
        return RecyclingDrafter(vocab, **p, table=table)
    return build_with_budget(engine, params, make, owner)


METHOD = RECYCLING_METHOD = register(MethodInfo(
    name="recycling", label="Token recycling",
    description="The target's top-k candidates from every verification fill an adjacency table (token -> likely "
                "next tokens); a static tree is filled from it breadth-first (Luo et al. 2024). Learns across runs "
                "(on the page, each browser tab from its own).",
    lossless=True, knobs=with_budget_knob(RECYCLING_KNOBS), sources=(SOURCE_TARGET, SOURCE_RECYCLING),
    source_labels={SOURCE_RECYCLING: "token recycling"}, build=build_recycling, learns_across_runs=True))
