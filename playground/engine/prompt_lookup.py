"""Prompt lookup decoding: copy the continuation of an earlier match of the latest n-gram.

Source: Saxena 2023, "Prompt Lookup Decoding" (apoorvumang/prompt-lookup-decoding), the
method behind transformers' ``prompt_lookup_num_tokens``. The drafter searches the
prompt plus the output so far for the longest suffix n-gram (size ``max_ngram_size``
down to 1) that occurred before, and proposes the ``num_pred_tokens`` tokens that
followed it. It is deterministic, so under sampling the verifier uses the one-hot rule.
"""

from __future__ import annotations

import bisect

import torch

from .budget import AcceptanceEstimator, with_budget_knob
from .step_cost import build_with_budget
from .drafter import DecodeState, Drafter, StepResult
from .events import SOURCE_PROMPT_LOOKUP, SOURCE_TARGET
from .limits import PROMPT_LOOKUP_NGRAM_KNOB, PROMPT_LOOKUP_TOKENS_KNOB
from .tree import Candidates
from .registry import MethodInfo, register


def find_candidate(tokens: torch.Tensor, max_ngram_size: int, num_pred_tokens: int) -> list[int]:
    """Tokens after the latest earlier match of the longest suffix n-gram (:func:`find_match`)."""
    return find_match(tokens, max_ngram_size, num_pred_tokens)[0]


MAX_COPY_LEN = 32
"""How far back :func:`find_match` follows a match's agreement (its ``copy_len``), in tokens."""


def find_match(tokens: torch.Tensor, max_ngram_size: int, num_pred_tokens: int) -> tuple[list[int], int, int]:
    """Tokens that followed the most recent earlier occurrence of the longest matching suffix.

    Args:
        tokens: ``(seq_len,)`` int64, prompt plus output so far (CPU).
        max_ngram_size: longest suffix tried; shorter ones are tried down to 1.
        num_pred_tokens: how many following tokens to return at most.

    Returns:
        ``(up to num_pred_tokens token ids, the matched n-gram size n, copy_len)``, where
        ``copy_len`` >= n counts the tokens before the proposal that agree with the occurrence's
        (the suffix matched backwards past the n-gram, at most :data:`MAX_COPY_LEN`): how long the
        copy has held so far. ``([], 0, 0)`` when no suffix n-gram recurs.
    """
    seq_len = tokens.shape[0]
    for n in range(min(max_ngram_size, seq_len - 1), 0, -1):
        suffix = tokens[seq_len - n:]
        # Windows starting at 0 .. seq_len - n - 1: every earlier occurrence, never the suffix itself.
        windows = tokens[:seq_len - 1].unfold(0, n, 1)
        hits = (windows == suffix).all(dim=1).nonzero().flatten().tolist()
        for start in reversed(hits):  # most recent first
            follow = tokens[start + n:start + n + num_pred_tokens]
            if not follow.numel():
                continue
            length = n
            if n == max_ngram_size:  # a shorter n cannot extend: the (n + 1)-gram would have matched
                back = tokens[max(0, start - MAX_COPY_LEN + n):start].flip(0)
                mine = tokens[max(0, seq_len - MAX_COPY_LEN):seq_len - n].flip(0)
                m = min(back.numel(), mine.numel())
                differ = (back[:m] != mine[:m]).nonzero()
                length += int(differ[0]) if differ.numel() else m
            return follow.tolist(), n, length
    return [], 0, 0


def held_prior(held: int) -> float:
    """Prompt lookup's prior that a copy which has held for ``held`` tokens holds one more:
    ``(h - 0.5) / (h + 1)`` (0.25 after one token, 0.63 after three, 0.86 after ten): copies that
    ran long tend to run on, and a lone matched token rarely starts a copy.

    Fitted on the verdicts of every tested node (``budget off``, 64 new tokens) over 40 of the
    default target's own answers to self-generated requests (``data/selfgen/default``, 5 of each
    kind, no benchmark text), 2026-12-07: the first token after a one-token match was accepted
    0.21 of the time, after two 0.52; tokens deeper in a copy 0.53 after two, 0.72 after four,
    0.90 after ten to fourteen, 0.95 after 22 or more. The former prior, ``h / (h + 1.5)``, said
    0.4 for the one-token match, the bulk of the nodes (981 of 2,352). Speed was level with the
    former prior in a same-run A/B on the dev set (docs/budget.md); the estimates each run starts
    from are what happens."""
    return (held - 0.5) / (held + 1.0)

HELD_BINS = (1, 2, 3, 4, 5, 7, 10, 15, 22)
"""Edges of the held-length bins that key prompt lookup's acceptance estimates."""


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

    def begin(self, prompt_ids: list[int]) -> None:
        self.estimator.new_run()  # earlier answers' verdicts become a prior; this answer's soon count more

    def propose(self, state: DecodeState) -> Candidates:
        k = min(self.num_pred_tokens, state.budget)
        if k <= 0:
            return Candidates.empty(state.device)
        found, _, held = find_match(torch.tensor(state.tokens), self.max_ngram_size, k)
        cand = Candidates.chain(found, self.source, device=state.device)
        # Acceptance estimate: a running hit rate per (first token or not, how long the copy will
        # have held before the token), from a prior that trusts copies that held longer (a passage
        # being copied or translated runs on; a chance n-gram match in free text rarely does).
        held_before = [held + d for d in range(len(found))]
        keys = [(d == 0, bisect.bisect_right(HELD_BINS, h)) for d, h in enumerate(held_before)]
        priors = [held_prior(h) for h in held_before]
        cand.accept_probs = self.estimator.estimate(cand, keys, priors)
        return cand

    def update(self, result: StepResult) -> None:
        self.estimator.observe(result)


METHOD = register(MethodInfo(
    "prompt_lookup", "Prompt lookup",
    "Copies the continuation of an earlier match of the latest n-gram in the prompt and output (Saxena 2023).",
    lossless=True, knobs=with_budget_knob((PROMPT_LOOKUP_NGRAM_KNOB, PROMPT_LOOKUP_TOKENS_KNOB)),
    sources=(SOURCE_TARGET, SOURCE_PROMPT_LOOKUP), source_labels={SOURCE_PROMPT_LOOKUP: "prompt lookup"},
    build=lambda engine, params: build_with_budget(engine, params, lambda p: PromptLookupDrafter(**p),
                                                   "prompt_lookup")))
