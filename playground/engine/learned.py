"""Learning scopes: what methods learn across runs, kept apart per visitor.

Some methods keep state from one run to the next in the engine (``Engine.persistent`` keys under
``learned/``): suffix decoding's cache of earlier outputs, the token-recycling table, the budget's
acceptance estimates and the draft gates' rates. On a server several people share (a Hugging Face
Space), one visitor's outputs must not feed another's drafts: the step inspector draws every
drafted node, rejected ones included, so a suffix tree built from someone else's answer (which
often copies their prompt) would show its text. A run made in a *scope* (the page passes its
browser session) keeps that state under ``learned@<scope>/`` instead of ``learned/``: each scope
learns from its own runs only, and runs without a scope (the Python API, the CLI benchmark) share
the unscoped state as before. The engine keeps the state of at most :data:`MAX_LEARNING_SCOPES`
scopes and drops the least recently used beyond that.

A scope is set while a run's drafters are built (their builders read ``engine.persistent``
then, never during steps): :func:`in_scope` sets it for the builders, including drafters built
inside another's builder (a mixture's members).
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from contextvars import ContextVar
from typing import Iterator

LEARNED = "learned/"
"""Prefix of the :meth:`~playground.engine.engine.Engine.persistent` keys that learn across runs."""
MAX_LEARNING_SCOPES = 32
"""Scopes whose learned state an engine keeps (least recently used dropped beyond). Each holds one
object per method and knob setting run in it: a recycling table (the target's vocabulary times its
top-k ids, a few MB), a suffix cache (up to ``cache_outputs`` outputs), estimators and gates (small).
The page also drops a browser tab's scope when the tab closes (``app.forget_session``)."""
MAX_SCOPE_CHARS = 200
"""Longest scope name (a Gradio session hash is about 11 characters)."""

_SCOPE: ContextVar[str | None] = ContextVar("learning_scope", default=None)


def check_scope(scope) -> str | None:
    """``scope`` checked: None (no scope) or a non-empty string of at most :data:`MAX_SCOPE_CHARS`
    characters without ``/``.

    Raises:
        TypeError: not a string or None.
        ValueError: empty, too long, or containing ``/``.
    """
    if scope is None:
        return None
    if not isinstance(scope, str):
        raise TypeError(f"scope must be a string or None, got {type(scope).__name__}")
    if not scope or len(scope) > MAX_SCOPE_CHARS or "/" in scope:
        raise ValueError(f"scope must be 1 to {MAX_SCOPE_CHARS} characters without '/', got {scope!r}")
    return scope


def current_scope() -> str | None:
    """The scope drafters are being built in now (None: no scope)."""
    return _SCOPE.get()


@contextlib.contextmanager
def in_scope(scope: str | None) -> Iterator[None]:
    """Build drafters in ``scope`` within this block (synchronous code only: not across a ``yield``)."""
    token = _SCOPE.set(scope)
    try:
        yield
    finally:
        _SCOPE.reset(token)


def scoped_key(key: str, scope: str | None) -> str:
    """``key`` as stored for ``scope``: a ``learned/...`` key becomes ``learned@<scope>/...``; any
    other key (a device calibration, a datastore) and every key without a scope are unchanged."""
    if scope is None or not key.startswith(LEARNED):
        return key
    return f"learned@{scope}/{key[len(LEARNED):]}"


class ScopeLRU:
    """The scopes an engine keeps learned state for, most recently used last (thread-safe).

    Args:
        size: how many scopes to keep (at least 1).
    """

    def __init__(self, size: int = MAX_LEARNING_SCOPES):
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        self.size = size
        self._used: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def touch(self, scope: str) -> list[str]:
        """Mark ``scope`` used now; return the scopes dropped to make room (their state should go)."""
        with self._lock:
            self._used[scope] = None
            self._used.move_to_end(scope)
            dropped = []
            while len(self._used) > self.size:
                dropped.append(self._used.popitem(last=False)[0])
            return dropped

    def discard(self, scope: str) -> None:
        """Stop tracking ``scope`` (its state was dropped)."""
        with self._lock:
            self._used.pop(scope, None)

    def __len__(self) -> int:
        return len(self._used)
