"""Medusa tree presets, and choosing a tree for this device from measured costs and head accuracies.

A bigger tree offers more chances that some path is accepted, but verifying it costs more,
and on a CPU the cost of a forward pass grows with its query count much sooner than on a GPU
(notes.md: 8 tokens ~ 1.3x one token, 64 tokens ~ 3x here). So the best tree depends on the
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
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from .limits import MAX_MEDUSA_TREE_NODES, MEDUSA_TOP_K, ChoiceKnob
from .target import CausalLM
from .theory import VerifyCost
from .tree import parse_tree_choices

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
STEP_COST_NODES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
"""Tree sizes (nodes) whose decoding step is timed by :func:`measure_step_cost` (interpolated in between)."""


@torch.inference_mode()
def measure_head_accuracy(target: CausalLM, heads, prompt_ids: list[int], new_tokens: int = 48,
                          top_k: int = MEDUSA_TOP_K) -> list[list[float]]:
    """Top-1..top-k accuracy of each head on the target's own greedy continuation of a prompt.

    Steps: 1. greedy-decode ``new_tokens`` tokens, keeping the last hidden state of every
    position; 2. at each position t of the continuation, head k (0-based) is right at rank r when
    its r-th token is the token at t + k + 2; 3. cumulative accuracies per head.

    Returns:
        ``(num_heads, top_k)`` cumulative accuracies (row h, column i: top-(i+1) accuracy).
    """
    cache = target.new_cache()
    logits, hidden = target.forward(cache, torch.tensor(prompt_ids, dtype=torch.long), return_hidden=True)
    tokens, states = list(prompt_ids), [hidden[-1]]
    for _ in range(new_tokens):
        tokens.append(int(logits[-1].argmax()))
        logits, hidden = target.forward(cache, torch.tensor(tokens[-1:]), return_hidden=True)
        states.append(hidden[-1])
    start = len(prompt_ids) - 1  # states[i] is the hidden state at position start + i
    top = torch.topk(heads(torch.stack(states))[..., :target.vocab_size], top_k, dim=-1).indices.cpu()
    counts = [[0] * top_k for _ in range(heads.num_heads)]
    totals = [0] * heads.num_heads
    for i in range(len(states)):
        for k in range(heads.num_heads):
            pos = start + i + k + 2
            if pos >= len(tokens):
                break
            totals[k] += 1
            hit = (top[i, k] == tokens[pos]).nonzero()
            if len(hit):
                for r in range(int(hit[0, 0]), top_k):
                    counts[k][r] += 1
    return [[c / t if t else 0.0 for c in row] for row, t in zip(counts, totals)]


@torch.inference_mode()
def measure_step_cost(target: CausalLM, heads, paths: list[list[int]], prompt_ids: list[int],
                      nodes: tuple[int, ...] = STEP_COST_NODES, rounds: int = 10,
                      useful_below: float | None = None) -> VerifyCost:
    """Time real Medusa decoding steps with the first n of ``paths`` as the tree, for each n in
    ``nodes``, against plain decoding steps; the relative costs, keyed by query count n + 1.

    A whole step is timed, as the benchmark times it: the heads, the tree-masked forward pass,
    verification and the cache commit. Timing the forward pass alone, with nothing between
    passes, underestimated a tree step on a 2-vCPU CPU (bfloat16, 7 nodes: 1.1x one token alone,
    1.28x as a decoding step), and the planner then chose trees that lost to smaller ones.

    Steps: 1. start one greedy decode of ``prompt_ids`` per tree size, plus one plain decode;
    2. for ``rounds`` rounds step each of them once in turn (round-robin, so that drift in the
    machine's speed hits all alike; the first two steps are not timed); 3. cost(n + 1) = median
    step time with n nodes / median plain step time.

    Args:
        target: the target (the heads attached to its output layer).
        heads: the :class:`~playground.engine.medusa.MedusaHeads`.
        paths: candidate paths in growth order (:func:`greedy_tree`); each prefix is a valid tree.
        prompt_ids: ``(prompt_len,)`` a chat prompt to decode from.
        nodes: tree sizes to time (those beyond ``len(paths)`` are skipped).
        rounds: timed steps per size (the median is kept).
        useful_below: when given, a size whose cost after three timed rounds exceeds it (no tree
            can then pay off: e.g. the expected tokens per step of the biggest tree) is timed no
            more, nor is any bigger size; they keep that estimate.

    Returns:
        :class:`~playground.engine.theory.VerifyCost` with ``table`` q -> relative cost (q = 1:
        plain decoding) and ``seconds`` q -> median seconds per step.

    Raises:
        ValueError: an empty prompt or ``rounds`` below 1.
    """
    from .autoregressive import AutoregressiveDrafter
    from .decoding import GenerationSettings, decode
    from .medusa import MedusaDrafter

    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    sizes = [0] + sorted({n for n in nodes if 1 <= n <= len(paths)})
    settings = GenerationSettings(max_new_tokens=(rounds + 3) * (1 + heads.num_heads))
    runs = {}
    for n in sizes:
        drafter = (AutoregressiveDrafter() if n == 0 else
                   MedusaDrafter(heads, sorted(paths[:n], key=lambda p: (len(p), p))))
        runs[n] = decode(target, drafter, prompt_ids, settings)  # no EOS: every run lasts
    times: dict[int, list[float]] = {n: [] for n in sizes}
    active = list(sizes)
    for r in range(rounds + 2):
        for n in active:
            event = next(runs[n], None)
            if event is not None and event.step > 1 and not event.finished:
                times[n].append(event.seconds)
        if useful_below is not None and r == 4:  # three timed steps each: drop hopeless sizes
            base = statistics.median(times[0])
            hopeless = [n for n in active if n and statistics.median(times[n]) / base > useful_below]
            if hopeless:
                active = [n for n in active if n < min(hopeless)]
    seconds = {n + 1: statistics.median(t) for n, t in times.items() if t}
    return VerifyCost({q: s / seconds[1] for q, s in seconds.items()}, seconds,
                      source="decoding steps with each tree size, relative to plain decoding steps")


def auto_tree(target: CausalLM, heads, calibration_ids: list[int], max_nodes: int = MAX_MEDUSA_TREE_NODES,
              rounds: int = 10) -> tuple[TreeChoice, dict]:
    """Choose a tree for this device: the heads' accuracy (from their ``config.json`` when training
    recorded it, else measured on ``calibration_ids``) and the measured cost of decoding steps
    with the candidate trees (:func:`measure_step_cost`, on ``calibration_ids``; the heads' own
    time is inside those steps).

    Returns:
        The :class:`TreeChoice` and a dict of what was measured (``seconds`` per query count,
        ``cost`` per query count, ``accuracy``, ``accuracy_source``, ``measure_s``).

    Raises:
        ValueError: an empty calibration prompt.
    """
    if not calibration_ids:
        raise ValueError("auto tree: a calibration prompt is needed to time decoding steps")
    t0 = time.perf_counter()
    if heads.top_k_accuracy is not None:
        accuracy, source = heads.top_k_accuracy, "recorded at training on a held-out split"
    else:
        accuracy, source = measure_head_accuracy(target, heads, calibration_ids), "measured on a calibration prompt"
    rank_probs = rank_probs_from_accuracy(accuracy)
    grown = greedy_tree(rank_probs, max_nodes)
    paths = [path for path, _ in grown]
    # A step over more nodes never costs less: noise must not make a bigger tree look cheaper.
    cost = measure_step_cost(target, heads, paths, calibration_ids, rounds=rounds,
                             useful_below=1 + sum(p for _, p in grown)).monotone()
    choice = choose_tree(rank_probs, cost, max_nodes)
    if not choice.choices:  # plain decoding wins: still propose the top-1 chain's first node
        choice.choices, choice.fallback = [[0]], True
    info = {"seconds": dict(cost.seconds), "cost": dict(cost.table), "accuracy": accuracy,
            "accuracy_source": source, "measure_s": time.perf_counter() - t0}
    return choice, info
