"""Lookahead decoding: Jacobi iterations generate n-grams; those starting with the root are verified.

Source: Fu, Bailis, Stoica, Zhang 2024, "Break the Sequential Dependency of LLM Inference Using
Lookahead Decoding" (ICML; reference implementation hao-ai-lab/LookaheadDecoding). Each step is
**one** target forward pass over three groups of queries:

* the *root* (the last emitted token, at position ``past_len``);
* the *verification branch*: up to ``G`` (guess_set_size) candidate continuations of
  ``N - 1`` tokens from the n-gram pool whose key is the root, merged into a prefix tree
  (a :class:`~playground.engine.tree.Candidates`); candidate node at depth d sits at
  ``past_len + d`` and sees the prefix, the root and its ancestors only;
* the *lookahead branch* (extra queries, :class:`~playground.engine.tree.ExtraQueries`): a
  2D window of ``N - 1`` Jacobi levels x ``W`` (window) columns. Level 0 holds the current
  guesses, level ``l`` the guesses ``l`` Jacobi iterations newer. The token at level ``l``,
  column ``j`` sits at ``past_len + 1 + j + l`` and sees the prefix, the root, the level-0
  tokens of columns ``0..j`` and the tokens of levels ``1..l`` in its own column: its context
  is then the contiguous positions ``past_len .. past_len + 1 + j + l``, so every column is one
  n-gram trajectory through the Jacobi iterations.

After the pass (:meth:`LookaheadDrafter.update`): the argmax at the newest level gives the next
Jacobi level; each column (oldest level .. newest output) is an n-gram that goes into the pool;
the oldest level is dropped; the verifier's accepted path (greedy longest match, or the one-hot
speculative-sampling rule, since the pool is deterministic) moves the root, and the window's
columns shift left by the same amount (fresh columns are random prompt tokens, as in the
reference). The target's output is exactly autoregressive decoding's: the window only changes
what is proposed, never what is accepted.
"""

from __future__ import annotations

import random

import torch

from .budget import AcceptanceEstimator, DraftGate, GateMemory, StepCost, with_budget_knob

from .drafter import DecodeState, Drafter, StepResult
from .events import SOURCE_LOOKAHEAD, SOURCE_TARGET
from .limits import LOOKAHEAD_GUESS_KNOB, LOOKAHEAD_KNOBS, LOOKAHEAD_NGRAM_KNOB, LOOKAHEAD_WINDOW_KNOB
from .tree import Candidates, ExtraQueries
from .registry import MethodInfo, register
from .step_cost import build_with_budget

LOOKAHEAD_PRESETS: dict[str, dict[str, int]] = {
    "cpu": dict(window=2, ngram_size=3, guess_set_size=3),
    "7b": dict(window=15, ngram_size=5, guess_set_size=15),
    "13b": dict(window=10, ngram_size=5, guess_set_size=10),
    "33b": dict(window=7, ngram_size=5, guess_set_size=7),
}
"""(W, N, G): the paper's settings for 7B / 13B / 33B models on a GPU (G = W), and a small CPU
setting, also the knobs' default: 11 tokens per pass, which cost about 1.4 single-token forwards
on the development CPU (fp32, oneDNN layers); in a sweep there, larger windows raised tau but lost
more in cost than they gained (docs/lookahead.md)."""


class NgramPool:
    """The n-gram pool: for each key token, at most ``guess_set_size`` continuations of
    ``ngram_size - 1`` tokens, most recent kept (an n-gram seen again moves to the newest slot).

    Attributes:
        table: key token -> continuations, oldest first.
    """

    def __init__(self, ngram_size: int, guess_set_size: int):
        self.ngram_size = ngram_size
        self.guess_set_size = guess_set_size
        self.table: dict[int, list[tuple[int, ...]]] = {}
        self._size = 0  # n-grams held (kept up to date by add)

    def add(self, ngram: list[int] | tuple[int, ...]) -> None:
        """Insert one n-gram ``(ngram_size,)``: key ``ngram[0]``, continuation ``ngram[1:]``."""
        if len(ngram) != self.ngram_size:
            raise ValueError(f"an n-gram must have {self.ngram_size} tokens, got {len(ngram)}")
        entries = self.table.setdefault(int(ngram[0]), [])
        value = tuple(int(t) for t in ngram[1:])
        # 1. Dedup: a repeated n-gram becomes the most recent. 2. Evict the oldest beyond G.
        if value in entries:
            entries.remove(value)
            self._size -= 1
        entries.append(value)
        self._size += 1
        if len(entries) > self.guess_set_size:
            del entries[0]
            self._size -= 1

    def add_sequence(self, tokens: list[int]) -> None:
        """Insert every n-gram of ``tokens`` (e.g. the prompt), in order."""
        for i in range(len(tokens) - self.ngram_size + 1):
            self.add(tokens[i:i + self.ngram_size])

    def lookup(self, key: int) -> list[tuple[int, ...]]:
        """Continuations of ``key``, most recent first (at most ``guess_set_size``)."""
        return list(reversed(self.table.get(int(key), [])))

    def __len__(self) -> int:
        return self._size


def candidate_tree(continuations: list[tuple[int, ...]], budget: int, source: str = SOURCE_LOOKAHEAD,
                   device: torch.device | str = "cpu") -> Candidates:
    """Merge continuations of the root into a prefix tree, each cut to ``budget`` tokens.

    Shared prefixes become one node, so siblings are distinct tokens and greedy verification
    (first matching child) finds the longest matching continuation.

    Returns:
        :class:`Candidates` of ``num_nodes`` <= ``len(continuations) * budget`` tokens.
    """
    tokens: list[int] = []
    parents: list[int] = []
    node_of: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    for cont in continuations:
        parent = -1
        for tok in cont[:max(budget, 0)]:
            # 1. Reuse the node when this prefix exists; 2. else add a child.
            if (parent, tok) not in node_of:
                node_of[(parent, tok)] = len(tokens)
                tokens.append(tok)
                parents.append(parent)
            parent = node_of[(parent, tok)]
    return Candidates(torch.tensor(tokens, dtype=torch.long, device=device),
                      torch.tensor(parents, dtype=torch.long, device=device), [source] * len(tokens))


def lookahead_attention(window: int, num_levels: int, num_nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask rows and position offsets of the lookahead branch (Fu et al. 2024, Fig. 2).

    Extra query ``l * window + j`` is level ``l``, column ``j``. It sees the root, the level-0
    tokens of columns ``0..j`` and the levels ``1..l`` of column ``j`` (itself included); never
    the candidates.

    Args:
        window: W, columns per level.
        num_levels: levels present (``N - 1`` once warmed up; fewer during the first steps).
        num_nodes: candidates in the same pass (their columns stay blocked).

    Returns:
        ``attention``: ``(m, 1 + num_nodes + m)`` bool over ``[root, candidates, extras]`` with
        ``m = num_levels * window``; ``positions``: ``(m,)`` offsets from the root, ``1 + j + l``.
    """
    m = num_levels * window
    attention = torch.zeros(m, 1 + num_nodes + m, dtype=torch.bool)
    positions = torch.zeros(m, dtype=torch.long)
    base = 1 + num_nodes  # column of extra 0 in the pass
    for level in range(num_levels):
        for j in range(window):
            row = level * window + j
            # 1. The root (and through the cache, the prefix).
            attention[row, 0] = True
            # 2. Level-0 tokens of columns 0..j.
            attention[row, base:base + j + 1] = True
            # 3. Levels 1..level of the own column.
            for earlier in range(1, level + 1):
                attention[row, base + earlier * window + j] = True
            positions[row] = 1 + j + level
    return attention, positions


class LookaheadDrafter(Drafter):
    """Lookahead decoding as a drafter: n-gram pool candidates plus the Jacobi window as extras.

    Args:
        window: W in [1, 20]; ngram_size: N in [2, 8]; guess_set_size: G in [1, 20].
        seed_pool_from_prompt: put the prompt's own n-grams in the pool at the start.
        harvest_output: also put the n-grams of the committed output in the pool as they
            appear (exact n-grams of the text so far, as prompt lookup uses; an addition to
            the paper, which harvests the Jacobi window only).
        seed: seeds the choice of random prompt tokens that fill the window.

    Attributes:
        pool: the :class:`NgramPool`; pool_size: n-grams in it.
        pool_hits: steps in which at least one pool token was accepted.
        pool_tokens_accepted: pool tokens accepted in total.

    Raises:
        ValueError: when a knob is outside its bound in :mod:`playground.engine.limits`.
    """

    name = "lookahead"
    source = SOURCE_LOOKAHEAD

    def __init__(self, window: int = LOOKAHEAD_WINDOW_KNOB.default, ngram_size: int = LOOKAHEAD_NGRAM_KNOB.default,
                 guess_set_size: int = LOOKAHEAD_GUESS_KNOB.default, seed_pool_from_prompt: bool = True,
                 harvest_output: bool = True, seed: int = 0):
        self.window = LOOKAHEAD_WINDOW_KNOB.check(window)
        self.ngram_size = LOOKAHEAD_NGRAM_KNOB.check(ngram_size)
        self.guess_set_size = LOOKAHEAD_GUESS_KNOB.check(guess_set_size)
        self.seed_pool_from_prompt = seed_pool_from_prompt
        self.harvest_output = harvest_output
        self.seed = seed
        self.estimator = AcceptanceEstimator()  # kept across runs (the engine may share a persistent one)
        self.gate_memory = GateMemory()  # likewise
        self.begin([0])

    @property
    def pool_size(self) -> int:
        return len(self.pool)

    def begin(self, prompt_ids: list[int]) -> None:
        """1. Empty pool (seeded with the prompt's n-grams); 2. level 0 = random prompt tokens."""
        self.rng = random.Random(self.seed)
        self.prompt = list(prompt_ids)
        self.pool = NgramPool(self.ngram_size, self.guess_set_size)
        if self.seed_pool_from_prompt:
            self.pool.add_sequence(self.prompt)
        self.levels: list[list[int]] = [self._fresh(self.window)]
        self.harvested = len(self.prompt) + 1  # first (exclusive) end of an output n-gram not yet pooled
        self.pool_hits = 0
        self.pool_tokens_accepted = 0
        self.window_ngrams: dict[int, set[tuple[int, ...]]] = {}  # key token -> continuations the window made
        self.root = -1  # the root of the latest proposal
        # The window's gate (budget on): its "acceptance" is the accepted tokens per step that came
        # from n-grams the window generated.
        self.gate = DraftGate(prior=self.gate_memory.prior(1.0))

    def finish(self, tokens: list[int], prompt_len: int) -> None:
        self.gate_memory.remember(self.gate)

    def info(self) -> dict[str, int]:
        """The pool's size (n-grams) and hits (steps that accepted a pool token) so far."""
        return {"pool_ngrams": len(self.pool), "pool_hits": self.pool_hits}

    def _fresh(self, count: int) -> list[int]:
        return [self.rng.choice(self.prompt) for _ in range(count)]

    def _window_now(self, context: int) -> bool:
        """With the budget on: whether the Jacobi window rides in this step's pass (:class:`DraftGate`).

        The window's queries cost ``cost(1 + m) - 1`` of a plain step (m = its queries, at this
        context length) and pay only through the pool's later hits on n-grams it generated, so it is
        kept while those accepted tokens per step (a moving average, :meth:`_window_credit`) are at
        least that, and otherwise runs only to probe. Without the budget it always rides."""
        cost = self.budget_cost
        if cost is None:
            return True
        m = len(self.levels) * self.window
        self.gate.pay_at = max(0.0, float(cost(1 + m, False, context)) - 1.0) if isinstance(cost, StepCost) \
            else max(0.0, float(cost(1 + m)) - 1.0)
        return self.gate.draft_now()

    def _window_credit(self, result: StepResult) -> int:
        """This step's accepted pool tokens if they continue an n-gram the Jacobi window generated,
        else 0: what the window earned. The pool also holds the prompt's and the output's own
        n-grams, which would be proposed (and accepted) without the window; crediting their hits to
        it kept the window riding on RAG passages for nothing (dev set, 4 first turns a category, 64
        tokens, one round-robin run on a Sapphire Rapids Xeon: the window in 905 of 2367 steps and
        1.02x overall, RAG 0.93x, crediting every hit; 310 of 2404 and 1.10x, RAG 1.02x, crediting
        the window's own)."""
        if not result.path:
            return 0
        accepted = tuple(int(result.candidates.tokens[c]) for c in result.path)
        made = self.window_ngrams.get(self.root, ())
        return len(accepted) if any(cont[:len(accepted)] == accepted for cont in made) else 0

    def propose(self, state: DecodeState) -> Candidates:
        """Pool continuations of the root (at most ``state.budget`` deep) plus the window as extras."""
        # 1. Verification branch: the pool's n-grams keyed by the root, as a prefix tree.
        self.root = int(state.tokens[-1])
        cand = candidate_tree(self.pool.lookup(self.root), state.budget, self.source)
        # 2. Lookahead branch: every level of the window, flattened level by level (unless the
        # budget finds the pool not paying for it at the moment).
        extras = None
        if self._window_now(len(state.tokens)):
            attention, positions = lookahead_attention(self.window, len(self.levels), len(cand))
            tokens = torch.tensor([t for level in self.levels for t in level], dtype=torch.long)
            extras = ExtraQueries(tokens, positions, attention)
        out = Candidates(cand.tokens, cand.parents, cand.sources, extras=extras)
        # Acceptance estimate: the pool's running hit rate by depth and by how many n-grams compete.
        depths, siblings = out.depths(), out.children()
        keys = [(min(d, 4), min(len(siblings[p + 1]), 3)) for d, p in zip(depths, out.parents.tolist())]
        out.accept_probs = self.estimator.estimate(out, keys, [0.35 if d == 1 else 0.7 for d, _ in keys])
        return out

    def update(self, result: StepResult) -> None:
        """Next Jacobi level, n-gram harvest, window shift by the tokens emitted this step."""
        self.estimator.observe(result)
        self.gate.observe(self._window_credit(result))
        if result.path:
            self.pool_hits += 1
            self.pool_tokens_accepted += len(result.path)
        if self.harvest_output:
            # 0. Exact n-grams of the committed text that end in this step's tokens.
            for end in range(max(self.harvested, self.ngram_size), len(result.tokens) + 1):
                self.pool.add(result.tokens[end - self.ngram_size:end])
            self.harvested = len(result.tokens) + 1
        if result.extra_logits is None:  # the window did not ride: its levels only follow the root
            shift = len(result.path) + 1
            self.levels = [(level + self._fresh(shift))[shift:] for level in self.levels]
            return
        expected = (len(self.levels) * self.window, )
        if result.extra_logits.shape[:1] != expected:
            raise ValueError(f"extra_logits must have shape ({expected[0]}, vocab_size), "
                             f"got {tuple(result.extra_logits.shape)}")
        # 1. The newest level's outputs (greedy Jacobi step) form the next level.
        newest = result.extra_logits[-self.window:].argmax(dim=-1).tolist()
        self.levels.append(newest)
        dropped = 0
        if len(self.levels) == self.ngram_size:
            # 2. Full window: each column, oldest level to the new output, is an n-gram.
            for j in range(self.window):
                ngram = [level[j] for level in self.levels]
                self.pool.add(ngram)
                self.window_ngrams.setdefault(ngram[0], set()).add(tuple(ngram[1:]))
            # 3. Drop the oldest level: the others move one level down (one position on).
            self.levels.pop(0)
            dropped = 1
        # 4. The root moved by len(path) + 1 positions; level-0 column j must sit at root + 1 + j.
        shift = len(result.path) + 1 - dropped
        if shift > 0:
            self.levels = [(level + self._fresh(shift))[shift:] for level in self.levels]



METHOD = register(MethodInfo(
    "lookahead", "Lookahead",
    "Jacobi iterations in a W x (N - 1) window generate n-grams; those starting with the last token are "
    "verified in the same pass (Fu et al. 2024).",
    lossless=True, knobs=with_budget_knob(LOOKAHEAD_KNOBS), sources=(SOURCE_TARGET, SOURCE_LOOKAHEAD),
    source_labels={SOURCE_LOOKAHEAD: "lookahead n-gram"},
    build=lambda engine, params: build_with_budget(engine, params, lambda p: LookaheadDrafter(**p), "lookahead")))
