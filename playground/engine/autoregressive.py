"""Plain autoregressive decoding: the drafter that proposes nothing (the baseline)."""

from __future__ import annotations

from .drafter import DecodeState, Drafter
from .tree import Candidates
from .events import SOURCE_TARGET
from .registry import BASELINE, MethodInfo, register


class AutoregressiveDrafter(Drafter):
    """The baseline: every step is one target forward pass emitting one token."""

    name = "autoregressive"
    source = "target"

    def propose(self, state: DecodeState) -> Candidates:
        return Candidates.empty(state.device)



METHOD = register(MethodInfo(BASELINE, "Autoregressive", "Baseline: one target forward pass per token.",
                             lossless=True, knobs=(), sources=(SOURCE_TARGET,),
                             build=lambda engine, params: AutoregressiveDrafter()))
