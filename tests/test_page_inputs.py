"""The page's one rule for typed values (issue 20, inputs): out of range is clamped with a message
that says so, a fraction for a whole number is rounded with a message, and whatever is still
invalid when Run is pressed is refused with the page's label and the allowed range (nothing runs).
Options the loaded models cannot serve are not offered."""

from __future__ import annotations

import pytest

from playground.engine import GENERATION_KNOBS, METHODS, Knob
from playground.ui.inputs import _parse, run_arguments
from playground.ui.knobs import correction, page_check

K = Knob("k", "Speculative tokens K", 1, 16, 4)


@pytest.mark.parametrize("typed, fixed, verb", [(50, 16, "clamped"), (0, 1, "clamped"), (12.5, 12, "rounded"),
                                                (-3.5, 1, "clamped"), (1e9, 16, "clamped")])
def test_a_typed_value_is_corrected_and_the_message_says_to_what(typed, fixed, verb):
    message, value = correction(K, "K", typed)
    assert value == fixed and isinstance(value, int)
    assert message == f"K: allowed values are 1 to 16 (whole numbers); {typed:g} is {verb} to {fixed}."


def test_a_fine_or_empty_value_needs_no_correction():
    assert correction(K, "K", 7) == (None, None)
    assert correction(K, "K", None) == (None, None)
    assert correction(K, "K", True) == (None, None)  # not a number: Run refuses it


@pytest.mark.parametrize("value", [50, 12.5, True, None, float("inf"), "x"])
def test_run_refuses_what_is_still_invalid_with_the_page_label(value):
    with pytest.raises(ValueError) as e:
        page_check(K, "Speculative tokens K", value)
    assert str(e.value).startswith("Speculative tokens K: allowed values are 1 to 16 (whole numbers); got ")
    assert str(e.value).endswith("Nothing was run.") and "k must" not in str(e.value)


@pytest.mark.parametrize("name, value", [("max_new_tokens", 12.5), ("max_new_tokens", 0), ("seed", 1.5),
                                         ("top_p", 0), ("temperature", 5), ("max_new_tokens", 1_000_000)])
def test_generation_settings_out_of_range_name_the_page_label(name, value):
    knob = next(k for k in GENERATION_KNOBS if k.name == name)
    args = run_arguments("Hi", ["autoregressive"], **{name: value})
    with pytest.raises(ValueError) as e:
        _parse(tuple(args))
    assert str(e.value).startswith(f"{knob.label}: allowed values are ") and name not in str(e.value)


def test_method_knobs_out_of_range_name_the_method_and_knob_labels():
    knob = METHODS["prompt_lookup"].knobs[0]
    args = run_arguments("Hi", ["prompt_lookup"], params={"prompt_lookup": {knob.name: 10_000}})
    with pytest.raises(ValueError) as e:
        _parse(tuple(args))
    assert str(e.value).startswith(f"{METHODS['prompt_lookup'].label} settings: {knob.label}: allowed values")


def test_the_draft_proposer_without_draft_heads_is_not_offered():
    from types import SimpleNamespace

    from playground.engine import Engine

    engine = SimpleNamespace(draft_medusa=None)
    assert Engine.knob_choices(engine, "draft_model", "proposer") == ("model",)
    engine.draft_medusa = object()
    assert "medusa_heads" in Engine.knob_choices(engine, "draft_model", "proposer")
    assert Engine.knob_choices(engine, "draft_model", "k") is None
