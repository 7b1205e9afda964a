"""One input widget per knob (``playground.engine.limits``), shared by the page's method settings
and the Benchmark tab: a slider, a number box for very wide ranges, or a dropdown for a knob
chosen by name.

One rule for a typed value the page cannot use, said once: a value outside the allowed range
is set to the nearest allowed value and a message says so ("K: allowed values are 1 to 16;
50 is clamped to 16"); a whole-number setting given a fraction is rounded, with the same kind
of message. (A slider's number box clamps on leaving the field in Gradio's front end; the
handlers here say so, and round what the front end leaves unrounded. A typed "0" where the
minimum lies between 0 and 1, as for top-p, may be the start of "0.5": it is said when the field
is left and the front end has clamped it. A slider's box left empty keeps the value it had
(:data:`KEEP_ON_CLEAR_JS`): Gradio's front end would clamp "nothing" to the minimum, and a run
would silently make one token or sample with top-p 0.01.) Anything still invalid
when Run is pressed (an API call, a value sent before the correction arrived) is refused with
the page's label and the allowed range, and nothing runs (:func:`page_check`).

The range check is ours, not Gradio's: a stock ``gr.Slider`` / ``gr.Number`` raises in
``preprocess`` when a typed value is out of range, which fails every event reading the input
with a server traceback (and a 500 for unqueued events) instead of a message. The widgets here
are Gradio *templates* of the stock components (the mechanism of ``gradio.templates``: same
front end, ``is_template``) whose ``preprocess`` passes the value on unchanged.
"""

from __future__ import annotations

import gradio as gr
from gradio.components.number import Number

from .wording import choice_pairs
from .toast import warning

KEEP_ON_CLEAR_JS = """() => {
  // A slider's number box left empty gets back the last value it showed, before Gradio's own blur
  // handler clamps the empty value to the slider's minimum.
  const sliderBox = (el) => el instanceof HTMLInputElement && el.type === "number"
    && !!el.closest(".block")?.querySelector("input[type=range]");
  const remember = (e) => {
    const box = e.target;
    if (sliderBox(box) && box.value.trim() !== "") box.dataset.kept = box.value;
  };
  document.addEventListener("focusin", remember, true);
  document.addEventListener("beforeinput", remember, true);  // before each edit: what it showed
  document.addEventListener("blur", (e) => {
    const box = e.target;
    if (!sliderBox(box) || box.value.trim() !== "" || !box.dataset.kept) return;
    box.value = box.dataset.kept;
    box.dispatchEvent(new Event("input", { bubbles: true }));
  }, true);
}"""
"""Page script (``launch(js=...)``): a slider's number box emptied and left gets back the last value
it showed (before the edit that emptied it, so a value the server corrected meanwhile counts),
instead of Gradio's clamp of the empty value to the minimum (max new tokens 1, top-p 0.01,
repetition penalty 0.5, with no message). Listeners in the capture phase on the document run
before the box's own handlers; the ``input`` event updates the bound value."""

NUMBER_BOX_RANGE = 10_000
"""Knobs with a wider range than this get a number box instead of a slider (the seed)."""


class KnobSlider(gr.Slider):
    """``gr.Slider`` that leaves the range check to the handler (see the module docstring)."""

    is_template = True

    def preprocess(self, payload: float | None) -> float | None:
        return None if payload is None else Number.round_to_precision(payload, self.precision)


class KnobNumber(gr.Number):
    """``gr.Number`` that leaves the range check to the handler (see the module docstring)."""

    is_template = True

    def preprocess(self, payload: float | None) -> float | int | None:
        return payload  # no silent rounding: a fraction for a whole number is corrected or refused


class LooseCheckboxGroup(gr.CheckboxGroup):
    """``gr.CheckboxGroup`` whose ``preprocess`` passes the ticked values on without checking them
    against its choices: when a handler replaces the choices (another question set, other models),
    a click that reaches the server before the page has the new choices would otherwise fail with
    Gradio's "not in the list of choices" error instead of the handler's own message."""

    is_template = True

    def preprocess(self, payload):
        return list(payload or [])


def range_text(knob) -> str:
    """The allowed range of a numeric knob as the UI shows it: ``1 to 20``."""
    def fmt(x):
        return str(int(x)) if knob.integer else f"{x:g}"
    return f"{fmt(knob.minimum)} to {fmt(knob.maximum)}"


def _shown(value) -> str:
    if value is None:
        return "nothing"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _allowed(knob, label: str) -> str:
    return f"{label}: allowed values are {range_text(knob)}{' (whole numbers)' if knob.integer else ''}"


def correction(knob, label: str, value) -> tuple[str | None, int | float | None]:
    """The page's correction of a typed numeric value: ``(message, corrected value)``, or
    ``(None, None)`` when the value is fine (or empty: Run then says what is missing).

    Out of range: clamped to the nearest bound; a fraction for a whole-number knob: rounded.
    """
    if value is None or isinstance(value, bool):
        return None, None
    try:
        knob.check(value)
        return None, None
    except ValueError:
        pass
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        return None, None
    if v != v:
        return None, None
    fixed = min(max(v, knob.minimum), knob.maximum)
    if knob.integer:
        fixed = int(round(fixed))
        fixed = int(min(max(fixed, knob.minimum), knob.maximum))
    verb = "clamped" if not (knob.minimum <= v <= knob.maximum) else "rounded"
    return f"{_allowed(knob, label)}; {_shown(value)} is {verb} to {_shown(fixed)}.", fixed


def out_of_range_message(knob, label: str, value) -> str | None:
    """The warning for a typed value the page corrects (None when the value is fine)."""
    return correction(knob, label, value)[0]


def page_check(knob, label: str, value):
    """``knob.check(value)`` with the page's own wording in the error.

    Raises:
        ValueError: ``"<label>: allowed values are 1 to 16 (whole numbers); got 50. Nothing was
            run."`` (numeric knobs), or ``"<label>: <reason>"`` for a knob chosen by name.
    """
    try:
        return knob.check(value)
    except ValueError as e:
        if not hasattr(knob, "maximum"):
            raise ValueError(f"{label}: {str(e).removeprefix(knob.name).strip()}") from None
        raise ValueError(f"{_allowed(knob, label)}; got {_shown(value)}. Nothing was run.") from None


def knob_input(knob, elem_id: str, interactive: bool = True, value=None, label: str | None = None,
               choices=None):
    """The input of one knob, starting at ``value`` (None: the knob's default), labelled ``label``
    (None: the knob's own label), offering ``choices`` (None: all the knob's options) for a knob
    chosen by name. Call it inside a ``gr.Blocks``: a numeric input warns (a toast
    naming the allowed range) when the user types a value out of range."""
    value = knob.default if value is None else value
    label = knob.label if label is None else label
    if not hasattr(knob, "maximum"):  # a setting chosen by name (ChoiceKnob): a dropdown
        offered = list(knob.choices if choices is None else choices)  # only what the loaded models serve
        value = value if value in offered or getattr(knob, "parse", None) is not None else offered[0]
        return gr.Dropdown([p for p in choice_pairs(knob) if p[1] in offered], value=value, label=label,
                           info=knob.info,
                           elem_id=elem_id, interactive=interactive,
                           allow_custom_value=getattr(knob, "parse", None) is not None)
    if knob.maximum - knob.minimum > NUMBER_BOX_RANGE:
        box = KnobNumber(value=value, minimum=knob.minimum, maximum=knob.maximum, precision=0,
                         step=knob.step, label=label, info=knob.info, elem_id=elem_id,
                         interactive=interactive)

        def fix_number(v):  # on leaving the box: clamp and round, and say so
            message, fixed = correction(knob, label, v)
            if message:
                warning(message)
                return fixed
            return gr.skip()

        box.blur(fix_number, box, box, api_visibility="private", show_progress="hidden", concurrency_limit=None)
        return box
    box = KnobSlider(knob.minimum, knob.maximum, value=value, step=knob.step, label=label,
                     info=knob.info, elem_id=elem_id, interactive=interactive)

    typed = gr.State(None)  # a "0" left pending (see below), per browser session

    def fix_slider(v, pending):
        """``(new value or skip, pending)``: warn once for each correction of what was typed."""
        message, fixed = correction(knob, label, v)
        if message is not None and v == 0 and 0 < knob.minimum < 1:
            return gr.skip(), 0  # "0" on the way to "0.5": no warning yet, but remember it
        if message is not None:
            warning(message)
            # The front end clamps a value out of range itself when the field is left; a fraction
            # is rounded here.
            return (fixed if knob.minimum <= float(v) <= knob.maximum else gr.skip()), None
        if pending is not None:  # the "0" was left as it was: the front end clamped it (top-p 0 -> 0.01)
            said, clamped = correction(knob, label, pending)
            if said is not None and v == clamped:
                warning(said)
            return gr.skip(), None
        return gr.skip(), gr.skip()

    # On every change of the value: each keystroke, and the front end's clamp when the field is left.
    # Queued (toasts need the queue) but never waiting behind a run: no concurrency limit.
    box.change(fix_slider, [box, typed], [box, typed], api_visibility="private", show_progress="hidden",
               concurrency_limit=None, trigger_mode="always_last")
    return box
