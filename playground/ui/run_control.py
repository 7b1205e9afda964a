"""Run and Stop on the page: one stop signal per browser session, checked by the run itself.

Gradio's own ``cancels=`` closes a streaming handler from another request, so an update the
handler had already queued could still reach the page after the Stop button's own update
("Stopped" shown, then more text). Here Stop only sets a flag; the run's generator checks it
after every step, ends its engine run and sends the final "Stopped after N tokens" state as
its *last* update, so nothing can follow it.

The Run button is disabled (and Stop enabled) by an unqueued handler before the run is
queued, and the state is restored when the run ends, so a second Run cannot be clicked while
one is in flight and Stop cannot be clicked before there is a run to stop.

Sessions are told apart by Gradio's ``session_hash`` (one per page load; API clients have
their own). This module imports no gradio.
"""

from __future__ import annotations

import threading

from playground.engine import METHODS


class StopSignals:
    """Stop flags of the runs in flight, one per session (thread-safe).

    ``arm(key)`` gives the session's next run a fresh flag (the page calls it when Run is
    clicked, before the run is queued); ``flag(key)`` is what the run then checks (it arms one
    when no click armed it: an API call); ``stop(key)`` sets it; ``release(key, flag)`` forgets
    it when the run ends. A Stop with no run armed does nothing.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._flags: dict[str, threading.Event] = {}

    def arm(self, key: str | None) -> threading.Event:
        """A fresh, unset flag for ``key``'s next run (replacing any earlier one)."""
        flag = threading.Event()
        if key is not None:
            with self._lock:
                self._flags[key] = flag
        return flag

    def flag(self, key: str | None) -> threading.Event:
        """The flag armed for ``key`` (a fresh one when none is)."""
        with self._lock:
            existing = self._flags.get(key) if key is not None else None
        return existing if existing is not None else self.arm(key)

    def stop(self, key: str | None) -> bool:
        """Set ``key``'s flag; True when a run was armed for it."""
        with self._lock:
            flag = self._flags.get(key) if key is not None else None
        if flag is None:
            return False
        flag.set()
        return True

    def release(self, key: str | None, flag: threading.Event) -> None:
        """Forget ``flag`` if it is still ``key``'s (a newer run's flag is kept)."""
        with self._lock:
            if key is not None and self._flags.get(key) is flag:
                del self._flags[key]

    def __len__(self) -> int:
        with self._lock:
            return len(self._flags)


def reading_status(view, prompt_tokens: int, labels: str) -> str:
    """The status text while the methods read the prompt (each prefills it in turn, in page order:
    "Reading the prompt (1,631 tokens) for Lookahead: method 3 of 5…"), then while they generate.

    Args:
        view: the run's view (``chosen``: method names; ``outputs[m].last``: None until m's first step).
        prompt_tokens: the prompt's length in tokens.
        labels: the chosen methods' labels, joined for the "Running …" text.
    """
    waiting = [m for m in view.chosen if view.outputs[m].last is None]
    size = f"{prompt_tokens:,} token{'' if prompt_tokens == 1 else 's'}"
    if not waiting:
        return f"Running {labels} on a prompt of {size}…"
    i = len(view.chosen) - len(waiting) + 1
    return f"Reading the prompt ({size}) for {METHODS[waiting[0]].label}: method {i} of {len(view.chosen)}…"
