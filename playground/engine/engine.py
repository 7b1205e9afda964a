"""The :class:`Engine`: load a target (and its drafts and heads) and run methods on prompts.

An engine runs several methods on one prompt **round-robin in one worker**: each method takes
one step in turn, so every panel streams at once, no two methods compete for the device, and
each method's clock counts only its own steps. Models are read-only during runs; every run
builds its own caches and drafters, and a lock serialises steps across concurrent callers.
"""

from __future__ import annotations

import dataclasses
import gc
import threading
from typing import Any, Callable, Iterator

import torch

from . import methods as _methods  # noqa: F401  (registers every method)
from .decoding import GenerationSettings, SharedPrefill, decode
from .drafter import Drafter
from .events import StepEvent, round_robin
from .learned import LEARNED, MAX_LEARNING_SCOPES, ScopeLRU, check_scope, current_scope, in_scope, scoped_key
from .penalty import model_generation_settings, model_repetition_penalty
from .prompt_ids import check_prompt_ids
from .registry import METHODS, MethodSpec, check_method_names
from .target import CausalLM

MISSING_PART = {
    "draft": "no draft model is loaded for {target}: start the app with --draft MODEL (a smaller model with the "
             "same tokenizer)",
    "medusa": "no Medusa heads are loaded for {target}: start with --medusa PATH_OR_HUB_ID, or train heads with "
              "`python -m playground.training.medusa`",
    "eagle": "no EAGLE head is loaded for {target}: start with --eagle PATH_OR_HUB_ID, or train one with "
             "`python -m playground.training.eagle`",
    "datastore": "no REST datastore for {target}: write its answers with `python -m playground.training.tasks "
                 "--target SPEC --out FOLDER` and set PLAYGROUND_DATASTORE=FOLDER",
}
"""Why a method that needs a part cannot run, per part (``{target}``: the target's name)."""


class Engine:
    """A loaded target (and optional draft, Medusa heads, EAGLE head) that runs methods on prompts.

    Args:
        target: a loaded target model (:class:`~playground.engine.models.LoadedModel`): needs
            ``model``, ``tokenizer``, ``name``, ``context_length``, ``eos_token_ids``.
        draft: an optional loaded draft sharing the target's tokenizer.
        medusa: optional :class:`~playground.engine.medusa.MedusaHeads` for the target (attached
            to its ``lm_head``, see :func:`~playground.engine.medusa.load_heads`).
        draft_medusa: optional Medusa heads of the draft: draft_model's ``proposer`` knob
            ``medusa_heads`` then drafts with one draft pass per step.
        eagle: an optional EAGLE draft head for the target.
        datastore: an optional :class:`~playground.engine.rest.Datastore` for ``rest``; None: read
            when ``rest`` first runs (``rest.datastore_dir``).
    """

    def __init__(self, target, draft=None, medusa=None, draft_medusa=None, eagle=None, datastore=None):
        self.target, self.draft, self.medusa, self.draft_medusa = target, draft, medusa, draft_medusa
        self.eagle, self.datastore = eagle, datastore
        self.target_lm = CausalLM(target.model)
        self.draft_lm = CausalLM(draft.model) if draft is not None else None
        self.left_out: set[str] = set()  # parts Engine.load was told to leave out (unavailable_reason)
        self._lock = threading.RLock()  # one step (or one calibration) at a time
        self._persistent: dict[str, Any] = {}
        self._scopes = ScopeLRU(MAX_LEARNING_SCOPES)  # scopes whose learned state is kept (learned.py)
        self.calibrations: dict[str, int] = {}
        """How many times each :meth:`persistent` key's factory ran (1 each, unless forgotten; a
        learned key's count goes with its state, so scopes that come and go leave nothing behind)."""
        self.making: str | None = None
        """The :meth:`persistent` key whose factory is running now (a calibration timing the
        device, a datastore loading), else None: the page names it while a run waits for it."""

    @classmethod
    def load(cls, target: str, draft: str | None = None, medusa: str | None = None,
             draft_medusa: str | None = None, device="auto", dtype="auto", progress=None,
             methods: list[str] | None = None, eagle: str | None = None) -> "Engine":
        """Load the models named by specs and build an engine: the one loading path of the app,
        the benchmark and the presets.

        Args:
            target: the target's spec (``models.load_model``).
            draft: the draft's spec; None: the shipped draft when the target is the embedded
                default (``models.default_draft_spec``); ``"none"``: no draft.
            medusa: the target's Medusa heads; None: the shipped heads for the embedded default
                (``medusa.heads_spec``); ``"none"``: no heads.
            draft_medusa: Medusa heads trained on the draft (draft_model's ``proposer``
                ``medusa_heads``); needs a draft.
            device, dtype: as for ``models.load_model``; the draft follows the target.
            progress: optional ``progress(fraction, message)``.
            methods: when given, models that none of these methods uses are not loaded.
            eagle: the target's EAGLE head (same rules as ``medusa``).

        The objects alive after the load are frozen (``gc.freeze``), so that full garbage collections
        skip the libraries and models; the next ``load`` unfreezes them first.

        Raises:
            models.ModelLoadError: a model or heads cannot be found or loaded, or a draft with a
                different tokenizer.
            ValueError: a bad device or dtype, draft Medusa heads without a draft, or an unknown
                name in ``methods``.
        """
        from . import models
        from .medusa import heads_spec, load_heads

        check_method_names(methods)

        gc.unfreeze()  # what an earlier load froze (a replaced engine's models) may be collected again
        gc.collect()

        def wanted(part: str) -> bool:
            return methods is None or any(part in METHODS[m].requires for m in methods if m in METHODS)

        def say(message: str) -> None:
            if progress is not None:
                progress(0.0, message)

        loaded = models.load_model(target, device, dtype, progress)
        models.check_target_vocabulary(loaded, target)
        draft_spec = models.default_draft_spec(target, draft)
        loaded_draft = (models.load_draft(draft_spec, loaded, progress=progress)
                        if draft_spec and wanted("draft") else None)
        heads = None
        medusa_spec = heads_spec(target, medusa)
        if medusa_spec and wanted("medusa"):
            say(f"loading Medusa heads {medusa_spec}")
            heads = load_heads(medusa_spec, loaded)
        draft_heads = None
        if draft_medusa and draft_medusa.lower() != "none" and wanted("draft"):
            if loaded_draft is None:
                raise ValueError("draft Medusa heads need a draft model")
            say(f"loading the draft's Medusa heads {draft_medusa}")
            draft_heads = load_heads(draft_medusa, loaded_draft)
        eagle_spec, eagle_head = cls._eagle_spec(target, eagle), None
        if eagle_spec and wanted("eagle"):
            from .eagle import load_eagle
            say(f"loading the EAGLE head {eagle_spec}")
            eagle_head = load_eagle(eagle_spec, loaded)
        engine = cls(loaded, loaded_draft, medusa=heads, draft_medusa=draft_heads, eagle=eagle_head)
        specs = {"draft": draft_spec, "medusa": medusa_spec, "eagle": eagle_spec}
        engine.left_out = {p for p, spec in specs.items() if spec and not wanted(p)}  # unavailable_reason says so
        # Every object alive now (the libraries, the models) lives as long as the engine: frozen, Python's
        # full garbage collections skip them. Unfrozen, each full collection walked them all (0.1-0.3 s
        # on the 2-vCPU EPYC) and stalled whichever method was stepping at the time.
        gc.freeze()
        return engine

    @staticmethod
    def _eagle_spec(target_spec: str, eagle: str | None) -> str | None:
        """The EAGLE head to load for the target (None when the method is not installed or none applies)."""
        if "eagle" not in METHODS:
            return None
        from . import eagle as eagle_pkg

        return eagle_pkg.head_spec(target_spec, eagle) or None

    # ----- what is loaded and what can run ----------------------------------------------------
    def loaded_parts(self) -> dict[str, bool]:
        """Which optional parts are loaded: ``{"draft": ..., "medusa": ..., "eagle": ..., "draft_medusa": ...,
        "datastore": ...}`` (the datastore: given, or a folder of chunks for this target, read when REST runs)."""
        from .rest import datastore_available

        return {"draft": self.draft_lm is not None, "medusa": self.medusa is not None, "eagle": self.eagle is not None,
                "draft_medusa": self.draft_medusa is not None, "datastore": datastore_available(self)}

    def describe(self) -> dict:
        """Plain facts about the loaded models for the UI and the records: target name, spec,
        device, dtype (a string), context length, draft name, Medusa and EAGLE head counts, and
        ``generation_config``: the target's own generation settings (:meth:`generation_defaults`:
        which are applied, which only suggested, which ignored)."""
        t = self.target
        return {"target": t.name, "target_spec": getattr(t, "spec", None), "device": str(t.device),
                "dtype": str(t.dtype).removeprefix("torch."), "context_length": t.context_length,
                "draft": self.draft.name if self.draft is not None else None,
                "medusa_heads": self.medusa.num_heads if self.medusa is not None else 0,
                "draft_medusa_heads": self.draft_medusa.num_heads if self.draft_medusa is not None else 0,
                "eagle": self.eagle is not None, "generation_config": self.generation_defaults()}

    @property
    def dtype(self) -> torch.dtype:
        """The target's dtype (sets the lossless check's near-tie threshold)."""
        return self.target.dtype

    def parameter_count(self, part: str = "target") -> int:
        """Parameters of the target or the draft (``part``), 0 when absent."""
        model = self.target.model if part == "target" else getattr(self.draft, "model", None)
        return sum(p.numel() for p in model.parameters()) if model is not None else 0

    def unavailable_reason(self, method: str) -> str | None:
        """Why ``method`` cannot run with the loaded models, or None when it can."""
        info = METHODS.get(method)
        if info is None:
            return f"unknown method {method!r}"
        parts = self.loaded_parts()
        missing = [p for p in info.requires if not parts.get(p)]
        if missing and missing[0] in self.left_out:
            part = {"draft": "draft model", "medusa": "Medusa heads", "eagle": "EAGLE head"}.get(missing[0], missing[0])
            return (f"its {part} {'were' if part.endswith('s') else 'was'} not loaded: Engine.load(methods=...) "
                    f"left {method!r} out; add it to methods to load what it needs")
        if missing:
            return MISSING_PART.get(missing[0], "no {part} is loaded for {target}").format(
                target=self.target.name, part=missing[0])
        return None

    def available_methods(self) -> list[str]:
        return [m for m in METHODS if self.unavailable_reason(m) is None]

    def knob_defaults(self, method: str) -> dict:
        """Knob values that replace the global defaults for ``method`` with the loaded models: for
        draft_model, the ones saved with the draft (``draft_model.DRAFT_KNOBS_FILE``); else {}."""
        if method == "draft_model" and self.draft is not None:
            return dict(getattr(self.draft, "knob_defaults", None) or {})
        return {}

    def knob_choices(self, method: str, knob: str) -> tuple[str, ...] | None:
        """The named options of ``method``'s ``knob`` that the loaded models can serve (None for a
        numeric knob, or one whose options all work): the draft model's ``medusa_heads`` proposer
        only with Medusa heads trained on the draft."""
        info = METHODS.get(method)
        spec = next((k for k in (info.knobs if info else ()) if k.name == knob), None)
        if spec is None or not hasattr(spec, "choices"):
            return None
        if method == "draft_model" and knob == "proposer" and getattr(self, "draft_medusa", None) is None:
            return tuple(c for c in spec.choices if c != "medusa_heads")
        return tuple(spec.choices)

    def with_defaults(self, spec: MethodSpec) -> MethodSpec:
        """``spec`` with :meth:`knob_defaults` filling the knobs it leaves unset (what runs)."""
        return MethodSpec(spec.name, {**self.knob_defaults(spec.name), **spec.params})

    def make_drafter(self, spec: MethodSpec, scope: str | None = None) -> Drafter:
        """A fresh drafter for ``spec`` (unset knobs: :meth:`knob_defaults`, then the global defaults),
        whose state learned across runs is ``scope``'s (see :mod:`.learned`; None: the scope it is
        built in, a mixture's member its mixture's, else the unscoped state).

        Raises:
            TypeError: ``spec`` is not a :class:`MethodSpec`, or ``scope`` not a string.
            ValueError: unknown method, bad knob, a method that cannot run here, or a bad scope.
        """
        if not isinstance(spec, MethodSpec):
            raise TypeError(f"methods are given as MethodSpec(name, params), got {type(spec).__name__}")
        params = self.with_defaults(spec).checked_params()
        reason = self.unavailable_reason(spec.name)
        if reason:
            raise ValueError(f"{spec.name} is unavailable: {reason}")
        scope = current_scope() if scope is None else check_scope(scope)
        if scope is not None:
            with self._lock:  # the least recently used scope beyond the limit goes
                for old in self._scopes.touch(scope):
                    self.forget(scoped_key(LEARNED, old))
        with in_scope(scope):
            return METHODS[spec.name].build(self, params)

    # ----- state kept across runs -------------------------------------------------------------
    def persistent(self, key: str, factory: Callable[[], Any]) -> Any:
        """The object kept under ``key`` for this engine's lifetime, made by ``factory()`` on first use.

        One-time calibrations (Medusa's ``auto`` tree, the verify-cost and step-cost curves) and
        state that learns across runs (suffix decoding's global cache) live here. ``factory`` runs
        once, under the engine's step lock (so no method steps while a calibration times the
        device), even when several threads ask at once: the check for an existing object is
        repeated under the lock. The lock is re-entrant, so a factory may ask for another key.
        ``factory`` runs outside ``torch.inference_mode`` (its model calls enter it themselves), so
        the tensors it makes may be updated in place by runs in or out of inference mode. A
        ``learned/`` key asked for while drafters are built in a scope is that scope's (:mod:`.learned`).
        """
        key = scoped_key(key, current_scope())
        try:
            return self._persistent[key]  # made already: no lock needed to read it
        except KeyError:
            pass
        with self._lock:
            if key not in self._persistent:
                self.calibrations[key] = self.calibrations.get(key, 0) + 1
                outer, self.making = self.making, key
                try:
                    # Made outside inference mode even when asked inside it (the benchmark runs
                    # under torch.inference_mode): a tensor kept across runs and updated in place
                    # (the recycling table) must not be an inference tensor, or every later run
                    # outside inference mode (the page, the API) fails on its first update.
                    with torch.inference_mode(False):
                        self._persistent[key] = factory()
                finally:
                    self.making = outer
            return self._persistent[key]

    def has_persistent(self, key: str) -> bool:
        """Whether :meth:`persistent` has made the object under ``key`` (e.g. a calibration ran)."""
        return key in self._persistent

    def persisted(self, key: str) -> Any:
        """The object :meth:`persistent` made under ``key``, or None (nothing is made here)."""
        return self._persistent.get(key)

    def forget(self, prefix: str = "") -> None:
        """Drop the persistent state whose key starts with ``prefix`` (all when empty); the benchmark
        calls it after warm-up so that no method learns from warm-up output. Scoped learned state
        (``learned@<scope>/``) goes with ``forget()`` or :meth:`forget_learned`, not ``forget("learned/")``."""
        with self._lock:
            for key in [k for k in self._persistent if k.startswith(prefix)]:
                del self._persistent[key]
                if key.startswith(("learned/", "learned@")):
                    self.calibrations.pop(key, None)

    def forget_learned(self, scope: str | None = None) -> None:
        """Drop what methods learned across runs in ``scope`` (None: runs made without a scope)."""
        self.forget(scoped_key(LEARNED, check_scope(scope)))
        if scope is not None:
            self._scopes.discard(scope)

    def exclusive(self):
        """A context manager holding the step lock (no method steps while it is held): for swapping
        models between steps or timing the device."""
        return self._lock

    def verify_cost(self, sizes=None):
        """This device's measured cost of one target pass over n tokens relative to one
        (:class:`~playground.engine.theory.VerifyCost`), measured once per engine (under the lock)
        at :data:`~playground.engine.theory.VERIFY_COST_SIZES` (those that fit the context) and kept:
        the one curve the Theory tab and EAGLE's ``auto`` tree size read. ``sizes`` given: measured
        afresh at those sizes, not kept.

        Raises:
            ValueError: a size below 1, or sizes that do not fit the target's context.
        """
        from .theory import VERIFY_COST_SIZES, measure_verify_cost

        if sizes is not None:
            with self._lock:
                return measure_verify_cost(self.target, sizes)

        def measure():
            ctx = int(getattr(self.target_lm.model.config, "max_position_embeddings", 0) or 1 << 30)
            prefix = min(128, ctx // 2)
            fit = [n for n in VERIFY_COST_SIZES if prefix + n <= ctx] or [1]
            return measure_verify_cost(self.target, fit, prefix_len=prefix, repeats=3)
        return self.persistent("verify_cost", measure)

    def replace_models(self, other: "Engine") -> None:
        """Take ``other``'s models (a preset switch), between two steps of any run in flight."""
        with self._lock:
            for name in ("target", "draft", "target_lm", "draft_lm", "medusa", "draft_medusa", "eagle", "left_out"):
                setattr(self, name, getattr(other, name))
            self.forget()

    # ----- prompts ----------------------------------------------------------------------------
    def encode_prompt(self, prompt: str | list[dict], chat: bool = True) -> list[int]:
        """Token ids of a prompt, with the target's chat template applied when it has one.

        Args:
            prompt: a user message, or a whole conversation as ``[{"role", "content"}, ...]``.
            chat: apply the chat template (False: plain text, e.g. code completion).

        Raises:
            TypeError: ``prompt`` is neither text nor a list of messages.
            ValueError: empty prompt, or a prompt longer than the target's context.
        """
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ValueError("the prompt is empty: type something to generate from")
            messages = [{"role": "user", "content": prompt}]
        elif isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt):
            messages = prompt
            if not messages or not str(messages[-1].get("content", "")).strip():
                raise ValueError("the prompt is empty: type something to generate from")
        else:
            raise TypeError(f"prompt must be text or a list of {{'role', 'content'}} messages, got "
                            f"{type(prompt).__name__}")
        tok = self.target.tokenizer
        if chat and getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids
            ids = ids[0].tolist()
        else:
            ids = tok("\n".join(m["content"] for m in messages), add_special_tokens=True)["input_ids"]
        ctx = self.target.context_length
        if len(ids) >= ctx:
            raise ValueError(f"the prompt is {len(ids)} tokens, longer than the model's context of {ctx} tokens")
        return ids

    def decode_text(self, ids: list[int]) -> str:
        """The text of token ids (special tokens dropped)."""
        return self.target.tokenizer.decode(ids, skip_special_tokens=True)

    # ----- runs -------------------------------------------------------------------------------
    def check_prompt_ids(self, prompt_ids) -> list[int]:
        """``prompt_ids`` as a list of ints, checked against the target's vocabulary.

        Any 1-D sequence of integers is accepted: a list, a tuple, a 1-D tensor or array.

        Raises:
            TypeError: text, booleans, or anything but integer token ids (encode text with
                :meth:`encode_prompt` first).
            ValueError: an empty prompt, or an id outside ``[0, vocab_size)``.
        """
        return check_prompt_ids(prompt_ids, self.target.model.get_input_embeddings().num_embeddings)

    def resolve_settings(self, settings: GenerationSettings) -> GenerationSettings:
        """``settings`` with the target's own defaults filling what the caller left unset: the
        ``repetition_penalty`` of its ``generation_config`` (1.0 when it has none). The model's
        sampling defaults (temperature, top-p, top-k) are not applied: runs sample only when the
        caller asks (see :meth:`generation_defaults`).

        Raises:
            TypeError: ``settings`` is not :class:`GenerationSettings`.
            ValueError: the model's repetition penalty is outside the knob's bounds.
        """
        if not isinstance(settings, GenerationSettings):
            raise TypeError(f"settings must be GenerationSettings, got {type(settings).__name__}")
        if settings.repetition_penalty is None:
            settings = dataclasses.replace(settings, repetition_penalty=model_repetition_penalty(self.target.model))
        return settings

    def generation_defaults(self) -> dict:
        """What the target's ``generation_config`` asks for (see :func:`.penalty.model_generation_settings`):
        ``{"applied": {...}, "suggested": {...}, "ignored": {...}}``: ``applied`` every run uses
        unless its settings say otherwise (the repetition penalty); ``suggested`` the model's sampling
        defaults, for the page to offer (runs stay greedy unless asked); ``ignored`` settings the
        model sets that the engine does not implement."""
        return model_generation_settings(self.target.model)

    def _check_run(self, prompt_ids, specs, settings, cancel=None, scope=None
                   ) -> tuple[list[int], list[Drafter], GenerationSettings]:
        """Everything a run checks before its first step; returns the ids, fresh drafters and the
        settings with the model's defaults filled in."""
        if cancel is not None and not callable(getattr(cancel, "is_set", None)):
            raise TypeError(f"cancel must be a threading.Event (or None), got {type(cancel).__name__}")
        settings = self.resolve_settings(settings)
        if isinstance(specs, (str, MethodSpec)) or not isinstance(specs, (list, tuple)):
            raise TypeError("specs must be a list of MethodSpec")
        if not specs:
            raise ValueError("choose at least one method")
        names = [getattr(s, "name", None) for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"each method can run once per comparison, got {names}")
        prompt_ids = self.check_prompt_ids(prompt_ids)
        ctx = self.target.context_length
        if len(prompt_ids) + settings.max_new_tokens > ctx:
            raise ValueError(f"the prompt is {len(prompt_ids)} tokens; with {settings.max_new_tokens} max new tokens "
                             f"it exceeds the model's context of {ctx} tokens")
        scope = check_scope(scope)
        return prompt_ids, [self.make_drafter(s, scope) for s in specs], settings

    def run_one(self, prompt_ids, spec: MethodSpec, settings: GenerationSettings,
                cancel: threading.Event | None = None, scope: str | None = None) -> Iterator[StepEvent]:
        """Events of one method on one prompt (each step holds the engine's lock).

        Raises:
            TypeError, ValueError: as :meth:`run`; raised at the call, before any step runs.
        """
        prompt_ids, (drafter,), settings = self._check_run(prompt_ids, [spec], settings, cancel, scope)
        return self._steps(prompt_ids, spec.name, drafter, settings, cancel)

    def _steps(self, prompt_ids: list[int], method: str, drafter: Drafter, settings: GenerationSettings,
               cancel: threading.Event | None, prefill: SharedPrefill | None = None) -> Iterator[StepEvent]:
        """The events of ``drafter`` on checked ``prompt_ids``, each step under the engine's lock."""
        gen = decode(self.target_lm, drafter, prompt_ids, settings, eos_token_ids=self.target.eos_token_ids,
                     tokenizer=self.target.tokenizer, context_length=self.target.context_length,
                     cancel=cancel, method=method, prefill=prefill)
        while True:
            with self._lock:
                event = next(gen, None)
            if event is None:
                return
            yield event

    def run(self, prompt_ids, specs: list[MethodSpec], settings: GenerationSettings,
            cancel: threading.Event | None = None, scope: str | None = None) -> Iterator[StepEvent]:
        """Run several methods side by side, round-robin, one step each in turn; the prompt's pass is
        made once for all (:class:`~.decoding.SharedPrefill`), its seconds in each method's first step.

        Args:
            prompt_ids: ``(prompt_len,)`` token ids (see :meth:`encode_prompt`): any 1-D sequence
                of ints (list, tuple, tensor, array).
            specs: the methods to run (distinct names).
            settings: shared generation settings (every method gets the same seed).
            cancel: set it to stop every method before its next step.
            scope: whose learned state the methods read and add to (suffix decoding's cache, the
                recycling table, the budget's estimates; :mod:`.learned`): the page passes its
                browser session, so no visitor's outputs feed another's drafts. None: the state of
                every run made without a scope.

        Returns:
            An iterator of each method's :class:`StepEvent` in turn until all have finished. A
            method that raises during its steps ends alone, with finish reason ``"error"`` (its
            last event's ``error`` says why; :func:`~.events.round_robin`).

        Raises:
            ValueError: no method, duplicate methods, bad knobs, an unavailable method, an
                empty prompt, a token id outside the vocabulary, or a prompt that does not fit
                the context; raised at the call, before any step runs.
            TypeError: ``prompt_ids`` is not a sequence of integer ids (e.g. text), ``specs``
                not a list of :class:`MethodSpec`, ``settings`` not :class:`GenerationSettings`,
                ``cancel`` not an event, ``scope`` not a string.
        """
        prompt_ids, drafters, settings = self._check_run(prompt_ids, specs, settings, cancel, scope)
        shared = SharedPrefill([i for d in drafters for i in d.feature_layers], len(drafters),  # one pass for all
                               self.target_lm.num_layers)
        return round_robin([(s.name, self._steps(prompt_ids, s.name, d, settings, cancel, shared))
                            for s, d in zip(specs, drafters)])
