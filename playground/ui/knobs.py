"""One input widget per knob (``playground.engine.limits``), shared by the page's method settings
and the Benchmark tab: a slider, a number box for very wide ranges, or a dropdown for a knob
chosen by name.

Bounds are checked by our handlers (``Knob.check``, which names the bound), not by Gradio: a
stock ``gr.Slider`` / ``gr.Number`` raises in ``preprocess`` when a typed value is out of range,
which fails every event reading the input with a server traceback (and a 500 for unqueued
events) instead of a message. The widgets here are Gradio *templates* of the stock components
(the mechanism of ``gradio.templates``: same front end, ``is_template``) whose ``preprocess``
passes the value on; typing a value out of range shows a warning naming the allowed range, and
the Run handlers refuse it with the same message.
"""

from __future__ import annotations

import gradio as gr
from gradio.components.number import Number

from .toast import warning

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
        return None if payload is None else self.round_to_precision(payload, self.precision)


def range_text(knob) -> str:
    """The allowed range of a numeric knob as the UI shows it: ``1 to 20``."""
    def fmt(x):
        return str(int(x)) if knob.integer else f"{x:g}"
    return f"{fmt(knob.minimum)} to {fmt(knob.maximum)}"


def out_of_range_message(knob, label: str, value) -> str | None:
    """The warning for a typed value outside the knob's bounds (None when the value is fine)."""
    try:
        knob.check(value)
    except ValueError:
        shown = "nothing" if value is None else f"{value:g}" if isinstance(value, float) else str(value)
        return (f"{label}: allowed values are {range_text(knob)}"
                f"{'' if not knob.integer else ' (whole numbers)'}; got {shown}. Runs refuse it until it is fixed.")
    return None


def knob_input(knob, elem_id: str, interactive: bool = True, value=None, label: str | None = None):
    """The input of one knob, starting at ``value`` (None: the knob's default), labelled ``label``
    (None: the knob's own label). Call it inside a ``gr.Blocks``: a numeric input warns (a toast
    naming the allowed range) when the user types a value out of range."""
    value = knob.default if value is None else value
    label = knob.label if label is None else label
    if not hasattr(knob, "maximum"):  # a setting chosen by name (ChoiceKnob): a dropdown
        return gr.Dropdown(list(knob.choices), value=value, label=label, info=knob.info,
                           elem_id=elem_id, interactive=interactive,
                           allow_custom_value=getattr(knob, "parse", None) is not None)
    if knob.maximum - knob.minimum > NUMBER_BOX_RANGE:
        box = KnobNumber(value=value, minimum=knob.minimum, maximum=knob.maximum, precision=0,
                         step=knob.step, label=label, info=knob.info, elem_id=elem_id,
                         interactive=interactive)
    else:
        box = KnobSlider(knob.minimum, knob.maximum, value=value, step=knob.step, label=label,
                         info=knob.info, elem_id=elem_id, interactive=interactive)

    def warn(v):
        message = out_of_range_message(knob, label, v)
        if message:
            warning(message)

    # Queued (toasts need the queue) but never waiting behind a run: no concurrency limit.
    box.input(warn, box, None, api_visibility="private", show_progress="hidden", concurrency_limit=None,
              trigger_mode="always_last")
    return box
