"""Medusa's per-device tree (``auto``): head accuracies and decoding-step costs measured on this
device, then the tree that maximises expected tokens per unit time (:func:`.trees.choose_tree`).
It runs real decoding steps, so it lives apart from the tree data (:mod:`.trees`)."""

from __future__ import annotations

import statistics
import time

import torch

from ..autoregressive import AutoregressiveDrafter
from ..decoding import GenerationSettings, decode
from ..limits import MAX_MEDUSA_TREE_NODES, MEDUSA_TOP_K
from ..target import CausalLM
from ..theory import ORIGIN_STEPS, VerifyCost
from .drafter import MedusaDrafter
from .trees import TreeChoice, choose_tree, greedy_tree, rank_probs_from_accuracy


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
                      source="decoding steps with each tree size, relative to plain decoding steps",
                      origin=ORIGIN_STEPS)


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
