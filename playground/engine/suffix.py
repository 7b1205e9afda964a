"""Suffix decoding: suffix trees over this request and earlier outputs propose a frequency-scored tree.

Source: Oliaro, Jia, Campos, Qiao 2024, "SuffixDecoding: Extreme Speculative Decoding for Emerging
AI Applications" (arXiv 2411.04975); reference implementations: Snowflake's Arctic Inference
(``arctic_inference.suffix_decoding``) and vLLM's suffix proposer, which wraps it. Facts taken
from them, code written here:

1. Two suffix trees: a **per-request** tree over the prompt and the output so far, and a **global**
   tree over earlier outputs (a bounded cache; the oldest output is evicted first). Each is a
   suffix trie cut at depth ``max_depth``: every substring of length <= ``max_depth`` is a path,
   and a node's ``count`` is how often its substring occurs.
2. Each step, the longest suffix of the current sequence that is a path in a tree (the *pattern*,
   at most ``max_match`` tokens) is found.
3. From the pattern's node a speculation tree grows best-first: a child's conditional frequency
   is ``count(child) / count(node)``, a node's score is the product along its path, nodes whose
   score falls below ``min_token_prob`` are not added, and at most
   ``max_spec_factor * match_length + max_spec_offset`` nodes (and ``max_spec_tokens``) are kept:
   longer matches speculate further (the paper's adaptive speculation length).
4. The candidate tree of the best-scoring pattern length and tree (sum of node scores: the
   expected accepted tokens) is proposed.

The proposal is deterministic, so under sampling the verifier uses the one-hot rule; the output
is the target's either way.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from math import ceil

import torch

from .budget import AcceptanceEstimator, probability_bin, with_budget_knob
from .step_cost import build_with_budget
from .drafter import DecodeState, Drafter, StepResult
from .events import SOURCE_TARGET
from .limits import Knob
from .registry import MethodInfo, register
from .tree import Candidates

SOURCE_SUFFIX = "suffix"
"""Tokens accepted from a suffix tree (this request's or the global cache)."""

MAX_SUFFIX_DEPTH = 64
"""Deepest suffix trie (pattern plus speculation, in tokens)."""
MAX_SUFFIX_SPEC_TOKENS = 32
"""Most candidate nodes suffix decoding proposes per step."""
MAX_SUFFIX_CACHE_OUTPUTS = 4096
"""Most earlier outputs the global suffix tree keeps."""

SUFFIX_DEPTH_KNOB = Knob("max_depth", "Tree depth", 4, MAX_SUFFIX_DEPTH, 32,
                         info="Suffix decoding: depth of the suffix tries (pattern plus speculation, tokens).")
SUFFIX_SPEC_KNOB = Knob("max_spec_tokens", "Max speculated tokens", 1, MAX_SUFFIX_SPEC_TOKENS, 16,
                        info="Suffix decoding: most candidate nodes per step.")
# 2.0, not the reference implementations' 1.0: faster here with the budget pruning (docs/suffix.md).
SUFFIX_FACTOR_KNOB = Knob("max_spec_factor", "Speculation per matched token", 0.0, 8.0, 2.0, step=0.1, integer=False,
                          info="Suffix decoding: speculate at most factor x match length (+ 1) nodes.")
SUFFIX_MIN_PROB_KNOB = Knob("min_token_prob", "Min token probability", 0.0, 1.0, 0.1, step=0.01, integer=False,
                            info="Suffix decoding: drop nodes whose frequency-estimated path probability is lower.")
SUFFIX_CACHE_KNOB = Knob("cache_outputs", "Global cache (outputs)", 0, MAX_SUFFIX_CACHE_OUTPUTS, 256,
                         info="Suffix decoding: earlier outputs kept in the global suffix tree (0 = this request only).")
SUFFIX_KNOBS = (SUFFIX_DEPTH_KNOB, SUFFIX_SPEC_KNOB, SUFFIX_FACTOR_KNOB, SUFFIX_MIN_PROB_KNOB, SUFFIX_CACHE_KNOB)
MAX_MATCH = 16
"""Longest pattern matched (tokens); the rest of the depth is room to speculate."""

DEPTH_PRIOR = {"local": (0.38, 0.68, 0.9), "global": (0.3, 0.43, 0.43)}
"""Suffix decoding's prior that a node is accepted (its parent accepted), per unit of the suffix
tree's frequency c, by tree and depth 1, 2, 3+: ``c * DEPTH_PRIOR[tree][min(depth, 3) - 1]``.

Fitted on the verdicts of every tested node (``budget off``, 64 new tokens) over 40 of the default
target's own answers to self-generated requests (``data/selfgen/default``, 5 of each kind, no
benchmark text, each answer's output joining the global cache), 2026-12-07: the first token of a
match is the risky one (this request's tree: accepted 0.41 of the time at c = 1; the global cache:
0.26), while a match that has held runs on (this request's tree at depth 3: 0.83, depth 4 and
deeper: 0.93). The former prior, ``0.8 c`` at every depth, was 1.5 times the outcome overall and
twice it at depth 1, the bulk of the nodes: on the dev set's first writing question a fresh
estimator verified two or three nodes on 20 of 64 steps, none accepted. Speed was level with the
former prior in a same-run A/B on the dev set (docs/budget.md)."""


class SuffixTree:
    """A suffix trie cut at ``max_depth`` over one or more token sequences, with counts.

    ``count(node)`` of the node reached by substring s is the number of start positions at which s
    occurs in the sequences held (so a child's count over its parent's is the frequency with
    which the parent's substring continues with the child's token). Appending a token costs
    O(max_depth); removing a sequence O(len * max_depth).

    Nodes are integer ids (the root is 0): ``counts[id]`` and ``kids[id]`` (token -> child id).
    Dicts and lists of plain ints are not objects Python's cyclic garbage collector tracks, so a
    trie of a million nodes adds two lists to each full collection, not two million objects: with
    one object per node, full collections over the global cache took 0.1-0.3 s and stalled whichever
    method was stepping (the 2-vCPU EPYC, 2026-12-02).

    Args:
        max_depth: the deepest path kept.

    Raises:
        ValueError: ``max_depth`` below 1, or an unknown sequence id.
    """

    root = 0

    def __init__(self, max_depth: int):
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        self.max_depth = max_depth
        self.counts: list[int] = [0]
        self.kids: list[dict[int, int]] = [{}]
        self.free: list[int] = []  # ids of removed nodes, reused first
        self.seqs: dict[object, list[int]] = {}
        self.active: dict[object, list[int]] = {}  # per sequence: nodes of its open suffixes (< max_depth)

    def _new_node(self) -> int:
        if self.free:
            i = self.free.pop()
            self.counts[i], self.kids[i] = 0, {}
            return i
        self.counts.append(0)
        self.kids.append({})
        return len(self.counts) - 1

    def count(self, node: int) -> int:
        """Occurrences of ``node``'s substring."""
        return self.counts[node]

    def children(self, node: int) -> dict[int, int]:
        """``node``'s children: token -> child id (do not modify)."""
        return self.kids[node]

    def extend(self, seq_id, tokens: list[int]) -> None:
        """Append ``tokens`` to sequence ``seq_id`` (a new sequence when unknown)."""
        seq = self.seqs.setdefault(seq_id, [])
        active = self.active.setdefault(seq_id, [])
        counts, kids = self.counts, self.kids
        keep = self.max_depth - 1
        for t in tokens:
            t = int(t)
            seq.append(t)
            nxt = []
            # Every open suffix (and the new one starting at t) grows by t.
            for node in active + [0]:
                child = kids[node].get(t)
                if child is None:
                    child = kids[node][t] = self._new_node()
                counts[child] += 1
                nxt.append(child)
            # The suffix that reached max_depth is closed (the oldest, first in the list).
            self.active[seq_id] = active = nxt[-keep:] if keep > 0 else []

    def remove(self, seq_id) -> None:
        """Forget sequence ``seq_id``: every substring of it is counted once less (empty nodes go)."""
        seq = self.seqs.pop(seq_id, None)
        if seq is None:
            raise ValueError(f"no sequence {seq_id!r} in the suffix tree")
        self.active.pop(seq_id, None)
        counts, kids = self.counts, self.kids
        for i in range(len(seq)):
            node = 0
            for t in seq[i:i + self.max_depth]:
                child = kids[node][t]
                counts[child] -= 1
                if counts[child] == 0:  # this start position was its only occurrence: the subtree goes
                    del kids[node][t]
                    stack = [child]
                    while stack:
                        n = stack.pop()
                        stack.extend(kids[n].values())
                        kids[n] = {}
                        self.free.append(n)
                    break
                node = child

    def node(self, pattern: list[int]) -> int | None:
        """The node id of ``pattern`` (None when it never occurred)."""
        node = 0
        for t in pattern:
            node = self.kids[node].get(t)
            if node is None:
                return None
        return node

    def longest_match(self, context: list[int], max_match: int, min_count: int = 1) -> int:
        """Length of the longest suffix of ``context`` (at most ``max_match``) that is a path
        occurring at least ``min_count`` times (2 in a tree that holds ``context`` itself).

        This is monotone in the length (a substring's suffix occurs at least as often), so a
        binary search over lengths finds it in O(max_match log max_match)."""
        lo, hi = 0, min(max_match, len(context), self.max_depth)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            node = self.node(context[len(context) - mid:])
            if node is not None and self.counts[node] >= min_count:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def speculate(self, context: list[int], match_len: int, max_nodes: int, max_depth: int,
                  min_prob: float, discount: int = 0) -> tuple[list[int], list[int], list[float], float]:
        """Grow the speculation tree after the pattern ``context[-match_len:]`` best-first.

        ``discount`` occurrences of the pattern are taken off its count (1 in a tree holding
        ``context`` itself: the pattern's own occurrence at the end has no continuation yet).

        Returns:
            ``(tokens, parents, conditional frequencies, score)``: nodes in the order added (parents
            first), each node's ``count(child) / count(parent)``, and the sum of path products.
        """
        start = self.node(context[len(context) - match_len:]) if match_len else None
        if start is None or not self.kids[start] or max_nodes <= 0 or max_depth <= 0:
            return [], [], [], 0.0
        counts, kids = self.counts, self.kids
        depth_room = min(max_depth, self.max_depth - match_len)
        tokens, parents, conds, score = [], [], [], 0.0
        heap: list = []
        counter = 0

        def push(node: int, index: int, prob: float, depth: int, discount: int = 0):
            nonlocal counter
            total = counts[node] - discount
            if depth >= depth_room or total <= 0:
                return
            for t, child in kids[node].items():
                cond = min(1.0, counts[child] / total)
                p = prob * cond
                if p >= min_prob:
                    heapq.heappush(heap, (-p, counter, t, child, index, cond, depth + 1))
                    counter += 1

        push(start, -1, 1.0, 0, discount)
        while heap and len(tokens) < max_nodes:
            neg_p, _, t, child, parent, cond, depth = heapq.heappop(heap)
            tokens.append(t)
            parents.append(parent)
            conds.append(cond)
            score += -neg_p
            push(child, len(tokens) - 1, -neg_p, depth)
        return tokens, parents, conds, score

    def num_nodes(self) -> int:
        """Nodes in the trie (root excluded)."""
        return len(self.counts) - 1 - len(self.free)


def reference_counts(seqs: list[list[int]], max_depth: int) -> dict[tuple[int, ...], int]:
    """Slow obvious reference of :class:`SuffixTree` counts: every substring (length <= max_depth)
    of every sequence, counted by start position."""
    out: dict[tuple[int, ...], int] = {}
    for seq in seqs:
        for i in range(len(seq)):
            for j in range(i + 1, min(len(seq), i + max_depth) + 1):
                key = tuple(seq[i:j])
                out[key] = out.get(key, 0) + 1
    return out


class SuffixCache:
    """The global suffix tree over earlier outputs, bounded to ``max_outputs`` (oldest evicted first).

    One per Engine and method (``engine.persistent``), so suffix decoding learns across runs.
    """

    def __init__(self, max_depth: int = SUFFIX_DEPTH_KNOB.default, max_outputs: int = SUFFIX_CACHE_KNOB.default):
        self.tree = SuffixTree(max_depth)
        self.max_outputs = max_outputs
        self.order: OrderedDict[int, None] = OrderedDict()
        self.next_id = 0

    def add(self, output: list[int]) -> None:
        """Add one finished output (then evict the oldest beyond ``max_outputs``)."""
        if self.max_outputs <= 0 or not output:
            return
        seq_id, self.next_id = self.next_id, self.next_id + 1
        self.tree.extend(seq_id, list(output))
        self.order[seq_id] = None
        while len(self.order) > self.max_outputs:
            old, _ = self.order.popitem(last=False)
            self.tree.remove(old)

    def __len__(self) -> int:
        return len(self.order)


class SuffixDrafter(Drafter):
    """Suffix decoding as a drafter (see the module docstring).

    Args:
        max_depth, max_spec_tokens, max_spec_factor, min_token_prob, cache_outputs: the knobs
            (:data:`SUFFIX_KNOBS`).
        cache: the global :class:`SuffixCache` kept across runs; None: a private one (learns
            across runs of this drafter object only).

    Raises:
        ValueError: a knob out of its bound.
    """

    name = "suffix"
    source = SOURCE_SUFFIX

    def __init__(self, max_depth: int = SUFFIX_DEPTH_KNOB.default, max_spec_tokens: int = SUFFIX_SPEC_KNOB.default,
                 max_spec_factor: float = SUFFIX_FACTOR_KNOB.default,
                 min_token_prob: float = SUFFIX_MIN_PROB_KNOB.default,
                 cache_outputs: int = SUFFIX_CACHE_KNOB.default, cache: SuffixCache | None = None):
        self.max_depth = SUFFIX_DEPTH_KNOB.check(max_depth)
        self.max_spec_tokens = SUFFIX_SPEC_KNOB.check(max_spec_tokens)
        self.max_spec_factor = SUFFIX_FACTOR_KNOB.check(max_spec_factor)
        self.min_token_prob = SUFFIX_MIN_PROB_KNOB.check(min_token_prob)
        cache_outputs = SUFFIX_CACHE_KNOB.check(cache_outputs)
        self.cache = cache if cache is not None else SuffixCache(self.max_depth, cache_outputs)
        self.cache.max_outputs = cache_outputs
        self.estimator = AcceptanceEstimator()
        self.begin([])

    def begin(self, prompt_ids: list[int]) -> None:
        self.local = SuffixTree(self.max_depth)
        self.local.extend(0, list(prompt_ids))
        self.seen = len(prompt_ids)
        self.hits = {"local": 0, "global": 0}
        self.last_tree = None

    def _sync(self, tokens: list[int]) -> None:
        if len(tokens) > self.seen:
            self.local.extend(0, tokens[self.seen:])
            self.seen = len(tokens)

    def propose(self, state: DecodeState) -> Candidates:
        """The best frequency-scored tree of either suffix tree (at most ``state.budget`` deep)."""
        # The per-request tree holds every committed token; the root (tokens[-1]) is added too.
        self._sync(state.tokens)
        if state.budget <= 0:
            return Candidates.empty(state.device)
        best = ([], [], [], 0.0, None)
        for name, tree in (("local", self.local), ("global", self.cache.tree)):
            if name == "global" and not self.cache.order:
                continue
            context = state.tokens
            # The local tree holds the context itself: a real match needs the pattern earlier too
            # (count >= 2, and its own last occurrence off the count); the global one, other outputs.
            own = 1 if name == "local" else 0
            longest = tree.longest_match(context, MAX_MATCH, 1 + own)
            for m in range(longest, 0, -1):
                limit = min(self.max_spec_tokens, ceil(self.max_spec_factor * m + 1))
                toks, pars, conds, score = tree.speculate(context, m, limit, state.budget, self.min_token_prob, own)
                if score > best[3]:
                    best = (toks, pars, conds, score, name)
                if m <= longest - 3:  # shorter patterns rarely score higher; bound the work
                    break
        toks, pars, conds, _, name = best
        self.last_tree = name
        if not toks:
            return Candidates.empty(state.device)
        cand = Candidates(torch.tensor(toks, dtype=torch.long), torch.tensor(pars, dtype=torch.long),
                          [self.source] * len(toks))
        depths = cand.depths()
        keys = [(name, probability_bin(c), min(d, 4)) for c, d in zip(conds, depths)]
        priors = [c * DEPTH_PRIOR[name][min(d, 3) - 1] for c, d in zip(conds, depths)]
        cand.accept_probs = self.estimator.estimate(cand, keys, priors)
        if cand.tokens.device != torch.device(state.device):
            cand = Candidates(cand.tokens.to(state.device), cand.parents.to(state.device), cand.sources,
                              accept_probs=cand.accept_probs)
        return cand

    def update(self, result: StepResult) -> None:
        self.estimator.observe(result)
        if result.path and self.last_tree:
            self.hits[self.last_tree] += 1

    def finish(self, tokens: list[int], prompt_len: int) -> None:
        """Add this run's output to the global cache (it learns across runs)."""
        self.cache.add(tokens[prompt_len:])

    def info(self) -> dict[str, int]:
        return {"cached_outputs": len(self.cache), "local_hits": self.hits["local"],
                "global_hits": self.hits["global"]}


def build_suffix(engine, params: dict, owner: str = "suffix") -> SuffixDrafter:
    """A :class:`SuffixDrafter` whose global cache is the engine's, kept under ``learned/<owner>/``:
    each method that runs suffix decoding (``suffix``, a mixture) learns only from its own outputs
    (the benchmark forgets ``learned/`` after warm-up)."""
    key = f"learned/{owner}/suffix/" + ",".join(f"{k}={params[k]}" for k in sorted(params))

    def make(p: dict) -> SuffixDrafter:
        # One cache per owner and settings (the budget included): no two methods share state.
        cache = engine.persistent(key, lambda: SuffixCache(p["max_depth"], p["cache_outputs"]))
        return SuffixDrafter(**p, cache=cache)
    return build_with_budget(engine, params, make, owner)


METHOD = SUFFIX_METHOD = register(MethodInfo(
    name="suffix", label="Suffix decoding",
    description="Suffix trees over the prompt, the output so far and earlier outputs propose a frequency-scored "
                "tree; longer matches speculate further (Oliaro et al. 2024). Learns across runs (on the page, each "
                "browser tab from its own).",
    lossless=True, knobs=with_budget_knob(SUFFIX_KNOBS), sources=(SOURCE_TARGET, SOURCE_SUFFIX),
    source_labels={SOURCE_SUFFIX: "suffix tree"}, build=build_suffix, learns_across_runs=True))
