"""The engine: everything that decodes, and its public API. Imports no UI code.

Everything outside ``playground/engine/`` (the UI, the benchmark, training, app.py) imports
the engine through this module only: ``from playground.engine import Engine, MethodSpec``.
Names load lazily (PEP 562), so ``from playground.engine import DTYPE_CHOICES`` stays cheap
(``--help`` needs no torch import) and importing one name does not build the whole engine.

The main names:

* :class:`Engine`: load a target (and draft, Medusa heads, EAGLE head) and run methods on a
  prompt, one or several side by side (round-robin).
* :class:`MethodSpec`, :class:`GenerationSettings`, :class:`SamplingConfig`: what to run.
* :data:`METHODS` (name -> :class:`MethodInfo`), :data:`BASELINE`, :func:`is_lossless`,
  :func:`lossless_check_applies`: the method registry and its lossless rules.
* :class:`StepEvent` (with its :class:`StepTree`), :class:`RunStats`, :class:`RunOutput`: what a run yields.
* :func:`check_lossless`, :class:`LosslessCheck`: a method's output against the baseline's.
* the knobs (:class:`Knob`, :class:`ChoiceKnob`, ``*_KNOB``) and named limits (``MAX_*``).
"""

from __future__ import annotations

import importlib

_EXPORTS: dict[str, str] = {
    # engine and runs
    "Engine": "engine", "RunOutput": "events",
    "GenerationSettings": "decoding", "decode": "decoding", "generate": "decoding",
    "SamplingConfig": "sampling", "logits_to_probs": "sampling",
    "StepEvent": "events", "StepTree": "events", "RunStats": "events", "SOURCE_TARGET": "events",
    "SOURCE_DRAFT": "events",
    "SOURCE_PROMPT_LOOKUP": "events", "SOURCE_LOOKAHEAD": "events",
    # methods
    # (read through .methods, which imports every method module first, so the registry is full)
    "METHODS": "methods", "MethodInfo": "methods", "MethodSpec": "methods", "BASELINE": "methods",
    "is_lossless": "methods", "lossless_check_applies": "methods", "source_labels": "methods",
    "methods_run": "methods",
    "Drafter": "drafter", "DecodeState": "drafter", "StepResult": "drafter",
    "Candidates": "tree",
    # lossless check
    "LosslessCheck": "lossless", "check_lossless": "lossless", "NEAR_TIE_MARGIN": "lossless",
    # knobs and limits
    "Knob": "limits", "ChoiceKnob": "limits", "GENERATION_KNOBS": "limits", "DTYPE_CHOICES": "limits",
    "MAX_NEW_TOKENS_KNOB": "limits", "TEMPERATURE_KNOB": "limits", "TOP_P_KNOB": "limits", "TOP_K_KNOB": "limits",
    "SEED_KNOB": "limits", "REPETITION_PENALTY_KNOB": "limits", "MAX_REPETITION_PENALTY": "limits",
    "apply_repetition_penalty": "penalty", "model_generation_settings": "penalty", "MAX_SPECULATIVE_TOKENS": "limits", "MAX_MEDUSA_HEADS": "limits",
    "MEDUSA_TOP_K": "limits", "MAX_STOP_STRINGS": "limits", "MAX_STOP_STRING_CHARS": "limits",
    "POSTERIOR_THRESHOLD_KNOB": "limits", "POSTERIOR_ALPHA_KNOB": "limits",
    "K_KNOB": "limits", "DRAFT_CONFIDENCE_KNOB": "limits", "PROMPT_LOOKUP_NGRAM_KNOB": "limits",
    "PROMPT_LOOKUP_TOKENS_KNOB": "limits", "LOOKAHEAD_WINDOW_KNOB": "limits", "LOOKAHEAD_NGRAM_KNOB": "limits",
    "LOOKAHEAD_GUESS_KNOB": "limits", "MAX_NEW_TOKENS": "limits", "MAX_TEMPERATURE": "limits",
    "LOOKAHEAD_PRESETS": "lookahead", "CausalLM": "target",
    # models
    "ModelLoadError": "models", "TokenizerMismatchError": "models", "LoadedModel": "models",
    "load_model": "models", "load_draft": "models", "default_draft_spec": "models", "cache_dir": "models",
    "DEFAULT_TARGET": "models", "DEFAULT_HUB_ID": "models", "DEFAULT_DRAFT_DIR": "models",
    "resolve_device": "models", "resolve_dtype": "models", "model_source": "models",
    "TokenMap": "draft_model", "DraftModelDrafter": "draft_model", "MedusaDraftDrafter": "draft_model", "TOKEN_MAP_FILE": "draft_model", "DRAFT_KNOBS_FILE": "draft_model", "load_knob_defaults": "draft_model",
    # the cost model
    "theory": None, "VerifyCost": "theory", "measure_verify_cost": "theory", "K_PRESETS": "theory",
    "FALLBACK": "theory", "lookahead_tokens_per_pass": "theory",
    # Medusa
    "MedusaHeads": "medusa", "MedusaLoadError": "medusa", "load_heads": "medusa", "head_source": "medusa",
    "head_acceptance": "medusa", "HEAD_LOSS_DECAY": "medusa",
    "TREE_KNOB": "medusa", "TREE_PRESETS": "medusa", "TREE_DESCRIPTIONS": "medusa", "AUTO_TREE": "medusa",
    "TreeChoicesError": "medusa", "parse_tree_choices": "medusa", "tree_buffers": "medusa",
    "greedy_tree": "medusa", "expected_tokens": "medusa", "rank_probs_from_accuracy": "medusa",
    "medusa_tree": "medusa", "describe_medusa_tree": "medusa", "medusa_auto_tree": "medusa",
    "measure_head_accuracy": "medusa", "MC_SIM_7B_63": "medusa", "choose_tree": "medusa",
    # EAGLE
    "EagleHead": "eagle", "EagleDrafter": "eagle", "EagleLoadError": "eagle", "load_eagle": "eagle",
    "read_eagle": "eagle", "save_eagle": "eagle", "eagle_head_config": "eagle", "DEFAULT_EAGLE_DIR": "eagle",
    "eagle_spec": "eagle",
    "EAGLE_KNOBS": "limits", "MAX_EAGLE_DEPTH": "limits", "MAX_EAGLE_TOP_K": "limits",
    "MAX_EAGLE_TOTAL_TOKENS": "limits", "SOURCE_EAGLE": "mixture",
    # REST
    "Datastore": "rest", "RestDrafter": "rest", "read_answers": "rest", "DEFAULT_DATASTORE_DIR": "rest",
    # the per-step budget
    "apply_budget": "budget", "StepCost": "budget", "RunRate": "budget", "engine_step_cost": "step_cost",
    "time_in_background": "step_cost",
    # the CPU fast paths
    "cpu_linear": None, "half_weight_linear_layers": "cpu_linear", "cpu_attention": None,
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    """Load ``name`` from the submodule that defines it (PEP 562), once."""
    module = _EXPORTS.get(name, "")
    if module == "":
        raise AttributeError(f"playground.engine has no public name {name!r}")
    value = importlib.import_module(f"{__name__}.{module or name}")
    if module is not None:
        value = getattr(value, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
