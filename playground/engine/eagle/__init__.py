"""EAGLE-3 drafting with an EAGLE-2 dynamic tree: the head, its checkpoints, the tree and the drafter.

Importing this package registers the ``eagle`` method (:mod:`playground.engine.registry`).
"""

from __future__ import annotations

from ..events import SOURCE_TARGET
from ..limits import EAGLE_KNOBS, MAX_EAGLE_DEPTH, MAX_EAGLE_TOTAL_TOKENS
from ..registry import MethodInfo, register
from .checkpoint import DEFAULT_EAGLE_DIR, EagleLoadError, eagle_spec, load_eagle, read_eagle, save_eagle
from .checkpoint import head_config as eagle_head_config

head_spec = eagle_spec
"""The head the Engine loads for a target: ``head_spec(target_spec, eagle_option)`` (see :func:`eagle_spec`)."""
from .drafter import EagleDrafter, depth_source
from .head import EagleHead

__all__ = ["EagleHead", "EagleDrafter", "EagleLoadError", "load_eagle", "read_eagle", "save_eagle", "eagle_spec",
           "DEFAULT_EAGLE_DIR", "depth_source", "head_spec", "eagle_head_config"]

def _build(engine, params: dict) -> EagleDrafter:
    if getattr(engine, "eagle", None) is None:
        raise ValueError("eagle needs an EAGLE head: pass --eagle PATH_OR_HUB_ID (the default target loads "
                         "assets/eagle/default)")
    cost = None
    if params.get("total_tokens", "auto") == "auto":
        from ..step_cost import engine_step_cost
        cost = engine_step_cost(engine)  # the budget's step cost, measured once, priced per context length
    drafter = EagleDrafter(engine.eagle, verify_cost=cost, max_total=MAX_EAGLE_TOTAL_TOKENS, **params)
    if hasattr(engine, "persistent"):  # the gate's rate carries from one run to the next (GateMemory)
        from ..budget import GateMemory
        from ..step_cost import learned_key
        drafter.gate_memory = engine.persistent(f"learned/eagle/gate/{learned_key(params)}", GateMemory)
    return drafter


METHOD = register(MethodInfo(
    name="eagle", label="EAGLE-3",
    description="A one-layer head reads the target's low, middle and high features and the token just chosen, "
                "and grows a dynamic draft tree (EAGLE-2); lossless.",
    lossless=True, knobs=EAGLE_KNOBS,
    sources=(SOURCE_TARGET,) + tuple(depth_source(d) for d in range(1, MAX_EAGLE_DEPTH + 1)),
    source_labels={depth_source(d): f"EAGLE depth {d}" for d in range(1, MAX_EAGLE_DEPTH + 1)},
    requires=("eagle",), build=_build))
