"""One input widget per knob (``playground.engine.limits``), shared by the page's method settings
and the Benchmark tab: a slider, a number box for very wide ranges, or a dropdown for a knob
chosen by name."""

from __future__ import annotations

import gradio as gr

NUMBER_BOX_RANGE = 10_000
"""Knobs with a wider range than this get a number box instead of a slider (the seed)."""


def knob_input(knob, elem_id: str, interactive: bool = True, value=None, label: str | None = None):
    """The input of one knob, starting at ``value`` (None: the knob's default), labelled ``label``
    (None: the knob's own label)."""
    value = knob.default if value is None else value
    label = knob.label if label is None else label
    if not hasattr(knob, "maximum"):  # a setting chosen by name (ChoiceKnob): a dropdown
        return gr.Dropdown(list(knob.choices), value=value, label=label, info=knob.info,
                           elem_id=elem_id, interactive=interactive,
                           allow_custom_value=getattr(knob, "parse", None) is not None)
    if knob.maximum - knob.minimum > NUMBER_BOX_RANGE:
        return gr.Number(value=value, minimum=knob.minimum, maximum=knob.maximum, precision=0,
                         step=knob.step, label=label, info=knob.info, elem_id=elem_id,
                         interactive=interactive)
    return gr.Slider(knob.minimum, knob.maximum, value=value, step=knob.step, label=label,
                     info=knob.info, elem_id=elem_id, interactive=interactive)
