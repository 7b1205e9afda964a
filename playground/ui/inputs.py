"""The run handler's inputs: their names and order, the API's positional arguments, and the
parsing of the page's values into method specs and generation settings.

Every value is checked here, before any work, with the page's own labels in the messages.
"""

from __future__ import annotations

from playground.engine import GENERATION_KNOBS, METHODS, REPETITION_PENALTY_KNOB, GenerationSettings, MethodSpec
from playground.engine import SamplingConfig

from .knobs import page_check


def input_names() -> list[str]:
    """Names of the run handler's arguments, in order.

    ``prompt``; ``use_<method>`` per method; ``<method>_<knob>`` per method knob;
    then the generation settings (``max_new_tokens``, ``temperature``, ``top_p``, ``top_k``, ``seed``),
    then ``stop_strings`` (text, one stop string per line), then ``repetition_penalty`` (None:
    the model's own value).
    """
    names = ["prompt"] + [f"use_{m}" for m in METHODS]
    names += [f"{m}_{k.name}" for m, info in METHODS.items() for k in info.knobs]
    return names + [k.name for k in GENERATION_KNOBS] + [STOP_INPUT, PENALTY_INPUT]


STOP_INPUT = "stop_strings"
"""The page's stop-strings field: one stop string per line."""
PENALTY_INPUT = REPETITION_PENALTY_KNOB.name
"""The page's repetition-penalty slider (it starts at the model's own value; None in the API: the model's)."""


def stop_lines(text) -> tuple[str, ...]:
    """The stop strings of the page's field (one per line, empty lines dropped); a list or tuple of
    strings (API clients) is taken as it is."""
    if isinstance(text, (list, tuple)):
        return tuple(str(s) for s in text if str(s))
    return tuple(line for line in str(text or "").splitlines() if line)


def run_arguments(prompt: str, methods: list[str], params: dict[str, dict] | None = None,
                  **generation) -> list:
    """Positional arguments of the ``/run`` endpoint, for API clients and tests.

    Args:
        prompt: the user message.
        methods: names of the methods to tick.
        params: method -> {knob: value}; missing knobs take the knobs' global defaults, which may differ
            from the page's: the page starts the draft model's K at the value saved with the loaded
            draft (2 for the shipped one, against the global 4), so give ``{"draft_model": {"k": 2}}`` to
            run what the page runs. (A knob the page sends empty is refused, so None cannot mean "default".)
        generation: ``max_new_tokens``, ``temperature``, ``top_p``, ``top_k``, ``seed``
            (defaults from :data:`GENERATION_KNOBS`), ``stop_strings`` (a list, or lines of text)
            and ``repetition_penalty`` (default None: the model's own value).

    Example::

        client.submit(*run_arguments("Hi", ["autoregressive", "prompt_lookup"], max_new_tokens=32),
                      api_name="/run")

    Raises:
        TypeError: an unknown generation setting.
        ValueError: an unknown method (in ``methods`` or ``params``) or knob name, or ``methods``
            given as one string.
    """
    params = params or {}
    unknown = set(generation) - {k.name for k in GENERATION_KNOBS} - {STOP_INPUT, PENALTY_INPUT}
    if unknown:
        raise TypeError(f"unknown generation settings {sorted(unknown)}")
    if isinstance(methods, str):
        raise ValueError(f"methods must be a list of method names, got the string {methods!r}")
    names = [m for m in [*methods, *params] if m not in METHODS]
    if names:
        raise ValueError(f"unknown method {names[0]!r}: choose from {', '.join(METHODS)}")
    for m, knobs in params.items():
        bad = sorted(set(knobs) - {k.name for k in METHODS[m].knobs})
        if bad:
            raise ValueError(f"{m} has no knob {bad[0]!r}; its knobs: {', '.join(k.name for k in METHODS[m].knobs)}")
    args: list = [prompt] + [m in methods for m in METHODS]
    args += [params.get(m, {}).get(k.name, k.default) for m, info in METHODS.items() for k in info.knobs]
    stops = generation.get(STOP_INPUT, "")
    return args + [generation.get(k.name, k.default) for k in GENERATION_KNOBS] + \
        ["\n".join(stops) if isinstance(stops, (list, tuple)) else stops, generation.get(PENALTY_INPUT)]


def _parse(values: tuple) -> tuple[str, list[MethodSpec], GenerationSettings]:
    """Turn the handler's arguments into (prompt, method specs, settings).

    Raises:
        ValueError: wrong number of values, no method ticked, or a setting out of range.
    """
    names = input_names()
    if len(values) != len(names):
        raise ValueError(f"expected {len(names)} inputs ({', '.join(names)}), got {len(values)}")
    v = dict(zip(names, values))
    chosen = [m for m in METHODS if v[f"use_{m}"]]
    if not chosen:
        raise ValueError("no method is ticked: choose at least one method to run")
    specs = []
    for m in chosen:
        label = METHODS[m].label
        try:  # each knob with the page's label, then the checks across knobs
            params = {k.name: page_check(k, k.label, v[f"{m}_{k.name}"]) for k in METHODS[m].knobs}
            spec = MethodSpec(m, params)
            spec.checked_params()
        except ValueError as e:
            raise ValueError(f"{label} settings: {e}") from None
        specs.append(spec)
    gen = {k.name: page_check(k, k.label, v[k.name]) for k in GENERATION_KNOBS}
    sampling = SamplingConfig(gen["temperature"], gen["top_p"], gen["top_k"], gen["seed"])
    penalty = v[PENALTY_INPUT]
    penalty = None if penalty is None else page_check(REPETITION_PENALTY_KNOB, REPETITION_PENALTY_KNOB.label, penalty)
    try:
        settings = GenerationSettings(gen["max_new_tokens"], sampling, stop_strings=stop_lines(v[STOP_INPUT]),
                                      repetition_penalty=penalty)
    except (ValueError, TypeError) as e:
        raise ValueError(f"Stop strings: {e}") from None
    return str(v["prompt"] or ""), specs, settings


def model_settings_note(defaults: dict) -> str:
    """One Markdown line saying which generation settings come from the model's own configuration.

    Args:
        defaults: :meth:`Engine.generation_defaults` (``applied``, ``suggested``, ``ignored``).
    """
    def listed(d: dict) -> str:
        return ", ".join(f"{k.replace('_', ' ')} {v:g}" if isinstance(v, float) else f"{k.replace('_', ' ')} {v}"
                         for k, v in d.items())

    parts = []
    if defaults.get("applied"):
        parts.append(f"applied to every run unless changed here: {listed(defaults['applied'])}")
    if defaults.get("suggested"):
        parts.append(f"suggested for sampling (set a temperature to use them): {listed(defaults['suggested'])}")
    if defaults.get("ignored"):
        parts.append(f"not supported here, so not applied: {listed(defaults['ignored'])}")
    if not parts:
        return "The model's own configuration sets no generation settings: the values here are all that apply."
    return "From the model's own configuration: " + "; ".join(parts) + "."
