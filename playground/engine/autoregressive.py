"""Plain autoregressive decoding: the drafter that proposes nothing (the baseline)."""

from __future__ import annotations

from .drafter import DecodeState, Drafter
from .tree import Candidates


class AutoregressiveDrafter(Drafter):
    """The baseline: every step is one target forward pass emitting one token."""

    name = "autoregressive"
    source = "target"

    def propose(self, state: DecodeState) -> Candidates:
        return Candidates.empty(state.device)
