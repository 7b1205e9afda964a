"""Run and Stop on the page: one stop signal per browser session, checked by the run itself.

Gradio's own ``cancels=`` closes a streaming handler from another request, so an update the
handler had already queued could still reach the page after the Stop button's own update
("Stopped" shown, then more text). Here Stop only sets a flag; the run's generator checks it
after every event and every :data:`POLL_S` while it waits (the engine's events are pulled in
a helper thread, :class:`EventPump`, so a long engine call such as the first run's step-cost
calibration cannot hold Stop up), ends its engine run and sends the final "Stopped after N
tokens" state as its *last* update, so nothing can follow it.

The Run button is disabled (and Stop enabled) by an unqueued handler before the run is
queued, and the state is restored when the run ends, so a second Run cannot be clicked while
one is in flight and Stop cannot be clicked before there is a run to stop.

Sessions are told apart by Gradio's ``session_hash`` (one per page load; API clients have
their own). This module imports no gradio.
"""

from __future__ import annotations

import contextvars
import queue
import threading
from typing import Callable, Iterator, TypeVar

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

    def forget(self, key: str | None) -> None:
        """Drop ``key``'s flag, whatever it is: the page calls it when the run's event has ended (a run
        that never started, its job refused by a full queue, released nothing)."""
        with self._lock:
            self._flags.pop(key, None)

    def armed(self, key: str | None) -> bool:
        """Whether ``key`` has a run armed (clicked, queued or streaming) that has not ended."""
        with self._lock:
            return key is not None and key in self._flags

    def __len__(self) -> int:
        with self._lock:
            return len(self._flags)


class Overlaps:
    """Which runs shared the machine with another (thread-safe): two runs may be in flight at once.

    The engine serialises their steps, but one run's page updates (rendering a panel's HTML, the
    charts) and its own Python work run beside the other's steps on the same cores, so both runs'
    timings, and the speedups drawn from them, are distorted (two tabs on a 2-core CPU: prompt lookup
    at 0.68x instead of about 1.0x). The page's runs and the Benchmark tab's check in with
    :meth:`begin` and out with :meth:`end`; :meth:`shared` tells a run, before it reports its
    speeds, whether another run was in flight at any moment of it, so it can say so.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._active = 0
        self._starts = 0

    def begin(self) -> tuple[int, bool]:
        """Check a run in; returns its ticket (for :meth:`shared` and :meth:`end`)."""
        with self._lock:
            ticket = (self._starts + 1, self._active > 0)
            self._active += 1
            self._starts += 1
            return ticket

    def shared(self, ticket: tuple[int, bool]) -> bool:
        """Whether another run was in flight at some moment since ``ticket``'s run began: one was
        then, or one began since (the count of starts moved past the ticket's)."""
        return ticket[1] or self._starts != ticket[0]  # one int read: atomic

    def end(self, ticket: tuple[int, bool]) -> bool:
        """Check the run out; returns :meth:`shared` (before leaving)."""
        with self._lock:
            self._active -= 1
            return self.shared(ticket)


OVERLAPS = Overlaps()
"""The server's one record of runs in flight (page runs and benchmarks)."""

SHARED_NOTE = ("Another run (another tab, visitor or benchmark) was in flight during part of this one and "
               "shared the machine: this run's speeds are less reliable. Run again alone to compare methods.")
"""What a run that shared the machine says after its speeds."""


T = TypeVar("T")


def in_joined_thread(work: Callable[[], T], name: str = "torch-work") -> T:
    """``work()`` run in a new thread that is joined: its result, or its exception raised here.

    For torch work (loading models, timing the device) asked for by a thread that lives on: the
    main thread, or a Gradio worker thread, which Gradio reuses for the next requests. With GNU
    OpenMP (torch's CPU build) every thread that has run a parallel torch op keeps a team of worker
    threads for as long as it lives; with more OpenMP threads alive than cores, libgomp stops
    spin-waiting between parallel regions, and every op of the runs (each in its own thread,
    :class:`EventPump`) pays a wake-up. Measured through ``/run`` (autoregressive and prompt
    lookup, 128 tokens, 2-core Zen 5 EPYC): the baseline at 25-27 tokens/s with the model loaded
    in the app's main thread, 32-35 with it loaded here. A thread that has ended leaves no team.
    The caller's context variables (Gradio's progress tracking) are visible to ``work``. Ctrl+C
    interrupts the wait; the thread (a daemon) then ends with the process.
    """
    box: dict = {}
    context = contextvars.copy_context()

    def run() -> None:
        try:
            box["value"] = context.run(work)
        except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread
            box["error"] = e

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box.pop("error")  # popped: the traceback's frames must not keep the box, and it them, alive
    return box["value"]


POLL_S = 0.25
"""How often (seconds) :class:`EventPump` checks the stop flag while no event arrives."""


class EventPump:
    """Pull a run's events in a helper thread, so that Stop answers at once even while the
    engine is inside one long call (a one-time calibration timing the device, a datastore
    loading, another session's run holding the engine, a long prefill).

    Iterating yields each event of ``events`` in order, or ``None`` when ``poll_s`` passed with
    no event (the caller may update its status), and ends when ``events`` is exhausted or
    ``stop`` is set; :meth:`drain` then hands over the events that had arrived but were not
    yielded. An exception raised by ``events`` is raised again by the iteration.
    :meth:`close` ends the run: ``events`` (a generator) is closed in the helper thread once
    its current ``next()`` returns (a generator cannot be closed while it runs), which cancels
    the engine run after its current step; whatever the engine is inside then completes in the
    background (a calibration is kept for the next run).

    The helper thread runs in a copy of the caller's context (Gradio's request and progress).

    With ``lockstep`` the helper asks ``events`` for the next event only once the consumer asks
    for it, so no step of this run runs while its handler builds an update and Gradio post-processes
    it: on a CPU that work (Python, holding the GIL) slowed whichever step ran beside it by a wait at
    every torch call, about the same wait for a one-token step as for a verification of ten, so the
    baseline, the method with the most steps per token, lost the most and the page's speedups read
    high (through ``/run``, ten methods, 128 tokens: the baseline at 26.6-28.6 tokens/s against
    37-40 for the engine alone; 34.7-38.3 in lockstep). Not paced: Gradio's sending of the update
    (on its event loop), another session's run, and a generator that runs in another process
    (a ZeroGPU Space's GPU worker). The consumer must :meth:`close` the pump when it stops early.

    Args:
        events: the run's event iterator (:func:`~playground.ui.worker.stream_run`'s generator on
            the Playground, :func:`~playground.backends.vllm.runner.run_completion`'s on the vLLM tab).
        stop: the run's stop flag (None: never stopped from outside).
        poll_s: seconds between checks of ``stop`` while waiting.
        lockstep: pull an event only when the consumer asks for it (the Playground and the
            Benchmark tab, whose steps are timed here); otherwise the helper pulls ahead (the vLLM
            tab, where the server decodes at its own pace whatever the page does).
    """

    _END = object()

    def __init__(self, events, stop: threading.Event | None = None, poll_s: float = POLL_S, lockstep: bool = False):
        self.events, self.stop, self.poll_s = events, stop, poll_s
        self._queue: queue.Queue = queue.Queue()
        self._abandoned = threading.Event()
        self._asks = threading.Semaphore(0) if lockstep else None  # one release per event asked for
        # The caller's context variables go along (Gradio's request and progress, which a ZeroGPU
        # Space's GPU call reads).
        self._thread = threading.Thread(target=contextvars.copy_context().run, args=(self._pull,),
                                        name="run-events", daemon=True)
        self._thread.start()

    def _asked(self) -> bool:
        """Wait until the consumer asks for an event (lockstep); False once the run is abandoned."""
        if self._asks is not None:
            while not self._asks.acquire(timeout=self.poll_s):
                if self._abandoned.is_set() or (self.stop is not None and self.stop.is_set()):
                    return False
        return not self._abandoned.is_set()

    def _pull(self) -> None:
        try:
            events = iter(self.events)
            while self._asked():
                event = next(events, self._END)
                self._queue.put(event)
                if event is self._END:
                    return
        except BaseException as e:  # handed to the consumer, raised there
            self._queue.put(e)
        finally:
            close = getattr(self.events, "close", None)
            if close is not None:
                close()

    def __iter__(self) -> Iterator[object | None]:
        asked = False
        while not self._abandoned.is_set():
            if self.stop is not None and self.stop.is_set():
                return
            if self._asks is not None and not asked:
                self._asks.release()
                asked = True
            try:
                item = self._queue.get(timeout=self.poll_s)
            except queue.Empty:
                yield None
                continue
            asked = False
            if item is self._END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def drain(self) -> list:
        """The events that have arrived and were not yielded (after a stop), without waiting; an
        exception or the end among them is dropped."""
        out = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return out
            if item is not self._END and not isinstance(item, BaseException):
                out.append(item)

    def close(self) -> None:
        """End the run (see the class); returns at once, never waits for the engine."""
        self._abandoned.set()
        if self._asks is not None:
            self._asks.release()  # a helper waiting to be asked wakes, sees the run abandoned and ends


def waiting_status(making: str | None, seconds: float) -> str:
    """The status while a run waits for its first event: what the engine is doing meanwhile.

    Args:
        making: :attr:`~playground.engine.Engine.making` (the one-time work running now), or None.
        seconds: how long the run has waited.
    """
    what = {
        "step_cost": "timing this device's decoding steps for the per-step budget (once per set of models "
                     "loaded; about a minute on a small CPU)",
        "verify_cost": "timing this device's verification cost (once per set of models loaded)",
        "medusa_auto_tree": "timing Medusa's candidate trees on this device (once per set of models loaded)",
    }.get(making or "")
    if what is None and making and making.startswith("datastore"):
        what = "loading REST's datastore (once)"
    if what is None:
        what = "the first step (reading the prompt, or waiting while another run uses the engine)"
    return f"Preparing: {what}… {seconds:.0f} s. Stop ends it now."


def reading_status(view, prompt_tokens: int, labels: str) -> str:
    """The status text while the methods read the prompt, in page order ("Reading the prompt (1,631
    tokens) for Lookahead: method 3 of 5…"; the first method's step runs the target over it for all,
    each later one copies that and reads it into its own drafter, a draft model with its own pass), then
    while they generate.

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
