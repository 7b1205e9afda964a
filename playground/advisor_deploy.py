"""Whether the advised method deploys on vLLM, and what to deploy there when it does not.

The vLLM backend says which methods it serves (``playground.backends.vllm.methods.unsupported_reason``:
None when it serves a method, else a sentence why not); this module asks it, never a list of its own,
and turns the answer into the advice's deployment line (:func:`deployment`). The backend's module is
imported when the line is written, not at import: it imports nothing heavy (no vLLM, no torch), and
without it the line says so. This module imports no UI code and loads no model.
"""

from __future__ import annotations

from playground.engine import METHODS

VLLM_METHODS = {"prompt_lookup": "ngram", "draft_model": "draft_model", "eagle": "eagle3", "medusa": "medusa",
                "suffix": "suffix"}
"""Method -> vLLM's name for it (the ``method`` of vLLM's ``speculative_config``, vllm/config/speculative.py)."""

_HOW = {"eagle": ", with an EAGLE-3 head for the target as its draft model ({head}); vLLM drafts a chain, one "
                 "token a level, where this page grows a dynamic tree",
        "draft_model": ", with the draft as its draft model", "prompt_lookup": ", looking n-grams up in the prompt"}


def serving_reason(method: str) -> str | None:
    """Why the vLLM backend cannot serve ``method`` (its own sentence), or None when it can.

    Never raises: a build without the vLLM backend's module gets a sentence saying so.
    """
    try:
        from playground.backends.vllm import methods as vllm_methods
    except ImportError as e:  # a trimmed build: the advice still works, the line says why
        return f"the vLLM backend is not part of this build ({e})"
    return vllm_methods.unsupported_reason(method)


def in_words(method: str, names: dict[str, str] | None = None) -> str:
    """A method in a sentence: its entry in ``names``, else its label, lower case where it is not a name
    (``prompt lookup``, ``suffix decoding``; ``Medusa``, ``EAGLE-3`` stay); a measured variant
    ``name:knob=value`` in words, ``name (knob value)``."""
    if ":" in method:
        base, _, knobs = method.partition(":")
        words = []
        for knob in knobs.split(";"):
            name, _, value = knob.partition("=")
            value = ", ".join(in_words(m) for m in value.split("+")) if name == "members" else value.replace("+", ", ")
            words.append(f"{name.replace('_', ' ')} {value.replace('_', ' ')}")
        return f"{in_words(base, names)} ({', '.join(words)})"
    if names and method in names:
        return names[method]
    label = METHODS[method].label if method in METHODS else method.replace("_", " ")
    common = label[1:2].islower() and label.split()[0] not in ("Medusa", "Lookahead")
    return label[0].lower() + label[1:] if common else label


def _served_as(method: str, eagle_loaded: bool) -> str:
    """``"vLLM's eagle3 method, with ..."``: how the backend serves a method it serves."""
    name = VLLM_METHODS.get(method)
    head = ("the head loaded here" if eagle_loaded else
            "a published one for the target, or one trained with the project's EAGLE trainer")
    where = f"vLLM's {name} method" if name else "the backend's setting for it"
    return where + _HOW.get(method, "").format(head=head)


def deployment(primary: str, methods: list[str], speeds: dict[str, tuple[float, str]],
               eagle_loaded: bool = False) -> tuple[str, str | None]:
    """The deployment line for advice whose first choice is ``primary``: ``(sentence, method to serve on vLLM)``.

    1. ``primary`` served by the vLLM backend: say how (vLLM's method name, the head or draft it loads).
    2. Else the fastest method the backend serves among the advised ``methods`` and the measured ones
       (``speeds``' keys): measured ones above 1x first, fastest first, then the advised unmeasured ones
       in the advice's order (said to be unmeasured); one measured at 1x or below is never named. The
       sentence gives the backend's reason why ``primary`` is not served.
    3. None served: the target without speculation (vLLM's plain decoding), method None.

    Args:
        primary: the advice's first choice (a method name).
        methods: the methods the advice ticks (the baseline ``autoregressive`` among them is skipped).
        speeds: method -> ``(speedup over the baseline, where it was measured)``, e.g. ``(1.43,
            "on the 2-vCPU Xeon (the project's measurements)")``.
        eagle_loaded: an EAGLE head for the target is loaded in this app (named in EAGLE-3's line).

    Returns:
        the sentence (in words; vLLM's method names and the backend's reason as they are) and the method
        to serve on vLLM (``primary`` when served), or None when none of them is served. Never raises.
    """
    label = in_words(primary)
    why = serving_reason(primary)
    if why is None:
        return f"The vLLM backend serves {label}: {_served_as(primary, eagle_loaded)}.", primary
    advised = [m for m in dict.fromkeys([*methods, *speeds]) if m not in (primary, "autoregressive")]
    fast = sorted((m for m in advised if m in speeds and speeds[m][0] > 1.0), key=lambda m: -speeds[m][0])
    ranked = fast + [m for m in advised if m in methods and m not in speeds]
    best = next((m for m in ranked if serving_reason(m) is None), None)
    head = f"The vLLM backend cannot serve {label}: {why}."
    if best is None:
        return f"{head} It serves none of the other methods advised or measured here: on vLLM, serve the " \
               "target without speculation.", None
    which = (f"the fastest it serves is {in_words(best)} ({speeds[best][0]:.2f}x {speeds[best][1]})" if best in speeds
             else f"the first it serves is {in_words(best)} (not measured here)")
    return f"{head} Of the methods advised or measured here, {which}: {_served_as(best, eagle_loaded)}.", best
