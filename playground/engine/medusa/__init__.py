"""Medusa (Cai et al. 2024): extra decoding heads on the target's last hidden state fill a
candidate tree that the target verifies in one pass. One subpackage:

* :mod:`.heads`: the heads, their checkpoints (the reference format), hub download, loading;
* :mod:`.trees`: ``tree_choices`` parsing into tree buffers, presets, the tree search;
* :mod:`.calibrate`: the per-device ``auto`` tree (head accuracy and step costs measured here);
* :mod:`.drafter`: the Medusa-1 drafter and Medusa as a draft (a draft's heads extend its token);

and here, the method's registry entry and the tree a run uses (resolved against the loaded heads).
"""

from __future__ import annotations

from ..events import SOURCE_TARGET
from ..limits import MAX_MEDUSA_HEADS, MEDUSA_ACCEPTANCE_KNOB, POSTERIOR_ALPHA_KNOB, POSTERIOR_THRESHOLD_KNOB
from ..budget import with_budget_knob
from ..registry import MethodInfo, register
from ..step_cost import build_with_budget
from .drafter import MedusaDrafter, head_acceptance
from .heads import (DEFAULT_HEADS_DIR, HEAD_LOSS_DECAY, MedusaHeads, MedusaLoadError, head_source, heads_spec,
                    load_heads)
from .calibrate import STEP_COST_NODES, auto_tree, measure_head_accuracy, measure_step_cost
from .trees import (AUTO as AUTO_TREE, MC_SIM_7B_63, TREE_DESCRIPTIONS, TREE_KNOB, TREE_PRESETS, TreeBuffers,
                    TreeChoice, TreeChoicesError, choose_tree, expected_tokens, greedy_tree, parse_tree_choices,
                    preset_choices, rank_probs_from_accuracy, tree_buffers)

CALIBRATION_PROMPT = "Explain, step by step, how a bicycle works and why riding one is good exercise."
"""The prompt whose decoding steps the ``auto`` tree is timed on."""


def medusa_auto_tree(engine) -> tuple[TreeChoice, dict]:
    """The tree chosen for this device for ``engine``'s heads (measured once per engine, under its
    lock, then kept; see :func:`.trees.auto_tree`).

    Raises:
        ValueError: no Medusa heads are loaded.
    """
    if engine.medusa is None:
        raise ValueError(f"medusa is unavailable: {engine.unavailable_reason('medusa')}")

    def calibrate():
        if getattr(engine.target, "tokenizer", None) is not None:
            ids = engine.encode_prompt(CALIBRATION_PROMPT)
        else:  # a bare model (tests, API users): time steps from a fixed run of ids
            ids = [1 + i % (engine.target_lm.vocab_size - 1) for i in range(16)]
        return auto_tree(engine.target_lm, engine.medusa, ids)

    return engine.persistent("medusa_auto_tree", calibrate)


def medusa_tree(engine, value) -> list[list[int]]:
    """The paths of a ``tree_choices`` value for ``engine``'s heads: a preset name (``auto``:
    chosen for this device), a JSON string or a list of index paths.

    Raises:
        ValueError / TreeChoicesError: no heads loaded, or a malformed tree.
    """
    if engine.medusa is None:
        raise ValueError(f"medusa is unavailable: {engine.unavailable_reason('medusa')}")
    if value == AUTO_TREE:
        return medusa_auto_tree(engine)[0].choices
    if isinstance(value, str) and value in TREE_PRESETS:
        return preset_choices(value, engine.medusa.num_heads)
    return [list(p) for p in parse_tree_choices(value, num_heads=engine.medusa.num_heads)]


def describe_medusa_tree(engine, value) -> str:
    """One line saying which tree ``value`` means with ``engine``'s heads, for the UI and the benchmark.

    Raises:
        ValueError / TreeChoicesError: no heads loaded, or a malformed tree.
    """
    if value == AUTO_TREE:
        choice, info = medusa_auto_tree(engine)
        return f"auto: {choice.describe()}; head accuracy: {info['accuracy_source']}"
    paths = medusa_tree(engine, value)
    depth = max(len(p) for p in paths)
    name = value if isinstance(value, str) and value in TREE_PRESETS else "custom"
    return f"{name}: {len(paths)} {'node' if len(paths) == 1 else 'nodes'}, depth {depth}"


def _build(engine, params: dict) -> MedusaDrafter:
    def make(p: dict) -> MedusaDrafter:
        return MedusaDrafter(engine.medusa, medusa_tree(engine, p["tree_choices"]), p["acceptance"],
                             p["posterior_threshold"], p["posterior_alpha"])
    return build_with_budget(engine, params, make, "medusa")


METHOD = register(MethodInfo(
    "medusa", "Medusa",
    "Extra heads on the target's last hidden state propose a tree of tokens; the target verifies it in one "
    "pass (Cai et al. 2024). Lossless with exact acceptance; typical acceptance trades exactness for speed.",
    lossless=True, knobs=with_budget_knob((TREE_KNOB, MEDUSA_ACCEPTANCE_KNOB, POSTERIOR_THRESHOLD_KNOB,
                                           POSTERIOR_ALPHA_KNOB)),
    sources=(SOURCE_TARGET,) + tuple(head_source(k) for k in range(1, MAX_MEDUSA_HEADS + 1)),
    source_labels={head_source(k): f"Medusa head {k}" for k in range(1, MAX_MEDUSA_HEADS + 1)},
    build=_build, requires=("medusa",),
    lossless_if=lambda p: p.get("acceptance", MEDUSA_ACCEPTANCE_KNOB.default) == "exact"))

__all__ = ["AUTO_TREE", "CALIBRATION_PROMPT", "DEFAULT_HEADS_DIR", "HEAD_LOSS_DECAY", "MC_SIM_7B_63", "METHOD",
           "MedusaDrafter", "MedusaHeads", "STEP_COST_NODES", "measure_step_cost", "MedusaLoadError", "TREE_DESCRIPTIONS", "TREE_KNOB",
           "TREE_PRESETS", "TreeBuffers", "TreeChoice", "TreeChoicesError", "auto_tree", "medusa_auto_tree",
           "choose_tree", "describe_medusa_tree", "expected_tokens", "greedy_tree", "head_acceptance", "head_source",
           "heads_spec", "load_heads", "measure_head_accuracy", "parse_tree_choices", "preset_choices",
           "rank_probs_from_accuracy", "medusa_tree", "tree_buffers"]
