"""Which token sources the page's legend lists: only those the loaded models can produce.

A method that cannot run with the loaded models (no EAGLE head, no Medusa heads, no draft model)
adds no colour; Medusa heads beyond those loaded add none either. EAGLE's depth colours are kept
as one group (``render.legend_html`` draws them as a single ramp entry): a step can draft as deep as
the tree-depth knob allows.
"""

from __future__ import annotations

from playground.engine import METHODS, MAX_MEDUSA_HEADS, SOURCE_EAGLE, head_source


def legend_sources(engine) -> list[str]:
    """Token sources the legend lists, each once, in page order (``"target"`` first).

    Args:
        engine: the loaded :class:`~playground.engine.Engine`, or any object with ``medusa`` (heads with
            ``num_heads``, or None) and optionally ``unavailable_reason(method)``; without the latter
            every method counts as available.

    Returns:
        source tags, e.g. ``["target", "prompt_lookup", "lookahead", "suffix", "recycling"]``.
    """
    medusa = getattr(engine, "medusa", None)
    loaded = getattr(medusa, "num_heads", 0) if medusa is not None else 0
    absent = {head_source(k) for k in range(loaded + 1, MAX_MEDUSA_HEADS + 1)}
    reason = getattr(engine, "unavailable_reason", None)
    if reason is not None and reason("eagle") is not None:
        absent.add(SOURCE_EAGLE)  # a mixture proposes EAGLE tokens only with a head loaded
    methods = [m for m in METHODS if reason is None or reason(m) is None]
    # dict.fromkeys: a mixture repeats its members' sources; each is listed once
    return list(dict.fromkeys(s for m in methods for s in METHODS[m].sources if s not in absent))
