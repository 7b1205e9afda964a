"""EAGLE-2's dynamic draft tree (Li et al. 2024, "EAGLE-2: Faster Inference of Language Models with
Dynamic Draft Trees"), and a slow obvious reference that tests compare it with.

The draft's confidence approximates the chance that a token is accepted, so a node's *value* is
the product of the draft probabilities along its path (its cumulative log-probability, ``score``):

1. **Expand** ``depth`` levels: the root's ``top_k`` most likely children form level 1; at each
   further level, the ``top_k`` nodes of the previous level with the highest score are run through
   the draft (one batched draft call per level) and each gets its ``top_k`` most likely children.
2. **Rerank**: of every node generated, keep the ``total_tokens`` with the highest score. A child's
   score never exceeds its parent's, so the kept set is a tree (ties go to the shallower node).

``total_tokens`` may be chosen per step (``auto``): the n that maximises expected tokens per step,
``1 + sum of the n best values``, over the measured cost of verifying ``n + 1`` tokens
(:func:`best_rate`); with it a level is expanded only when it is expected to raise that rate by
more than the level costs (:func:`next_level_pays`, this project's rule, not EAGLE-2's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass
class DraftPool:
    """Every node the expansion generated (in creation order, parents before children).

    Attributes:
        tokens: ``(m,)`` target token ids; parents: ``(m,)`` pool index of each parent (-1: root);
        scores: ``(m,)`` float32 cumulative draft log-probabilities; logp: ``(m,)`` each node's own
        draft log-probability given its parent; depths: ``(m,)`` int64, 1 for the root's children.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    scores: torch.Tensor
    logp: torch.Tensor
    depths: torch.Tensor

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def expand(step: Callable, root_logp: torch.Tensor, root_state, depth: int, top_k: int,
           draft_ids: torch.Tensor, stop_below: float = 0.0,
           keep_expanding: Callable[[torch.Tensor, torch.Tensor], bool] | None = None) -> DraftPool:
    """Step 1 (expansion), batched per level.

    A further level is expanded only while the likeliest node of the newest level has a value
    (path probability) of at least ``stop_below``: no child of it can be worth more, so when that
    is less than what a draft call costs (relative to a target step) the level cannot pay for
    itself; and only while ``keep_expanding(values, frontier_values)`` (every pool node's value
    ``(m,)`` and the values ``(f,)`` of the nodes the level would expand) says so. With neither
    (EAGLE-2's rule) all ``depth`` levels are expanded.

    Args:
        step: ``step(states, tokens, parent_entries, level) -> (logp, states)``: runs the draft on the
            frontier nodes (``tokens`` ``(f,)`` target ids; ``states`` their parents' states;
            ``parent_entries``: for each, the list of its ancestors' entry indices, root side first)
            and returns their children's log-probabilities ``(f, draft_vocab_size)`` and their own
            states. The entry of frontier node i of this call is the i-th appended.
        root_logp: ``(draft_vocab_size,)`` log-probabilities of the root's children (any device; the
            returned pool is on the CPU).
        root_state: the state (pre-norm output) of the root's entry.
        depth, top_k: levels and children per expanded node.
        draft_ids: ``(draft_vocab_size,)`` target id of each draft id.
        stop_below: the early stop above (a probability; 0: never).
        keep_expanding: the rule above, asked before each level after the first (None: always);
            the drafter's ``auto`` passes :func:`next_level_pays`.
    """
    # The pool's bookkeeping lives on the CPU: the head's log-probabilities come over once per level.
    draft_ids = draft_ids.cpu()
    k = min(top_k, root_logp.shape[0])
    lp, ix = (x.cpu() for x in root_logp.float().topk(k))
    tokens, parents, scores, logps, depths = [draft_ids[ix]], [torch.full((k,), -1)], [lp], [lp], [torch.ones(k)]
    count = k
    level_nodes = torch.arange(k)  # pool indices of the newest level
    entry_of: dict[int, int] = {}
    ancestors: dict[int, list[int]] = {-1: []}
    states = {-1: root_state}
    entries = 0
    all_parents = parents[0].tolist()
    all_scores = lp.clone()
    all_tokens = tokens[0].clone()
    for level in range(2, depth + 1):
        if stop_below > 0 and float(all_scores[level_nodes].max().exp()) < stop_below:
            break
        # 1a. The top_k nodes of the newest level (by score) are expanded.
        order = all_scores[level_nodes].topk(min(top_k, len(level_nodes))).indices
        if keep_expanding is not None and not keep_expanding(all_scores.exp(), all_scores[level_nodes[order]].exp()):
            break
        frontier = level_nodes[order].tolist()
        anc = []
        for node in frontier:
            p = all_parents[node]
            anc.append(ancestors[p] + ([entry_of[p]] if p >= 0 else []))
        logp, new_states = step(torch.stack([states[all_parents[n]] for n in frontier]), all_tokens[frontier], anc,
                                level)
        for i, node in enumerate(frontier):
            entry_of[node] = entries + i
            ancestors[node] = anc[i]
            states[node] = new_states[i]
        entries += len(frontier)
        # 1b. Each expanded node's top_k children join the pool.
        clp, cix = (x.cpu() for x in logp.float().topk(min(top_k, logp.shape[-1]), -1))  # (f, k)
        child_scores = all_scores[frontier][:, None] + clp
        f, kk = clp.shape
        new_idx = torch.arange(count, count + f * kk)
        tokens.append(draft_ids[cix].reshape(-1))
        parents.append(torch.tensor(frontier).repeat_interleave(kk))
        scores.append(child_scores.reshape(-1))
        logps.append(clp.reshape(-1))
        depths.append(torch.full((f * kk,), float(level)))
        all_parents += parents[-1].tolist()
        all_scores = torch.cat([all_scores, scores[-1]])
        all_tokens = torch.cat([all_tokens, tokens[-1]])
        count += f * kk
        level_nodes = new_idx
    return DraftPool(torch.cat(tokens).long(), torch.cat(parents).long(), torch.cat(scores).float(),
                     torch.cat(logps).float(), torch.cat(depths).long())


def best_rate(values: torch.Tensor, cost: Callable[[int], float], most: int, extra: float = 0.0) -> tuple[int, float]:
    """The n <= ``most`` maximising ``(1 + sum of the n largest values) / (cost(n + 1) + extra)``, and that rate.

    Args:
        values: ``(m,)`` estimated acceptance probability of each node (exp of its score).
        cost: relative cost of verifying q tokens (1.0 at q = 1).
        extra: a cost every size pays alike (relative to a plain step; a draft level still to run).

    Returns:
        ``(n, expected tokens per unit of cost)``; ties go to the smaller n (n = 0: a plain step).
    """
    v = values.float().sort(descending=True).values[:most]
    expected = (1.0 + torch.cumsum(v, 0)).tolist()
    best_n, best = 0, 1.0 / (cost(1) + extra)
    for n in range(1, len(v) + 1):
        score = expected[n - 1] / (cost(n + 1) + extra)
        if score > best:
            best_n, best = n, score
    return best_n, best


def choose_size(values: torch.Tensor, cost: Callable[[int], float], most: int) -> int:
    """``total_tokens = auto``: the n <= ``most`` maximising ``(1 + sum of the n largest values) / cost(n + 1)``
    (:func:`best_rate`)."""
    return best_rate(values, cost, most)[0]


def next_level_pays(values: torch.Tensor, frontier: torch.Tensor, child_probs: torch.Tensor,
                    cost: Callable[[int], float], most: int, level_cost: float) -> bool:
    """Whether one more draft level is expected to raise :func:`best_rate` by more than it costs.

    The level would give each frontier node (value v) children worth about ``v * child_probs[r]``
    (``child_probs``: ``(k,)`` the draft's mean r-th largest child probability, measured on earlier
    expansions). The level is worth running when the best rate over the pool with those children,
    every size paying ``level_cost`` more (one draft call, relative to a plain target step), beats
    the best rate over the pool as it is. It looks one level ahead only (each further level asks
    again). The tree's correctness never depends on it: it only decides how much is drafted.

    Args:
        values: ``(m,)`` every pool node's value; frontier: ``(f,)`` the values of the nodes the
        level would expand; cost, most: as for :func:`best_rate`.
    """
    now = best_rate(values, cost, most)[1]
    guess = (frontier.float()[:, None] * child_probs.float()[None, :]).reshape(-1)
    return best_rate(torch.cat([values.float(), guess]), cost, most, level_cost)[1] > now


def rerank(pool: DraftPool, total_tokens: int) -> tuple[list[int], list[int]]:
    """Step 2 (rerank): the ``total_tokens`` best nodes, in topological order.

    Returns:
        ``(kept, parents)``: pool indices of the kept nodes (by depth, then creation order) and each
        one's parent as an index into ``kept`` (-1: the root).
    """
    n = min(total_tokens, len(pool))
    if n <= 0:
        return [], []
    # Highest score first; on ties the shallower node first, so the kept set holds every ancestor.
    key = pool.scores.double() - pool.depths.double() * 1e-9
    chosen = key.topk(n).indices.tolist()
    kept = sorted(chosen, key=lambda i: (int(pool.depths[i]), i))
    where = {node: i for i, node in enumerate(kept)}
    parents = [where[int(pool.parents[i])] if int(pool.parents[i]) >= 0 else -1 for i in kept]
    return kept, parents


def reference_tree(logp_of_path: Callable[[list[int]], torch.Tensor], depth: int, top_k: int, total_tokens: int,
                   draft_ids: torch.Tensor) -> list[tuple[tuple[int, ...], float]]:
    """The slow obvious EAGLE-2 tree: each node's children from ``logp_of_path(path)`` (the draft run
    from scratch on the path's target ids, no cache), nodes kept as paths.

    Returns:
        The kept nodes as ``(path of target ids, score)``, best first (ties: shallower first).
    """
    pool: list[tuple[tuple[int, ...], float]] = []
    level: list[tuple[tuple[int, ...], float]] = [((), 0.0)]
    for d in range(1, depth + 1):
        if d > 1:  # expand only the top_k nodes of the newest level
            level = sorted(level, key=lambda x: -x[1])[:top_k]
        children = []
        for path, score in level:
            lp = logp_of_path(list(path)).float()
            vals, idx = lp.topk(min(top_k, lp.shape[0]))
            for v, i in zip(vals.tolist(), idx.tolist()):
                children.append((path + (int(draft_ids[i]),), score + v))
        pool += children
        level = children
    pool.sort(key=lambda x: (-x[1], len(x[0])))
    return pool[:total_tokens]
