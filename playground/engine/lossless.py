"""The lossless check: a method's greedy output against the baseline's, token for token, with
divergences at numerical near-ties told apart from real mismatches."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LosslessCheck:
    """Whether a method's greedy output matched the baseline's.

    Attributes:
        matched: identical token ids.
        position: first diverging position (0-based, in new tokens), None when matched.
        baseline_margin: the baseline's top-1 minus top-2 logit at that position.
        near_tie: the divergence is at a near-tie (margin below the dtype's rounding
            noise), so reduced-precision numerics, not a bug, are the likely cause.
    """

    matched: bool
    position: int | None = None
    baseline_margin: float | None = None
    near_tie: bool = False

    def message(self) -> str:
        if self.matched:
            return "matches the baseline token for token"
        where = f"diverges from the baseline at new token {self.position}"
        if self.baseline_margin is None:
            return where
        kind = "a near-tie: reduced-precision rounding, not a bug" if self.near_tie else \
            "NOT a near-tie: a real mismatch"
        return f"{where} (baseline's top-2 logit margin there {self.baseline_margin:.3g}: {kind})"


NEAR_TIE_MARGIN = {torch.float32: 1e-3, torch.float64: 1e-6, torch.bfloat16: 0.5, torch.float16: 0.1}
"""Top-2 logit margins below which a divergence counts as a numerical near-tie, per dtype
(bf16 batched-vs-sequential forwards were seen to differ by up to 0.5 in logits here)."""


def check_lossless(baseline_ids: list[int], baseline_margins: list[float], ids: list[int],
                   dtype: torch.dtype = torch.float32) -> LosslessCheck:
    """Compare a method's output with the baseline's, token for token.

    Args:
        baseline_ids, ids: new token ids of the baseline and of the method.
        baseline_margins: the baseline's top-1 minus top-2 logit at each of its tokens.
        dtype: the target's dtype (sets the near-tie threshold).
    """
    for i, (a, b) in enumerate(zip(baseline_ids, ids)):
        if a != b:
            margin = baseline_margins[i] if i < len(baseline_margins) else None
            near = margin is not None and margin < NEAR_TIE_MARGIN.get(dtype, 0.5)
            return LosslessCheck(False, i, margin, near)
    if len(baseline_ids) != len(ids):
        i = min(len(baseline_ids), len(ids))
        margin = baseline_margins[i] if i < len(baseline_margins) else None
        near = margin is not None and margin < NEAR_TIE_MARGIN.get(dtype, 0.5)
        return LosslessCheck(False, i, margin, near)
    return LosslessCheck(True)
