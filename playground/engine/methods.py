"""Every method, registered by importing its module (each module calls ``registry.register``).

Adding a method means adding its module and one line here; the order of ``MODULES`` is the order
of the methods on the page and in the benchmark (the baseline first), whichever module happened
to be imported first.
"""

from . import (autoregressive, draft_model, eagle, lookahead, medusa, mixture, prompt_lookup, recycling,
               rest, suffix)
from .registry import (BASELINE, METHODS, MethodInfo, MethodSpec, is_lossless, lossless_check_applies,
                       methods_run, source_labels)

MODULES = (
    autoregressive,
    prompt_lookup,
    draft_model,
    lookahead,
    medusa,
    eagle,
    suffix,
    recycling,
    rest,
    mixture,
)
"""The method modules in page order; each defines ``METHOD`` (its registered :class:`MethodInfo`)."""


def _order() -> None:
    """Put :data:`METHODS` in the order of :data:`MODULES` (methods registered elsewhere, e.g. by
    tests, keep their place after them)."""
    ordered = {m.METHOD.name: m.METHOD for m in MODULES}
    rest = {k: v for k, v in METHODS.items() if k not in ordered}
    METHODS.clear()
    METHODS.update({**ordered, **rest})


_order()

__all__ = ["BASELINE", "METHODS", "MODULES", "MethodInfo", "MethodSpec", "is_lossless", "lossless_check_applies",
           "source_labels"]
