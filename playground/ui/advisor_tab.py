"""The Advisor tab: which method suits your situation, why, and a button that applies it.

The rules and the advice come from :mod:`playground.advisor` (data plus one function, quoting
``assets/measurements.json``); this module only lays them out, applies an
:class:`~playground.advisor.Advice` to the Playground tab's checkboxes and sliders, and offers the
model presets (:mod:`playground.presets`; the Models tab, :mod:`.models_tab`, loads them per session).
"""

from __future__ import annotations

import html
import logging

import gradio as gr

from playground import advisor, presets
from playground.engine import BASELINE, METHODS, theory

log = logging.getLogger(__name__)

NO_DRAFT = 0.0
"""The draft-size box's value meaning "no same-family smaller model"."""


def _size_b(engine, part: str) -> float:
    """A loaded model's parameter count in billions, to 3 significant digits (0.135, 0.00747)."""
    return float(f"{engine.parameter_count(part) / 1e9:.3g}")


def target_size_b(engine) -> float:
    """The loaded target's parameter count in billions (3 significant digits)."""
    try:
        return _size_b(engine, "target")
    except AttributeError:
        return 0.135


def loaded_draft_b(engine) -> float:
    """The loaded draft's size in billions, or :data:`NO_DRAFT` when none is loaded."""
    try:
        return _size_b(engine, "draft") if engine.draft is not None else NO_DRAFT
    except AttributeError:
        return NO_DRAFT


def loaded_models(engine) -> tuple[bool, bool, int | None]:
    """``(draft loaded, Medusa heads loaded, the draft's own K or None)`` for the advisor."""
    draft = getattr(engine, "draft", None)
    k = ((getattr(draft, "knob_defaults", None) or {}).get("k")) if draft is not None else None
    return (draft is not None and engine.unavailable_reason("draft_model") is None,
            getattr(engine, "medusa", None) is not None and engine.unavailable_reason("medusa") is None,
            int(k) if isinstance(k, (int, float)) and not isinstance(k, bool) else None)


def advice_markdown(advice: advisor.Advice, engine) -> str:
    """The advice as Markdown: the recommendation, settings, reasons with their rules, measured notes."""
    label = METHODS[advice.primary].label if advice.primary in METHODS else advice.primary
    lines = [f"### Recommended: **{label}**"]
    ticks = ", ".join(METHODS[m].label if m in METHODS else m for m in advice.methods)
    lines.append(f"Compare on the Playground tab: {ticks}.")
    for m, params in advice.params.items():
        if not params:
            continue
        name = METHODS[m].label if m in METHODS else m
        lines.append(f"- **{name}**: " + ", ".join(f"{k} = {v}" for k, v in params.items()))
    lines.append("\n**Why**")
    for rule_id, text in advice.reasons:
        rule = advisor.RULES[rule_id]
        lines.append(f"- {html.escape(text)}. _Rule `{rule_id}`: {html.escape(rule.guidance)} ({rule.source})_")
    if advice.measured_notes:
        lines.append("\n**Where our measurements disagree**")
        lines += [f"- {html.escape(n)}" for n in advice.measured_notes]
    missing = [m for m in advice.methods if m not in METHODS or engine.unavailable_reason(m)]
    if missing:
        lines.append("\n_Not available with the loaded models (Apply skips them): "
                     + "; ".join(f"{m}: {engine.unavailable_reason(m) if m in METHODS else 'not in this build'}"
                                 for m in missing) + "_")
    return "\n".join(lines)


def _number(value, name: str) -> float:
    """A number box's value as a float; an empty box or text is a ValueError naming the box."""
    if value is None or value == "":
        raise ValueError(f"{name} is empty: enter a number")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None


def situation(target_b, draft_b, train, task, appetite, device, loaded_draft=False, loaded_medusa=False,
              draft_k=None, cpu_isa=None) -> advisor.Situation:
    """A :class:`advisor.Situation` from the tab's inputs (draft size 0 = none; a negative one is an error).

    Raises:
        ValueError: an empty or non-numeric size (the situation's own check names the allowed range).
    """
    t = _number(target_b, "target size")
    d = 0.0 if draft_b is None or draft_b == "" else _number(draft_b, "draft size")
    if d < 0:
        raise ValueError(f"the draft size must be 0 (no draft) or a positive size below the target, got {d:g}")
    return advisor.Situation(t, d if d > 0 else None, bool(train), task, appetite, device,
                             bool(loaded_draft), bool(loaded_medusa), draft_k if loaded_draft else None,
                             cpu_isa if device == "cpu" else None)


def advise(engine, *values) -> tuple[str, dict | None]:
    """``(markdown, advice as plain data or None)``; bad input gives a message that says what is allowed
    and no recommendation (so Apply has nothing stale to apply), never raises.

    ``values``: the tab's inputs (target size, draft size, willing to train, task, appetite, device,
    draft loaded, Medusa loaded).
    """
    try:
        _, _, draft_k = loaded_models(engine)
        s = situation(*values, draft_k=draft_k, cpu_isa=advisor.cpu_isa())
        adv = advisor.advise(s, verify_cost=_measured_cost(engine))
    except (TypeError, ValueError) as e:
        return (f"**Cannot advise:** {html.escape(str(e))}.\n\nAllowed: a target size above 0 and at most "
                f"{advisor.MAX_TARGET_B:g} billion parameters, and a draft size of 0 (none) or above 0 and below "
                "the target. Fix the input to see a recommendation."), None
    return advice_markdown(adv, engine), {"methods": adv.methods, "params": adv.params, "primary": adv.primary}


def _measured_cost(engine):
    """This device's verify cost if the Theory tab has measured it (made non-decreasing), else None."""
    from . import insight, worker

    key = next((k for k, e in worker.ENGINES.items() if e is engine), None)  # the Theory tab registered it
    d = insight.VERIFY_COSTS.get(key) if key else None
    return theory.VerifyCost.from_dict(d).monotone() if d else None


def apply_values(engine, advice: dict | None, knob_keys: list[tuple[str, str]]) -> tuple:
    """Output values applying ``advice`` to the Playground tab: one per method checkbox (in METHODS
    order), one per knob slider (in ``knob_keys`` order; skipped when the advice does not set it),
    then a status message."""
    if not advice:
        return (*(gr.skip() for _ in METHODS), *(gr.skip() for _ in knob_keys),
                "Nothing applied: there is no recommendation (fix the advisor's input first).")
    ticks = [m for m in advice["methods"] if m in METHODS and engine.unavailable_reason(m) is None]
    skipped = [m for m in advice["methods"] if m not in ticks]
    boxes = [m in ticks for m in METHODS]
    knobs = []
    for m, k in knob_keys:
        value = (advice["params"].get(m) or {}).get(k)
        if value is not None and m in METHODS:
            knob = next(kn for kn in METHODS[m].knobs if kn.name == k)
            if hasattr(knob, "maximum"):  # clamp numbers into the slider's bounds
                value = min(max(value, knob.minimum), knob.maximum)
            value = knob.check(value)
        knobs.append(gr.skip() if value is None else value)
    return (*boxes, *knobs, applied_message(advice, ticks, skipped, knob_keys))


def applied_message(advice: dict, ticks: list[str], skipped: list[str], knob_keys: list[tuple[str, str]]) -> str:
    """The confirmation shown after Apply: each ticked method with the settings that were set."""
    parts = []
    for m in ticks:
        set_here = {k: v for k, v in (advice["params"].get(m) or {}).items() if (m, k) in knob_keys}
        label = METHODS[m].label
        parts.append(label + (" (" + ", ".join(f"{_KNOB_NAMES.get(k, k)} = {v}" for k, v in set_here.items()) + ")"
                              if set_here else ""))
    msg = "**Applied to the Playground tab:** " + "; ".join(parts) + ". Run it there to measure."
    if skipped:
        msg += " Not available with the loaded models, so not ticked: " + ", ".join(skipped) + "."
    return msg


_KNOB_NAMES = {"k": "K", "window": "W", "ngram_size": "N", "guess_set_size": "G"}


def preset_markdown(name: str) -> str:
    p = presets.get_preset(name)
    parts = [f"**{p.label}** — target `{p.target}`"]
    if p.drafts:
        parts.append("drafts " + ", ".join(f"`{d}`" for d in p.drafts))
    if p.medusa:
        parts.append(f"Medusa heads `{p.medusa}`")
    where = "loads offline" if p.offline else "needs the Hugging Face hub"
    return ", ".join(parts) + f" ({where}). {p.note}"


def build(engine, use: dict, knobs: dict) -> None:
    """Lay the tab out and wire Apply to the Playground tab's ``use`` checkboxes and ``knobs`` sliders.

    Args:
        use: method -> its checkbox on the Playground tab.
        knobs: ``(method, knob name)`` -> its slider on the Playground tab.
    """
    device = "cpu" if str(engine.target.device) == "cpu" else "gpu"
    gr.Markdown("Tell the advisor about your deployment; it recommends a method and settings, with the rule behind "
                "each choice, and says where measurements (this device's from the Theory tab, or the project's, "
                "naming the machine) disagree with a rule.")
    has_draft, has_medusa, _ = loaded_models(engine)
    with gr.Row(equal_height=False):
        with gr.Column(scale=2, min_width=300):
            # No minimum/maximum on the boxes: Gradio would reject out-of-range values with a server
            # traceback and keep the old advice; advise() checks them and says what is allowed.
            target_b = gr.Number(target_size_b(engine), label=f"Target size (billions of parameters, above 0 and at "
                                 f"most {advisor.MAX_TARGET_B:g})", elem_id="advisor-target-b")
            draft_b = gr.Number(loaded_draft_b(engine), label="Same-family smaller model with the same tokenizer "
                                "(billions; 0 = none)", elem_id="advisor-draft-b")
            train = gr.Checkbox(False, label="Willing to train something (e.g. Medusa heads)", elem_id="advisor-train")
            loaded_draft = gr.Checkbox(has_draft, label="This draft is loaded here (made for this target; the "
                                       "Playground tab can measure it)", elem_id="advisor-loaded-draft")
            loaded_medusa = gr.Checkbox(has_medusa, label="Medusa heads for this target are loaded here",
                                        elem_id="advisor-loaded-medusa")
            task = gr.Dropdown(list(advisor.TASKS), value="chat", label="Task", elem_id="advisor-task",
                               info="Code, summarisation, RAG and extraction copy from the prompt.")
            appetite = gr.Radio(list(advisor.APPETITES), value="default", label="Appetite for risk (sets K)",
                                elem_id="advisor-appetite")
            dev = gr.Radio(["gpu", "cpu"], value=device, label="Device", elem_id="advisor-device")
            with gr.Row():
                go_btn = gr.Button("Advise", variant="primary", elem_id="advisor-go")
                apply_btn = gr.Button("Apply to the Playground tab", elem_id="advisor-apply")
            applied = gr.Markdown("", elem_id="advisor-applied")
        with gr.Column(scale=3):
            inputs = [target_b, draft_b, train, task, appetite, dev, loaded_draft, loaded_medusa]
            md0, adv0 = advise(engine, target_size_b(engine), loaded_draft_b(engine), False, "chat", "default",
                               device, has_draft, has_medusa)
            out = gr.Markdown(md0, elem_id="advisor-output")
            state = gr.State(adv0)
    with gr.Accordion("Model presets", open=True, elem_id="presets"):
        gr.Markdown("Each preset is a target with its drafts or Medusa heads; hub presets need the Hugging Face "
                    "hub (and usually a GPU). To run one, choose it on the Models tab: it loads for this browser "
                    "tab only.")
        with gr.Row():
            pick = gr.Dropdown([(p.label, p.name) for p in presets.PRESETS.values()], value="default",
                               label="Preset", elem_id="preset-pick")
            fill_btn = gr.Button("Use its sizes in the advisor", size="sm", elem_id="preset-fill")
        preset_info = gr.Markdown(preset_markdown("default"), elem_id="preset-info")
        with gr.Accordion("The advisor's rules", open=False):
            gr.Markdown("\n".join(f"- **`{r.id}`**: {r.guidance} _({r.source})_" for r in advisor.RULES.values()))

    knob_keys = list(knobs)
    def advise_and_clear(*v):  # new advice: the last "Applied" message no longer describes it
        return (*advise(engine, *v), "")

    go_btn.click(advise_and_clear, inputs, [out, state, applied], api_visibility="private", queue=False)
    for comp in inputs:
        comp.change(advise_and_clear, inputs, [out, state, applied], api_visibility="private", queue=False)
    apply_btn.click(lambda adv: apply_values(engine, adv, knob_keys), state,
                    [*(use[m] for m in METHODS), *(knobs[k] for k in knob_keys), applied],
                    api_visibility="private", queue=False)
    pick.change(preset_markdown, pick, preset_info, api_visibility="private", queue=False)

    def fill(name):
        p = presets.get_preset(name)
        sizes = {"HuggingFaceTB/SmolLM2-360M-Instruct": 0.36, "HuggingFaceTB/SmolLM2-135M-Instruct": 0.135,
                 "Qwen/Qwen2.5-0.5B-Instruct": 0.5, "meta-llama/Llama-2-7b-chat-hf": 6.7}
        here = p.target == getattr(engine.target, "spec", None)  # the preset's models are the loaded ones
        draft_b_value = loaded_draft_b(engine) if here and has_draft else sizes.get(p.draft, NO_DRAFT)
        return p.params_b, draft_b_value, bool(p.medusa), here and has_draft, here and has_medusa

    fill_btn.click(fill, pick, [target_b, draft_b, train, loaded_draft, loaded_medusa], api_visibility="private",
                   queue=False)
