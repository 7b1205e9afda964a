"""Page wording for things the engine names by key: why a method is unavailable, and the options of a
setting chosen by name.

The engine's own messages are for programs and the command line (they may name a flag or a key);
the page says the same in its own terms: method labels, not keys; what to load, not which flag
to pass. Nothing here imports gradio or touches a model.
"""

from __future__ import annotations

from playground.engine import METHODS

def size_b(engine, part: str) -> float:
    """A loaded model's parameter count in billions, to 3 significant digits (0.135, 0.00747)."""
    return float(f"{engine.parameter_count(part) / 1e9:.3g}")


def target_sized_draft(engine) -> bool:
    """Whether the engine's draft is as large as its target (the Models tab's "the target itself", a
    check of the machinery, not a speed-up: the Advisor leaves it out)."""
    try:
        return engine.draft is not None and size_b(engine, "draft") >= size_b(engine, "target")
    except AttributeError:  # sizes unknown: a draft is smaller than its target
        return False


MISSING_PART_TEXT = {
    "draft": "no draft model is loaded for {target}: it needs a smaller model with the same tokenizer, loaded "
             "with the target",
    "medusa": "no Medusa heads are loaded for {target}: Medusa needs heads trained on this target, loaded with it",
    "eagle": "no EAGLE head is loaded for {target}: EAGLE-3 needs a draft head trained on this target, loaded "
             "with it",
    "datastore": "no REST datastore for {target}: REST retrieves from this target's own earlier answers, which "
                 "ship only for the default model (PLAYGROUND_DATASTORE names a folder of them for another)",
}
"""Why a method that needs a part cannot run, per part, in page terms (``{target}``: the target's name)."""


def unavailable_text(engine, method: str) -> str | None:
    """Why ``method`` cannot run with ``engine``'s loaded models, in page terms; None when it can.

    The missing part (draft, Medusa heads, EAGLE head) is said in words; any other reason is the
    engine's own (``Engine.unavailable_reason``).
    """
    reason = engine.unavailable_reason(method)
    if reason is None or method not in METHODS:
        return reason
    parts = engine.loaded_parts() if hasattr(engine, "loaded_parts") else {}
    missing = [p for p in METHODS[method].requires if not parts.get(p)]
    if missing and missing[0] in MISSING_PART_TEXT:
        return MISSING_PART_TEXT[missing[0]].format(target=engine.target.name)
    return reason


CHOICE_LABELS: dict[tuple[str, str], str] = {
    ("proposer", "model"): "draft model (K passes)",
    ("proposer", "medusa_heads"): "Medusa heads on the draft (one pass)",
    ("tree_choices", "cpu_small"): "CPU small",
    ("tree_choices", "mc_sim_7b_63"): "Medusa paper, 63 nodes",
    ("tree_choices", "depth3"): "depth 3",
}
"""Page names of named options whose key is not readable as it is: ``(knob name, option) -> label``."""


def method_label(method: str) -> str:
    """A method's page label (``prompt_lookup`` -> ``Prompt lookup``); unknown names stay as they are."""
    return METHODS[method].label if method in METHODS else str(method)


def choice_label(knob_name: str, value: str) -> str:
    """The page name of option ``value`` of knob ``knob_name``: from :data:`CHOICE_LABELS`; a list of
    methods (a mixture's members, ``"suffix,recycling"``) as their labels joined by " + "; else the
    option itself with underscores as spaces."""
    if (knob_name, value) in CHOICE_LABELS:
        return CHOICE_LABELS[(knob_name, value)]
    names = [v.strip() for v in str(value).split(",")]
    if len(names) > 1 or names[0] in METHODS:
        return " + ".join(METHODS[n].label if n in METHODS else n.replace("_", " ") for n in names)
    return str(value).replace("_", " ")


def choice_pairs(knob) -> list[tuple[str, str]]:
    """``(page name, value)`` for each option of a :class:`ChoiceKnob`, for ``gr.Dropdown(choices=...)``:
    the page shows the name, the handlers get the value."""
    return [(choice_label(knob.name, c), c) for c in knob.choices]
