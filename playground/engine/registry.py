"""The method registry: each method module registers its own :class:`MethodInfo` where it is defined.

A method is a drafter plus what the API, the benchmark and the UI need to know about it
(name, label, knobs, token sources, when it is lossless, which loaded parts it needs, and a
factory that builds its drafter). Adding a method means adding one module that calls
:func:`register` and one import line in :mod:`playground.engine.methods`. This module imports
no method module, so the import graph has no cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .events import SOURCE_TARGET
from .limits import ChoiceKnob, Knob

BASELINE = "autoregressive"
"""The method every other one is compared with (plain autoregressive decoding)."""


@dataclass(frozen=True)
class MethodInfo:
    """What the UI and the benchmark need to know about one method.

    Attributes:
        name: API name (``prompt_lookup``); label: display name (``Prompt lookup``).
        description: one line for the UI.
        lossless: greedy output must equal the baseline's token for token.
        knobs: the method's settings (bounds shared with the UI inputs; :class:`ChoiceKnob` for
            named options).
        sources: source tags its tokens can carry (``target`` included).
        source_labels: legend text of each of its own sources (``{"prompt_lookup": "prompt lookup"}``).
        build: ``build(engine, params) -> Drafter``: a fresh drafter with checked ``params``; ``engine``
            is the :class:`~playground.engine.engine.Engine` (its loaded parts: ``target_lm``,
            ``draft_lm``, ``draft``, ``medusa``, ``eagle``; ``persistent(key, factory)`` for state kept
            across runs: state that learns (keys under ``learned/``) is asked for here, at build time,
            never during steps, so that it is the run's scope's (:mod:`~playground.engine.learned`)).
        requires: loaded parts the method needs, among ``"draft"``, ``"medusa"``, ``"eagle"``.
        lossless_if: when given, the method is lossless only for params where it returns True
            (Medusa: exact acceptance, not typical); see :func:`is_lossless`.
        learns_across_runs: its drafter keeps state from earlier runs (suffix decoding's global
            cache), which the page says and the benchmark resets after warm-up.
        uses: when given, ``uses(params)`` names the other methods a drafter with ``params`` runs
            (the mixture's members), whose loaded parts it needs too (:func:`methods_run`).
    """

    name: str
    label: str
    description: str
    lossless: bool
    knobs: tuple[Knob | ChoiceKnob, ...]
    sources: tuple[str, ...]
    build: Callable[[Any, dict], Any]
    source_labels: dict[str, str] = field(default_factory=dict)
    requires: tuple[str, ...] = ()
    lossless_if: Callable[[dict], bool] | None = None
    learns_across_runs: bool = False
    uses: Callable[[dict], tuple[str, ...]] | None = None

    @property
    def needs_draft(self) -> bool:
        return "draft" in self.requires


METHODS: dict[str, MethodInfo] = {}
"""Registered methods by name, in registration order (the baseline first)."""


def register(info: MethodInfo) -> MethodInfo:
    """Add ``info`` to :data:`METHODS` and return it.

    Raises:
        ValueError: a method of that name is already registered.
    """
    if info.name in METHODS:
        raise ValueError(f"method {info.name!r} is registered twice")
    METHODS[info.name] = info
    return info


def check_method_names(methods) -> None:
    """Check ``methods`` (``Engine.load``'s list of the methods to load models for; None: all).

    Raises:
        ValueError: a single string instead of a list, or a name that is not a registered method.
    """
    unknown = [m for m in methods or () if m not in METHODS]
    if isinstance(methods, str) or unknown:
        raise ValueError(f"methods must be a list of method names among {', '.join(METHODS)}; got {methods!r}"
                         + (f" ({', '.join(map(repr, unknown))} unknown)" if unknown else ""))


def methods_run(specs) -> list[str]:
    """The methods that ``specs`` (:class:`MethodSpec` objects) run, each once, in first-seen order:
    their own names and the methods they use (a mixture's members, :attr:`MethodInfo.uses`); what
    ``Engine.load(methods=...)`` needs to load every part they read (a mixture with EAGLE among
    its members needs the EAGLE head).

    Raises:
        ValueError: an unknown method, or params its ``uses`` refuses (the message says why).
    """
    names: list[str] = []
    for spec in specs:
        info = METHODS.get(spec.name)
        if info is None:
            check_method_names([spec.name])
        used = info.uses(spec.params or {}) if info.uses is not None else ()
        names += [n for n in (spec.name, *used) if n not in names]
    return names


def is_lossless(method: str, params: dict | None = None) -> bool:
    """Whether ``method`` with ``params`` must match the baseline under greedy decoding."""
    info = METHODS[method]
    return info.lossless and (info.lossless_if is None or bool(info.lossless_if(params or {})))


def lossless_check_applies(method: str, params: dict | None, temperature: float) -> bool:
    """Whether a run of ``method`` is checked token for token against the baseline: greedy
    decoding (``temperature == 0``) and a lossless method with these ``params``. Unknown methods
    (records of another version) are checked."""
    if temperature != 0:
        return False
    return method not in METHODS or is_lossless(method, params)


def source_labels() -> dict[str, str]:
    """Legend text of every registered token source (the target's bonus token first)."""
    labels = {SOURCE_TARGET: "target (bonus / correction)"}
    for info in METHODS.values():
        labels.update(info.source_labels)
    return labels


@dataclass(frozen=True)
class MethodSpec:
    """One method to run, with its knob values (missing knobs take their defaults).

    Raises:
        TypeError: ``name`` is not a string or ``params`` not a dict.
    """

    name: str
    params: dict = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.name, str):
            raise TypeError(f"MethodSpec.name must be a method name (str), got {type(self.name).__name__}")
        if not isinstance(self.params, dict):
            raise TypeError(f"MethodSpec.params must be a dict of knob values, got {type(self.params).__name__}")

    def checked_params(self) -> dict:
        """The params with defaults filled in and every value checked.

        Raises:
            ValueError: unknown method, unknown knob, or a value out of range.
        """
        info = METHODS.get(self.name)
        if info is None:
            raise ValueError(f"unknown method {self.name!r}; choose from {', '.join(METHODS)}")
        known = {k.name: k for k in info.knobs}
        unknown = set(self.params) - set(known)
        if unknown:
            raise ValueError(f"{self.name} has no setting {', '.join(sorted(unknown))}; "
                             f"its settings are {', '.join(known) or 'none'}")
        return {name: knob.check(self.params.get(name, knob.default)) for name, knob in known.items()}
