"""The Models tab: each browser session chooses its own target, draft, Medusa heads and EAGLE head.

A choice (:class:`ModelChoice`) loads through ``Engine.load`` (the loader of ``app.py``'s own
models) with a progress bar; the loaded engine is kept in :class:`EngineCache`, a small cache
shared by every session that chose the same models (least recently used dropped beyond
:data:`MAX_SESSION_ENGINES`, so memory stays bounded), and registered in :data:`worker.ENGINES`
under its choice's key. A session keeps that key in a ``gr.State``; the Playground tab's run
resolves it (:meth:`ModelsPanel.run`), so sessions never see each other's choice. The server's
own engine is shared by all sessions and never dropped. The other tabs follow the same key:
their handlers take it as an input and resolve it with :meth:`ModelsPanel.engine_for`, and what they
built from the server's models is refreshed through :meth:`ModelsPanel.follow` after a load.

On a shared server the operator locks the choice (``app.py --lock-models``, the default on Hugging
Face Spaces): the tab then only says which models every visitor uses.

What is offered (:mod:`.model_choices`): the presets (:mod:`playground.presets`) that load offline,
the embedded default, folders holding ``config.json`` and ``.gguf`` files in a models folder
(``$PLAYGROUND_MODELS_DIR`` or ``app.py --models-dir``) and hub models already in the Hugging Face
cache; hub presets only when the hub answers. Names can also be typed in (a hub id or a local path).
"""

from __future__ import annotations

import html
import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path

import gradio as gr

from playground.engine import METHODS, Engine, ModelLoadError

from . import render, wording, worker
from .model_choices import (AUTO, NONE, SAME, choice_lists, hub_reachable, local_models, models_dir,  # noqa: F401
                            preset_values, usable_presets)
from .run_control import in_joined_thread

log = logging.getLogger(__name__)

MAX_SESSION_ENGINES = 2
"""Engines kept loaded for sessions' choices besides the server's own (least recently used dropped)."""
KEY_PREFIX = "models:"
"""Engine keys of loaded choices start with this (the server's own engine has ``worker.register``'s key)."""
BUSY = ("a run on the Playground or Benchmark tab is using the models loaded now: press Stop there or wait "
        "for it to end, then load")
"""Why a load (or Back) is refused while the session's run streams (a Playground run's panels and
verdict, a benchmark's method list, would follow other models than the run's)."""


@dataclass(frozen=True)
class ModelChoice:
    """What a session asked for.

    Attributes:
        target: a model spec for ``Engine.load`` (``"default"``, hub id, folder or .gguf file).
        draft: a spec, :data:`AUTO` (the draft shipped for the target, if any), :data:`NONE` or
            :data:`SAME` (the target drafts for itself: every draft token is accepted).
        medusa, eagle: a spec, :data:`AUTO` or :data:`NONE`.
    """

    target: str
    draft: str = AUTO
    medusa: str = AUTO
    eagle: str = AUTO

    def checked(self) -> "ModelChoice":
        """This choice with blanks trimmed (an empty companion is :data:`AUTO`).

        Raises:
            ValueError: no target, or the target itself given as a Medusa/EAGLE choice.
        """
        target = str(self.target or "").strip()
        if not target:
            raise ValueError("choose a target model first")
        parts = {k: str(v or "").strip() or AUTO for k, v in (("draft", self.draft), ("medusa", self.medusa),
                                                             ("eagle", self.eagle))}
        for k in ("medusa", "eagle"):
            if parts[k] == SAME:
                raise ValueError(f"the {'Medusa heads' if k == 'medusa' else 'EAGLE head'} cannot be the target "
                                 "itself: choose shipped heads, none, or a heads folder")
        return ModelChoice(target, **parts)

    @property
    def key(self) -> str:
        """The engine key of this choice: the same for every session that chose the same models."""
        return KEY_PREFIX + json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_key(cls, key: str) -> "ModelChoice":
        """The choice behind a :attr:`key`.

        Raises:
            ValueError: not a key of a choice.
        """
        if not str(key).startswith(KEY_PREFIX):
            raise ValueError(f"not a model choice's key: {key!r}")
        return cls(**json.loads(key[len(KEY_PREFIX):]))


def _spec(value: str) -> str | None:  # Engine.load's spec for a companion (None: the shipped one)
    return None if value == AUTO else value


def load_choice(choice: ModelChoice, device="auto", dtype="auto", progress=None) -> Engine:
    """Load ``choice`` with ``Engine.load``; :data:`SAME` as the draft reuses the loaded target.

    Raises:
        ModelLoadError, ValueError: as ``Engine.load`` (the message says what is wrong).
    """
    same = choice.draft == SAME
    # In a thread that ends: Gradio reuses the calling worker thread, which must not keep an OpenMP
    # team beside the runs' threads (run_control.in_joined_thread says why).
    engine = in_joined_thread(lambda: Engine.load(
        choice.target, NONE if same else _spec(choice.draft), _spec(choice.medusa), device=device, dtype=dtype,
        progress=progress, eagle=_spec(choice.eagle)), name="model-load")
    if same:
        engine = Engine(engine.target, draft=engine.target, medusa=engine.medusa, eagle=engine.eagle)
    return engine


class EngineCache:
    """Engines loaded for sessions' choices, shared by the sessions that chose the same models.

    At most ``capacity`` are kept (least recently used dropped, from :data:`worker.ENGINES` too; a
    run in flight keeps its engine until it ends). The server's ``default`` engine is not counted
    and never dropped. Loads run one at a time; a second session asking for a choice being loaded
    waits and then shares it.

    Args:
        default: the server's engine (its models' device and dtype are used for every choice).
        capacity: engines kept besides ``default`` (at least 1).
    """

    def __init__(self, default: Engine, capacity: int = MAX_SESSION_ENGINES):
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.default, self.capacity = default, capacity
        self.default_key = worker.register(default)
        self._engines: OrderedDict[str, Engine] = OrderedDict()
        self._lock, self._load_lock = threading.Lock(), threading.Lock()

    def keys(self) -> list[str]:
        """Keys of the loaded choices, least recently used first."""
        with self._lock:
            return list(self._engines)

    def get(self, key: str | None) -> Engine | None:
        """The engine for ``key`` (None or the default's key: the default), or None when not loaded."""
        if key in (None, "", self.default_key):
            return self.default
        with self._lock:
            engine = self._engines.get(key)
            if engine is not None:
                self._engines.move_to_end(key)
            return engine

    def load(self, choice: ModelChoice, progress=None) -> str:
        """Load ``choice`` (or share it when loaded) and return its engine key.

        Raises:
            ModelLoadError, ValueError: the models cannot be loaded (the cache is unchanged).
        """
        choice = choice.checked()
        key = choice.key
        with self._load_lock:
            if self.get(key) is not None:
                return key
            target = self.default.target
            engine = load_choice(choice, target.device, target.dtype, progress)
            with self._lock:
                self._engines[key] = engine
                worker.ENGINES[key] = engine
                while len(self._engines) > self.capacity:
                    self._drop(*self._engines.popitem(last=False))
        return key

    def ensure(self, key: str | None) -> Engine:
        """The engine for ``key``, loaded again when it was dropped to make room for others.

        Raises:
            ModelLoadError, ValueError: it cannot be loaded again.
        """
        engine = self.get(key)
        if engine is None:
            self.load(ModelChoice.from_key(key))
            engine = self.get(key)
        return engine

    def release(self, engine: Engine) -> None:
        """After a run on ``engine``: if it was dropped meanwhile, remove what the run registered."""
        with self._lock:
            if engine is not self.default and all(e is not engine for e in self._engines.values()):
                self._drop("an engine dropped during a run", engine)

    @staticmethod
    def _drop(key: str, engine: Engine) -> None:
        for k in [k for k, e in worker.ENGINES.items() if e is engine]:  # also run_comparison's register()
            del worker.ENGINES[k]
        log.info("unloaded %s to keep at most the configured number of model sets", key)


# ----- page text ----------------------------------------------------------------------------------
def header(engine: Engine, title: str) -> str:
    """The page header for ``engine``: the title, then target, draft, device and dtype."""
    draft = getattr(engine, "draft", None)
    return render.header_markdown(title, engine.target.name, draft.name if draft is not None else None,
                                  str(engine.target.device), str(engine.target.dtype).removeprefix("torch."))


def models_markdown(engine: Engine) -> str:
    """What ``engine`` holds, in page terms: target, draft, heads, device and dtype."""
    d = engine.describe()
    parts = [f"**Target:** {html.escape(d['target'])}", f"**Draft:** {html.escape(d['draft'] or 'none')}",
             f"**Medusa heads:** {d['medusa_heads'] or 'none'}", f"**EAGLE head:** {'yes' if d['eagle'] else 'none'}",
             f"**Device:** {d['device']}", f"**dtype:** {d['dtype']}"]
    return " &nbsp;·&nbsp; ".join(parts)


def locked_markdown(engine: Engine) -> str:
    """The tab's text when the operator has fixed the models."""
    return ("### The models are fixed on this server\nWhoever runs this server chose the models, and every "
            f"visitor uses them: {models_markdown(engine)}.\n\nTo try other models, run the playground on your "
            "own computer, where this tab lets you choose them.")


_STAGES = (("convert", "converting its weights (once: later loads are faster)"),
           ("dequantis", "converting its weights"),
           ("saving", "saving the converted weights"), ("download", "downloading it"),
           ("weights", "reading its weights"), ("moving", "moving it to the device"), ("ready", "ready"),
           ("locating", "looking for it"))


def page_progress(progress, started: float | None = None):
    """A ``progress(fraction, message)`` for ``Engine.load`` that drives a ``gr.Progress`` in page terms.

    The target takes the first 60 % of the bar, the draft the next 30 %, heads the rest; messages
    name the part and the stage, never a path.
    """
    state = {"part": -1}
    started = time.perf_counter() if started is None else started

    def show(fraction: float, message: str) -> None:
        if message.startswith("locating model"):
            state["part"] += 1
        if "Medusa" in message:
            total, text = 0.92, "Loading the Medusa heads"
        elif "EAGLE" in message:
            total, text = 0.96, "Loading the EAGLE head"
        else:
            part = max(state["part"], 0)
            base, width = ((0.0, 0.6), (0.6, 0.3))[min(part, 1)]
            stage = next((t for k, t in _STAGES if k in message.lower()), "loading")
            total, text = base + width * float(fraction), f"{'Target' if part == 0 else 'Draft'}: {stage}"
        progress(min(total, 0.99), desc=f"{text} ({time.perf_counter() - started:.0f} s)")
    return show


# ----- the tab --------------------------------------------------------------------------------------
def method_updates(engine: Engine, before: Engine | None, knob_keys: list[tuple[str, str]]) -> list:
    """Updates that make the Playground tab follow ``engine``: per method (METHODS order) its checkbox
    (disabled and unticked when unavailable; ticked when it just became available) and its reason
    line, then per knob (``knob_keys`` order) whether it can be changed."""
    boxes, reasons = [], []
    for m in METHODS:
        reason = engine.unavailable_reason(m)
        newly = reason is None and before is not None and before.unavailable_reason(m) is not None
        boxes.append(gr.update(interactive=reason is None, **({"value": False} if reason else
                                                             {"value": True} if newly else {})))
        text = wording.unavailable_text(engine, m) if reason else None  # in page terms, no command lines
        reasons.append(gr.update(value=f"**Unavailable:** {text}" if reason else "", visible=bool(reason)))
    knobs = [knob_update(engine, before, m, k) for m, k in knob_keys]
    return boxes + reasons + knobs


def knob_update(engine: Engine, before: Engine | None, method: str, name: str, reset: bool = False):
    """The update of ``method``'s knob ``name`` for ``engine``: whether it can be changed, the value
    saved with the loaded models (``engine.knob_defaults``; the knob's own default when ``reset`` or
    when ``before`` had a saved value and ``engine`` has none; else the value stays), and for a knob
    chosen by name the options the loaded models serve (``engine.knob_choices``)."""
    knob = next(k for k in METHODS[method].knobs if k.name == name)
    update: dict = {"interactive": engine.unavailable_reason(method) is None}
    saved = engine.knob_defaults(method).get(name) if hasattr(engine, "knob_defaults") else None
    was = before.knob_defaults(method).get(name) if hasattr(before, "knob_defaults") else None
    if saved is not None:
        update["value"] = saved
    elif reset or was is not None:
        update["value"] = knob.default
    offered = engine.knob_choices(method, name) if hasattr(engine, "knob_choices") else None
    if offered is not None and not hasattr(knob, "maximum"):
        update["choices"] = [p for p in wording.choice_pairs(knob) if p[1] in offered]
    return gr.update(**update)


class ModelsPanel:
    """The Models tab's components and handlers (see the module docstring).

    Attributes:
        key: the session's engine key (a ``gr.State``; the server's engine key until a load).
        cache: the :class:`EngineCache` shared by every session of this page.
        locked: whether the operator fixed the models.
        running: ``running(session_hash)``: whether the session has a run on (no load then).
    """

    def __init__(self, engine: Engine, locked: bool | None = None, folder: str | Path | None = None,
                 title: str = "", running=lambda session: False):
        self.cache, self.running = EngineCache(engine), running
        self.locked = worker.on_spaces() if locked is None else bool(locked)
        self.folder, self.title = models_dir(folder), title
        self.key = gr.State(self.cache.default_key)

    def header_fn(self, engine: Engine) -> str:
        """The page header for ``engine`` (see :func:`header`)."""
        return header(engine, self.title)

    def engine_for(self, key: str | None) -> Engine:
        """The engine of a session's key (None or the server's key: the server's engine), loaded
        again when it was dropped to make room for other sessions' choices.

        Raises:
            gr.Error: it cannot be loaded again (the message says why, in page terms).
        """
        try:
            return self.cache.ensure(key)
        except (ModelLoadError, ValueError) as e:
            raise gr.Error(f"The models chosen on the Models tab cannot be loaded again: {e}") from None

    def follow(self, fn, inputs: list, outputs: list) -> None:
        """After the session's models change (a load or Back to the server's models), call
        ``fn(engine, key, *inputs' values)`` and show what it returns in ``outputs``: for parts of the
        page whose content was built from the server's models (defaults, what is offered)."""
        self.key.change(lambda key, *v: fn(self.engine_for(key), key, *v), [self.key, *inputs], outputs,
                        api_visibility="private")

    def run(self, run_comparison, *values):
        """Run ``run_comparison(engine, *values[:-1])`` on the engine of the session's key (``values[-1]``)."""
        *values, key = values
        engine = self.engine_for(key)
        try:
            yield from run_comparison(engine, *values)
        finally:
            self.cache.release(engine)

    def load(self, target, draft, medusa, eagle, key, request: gr.Request = None, progress=gr.Progress()):
        """The Load handler: load the choice with a progress bar; the outputs follow the new engine."""
        before = self.cache.get(key)
        started = time.perf_counter()
        try:
            if self.locked:
                raise ValueError("the models are fixed on this server")
            if self._busy(request):
                raise ValueError(BUSY)
            new_key = self.cache.load(ModelChoice(target, draft, medusa, eagle),
                                      page_progress(progress, started))
            if self._busy(request):  # a Run pressed while they loaded
                raise ValueError("a run started while they loaded (they are kept: press Load again once it has "
                                 "ended, and they come at once)")
        except (ModelLoadError, ValueError, MemoryError, OSError) as e:
            msg = render.status_html("warning", f"Could not load these models: {str(e).rstrip('.')}. The models "
                                                "loaded before stay in use.")
            return (key, msg, gr.skip(), gr.skip(), *(gr.skip() for _ in range(self._n_updates)))
        engine = self.cache.get(new_key)
        done = render.status_html("done", f"Loaded in {time.perf_counter() - started:.1f} s, for this browser tab "
                                          "only: its Playground, Benchmark, Theory and Advisor tabs now use them; other "
                                          "browser tabs and visitors keep their own.")
        return (new_key, done, models_markdown(engine), self.header_fn(engine),
                *method_updates(engine, before, self.knob_keys))

    def _busy(self, request) -> bool:  # the requesting session has a run on
        return self.running(getattr(request, "session_hash", None))

    def reset(self, key, request: gr.Request = None):
        """Back to the server's models (the form too, so the next Load does not bring the last choice back)."""
        if self._busy(request):
            return (key, render.status_html("warning", f"Not now: {BUSY}."), *(gr.skip(),) * (self._n_updates + 7))
        engine = self.cache.default
        return (self.cache.default_key, render.status_html("done", "Back to the server's models."),
                models_markdown(engine), self.header_fn(engine),
                *method_updates(engine, self.cache.get(key), self.knob_keys), "default", AUTO, AUTO, AUTO, None)

    def build(self, header, use: dict, reasons: dict, knobs: list, knob_keys: list[tuple[str, str]]) -> None:
        """Lay the tab out (inside a ``gr.Tab``) and wire it to the page header and the Playground
        tab's method checkboxes (``use``), reason lines (``reasons``) and knob inputs (``knobs``)."""
        engine = self.cache.default
        self.knob_keys = knob_keys
        self._n_updates = 2 * len(METHODS) + len(knobs)
        if self.locked:
            gr.Markdown(locked_markdown(engine), elem_id="models-locked")
            return
        lists = choice_lists(self.folder)
        gr.Markdown("Choose the models this browser tab runs. Other visitors keep their own choice; the same "
                    "models chosen in several tabs load once.")
        current = gr.Markdown(models_markdown(engine), elem_id="models-current")
        preset = gr.Dropdown(lists["preset"], value=None, label="Preset (fills the fields below)",
                             elem_id="models-preset")
        with gr.Row():
            target = gr.Dropdown(lists["target"], value="default", label="Target", allow_custom_value=True,
                                 elem_id="models-target", info="Or type a hub id or the path of a model folder.")
            draft = gr.Dropdown(lists["draft"], value=AUTO, label="Draft", allow_custom_value=True,
                                elem_id="models-draft", info="Needs the target's tokenizer.")
        with gr.Row():
            medusa = gr.Dropdown(lists["medusa"], value=AUTO, label="Medusa heads", allow_custom_value=True,
                                 elem_id="models-medusa")
            eagle = gr.Dropdown(lists["eagle"], value=AUTO, label="EAGLE head", allow_custom_value=True,
                                elem_id="models-eagle")
        with gr.Row():
            load_btn = gr.Button("Load these models", variant="primary", elem_id="models-load")
            reset_btn = gr.Button("Back to the server's models", elem_id="models-reset")
        status = gr.HTML("", elem_id="models-status")
        outputs = [self.key, status, current, header, *use.values(), *reasons.values(), *knobs]
        preset.change(lambda name: preset_values(name) if name else (gr.skip(),) * 4, preset,
                      [target, draft, medusa, eagle], api_visibility="private")
        # The last load's message goes first (it stood beside the next load's progress).
        load_btn.click(lambda: "", None, status, api_visibility="private", queue=False).then(
            self.load, [target, draft, medusa, eagle, self.key], outputs, api_visibility="private",
            concurrency_id="model-load", concurrency_limit=1)
        # Queued like Load: the session key's change (which every tab built from the models
        # follows: the legend, the Advisor, the Theory tab) did not reach the page without the queue.
        reset_btn.click(self.reset, self.key, [*outputs, target, draft, medusa, eagle, preset],
                        api_visibility="private")
