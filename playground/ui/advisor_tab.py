"""The Advisor tab: which method suits your situation, why, and a button that applies it.

The rules and the advice come from :mod:`playground.advisor` (data plus one function, quoting
``assets/measurements.json``); this module only lays them out, applies an
:class:`~playground.advisor.Advice` to the Playground tab's checkboxes and sliders, and offers the
model presets (:mod:`playground.presets`; the Models tab, :mod:`.models_tab`, loads them per session).
"""

from __future__ import annotations

import dataclasses
import html
import logging
import re

import gradio as gr

from playground import advisor, presets
from playground.engine import BASELINE, METHODS

from . import wording
from .wording import choice_label, method_label, unavailable_text

log = logging.getLogger(__name__)

NO_DRAFT = 0.0
"""The draft-size box's value meaning "no same-family smaller model"."""


_size_b = wording.size_b


def target_size_b(engine) -> float:
    """The loaded target's parameter count in billions (3 significant digits)."""
    try:
        return _size_b(engine, "target")
    except AttributeError:
        return 0.135


_target_sized_draft = wording.target_sized_draft  # no draft to advise on: the advisor refuses such a draft


def loaded_draft_b(engine) -> float:
    """The loaded draft's size in billions, or :data:`NO_DRAFT` when none smaller than the target is loaded."""
    try:
        return NO_DRAFT if engine.draft is None or _target_sized_draft(engine) else _size_b(engine, "draft")
    except AttributeError:
        return NO_DRAFT


def loaded_models(engine) -> tuple[bool, bool, int | None, bool]:
    """``(draft loaded, Medusa heads loaded, the draft's own K or None, EAGLE-3 head loaded)`` for the advisor
    (a part counts as loaded when the engine holds it and can run its method; a draft only when it is
    smaller than the target)."""
    draft = None if _target_sized_draft(engine) else getattr(engine, "draft", None)
    k = ((getattr(draft, "knob_defaults", None) or {}).get("k")) if draft is not None else None
    return (draft is not None and engine.unavailable_reason("draft_model") is None,
            getattr(engine, "medusa", None) is not None and engine.unavailable_reason("medusa") is None,
            int(k) if isinstance(k, (int, float)) and not isinstance(k, bool) else None,
            getattr(engine, "eagle", None) is not None and engine.unavailable_reason("eagle") is None)


RULE_TITLES = {
    "no_draft_medusa": "No draft model: train Medusa heads", "same_family_draft": "A same-family draft is available",
    "draft_size": "Draft size", "target_too_small": "A small target", "zero_training": "No training and no draft",
    "copy_tasks": "Tasks that copy from the prompt", "k_defaults": "How many tokens to draft (K)",
    "loaded_draft": "A draft made for this target is loaded", "loaded_medusa": "Medusa heads are loaded",
    "lookahead_size": "Lookahead's window by model size", "medusa_threshold": "Medusa's typical acceptance",
    "medusa_tree": "Medusa's tree", "measured_run": "What this page measured",
    "loaded_eagle": "An EAGLE-3 head is loaded", "eagle_head": "EAGLE-3 first on a GPU",
    "measured_figures": "What the project measured", "measured_variant": "Settings the project measured faster",
}
"""The page's title of each advisor rule (the rules' ids are internal)."""


def rule_title(rule_id: str) -> str:
    """A rule's title on the page (its id made readable when it has none)."""
    return RULE_TITLES.get(rule_id, rule_id.replace("_", " ").capitalize())


def _label(m: str) -> str:
    return METHODS[m].label if m in METHODS else m.replace("_", " ")


def _knob_label(m: str, k: str) -> str:
    knob = next((kn for kn in METHODS[m].knobs if kn.name == k), None) if m in METHODS else None
    return _KNOB_NAMES.get(k) or (knob.label if knob is not None else k.replace("_", " "))


def _value_text(m: str, k: str, v) -> str:
    return choice_label(k, v) if isinstance(v, str) else str(v)


_SNAKE = re.compile(r"\b[a-z0-9]+(?:_[a-z0-9]+)+\b")


def page_words(text: str) -> str:
    """``text`` in the page's words: a snake_case name (vLLM's ``draft_model`` method, a config key quoted
    by the vLLM backend's reason) with spaces for its underscores."""
    return _SNAKE.sub(lambda m: m.group(0).replace("_", " "), text)


def advice_markdown(advice: advisor.Advice, engine) -> str:
    """The advice as Markdown: the recommendation, settings (page names), whether it deploys on vLLM (else
    the fastest advised method that does), reasons with the rule behind each (its title and source,
    never its id; its guidance is in the tab's list of rules, which the reason applies), measured notes."""
    label = method_label(advice.primary)
    lines = [f"### Recommended: **{label}**"]
    ticks = ", ".join(method_label(m) for m in advice.methods)
    lines.append(f"Compare on the Playground tab: {ticks}.")
    for m, params in advice.params.items():
        if not params:
            continue
        lines.append(f"- **{_label(m)}**: " + ", ".join(f"{_knob_label(m, k)} = {_value_text(m, k, v)}"
                                                     for k, v in params.items()))
    if advice.deploy:
        lines.append(f"\n**On vLLM:** {html.escape(page_words(advice.deploy))}")
    lines.append("\n**Why**")
    for rule_id, text in advice.reasons:  # each rule's guidance in full: "The advisor's rules", below
        lines.append(f"- **{rule_title(rule_id)}**: {html.escape(text)}. _({advisor.RULES[rule_id].source})_")
    if advice.measured_notes:
        lines.append("\n**What the measurements say** (where they disagree with a rule, they win)")
        lines += [f"- {html.escape(n)}" for n in advice.measured_notes]
    missing = [m for m in advice.methods if m not in METHODS or engine.unavailable_reason(m)]
    if missing:
        lines.append("\n_Not available with the loaded models (Apply skips them): "
                     + "; ".join(f"{_label(m)}: {unavailable_text(engine, m) if m in METHODS else 'not in this build'}"
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


def loaded_here(engine, size, device) -> tuple[bool, bool, bool]:
    """The tab's "loaded here" boxes (draft, Medusa heads, EAGLE-3 head) for a target of ``size`` billion
    parameters on ``device``: what ``engine`` has loaded when they describe its target, else all
    False (the advice then is for another deployment: it kept "the loaded draft's own K", measured
    on the 135M default, for a 7B target's draft)."""
    loaded_size, _, has_draft, has_medusa, loaded_device, has_eagle = situation_values(engine)
    try:
        here = abs(float(size) - loaded_size) < 1e-9 and device == loaded_device
    except (TypeError, ValueError):
        here = False
    return has_draft and here, has_medusa and here, has_eagle and here


def situation(target_b, draft_b, train, task, appetite, device, loaded_draft=False, loaded_medusa=False,
              loaded_eagle=False, *, draft_k=None, cpu_isa=None) -> advisor.Situation:
    """A :class:`advisor.Situation` from the tab's inputs, in the order of the tab's input list (draft size
    0 = none; a negative one is an error); ``draft_k`` and ``cpu_isa`` by keyword.

    Raises:
        ValueError: an empty or non-numeric size (the situation's own check names the allowed range).
    """
    t = _number(target_b, "target size")
    d = 0.0 if draft_b is None or draft_b == "" else _number(draft_b, "draft size")
    if d < 0:
        raise ValueError(f"the draft size must be 0 (no draft) or a positive size below the target, got {d:g}")
    return advisor.Situation(t, d if d > 0 else None, bool(train), task, appetite, device,
                             bool(loaded_draft), bool(loaded_medusa), draft_k if loaded_draft else None,
                             cpu_isa if device == "cpu" else None, eagle_loaded=bool(loaded_eagle))


def run_figures(summary: dict | None, verify_cost) -> tuple[advisor.DraftMeasurement | None, dict[str, float]]:
    """What the last run on the Playground tab measured, for the advisor: the draft model's measurement
    (:func:`advisor.measure_draft`, the same as the draft panel's) and each method's speedup over the
    baseline. Sampled runs count for neither (their acceptance differs from greedy decoding's)."""
    if not summary or not summary.get("greedy", True):
        return None, {}
    methods = summary.get("methods") or {}
    d = methods.get("draft_model")
    draft = advisor.measure_draft(d["stats"], (d.get("params") or {}).get("k"), verify_cost) if d else None
    base = summary.get("baseline_tokens_per_s")
    speeds = {m: x["stats"]["tokens_per_s"] / base for m, x in methods.items()
              if base and m != BASELINE and (x.get("stats") or {}).get("tokens_per_s")}
    return draft, speeds


def advise(engine, *values, summary: dict | None = None, engine_key: str | None = None) -> tuple[str, dict | None]:
    """``(markdown, advice as plain data or None)``; bad input gives a message that says what is allowed
    and no recommendation (so Apply has nothing stale to apply), never raises.

    ``values``: the tab's inputs (target size, draft size, willing to train, task, appetite, device,
    draft loaded, Medusa loaded, EAGLE-3 head loaded; the last may be left out: not loaded). ``summary``:
    the last Playground run (``RunView.summary()``), whose measured draft K and speedups the advice
    follows when its device is this one. ``engine_key``: the
    session's engine key, under which the Theory tab caches this engine's measured verify cost (None:
    looked up from ``engine``).
    """
    try:
        draft_k = loaded_models(engine)[2]
        s = situation(*values, draft_k=draft_k, cpu_isa=advisor.cpu_isa())
        here = s.device == ("cpu" if str(getattr(getattr(engine, "target", None), "device", "cpu")) == "cpu" else "gpu")
        draft_run, speeds = run_figures(summary, _page_cost(engine, engine_key)) if here else (None, {})
        off = {"draft_model": not s.draft_loaded, "medusa": not s.medusa_loaded, "eagle": not s.eagle_loaded}
        available = tuple(m for m in METHODS if not off.get(m) and _runnable(engine, m)) if here else None
        s = dataclasses.replace(s, draft_run=draft_run if s.draft_loaded else None, run_speedups=speeds or None,
                                available=available)
        adv = advisor.advise(s, verify_cost=_measured_cost(engine, engine_key))
    except (TypeError, ValueError) as e:
        return (f"**Cannot advise:** {html.escape(str(e))}.\n\nAllowed: a target size above 0 and at most "
                f"{advisor.MAX_TARGET_B:g} billion parameters, and a draft size of 0 (none) or above 0 and below "
                "the target. Fix the input to see a recommendation."), None
    return advice_markdown(adv, engine), {"methods": adv.methods, "params": adv.params, "primary": adv.primary}


def _engine_key(engine) -> str | None:
    from . import worker

    return next((k for k, e in worker.ENGINES.items() if e is engine), None)  # the Theory tab registered it


def _runnable(engine, method: str) -> bool:
    """Whether the loaded models can run ``method`` (the engine's own reason, where it gives one)."""
    reason = getattr(engine, "unavailable_reason", None)
    try:
        return reason is None or reason(method) is None
    except Exception:  # noqa: BLE001 - a stand-in engine without models: count it as runnable
        return True


def _measured_cost(engine, key: str | None = None):
    """This device's verify cost when measured (the page's one curve, ``insight.verify_cost_for``, fitted
    non-decreasing as the Theory tab shows it), else None (the advisor then uses the project's)."""
    from . import insight

    cost = insight.verify_cost_for(key or _engine_key(engine) or "")
    return cost.monotone() if insight.measured_here(cost) else None


def _page_cost(engine, key: str | None = None):
    """The verify cost the draft panel uses (``insight.verify_cost_for``): measured, else the fallback."""
    from . import insight

    return insight.verify_cost_for(key or _engine_key(engine) or "")


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
        parts.append(label + (" (" + ", ".join(f"{_knob_label(m, k)} = {_value_text(m, k, v)}"
                                               for k, v in set_here.items()) + ")"
                              if set_here else ""))
    msg = "**Applied to the Playground tab:** " + "; ".join(parts) + ". Run it there to measure."
    if skipped:
        msg += " Not available with the loaded models, so not ticked: " + ", ".join(map(_label, skipped)) + "."
    return msg


_KNOB_NAMES = {"k": "K", "window": "W", "ngram_size": "N", "guess_set_size": "G", "tree_choices": "tree"}


def preset_markdown(name: str) -> str:
    p = presets.get_preset(name)
    target = "the embedded SmolLM2-135M-Instruct" if p.target == "default" else f"`{p.target}`"
    parts = [f"**{p.label}** — target {target}"]
    if p.drafts:
        parts.append("drafts " + ", ".join(f"`{d}`" for d in p.drafts))
    if p.medusa:
        parts.append(f"Medusa heads `{p.medusa}`")
    where = "loads offline" if p.offline else "needs the Hugging Face hub"
    return ", ".join(parts) + f" ({where}). {p.note}"


def situation_values(engine) -> tuple:
    """The tab's inputs that describe the loaded models, for ``engine``: (target size, draft size,
    draft loaded, Medusa loaded, device, EAGLE-3 head loaded)."""
    has_draft, has_medusa, _, has_eagle = loaded_models(engine)
    device = "cpu" if str(engine.target.device) == "cpu" else "gpu"
    return target_size_b(engine), loaded_draft_b(engine), has_draft, has_medusa, device, has_eagle


def preset_sizes(engine, name: str) -> tuple:
    """What "Use its sizes in the advisor" fills for preset ``name``, with ``engine`` loaded: (target size,
    draft size, willing to train, draft loaded, Medusa loaded, EAGLE-3 head loaded)."""
    p = presets.get_preset(name)
    has_draft, has_medusa, _, has_eagle = loaded_models(engine)
    sizes = {"HuggingFaceTB/SmolLM2-360M-Instruct": 0.36, "HuggingFaceTB/SmolLM2-135M-Instruct": 0.135,
             "Qwen/Qwen2.5-0.5B-Instruct": 0.5, "meta-llama/Llama-2-7b-chat-hf": 6.7}
    here = p.target == getattr(engine.target, "spec", None)  # the preset's models are the loaded ones
    draft_b_value = loaded_draft_b(engine) if here and has_draft else sizes.get(p.draft, NO_DRAFT)
    return p.params_b, draft_b_value, bool(p.medusa), here and has_draft, here and has_medusa, here and has_eagle


def build(engine, use: dict, knobs: dict, last_run: gr.State | None = None, models=None, tab=None) -> None:
    """Lay the tab out and wire Apply to the Playground tab's ``use`` checkboxes and ``knobs`` sliders.

    Args:
        use: method -> its checkbox on the Playground tab.
        knobs: ``(method, knob name)`` -> its slider on the Playground tab.
        last_run: the Playground's last finished run (``RunView.summary()``); the advice follows
            what it measured (the draft panel's K, the fastest method).
        models: the Models tab's :class:`~.models_tab.ModelsPanel`: the handlers use the session's
            engine (its ``key`` state is their last input) and the inputs describing the loaded models
            follow a load; None: ``engine``.
        tab: the ``gr.Tab`` holding this one: opening it refreshes the advice, so it reads the
            measurements made since the page was built (the device's timing right after the start).
    """
    device = "cpu" if str(engine.target.device) == "cpu" else "gpu"
    gr.Markdown("Tell the advisor about your deployment; it recommends a method and settings, with the rule behind "
                "each choice, and says where measurements (this device's from the Theory tab, or the project's, "
                "naming the machine) disagree with a rule.")
    has_draft, has_medusa, _, has_eagle = loaded_models(engine)
    with gr.Row(equal_height=False):
        with gr.Column(scale=2, min_width=300):
            # No minimum/maximum on the boxes: Gradio would reject out-of-range values with a server
            # traceback and keep the old advice; advise() checks them and says what is allowed.
            target_b = gr.Number(target_size_b(engine), label=f"Target size (billions of parameters, above 0 and at "
                                 f"most {advisor.MAX_TARGET_B:g})", elem_id="advisor-target-b")
            draft_b = gr.Number(loaded_draft_b(engine), label="Same-family smaller model with the same tokenizer "
                                "(billions; 0 = none)", elem_id="advisor-draft-b")
            train = gr.Checkbox(False, label="Willing to train something (an EAGLE-3 head, Medusa heads)",
                                elem_id="advisor-train")
            loaded_draft = gr.Checkbox(has_draft, label="This draft is loaded here (made for this target; the "
                                       "Playground tab can measure it)", elem_id="advisor-loaded-draft")
            loaded_medusa = gr.Checkbox(has_medusa, label="Medusa heads for this target are loaded here",
                                        elem_id="advisor-loaded-medusa")
            loaded_eagle = gr.Checkbox(has_eagle, label="An EAGLE-3 head for this target is loaded here",
                                       elem_id="advisor-loaded-eagle")
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
            # The order situation() takes; the EAGLE-3 box last, as callers that predate it leave it out.
            inputs = [target_b, draft_b, train, task, appetite, dev, loaded_draft, loaded_medusa, loaded_eagle]
            md0, adv0 = advise(engine, target_size_b(engine), loaded_draft_b(engine), False, "chat", "default",
                               device, has_draft, has_medusa, has_eagle)
            out = gr.Markdown(md0, elem_id="advisor-output")
            state = gr.State(adv0)
    with gr.Accordion("Model presets", open=True, elem_id="presets"):
        gr.Markdown("Each preset is a target with its drafts or Medusa heads; hub presets need the Hugging Face "
                    "hub (and usually a GPU). To run one, choose it on the Models tab: it loads for this browser "
                    "tab only. The Models tab offers a hub preset only where the hub answers (or its model is "
                    "already on this machine); offline, only the embedded default.")
        with gr.Row():
            pick = gr.Dropdown([(p.label, p.name) for p in presets.PRESETS.values()], value="default",
                               label="Preset", elem_id="preset-pick")
            fill_btn = gr.Button("Use its sizes in the advisor", size="sm", elem_id="preset-fill")
        preset_info = gr.Markdown(preset_markdown("default"), elem_id="preset-info")
        with gr.Accordion("The advisor's rules", open=False):
            gr.Markdown("\n".join(f"- **{rule_title(r.id)}**: {r.guidance} _({r.source})_"
                                   for r in advisor.RULES.values()))

    knob_keys = list(knobs)
    run = [last_run] if last_run is not None else []
    key = [models.key] if models is not None else []

    def session(*k):  # the session's engine and key (the server's without a Models tab)
        return (models.engine_for(k[0]), k[0]) if models is not None else (engine, None)

    def advise_and_clear(*v):  # new advice: the last "Applied" message no longer describes it
        # ``inputs``, then the last run and the session key: read from the end, so a caller that predates
        # the EAGLE-3 box (one input fewer) still lines up.
        tail = len(run) + len(key)
        values, rest = v[:len(v) - tail], v[len(v) - tail:]
        chosen, k = session(*rest[len(run):])
        return (*advise(chosen, *values, summary=rest[0] if run else None, engine_key=k), "")

    go_btn.click(advise_and_clear, inputs + run + key, [out, state, applied], api_visibility="private", queue=False)
    if tab is not None:  # the advice built with the page predates this device's timing
        tab.select(lambda *v: advise_and_clear(*v)[:2], inputs + run + key, [out, state], api_visibility="private",
                   queue=False)
    # One listener for every input, the latest change winning: a typed size also clears the "loaded here"
    # boxes (below), and the advice of the size's change must not land after the boxes' own.
    gr.on([comp.change for comp in inputs + run], advise_and_clear, inputs + run + key, [out, state, applied],
          api_visibility="private", queue=False, trigger_mode="always_last")
    apply_btn.click(lambda adv, *k: apply_values(session(*k)[0], adv, knob_keys), [state, *key],
                    [*(use[m] for m in METHODS), *(knobs[kk] for kk in knob_keys), applied],
                    api_visibility="private", queue=False)
    pick.change(preset_markdown, pick, preset_info, api_visibility="private", queue=False)
    fill_btn.click(lambda name, *k: preset_sizes(session(*k)[0], name), [pick, *key],
                   [target_b, draft_b, train, loaded_draft, loaded_medusa, loaded_eagle], api_visibility="private",
                   queue=False)
    # Typed another target size or device: the advice is for another deployment, not the loaded models.
    gr.on([target_b.input, dev.input], lambda size, device, *k: loaded_here(session(*k)[0], size, device),
          [target_b, dev, *key], [loaded_draft, loaded_medusa, loaded_eagle], api_visibility="private", queue=False)
    if models is not None:  # after a load: the sizes and "loaded" boxes describe the session's models
        models.follow(lambda e, _k: situation_values(e), [],
                      [target_b, draft_b, loaded_draft, loaded_medusa, dev, loaded_eagle])
