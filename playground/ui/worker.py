"""The model-running side of the page, as plain data in and plain data out (ZeroGPU-ready).

Hugging Face's ZeroGPU runs a ``@spaces.GPU`` function in a forked process: its arguments and
every value it yields are pickled across a pipe. So the functions here take only plain data
(an engine *key*, strings, lists of dicts, a settings dict) and yield only plain dicts; the
engine itself is looked up in :data:`ENGINES`, a module-level registry that a forked child
inherits. The page (:mod:`playground.ui.app`, the tabs) turns these dicts into HTML and figures
in the main process.

:func:`decorate` applies ``spaces.GPU(duration=...)`` when the ``spaces`` package is importable
(on a Space) and returns the function unchanged otherwise. :data:`RUN`, :data:`BENCH` and
:data:`MEASURE` are the decorated entry points the page calls.

This module imports no gradio or plotly.
"""

from __future__ import annotations

import os
import threading
import uuid
from typing import Callable, Iterator

from playground.engine import BASELINE, METHODS, Engine, GenerationSettings, MethodSpec, SamplingConfig

ENGINES: dict[str, Engine] = {}
"""Engine key -> engine (registered by the page; inherited by ZeroGPU's forked child)."""

GPU_BASE_S = 20
"""Seconds of ZeroGPU time asked for on top of the per-token estimate (moving weights, prefill)."""
GPU_S_PER_TOKEN = 0.06
"""Seconds of ZeroGPU time per new token per method (a 7B model at batch 1 does ~30 tokens/s)."""
GPU_MAX_S = 300
"""Most ZeroGPU seconds one call asks for (longer runs are cut by the platform)."""


def on_spaces() -> bool:
    """Whether this process runs on Hugging Face Spaces (``SPACE_ID`` is set there)."""
    return bool(os.environ.get("SPACE_ID"))


# ----- engine registry --------------------------------------------------------------------
def register(engine: Engine) -> str:
    """Register ``engine`` and return its key (the same key for the same engine)."""
    key = f"engine-{id(engine)}"
    ENGINES[key] = engine
    return key


def engine_for(key: str) -> Engine:
    """The engine registered under ``key``.

    Raises:
        KeyError: no engine has that key.
    """
    try:
        return ENGINES[key]
    except KeyError:
        raise KeyError(f"no engine registered as {key!r}") from None


# ----- plain data <-> engine types ------------------------------------------------------------
def spec_dicts(specs: list[MethodSpec]) -> list[dict]:
    """``[{"name": str, "params": dict}, ...]`` for method specs."""
    return [{"name": s.name, "params": dict(s.params)} for s in specs]


def settings_dict(settings: GenerationSettings) -> dict:
    """Generation settings as a plain dict (``max_new_tokens``, ``temperature``, ``top_p``, ``top_k``, ``seed``)."""
    s = settings.sampling
    return {"max_new_tokens": settings.max_new_tokens, "temperature": s.temperature, "top_p": s.top_p,
            "top_k": s.top_k, "seed": s.seed, "stop_strings": list(settings.stop_strings),
            "repetition_penalty": settings.repetition_penalty}


def _specs(specs: list[dict]) -> list[MethodSpec]:
    return [MethodSpec(d["name"], dict(d.get("params") or {})) for d in specs]


def _settings(d: dict) -> GenerationSettings:
    return GenerationSettings(d["max_new_tokens"], SamplingConfig(d.get("temperature", 0.0), d.get("top_p", 1.0),
                                                                  d.get("top_k", 0), d.get("seed", 0)),
                              stop_strings=tuple(d.get("stop_strings") or ()),
                              repetition_penalty=d.get("repetition_penalty"))


def event_dict(event) -> dict:
    """A :class:`StepEvent` as plain data: its fields, ``stats`` as ``RunStats.as_dict()``, the
    step's timeline point ``(elapsed_s, new_tokens)``, and ``tree``: what the step verified
    (``StepTree.as_dict()``: token ids, parents, sources, depths, path, rejected, bonus token, draft
    and verify seconds), None when no step ran."""
    return {"type": "event", "method": event.method, "step": event.step, "tokens": list(event.tokens),
            "sources": list(event.sources), "pieces": [tuple(p) for p in event.pieces],
            "proposed": event.proposed, "accepted": event.accepted, "seconds": event.seconds,
            "margins": list(event.margins), "stats": event.stats.as_dict(),
            "point": (event.stats.elapsed_s, event.stats.new_tokens),
            "finished": event.finished, "finish_reason": event.finish_reason,
            "tree": event.tree.as_dict() if getattr(event, "tree", None) is not None else None,
            "error": getattr(event, "error", None)}


# ----- the functions a GPU runs -----------------------------------------------------------------
def stream_run(engine_key: str, prompt: str, specs: list[dict], settings: dict,
               scope: str | None = None) -> Iterator[dict]:
    """Run methods side by side on one prompt; yield plain dicts.

    Args:
        engine_key: see :func:`register`.
        prompt: the user message.
        specs: ``[{"name", "params"}, ...]`` (see :func:`spec_dicts`).
        settings: see :func:`settings_dict`.
        scope: whose learned state the methods read and add to (``Engine.run``): the page passes
            the browser session, so one visitor's outputs never feed another's drafts.

    Yields:
        ``{"type": "start", "prompt_tokens": int}`` once the run's checks passed (before the first
        method reads the prompt), then one :func:`event_dict` per step (round-robin over methods);
        after bad input (empty prompt, unavailable method, too long) a single
        ``{"type": "warning", "message": str}`` instead (after ``start`` when the first step
        raises it). Closing the generator cancels
        the run after its current step.
    """
    engine = engine_for(engine_key)
    cancel = threading.Event()
    events = None
    try:
        try:
            prompt_ids = engine.encode_prompt(prompt)
            events = engine.run(prompt_ids, _specs(specs), _settings(settings), cancel=cancel, scope=scope)
        except ValueError as e:
            yield {"type": "warning", "message": str(e)}
            return
        # Before the first method reads the prompt: the page times the run (and says which method
        # reads the prompt) from here.
        yield {"type": "start", "prompt_tokens": len(prompt_ids)}
        try:
            event = next(events, None)
        except ValueError as e:
            yield {"type": "warning", "message": str(e)}
            return
        while event is not None:
            yield event_dict(event)
            event = next(events, None)
    finally:
        cancel.set()
        if events is not None:
            events.close()


def stream_bench(engine_key: str, questions: list[dict], specs: list[dict], settings: dict,
                 warmup: int = 1) -> Iterator[dict]:
    """Run a benchmark through the benchmark's runner (``playground.bench.prepare``); yield plain dicts.

    Args:
        engine_key: see :func:`register`.
        questions: ``[{"question_id", "category", "turns": [str, ...]}, ...]`` (``bench.question_dict``).
        specs: methods, the baseline first (see ``bench.order_methods``).
        settings: see :func:`settings_dict`.
        warmup: untimed warm-up rounds of every method (as the CLI's ``--warmup``).

    Yields:
        ``{"type": "start", "runs": int}`` once every run check passed, then
        ``{"type": "record", "record": dict}`` per run (the CLI's record, same fields) and
        ``{"type": "skip", "message": str, "runs": int}`` for skipped turns, and
        ``{"type": "tick", "question_id", "turn"}`` about every half second while the methods step round-robin on a
        question (records come once every method has answered it); or one
        ``{"type": "warning", "message": str}`` instead when a check fails (bad setting, a method
        the loaded models cannot run, no question fitting the context). Closing the generator
        stops at once (at a tick: that question's records are dropped).

    Each benchmark learns in a scope of its own (``Engine.run``), dropped when it ends: its methods
    learn only from its earlier questions (as in the CLI), never from a visitor's runs or another
    benchmark's, and the questions' outputs (an upload's among them) stay out of every other run.
    """
    from playground import bench

    engine = engine_for(engine_key)
    scope = f"bench-{uuid.uuid4().hex}"
    try:
        try:
            run = bench.prepare(engine, [bench.question_from_dict(q) for q in questions], _specs(specs),
                                _settings(settings), scope=scope)
            yield {"type": "start", "runs": run.total_runs}
            run.warm_up(warmup)
        except (bench.BenchError, ValueError) as e:
            yield {"type": "warning", "message": str(e)}
            return
        for kind, item, runs in run.iter():
            if kind == "skip":
                yield {"type": "skip", "message": item, "runs": runs}
            elif kind == "tick":
                yield {"type": "tick", **item}
            else:
                yield {"type": "record", "record": item}
    finally:
        engine.forget_learned(scope)


def measure(engine_key: str, sizes: list[int] | None = None, force: bool = False) -> dict:
    """This device's verify cost (see ``theory.measure_verify_cost``): with ``sizes`` None, the engine's
    one kept curve (``Engine.verify_cost()``, measured once; ``force`` measures it again), which the
    Theory tab, the "why this speed" lines, the draft panel and the advisor all read; with ``sizes``,
    a fresh measurement at those sizes, not kept.

    Returns:
        ``VerifyCost.as_dict()``: ``{"table": {n: relative cost}, "seconds": {n: s}, "source": str}``.
    """
    engine = engine_for(engine_key)
    if sizes is not None:
        return engine.verify_cost(sizes).as_dict()
    if force:
        engine.forget("verify_cost")
    return engine.verify_cost().as_dict()


# ----- ZeroGPU ----------------------------------------------------------------------------------
def run_duration(engine_key: str, prompt: str, specs: list[dict], settings: dict, scope: str | None = None) -> int:
    """ZeroGPU seconds to ask for a side-by-side run: every method generates ``max_new_tokens``."""
    return int(min(GPU_MAX_S, GPU_BASE_S + GPU_S_PER_TOKEN * settings["max_new_tokens"] * max(1, len(specs))))


def bench_duration(engine_key: str, questions: list[dict], specs: list[dict], settings: dict, warmup: int = 1) -> int:
    """ZeroGPU seconds to ask for a benchmark (capped at :data:`GPU_MAX_S`: keep the page's limit small)."""
    turns = sum(len(q["turns"]) for q in questions)
    return int(min(GPU_MAX_S, GPU_BASE_S + GPU_S_PER_TOKEN * settings["max_new_tokens"] * max(1, len(specs))
                   * max(1, turns)))


def decorate(fn: Callable, duration, spaces_module=None) -> Callable:
    """``spaces.GPU(duration=duration)(fn)`` when ``spaces`` is importable (or given), else ``fn``.

    Args:
        fn: a module-level function taking and returning (or yielding) plain data.
        duration: seconds, or a function of ``fn``'s arguments giving seconds (ZeroGPU's dynamic duration).
        spaces_module: use this module instead of importing ``spaces`` (tests pass a stand-in).
    """
    if spaces_module is None:
        try:
            import spaces as spaces_module  # noqa: PLC0415 - optional, present on Hugging Face Spaces
        except ImportError:
            return fn
    return spaces_module.GPU(duration=duration)(fn)


RUN = decorate(stream_run, run_duration)
""":func:`stream_run`, on a ZeroGPU slice when ``spaces`` is installed."""
BENCH = decorate(stream_bench, bench_duration)
""":func:`stream_bench`, on a ZeroGPU slice when ``spaces`` is installed."""
MEASURE = decorate(measure, 60)
""":func:`measure`, on a ZeroGPU slice when ``spaces`` is installed."""

__all__ = ["BASELINE", "METHODS", "ENGINES", "RUN", "BENCH", "MEASURE", "register", "engine_for", "spec_dicts",
           "settings_dict", "event_dict", "stream_run", "stream_bench", "measure", "decorate", "on_spaces"]
