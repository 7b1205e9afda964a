"""Prompt lookup decoding: copy the continuation of an earlier match of the latest n-gram.

Source: Saxena 2023, "Prompt Lookup Decoding" (apoorvumang/prompt-lookup-decoding), the
method behind transformers' ``prompt_lookup_num_tokens``. The drafter searches the
prompt plus the output so far for the longest suffix n-gram (size ``max_ngram_size``
down to 1) that occurred before, and proposes the ``num_pred_tokens`` tokens that
followed it. It is deterministic, so under sampling the verifier uses the one-hot rule.
"""

from __future__ import annotations

import torch

from .budget import AcceptanceEstimator, node_paths, with_budget_knob
from .step_cost import build_with_budget
from .drafter import DecodeState, Drafter, StepResult
from .events import SOURCE_PROMPT_LOOKUP, SOURCE_TARGET
from .limits import PROMPT_LOOKUP_NGRAM_KNOB, PROMPT_LOOKUP_TOKENS_KNOB
from .tree import Candidates
from .registry import MethodInfo, register


def find_candidate(tokens: torch.Tensor, max_ngram_size: int, num_pred_tokens: int) -> list[int]:
    """Tokens after the latest earlier match of the longest suffix n-gram (:func:`find_match`)."""
    return find_match(tokens, max_ngram_size, num_pred_tokens)[0]


def find_match(tokens: torch.Tensor, max_ngram_size: int, num_pred_tokens: int) -> tuple[list[int], int]:
    """Tokens that followed the most recent earlier occurrence of the longest matching suffix.

    Args:
        tokens: ``(seq_len,)`` int64, prompt plus output so far (CPU).
        max_ngram_size: longest suffix tried; shorter ones are tried down to 1.
        num_pred_tokens: how many following tokens to return at most.

    Returns:
        ``(up to num_pred_tokens token ids, the matched n-gram size)``; ``([], 0)`` when no suffix
        n-gram recurs.
    """
    seq_len = tokens.shape[0]
    for n in range(min(max_ngram_size, seq_len - 1), 0, -1):
        suffix = tokens[seq_len - n:]
        # Windows starting at 0 .. seq_len - n - 1: every earlier occurrence, never the suffix itself.
        windows = tokens[:seq_len - 1].unfold(0, n, 1)
        hits = (windows == suffix).all(dim=1).nonzero().flatten()
        for start in reversed(hits.tolist()):  # most recent first
            follow = tokens[start + n:start + n + num_pred_tokens]
            if follow.numel():
                return follow.tolist(), n
    return [], 0


class PromptLookupDrafter(Drafter):
    """Prompt lookup (n-gram copy) drafter; knobs ``max_ngram_size`` and ``num_pred_tokens``.

    Raises:
        ValueError: when a knob is outside its bound in :mod:`playground.engine.limits`.
    """

    name = "prompt_lookup"
    source = SOURCE_PROMPT_LOOKUP

    def __init__(self, max_ngram_size: int = PROMPT_LOOKUP_NGRAM_KNOB.default,
                 num_pred_tokens: int = PROMPT_LOOKUP_TOKENS_KNOB.default):
        self.max_ngram_size = PROMPT_LOOKUP_NGRAM_KNOB.check(max_ngram_size)
        self.num_pred_tokens = PROMPT_LOOKUP_TOKENS_KNOB.check(num_pred_tokens)
        self.estimator = AcceptanceEstimator()
        self.streak = 0  # steps in a row whose verified proposal was accepted whole (capped at 2)
        self.found: list[int] = []

    def begin(self, prompt_ids: list[int]) -> None:
        self.streak, self.found = 0, []

    def propose(self, state: DecodeState) -> Candidates:
        k = min(self.num_pred_tokens, state.budget)
        if k <= 0:
            return Candidates.empty(state.device)
        found, n = find_match(torch.tensor(state.tokens), self.max_ngram_size, k)
        self.found = list(found)
        cand = Candidates.chain(found, self.source, device=state.device)
        # Acceptance estimate: a running hit rate per (match length, depth, streak), from a prior
        # that trusts longer matches, deeper tokens of a copy that has held so far, and a copy the
        # target took whole at the previous steps (translation, extraction: copying runs on).
        keys = [(min(n, 4), min(d, 6), self.streak) for d in range(1, len(found) + 1)]
        priors = [(0.25 + 0.1 * min(n, 4) + 0.15 * s) if d == 1 else 0.8 for _, d, s in keys]
        cand.accept_probs = self.estimator.estimate(cand, keys, priors)
        return cand

    def update(self, result: StepResult) -> None:
        self.estimator.observe(result)
        # The streak: did the target take the part of this drafter's chain that was verified (the
        # budget may have cut it; in a mixture it shares the tree)? Nothing verified: unchanged.
        paths = set(node_paths(result.candidates))
        verified = next((n for n in range(len(self.found), 0, -1) if tuple(self.found[:n]) in paths), 0)
        if verified:
            taken = [int(result.candidates.tokens[i]) for i in result.path]
            whole = taken[:verified] == self.found[:verified]
            self.streak = min(2, self.streak + 1) if whole else 0


METHOD = register(MethodInfo(
    "prompt_lookup", "Prompt lookup",
    "Copies the continuation of an earlier match of the latest n-gram in the prompt and output (Saxena 2023).",
    lossless=True, knobs=with_budget_knob((PROMPT_LOOKUP_NGRAM_KNOB, PROMPT_LOOKUP_TOKENS_KNOB)),
    sources=(SOURCE_TARGET, SOURCE_PROMPT_LOOKUP), source_labels={SOURCE_PROMPT_LOOKUP: "prompt lookup"},
    build=lambda engine, params: build_with_budget(engine, params, lambda p: PromptLookupDrafter(**p),
                                                   "prompt_lookup")))
