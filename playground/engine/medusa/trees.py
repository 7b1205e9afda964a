"""Medusa trees: parsing ``tree_choices`` into tree buffers, presets, and choosing a tree for this device from measured costs and head accuracies.

A bigger tree offers more chances that some path is accepted, but verifying it costs more,
and on a CPU the cost of a forward pass grows with its query count much sooner than on a GPU
(measured on a 2-vCPU CPU: 8 tokens ~ 1.3x one token, 64 tokens ~ 3x). So the best tree depends on the
device. :func:`choose_tree` follows Medusa's own tree construction (Cai et al. 2024, section
2.3.3) and Sequoia's reasoning (Chen et al. 2024, "Sequoia: Scalable, Robust, and
Hardware-aware Speculative Decoding"): with ``rank_probs[h][i]`` the probability that head h's
i-th token is the right one, a node's acceptance probability is the product along its path
(heads treated as independent), the expected tokens per step is ``1 + sum over nodes``, and
adding nodes greedily in order of path probability gives the best tree of each size. The
chosen size maximises ``expected tokens per step / cost(size)`` with ``cost`` a decoding step
with that tree measured on this device, relative to a plain decoding step.
"""

from __future__ import annotations

import heapq
import json
from dataclasses import dataclass
from typing import Callable

import torch

from ..limits import MAX_MEDUSA_TREE_NODES, MEDUSA_TOP_K, ChoiceKnob
from ..tree import tree_mask_bool

# ----- tree_choices -> tree buffers ----------------------------------------------------------

class TreeChoicesError(ValueError):
    """A Medusa tree (``tree_choices``) is malformed; the message says what and where."""


def parse_tree_choices(value, num_heads: int | None = None, top_k: int | None = None,
                       max_nodes: int | None = None) -> list[tuple[int, ...]]:
    """Check Medusa ``tree_choices`` and return them sorted by depth, then index path.

    A tree is a list of index paths (Cai et al. 2024, Medusa, section 2.1.2; the reference
    implementation's ``medusa_choices``): path ``[i_1, ..., i_d]`` is the node at depth ``d``
    whose token is head ``d``'s ``i_d``-th most likely token, below the node ``[i_1 .. i_{d-1}]``.
    Example (the seed's depth-3 tree): ``[[0], [0, 0], [0, 1], [0, 0, 0]]``.

    Args:
        value: the paths, or their JSON text.
        num_heads: when given, no path may be deeper than this (depth d is read from head d).
        top_k: bound on every index (default :data:`~playground.engine.limits.MEDUSA_TOP_K`).
        max_nodes: bound on the number of paths (default ``MAX_MEDUSA_TREE_NODES``).

    Returns:
        The paths as tuples, sorted by (depth, path), so that parents come before children.

    Raises:
        TreeChoicesError: malformed JSON, not a list of lists of integers, an empty tree, a
            negative index, an index >= top_k, a path deeper than ``num_heads``, a duplicate
            path, a path whose parent path is missing, or more than ``max_nodes`` paths.
    """
    from ..limits import MAX_MEDUSA_TREE_NODES, MEDUSA_TOP_K

    top_k = MEDUSA_TOP_K if top_k is None else top_k
    max_nodes = MAX_MEDUSA_TREE_NODES if max_nodes is None else max_nodes
    # 1. JSON text -> Python.
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise TreeChoicesError(f"the tree is not valid JSON: {e.msg} at line {e.lineno}, "
                                   f"column {e.colno}") from None
    # 2. Shape: a non-empty list of non-empty lists of integers.
    if not isinstance(value, (list, tuple)):
        raise TreeChoicesError(f"a tree must be a list of paths such as [[0], [0, 0], [1]], "
                               f"got {type(value).__name__}")
    if not value:
        raise TreeChoicesError("the tree is empty: give at least one path, e.g. [[0]]")
    if len(value) > max_nodes:
        raise TreeChoicesError(f"the tree has {len(value)} paths; at most {max_nodes} are allowed")
    paths: list[tuple[int, ...]] = []
    for n, path in enumerate(value):
        if not isinstance(path, (list, tuple)) or not path or \
                not all(isinstance(i, int) and not isinstance(i, bool) for i in path):
            shown = json.dumps(path) if _jsonable(path) else repr(path)
            raise TreeChoicesError(f"path {n} ({shown}) must be a non-empty list of integers")
        # 3. Bounds: indices in [0, top_k), depth <= num_heads.
        if min(path) < 0:
            raise TreeChoicesError(f"path {list(path)} has a negative index; indices count from 0 "
                                   "(0 = the head's most likely token)")
        if max(path) >= top_k:
            raise TreeChoicesError(f"path {list(path)} has index {max(path)}, beyond the heads' top-{top_k}: "
                                   f"indices must be in [0, {top_k - 1}]")
        if num_heads is not None and len(path) > num_heads:
            raise TreeChoicesError(f"path {list(path)} has depth {len(path)}, beyond the {num_heads} Medusa "
                                   f"heads loaded: depth must be in [1, {num_heads}]")
        paths.append(tuple(path))
    # 4. No duplicates, and every parent path present.
    seen: set[tuple[int, ...]] = set()
    for path in paths:
        if path in seen:
            raise TreeChoicesError(f"path {list(path)} appears twice in the tree")
        seen.add(path)
    for path in paths:
        if len(path) > 1 and path[:-1] not in seen:
            raise TreeChoicesError(f"path {list(path)} has no parent: add {list(path[:-1])} "
                                   "(every prefix of a path must be in the tree)")
    return sorted(paths, key=lambda p: (len(p), p))


def _jsonable(x) -> bool:
    try:
        json.dumps(x)
        return True
    except (TypeError, ValueError):
        return False


@dataclass
class TreeBuffers:
    """What a Medusa tree needs at every step (built once per tree, as the reference does).

    Nodes are the sorted paths of :func:`parse_tree_choices`; node i has path ``choices[i]``.

    Attributes:
        choices: ``num_nodes`` index paths, sorted by (depth, path).
        parents: ``(num_nodes,)`` int64 parent node index (-1 = child of the root).
        depths: ``(num_nodes,)`` int64, 1 for children of the root; node i's token comes from
            head ``depths[i]`` (1-based) and sits at position ``prefix length + depths[i]``.
        ranks: ``(num_nodes,)`` int64: node i's token is that head's ``ranks[i]``-th best.
        mask: ``(num_nodes + 1, num_nodes + 1)`` bool tree attention over [root, nodes]
            (:func:`tree_mask_bool`): a query sees itself and its ancestors.
        position_offsets: ``(num_nodes + 1,)`` int64: 0 for the root, then ``depths``;
            position ids are ``prefix length + position_offsets``.
        paths: root-to-leaf node index lists (one per leaf), the candidate sequences the
            reference reads back (``retrieve_indices``).
    """

    choices: list[tuple[int, ...]]
    parents: torch.Tensor
    depths: torch.Tensor
    ranks: torch.Tensor
    mask: torch.Tensor
    position_offsets: torch.Tensor
    paths: list[list[int]]

    def __len__(self) -> int:
        return len(self.choices)

    @property
    def max_depth(self) -> int:
        return int(self.depths.max()) if len(self) else 0

    def nodes_within(self, depth: int) -> int:
        """Number of nodes at depth <= ``depth``: a prefix of the node order (nodes are sorted by depth)."""
        return int((self.depths <= depth).sum())


def tree_buffers(choices) -> TreeBuffers:
    """Build :class:`TreeBuffers` from ``tree_choices`` (checked with :func:`parse_tree_choices`).

    Steps (as the reference's ``generate_medusa_buffers``): 1. sort the paths by depth so that
    parents come first; 2. each node's parent is the node of its path minus the last index;
    3. the attention mask lets each node see its ancestors; 4. positions are prefix length +
    depth; 5. the leaf paths are the candidate sequences.
    """
    paths = parse_tree_choices(choices)
    index = {p: i for i, p in enumerate(paths)}
    parents = torch.tensor([index[p[:-1]] if len(p) > 1 else -1 for p in paths], dtype=torch.long)
    depths = torch.tensor([len(p) for p in paths], dtype=torch.long)
    ranks = torch.tensor([p[-1] for p in paths], dtype=torch.long)
    has_child = {p[:-1] for p in paths if len(p) > 1}
    leaves = [p for p in paths if p not in has_child]
    leaf_paths = [[index[leaf[:d]] for d in range(1, len(leaf) + 1)] for leaf in leaves]
    return TreeBuffers(paths, parents, depths, ranks, tree_mask_bool(parents),
                       torch.cat([torch.zeros(1, dtype=torch.long), depths]), leaf_paths)


# ----- presets and the per-device tree --------------------------------------------------------
MC_SIM_7B_63 = [
    [0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0], [0, 2], [3], [0, 3], [4], [0, 4], [2, 0], [0, 5],
    [0, 0, 1], [5], [0, 6], [6], [0, 7], [0, 1, 0], [1, 1], [7], [0, 8], [0, 0, 2], [3, 0], [0, 9], [8], [9],
    [1, 0, 0], [0, 2, 0], [1, 2], [0, 0, 3], [4, 0], [2, 1], [0, 0, 4], [0, 0, 5], [0, 0, 0, 0], [0, 1, 1],
    [0, 0, 6], [0, 3, 0], [5, 0], [1, 3], [0, 0, 7], [0, 0, 8], [0, 0, 9], [6, 0], [0, 4, 0], [1, 4], [7, 0],
    [0, 1, 2], [2, 0, 0], [3, 1], [2, 2], [8, 0], [0, 5, 0], [1, 5], [1, 0, 1], [0, 2, 1], [9, 0], [0, 6, 0],
    [0, 0, 0, 1], [1, 6], [0, 7, 0],
]
"""The reference implementation's 63-node tree for Vicuna-7B on an A100 (``mc_sim_7b_63``), as data."""

AUTO = "auto"
TREE_PRESETS: dict[str, list[list[int]] | None] = {
    AUTO: None,
    "depth3": [[0], [0, 0], [0, 1], [0, 0, 0]],
    "chain": [[0], [0, 0], [0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0, 0]],
    "cpu_small": [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [0, 0, 0, 0]],
    "mc_sim_7b_63": MC_SIM_7B_63,
}
"""Named trees: ``auto`` (chosen per device by :func:`choose_tree`), the seed's depth-3 example,
a chain of each head's top-1 token, a small tree for CPUs (9 nodes), and the reference's 63-node
tree. Paths deeper than the loaded heads are dropped from a preset (never from a custom tree)."""

TREE_DESCRIPTIONS = {
    AUTO: "chosen for this device from the measured cost of verifying n tokens and the heads' accuracy",
    "depth3": "a small example: 4 nodes, depth 3 (the top-1 chain plus head 2's second choice)",
    "chain": "each head's top-1 token: a chain, one node per head",
    "cpu_small": "9 nodes, depth 4: small enough for a CPU",
    "mc_sim_7b_63": "the reference's 63-node tree (tuned for Vicuna-7B on an A100 GPU)",
}


def _parse_custom(value) -> list[list[int]]:
    return [list(p) for p in parse_tree_choices(value)]


TREE_KNOB = ChoiceKnob("tree_choices", "Tree", tuple(TREE_PRESETS), AUTO,
                       info="Medusa candidate tree: a preset, or a JSON list of index paths "
                            "(path [i, j] = head 2's j-th token below head 1's i-th).",
                       parse=_parse_custom, custom_label="a JSON list of index paths such as [[0], [0, 0], [1]]")


def preset_choices(name: str, num_heads: int) -> list[list[int]]:
    """A named preset's paths, without those deeper than ``num_heads``.

    Raises:
        ValueError: unknown name, or ``auto`` (which needs :func:`choose_tree`).
    """
    if name not in TREE_PRESETS or TREE_PRESETS[name] is None:
        raise ValueError(f"tree preset must be one of {', '.join(p for p in TREE_PRESETS if p != AUTO)}, got {name!r}")
    return [list(p) for p in TREE_PRESETS[name] if len(p) <= num_heads]


# ----- expected tokens per step ------------------------------------------------------------------
def rank_probs_from_accuracy(top_k_accuracy: list[list[float]], top_k: int = MEDUSA_TOP_K) -> list[list[float]]:
    """Per-rank probabilities ``(num_heads, top_k)`` from cumulative top-1..top-k accuracies.

    ``rank_probs[h][i] = acc_h(top-(i+1)) - acc_h(top-i)``: the chance that head h's i-th token is
    the right one. Missing ranks count as 0.
    """
    out = []
    for row in top_k_accuracy:
        cum = [max(0.0, min(1.0, float(a))) for a in row[:top_k]]
        cum = [max(cum[:i + 1]) for i in range(len(cum))]  # cumulative accuracies never decrease
        out.append([cum[0]] + [cum[i] - cum[i - 1] for i in range(1, len(cum))] + [0.0] * (top_k - len(cum)))
    return out


def expected_tokens(choices, rank_probs: list[list[float]]) -> float:
    """Expected tokens per step of a tree: 1 (the bonus token) + sum over nodes of the product of
    ``rank_probs[depth - 1][index]`` along the node's path (its chance of being accepted)."""
    total = 1.0
    for path in choices:
        p = 1.0
        for depth, i in enumerate(path):
            p *= rank_probs[depth][i] if depth < len(rank_probs) and i < len(rank_probs[depth]) else 0.0
        total += p
    return total


def greedy_tree(rank_probs: list[list[float]], max_nodes: int = MAX_MEDUSA_TREE_NODES) -> list[tuple[list[int], float]]:
    """Grow a tree one node at a time, always adding the node with the highest path probability.

    Since a child's probability never exceeds its parent's, the first n nodes form a valid tree
    and maximise expected tokens among trees of n nodes (under independent heads).

    Returns:
        ``[(path, path probability), ...]`` in the order added (at most ``max_nodes``).
    """
    num_heads = len(rank_probs)
    frontier = [(-p, [i]) for i, p in enumerate(rank_probs[0]) if p > 0] if num_heads else []
    heapq.heapify(frontier)
    added: list[tuple[list[int], float]] = []
    while frontier and len(added) < max_nodes:
        # 1. Take the most probable node not yet in the tree; 2. its children become candidates.
        neg, path = heapq.heappop(frontier)
        added.append((path, -neg))
        if len(path) < num_heads:
            for j, q in enumerate(rank_probs[len(path)]):
                if q > 0:
                    heapq.heappush(frontier, (neg * q, path + [j]))
    return added


@dataclass
class TreeChoice:
    """A tree chosen by :func:`choose_tree`.

    Attributes:
        choices: the paths (sorted by depth, then path); empty when no tree beats plain decoding.
        expected_tokens: expected tokens per step (bonus included).
        relative_cost: cost of a step with this tree relative to a plain decoding step.
        score: expected_tokens / relative_cost (expected speedup over autoregressive decoding).
        scores: score of the best tree of each size n = 0, 1, ... (for charts).
        fallback: no tree beat plain decoding, so the smallest tree ``[[0]]`` stands in.
    """

    choices: list[list[int]]
    expected_tokens: float
    relative_cost: float
    score: float
    scores: list[float]
    fallback: bool = False

    def describe(self) -> str:
        depth = max((len(p) for p in self.choices), default=0)
        if self.fallback:
            return (f"{len(self.choices)} node: no tree is expected to beat plain decoding with these heads on "
                    "this device (their accuracy is too low for the cost of verifying)")
        nodes = f"{len(self.choices)} {'node' if len(self.choices) == 1 else 'nodes'}"
        return (f"{nodes}, depth {depth}: expected {self.expected_tokens:.2f} tokens per step at "
                f"{self.relative_cost:.2f}x the cost of a plain decoding step (expected speedup {self.score:.2f}x)")


def choose_tree(rank_probs: list[list[float]], cost: Callable[[int], float], max_nodes: int = MAX_MEDUSA_TREE_NODES,
                head_cost: float = 0.0) -> TreeChoice:
    """The tree maximising expected tokens per step over step cost.

    Args:
        rank_probs: ``(num_heads, top_k)`` per-rank acceptance probabilities
            (:func:`rank_probs_from_accuracy`).
        cost: ``cost(q)`` = time of a target forward over q query tokens relative to q = 1.
        max_nodes: largest tree considered.
        head_cost: one head's own cost per step, relative to a one-token forward (a tree of
            depth d runs d heads).

    Steps: 1. grow the tree greedily (:func:`greedy_tree`); 2. for each size n, score =
    (1 + sum of the first n path probabilities) / (cost(n + 1) + depth * head_cost), and n = 0 scores 1
    (plain decoding); 3. keep the best size.
    """
    grown = greedy_tree(rank_probs, max_nodes)
    scores, best_n, expected = [1.0], 0, 1.0
    best = (1.0, 1.0, 1.0)  # (score, expected, cost)
    depth = 0
    for n, (path, p) in enumerate(grown, start=1):
        expected += p
        depth = max(depth, len(path))
        step_cost = cost(n + 1) + depth * head_cost
        score = expected / step_cost
        scores.append(score)
        if score > best[0]:
            best, best_n = (score, expected, step_cost), n
    choices = sorted((path for path, _ in grown[:best_n]), key=lambda p: (len(p), p))
    return TreeChoice(choices, best[1], best[2], best[0], scores)


# ----- measuring this device ---------------------------------------------------------------------
