"""The engine's public API: the method registry, side-by-side runs, and the lossless check.

:class:`Engine` holds a loaded target (and optionally a draft) and runs several methods
on one prompt **round-robin in one worker**: each method takes one step in turn, so
every panel streams at once, no two methods compete for the device, and each method's
clock counts only its own steps. Models are read-only during runs; every run builds its
own caches and drafters, and a lock serialises steps across concurrent callers.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from .autoregressive import AutoregressiveDrafter
from .decoding import GenerationSettings, decode
from .draft_model import DraftModelDrafter
from .drafter import Drafter
from .events import SOURCE_DRAFT, SOURCE_LOOKAHEAD, SOURCE_PROMPT_LOOKUP, SOURCE_TARGET, StepEvent
from .limits import (DRAFT_CONFIDENCE_KNOB, DRAFT_PROPOSER_KNOB, K_KNOB, LOOKAHEAD_KNOBS, MEDUSA_ACCEPTANCE_KNOB,
                     POSTERIOR_ALPHA_KNOB, POSTERIOR_THRESHOLD_KNOB, PROMPT_LOOKUP_NGRAM_KNOB, PROMPT_LOOKUP_TOKENS_KNOB, ChoiceKnob, Knob)
from .lookahead import LookaheadDrafter
from .medusa import MedusaDraftDrafter, MedusaDrafter, head_source
from .medusa_trees import AUTO, TREE_KNOB, TREE_PRESETS, TreeChoice, auto_tree, preset_choices
from .prompt_lookup import PromptLookupDrafter
from .tree import parse_tree_choices
from .target import CausalLM

BASELINE = "autoregressive"


@dataclass(frozen=True)
class MethodInfo:
    """What the UI and the benchmark need to know about one method.

    Attributes:
        name: API name; label: display name; description: one line for the UI.
        lossless: greedy output must equal the baseline's token for token.
        needs_draft: the method needs a draft model.
        knobs: the method's settings (bounds shared with the UI sliders; :class:`ChoiceKnob`
            for named options: a dropdown).
        sources: source tags its tokens can carry.
        lossless_if: when given, the method is lossless only for params where it returns True
            (Medusa: exact acceptance, not typical); see :func:`is_lossless`.
    """

    name: str
    label: str
    description: str
    lossless: bool
    needs_draft: bool
    knobs: tuple[Knob | ChoiceKnob, ...]
    sources: tuple[str, ...]
    lossless_if: Callable[[dict], bool] | None = None


METHODS: dict[str, MethodInfo] = {m.name: m for m in (
    MethodInfo(BASELINE, "Autoregressive", "Baseline: one target forward pass per token.", True, False, (),
               (SOURCE_TARGET,)),
    MethodInfo("prompt_lookup", "Prompt lookup", "Copies the continuation of an earlier match of the latest "
               "n-gram in the prompt and output (Saxena 2023).", True, False,
               (PROMPT_LOOKUP_NGRAM_KNOB, PROMPT_LOOKUP_TOKENS_KNOB), (SOURCE_TARGET, SOURCE_PROMPT_LOOKUP)),
    MethodInfo("draft_model", "Draft model", "A small draft model proposes K tokens; the target verifies them in "
               "one pass (Leviathan et al. 2023; Chen et al. 2023).", True, True,
               (K_KNOB, DRAFT_CONFIDENCE_KNOB, DRAFT_PROPOSER_KNOB),
               (SOURCE_TARGET, SOURCE_DRAFT)),
    MethodInfo("lookahead", "Lookahead", "Jacobi iterations in a W x (N - 1) window generate n-grams; those "
               "starting with the last token are verified in the same pass (Fu et al. 2024).", True, False,
               LOOKAHEAD_KNOBS, (SOURCE_TARGET, SOURCE_LOOKAHEAD)),
    MethodInfo("medusa", "Medusa", "Extra heads on the target's last hidden state propose a tree of tokens; "
               "the target verifies it in one pass (Cai et al. 2024). Lossless with exact acceptance; typical "
               "acceptance trades exactness for speed.", True, False,
               (TREE_KNOB, MEDUSA_ACCEPTANCE_KNOB, POSTERIOR_THRESHOLD_KNOB, POSTERIOR_ALPHA_KNOB),
               (SOURCE_TARGET,) + tuple(head_source(k) for k in range(1, 6)),
               lossless_if=lambda p: p.get("acceptance", MEDUSA_ACCEPTANCE_KNOB.default) == "exact"),
)}


# The drafters branch's bridge to the registry (the lead's engine.py replaces this module): every
# method but the baseline gets the ``budget`` knob, and the registered methods (suffix, recycling,
# mixture) join METHODS and SOURCE_LABELS below.
from . import methods as _methods  # noqa: E402,F401  (registers the new methods)
from . import registry as _registry  # noqa: E402
from .budget import BUDGET_KNOB, build_with_budget  # noqa: E402

for _name, _info in list(METHODS.items()):
    if _name != BASELINE:
        METHODS[_name] = MethodInfo(_info.name, _info.label, _info.description, _info.lossless, _info.needs_draft,
                                    _info.knobs + (BUDGET_KNOB,), _info.sources, _info.lossless_if)
for _name, _info in _registry.METHODS.items():
    METHODS.setdefault(_name, _info)


def is_lossless(method: str, params: dict | None = None) -> bool:
    """Whether ``method`` with ``params`` must match the baseline under greedy decoding."""
    info = METHODS[method]
    return info.lossless and (info.lossless_if is None or bool(info.lossless_if(params or {})))

SOURCE_LABELS = {
    SOURCE_TARGET: "target (bonus / correction)",
    SOURCE_DRAFT: "draft model",
    SOURCE_PROMPT_LOOKUP: "prompt lookup",
    SOURCE_LOOKAHEAD: "lookahead n-gram",
    **{head_source(k): f"Medusa head {k}" for k in range(1, 6)},
    **_registry.source_labels(),
}
"""Legend text of each token source."""


@dataclass(frozen=True)
class MethodSpec:
    """One method to run, with its knob values (missing knobs take their defaults)."""

    name: str
    params: dict = field(default_factory=dict)

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


@dataclass
class LosslessCheck:
    """Whether a method's greedy output matched the baseline's.

    Attributes:
        matched: identical token ids.
        position: first diverging position (0-based, in new tokens), None when matched.
        baseline_margin: the baseline's top-1 minus top-2 logit at that position.
        near_tie: the divergence is at a near-tie (margin below the dtype's rounding
            noise), so reduced-precision numerics, not a bug, are the likely cause.
    """

    matched: bool
    position: int | None = None
    baseline_margin: float | None = None
    near_tie: bool = False

    def message(self) -> str:
        if self.matched:
            return "matches the baseline token for token"
        where = f"diverges from the baseline at new token {self.position}"
        if self.baseline_margin is None:
            return where
        kind = "a near-tie: reduced-precision rounding, not a bug" if self.near_tie else \
            "NOT a near-tie: a real mismatch"
        return f"{where} (baseline's top-2 logit margin there {self.baseline_margin:.3g}: {kind})"


NEAR_TIE_MARGIN = {torch.float32: 1e-3, torch.float64: 1e-6, torch.bfloat16: 0.5, torch.float16: 0.1}
"""Top-2 logit margins below which a divergence counts as a numerical near-tie, per dtype
(bf16 batched-vs-sequential forwards were seen to differ by up to 0.5 in logits here)."""


def check_lossless(baseline_ids: list[int], baseline_margins: list[float], ids: list[int],
                   dtype: torch.dtype = torch.float32) -> LosslessCheck:
    """Compare a method's output with the baseline's, token for token.

    Args:
        baseline_ids, ids: new token ids of the baseline and of the method.
        baseline_margins: the baseline's top-1 minus top-2 logit at each of its tokens.
        dtype: the target's dtype (sets the near-tie threshold).
    """
    for i, (a, b) in enumerate(zip(baseline_ids, ids)):
        if a != b:
            margin = baseline_margins[i] if i < len(baseline_margins) else None
            near = margin is not None and margin < NEAR_TIE_MARGIN.get(dtype, 0.5)
            return LosslessCheck(False, i, margin, near)
    if len(baseline_ids) != len(ids):
        i = min(len(baseline_ids), len(ids))
        margin = baseline_margins[i] if i < len(baseline_margins) else None
        near = margin is not None and margin < NEAR_TIE_MARGIN.get(dtype, 0.5)
        return LosslessCheck(False, i, margin, near)
    return LosslessCheck(True)


@dataclass
class RunOutput:
    """Everything one method produced in a run (filled as its events arrive)."""

    method: str
    params: dict
    ids: list[int] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    margins: list[float] = field(default_factory=list)
    text: str = ""
    last: StepEvent | None = None

    def add(self, event: StepEvent) -> None:
        self.ids.extend(event.tokens)
        self.sources.extend(event.sources)
        self.margins.extend(event.margins)
        self.text += "".join(p for p, _ in event.pieces)
        self.last = event


class Engine:
    """A loaded target (and optional draft) that runs methods on prompts.

    Args:
        target: a loaded target model (see :mod:`playground.engine.models`): needs
            ``model``, ``tokenizer``, ``name``, ``context_length``, ``eos_token_ids``.
        draft: an optional loaded draft sharing the target's tokenizer.
        medusa: optional :class:`~playground.engine.medusa.MedusaHeads` for the target (attached
            to its ``lm_head``, see :func:`~playground.engine.medusa.load_heads`).
        draft_medusa: optional Medusa heads of the draft: draft_model's ``proposer`` knob
            ``medusa_heads`` then drafts with one draft pass per step.
    """

    def __init__(self, target, draft=None, medusa=None, draft_medusa=None):
        self.target = target
        self.draft = draft
        self.target_lm = CausalLM(target.model)
        self.draft_lm = CausalLM(draft.model) if draft is not None else None
        self.medusa = medusa
        self.draft_medusa = draft_medusa
        self.medusa_auto: tuple[TreeChoice, dict] | None = None  # the "auto" tree, chosen on first use
        self.lock = threading.Lock()
        self._persistent: dict = {}

    def persistent(self, key: str, factory):
        """The object kept under ``key`` for this engine's lifetime, made by ``factory()`` on first use
        (the step-cost curve; learned state under ``learned/``: suffix caches, recycling tables)."""
        if key not in self._persistent:
            self._persistent[key] = factory()
        return self._persistent[key]

    def forget(self, prefix: str = "") -> None:
        """Drop the persistent state whose key starts with ``prefix`` (all when empty)."""
        for key in [k for k in self._persistent if k.startswith(prefix)]:
            del self._persistent[key]

    @classmethod
    def load(cls, target: str, draft: str | None = None, medusa: str | None = None,
             draft_medusa: str | None = None, device="auto", dtype="auto", progress=None,
             methods: list[str] | None = None) -> "Engine":
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

        Raises:
            models.ModelLoadError: a model or heads cannot be found or loaded, or a draft with a
                different tokenizer.
            ValueError: a bad device or dtype, or draft Medusa heads without a draft.
        """
        from . import models
        from .medusa import heads_spec, load_heads

        def wanted(method: str) -> bool:
            return methods is None or method in methods

        def say(message: str) -> None:
            if progress is not None:
                progress(0.0, message)

        loaded = models.load_model(target, device, dtype, progress)
        draft_spec = models.default_draft_spec(target, draft)
        loaded_draft = (models.load_draft(draft_spec, loaded, progress=progress)
                        if draft_spec and wanted("draft_model") else None)
        heads = None
        medusa_spec = heads_spec(target, medusa)
        if medusa_spec and wanted("medusa"):
            say(f"loading Medusa heads {medusa_spec}")
            heads = load_heads(medusa_spec, loaded)
        draft_heads = None
        if draft_medusa and draft_medusa.lower() != "none" and wanted("draft_model"):
            if loaded_draft is None:
                raise ValueError("draft Medusa heads need a draft model (--draft)")
            say(f"loading the draft's Medusa heads {draft_medusa}")
            draft_heads = load_heads(draft_medusa, loaded_draft)
        return cls(loaded, loaded_draft, medusa=heads, draft_medusa=draft_heads)

    # ----- what can run --------------------------------------------------------------
    def unavailable_reason(self, method: str) -> str | None:
        """Why ``method`` cannot run with the loaded models, or None when it can."""
        info = METHODS.get(method)
        if info is None:
            return f"unknown method {method!r}"
        if info.needs_draft and self.draft_lm is None:
            return (f"no draft model is loaded for {self.target.name}: start the app with --draft MODEL "
                    "(a smaller model with the same tokenizer)")
        if method == "medusa" and self.medusa is None:
            return (f"no Medusa heads are loaded for {self.target.name}: start with --medusa PATH_OR_HUB_ID, or "
                    "train heads with `python -m playground.training.medusa`")
        return None

    # ----- Medusa trees --------------------------------------------------------------
    MEDUSA_CALIBRATION_PROMPT = "Explain, step by step, how a bicycle works and why riding one is good exercise."

    def medusa_auto_tree(self) -> tuple[TreeChoice, dict]:
        """The tree chosen for this device (measured once, then kept): see ``medusa_trees.auto_tree``."""
        if self.medusa_auto is None:
            if getattr(self.target, "tokenizer", None) is not None:
                calibration = self.encode_prompt(self.MEDUSA_CALIBRATION_PROMPT)
            else:  # a bare model (tests, API users): time steps from a fixed run of ids
                calibration = [1 + i % (self.target_lm.vocab_size - 1) for i in range(16)]
            with self.lock:
                self.medusa_auto = auto_tree(self.target_lm, self.medusa, calibration)
        return self.medusa_auto

    def medusa_tree(self, value) -> list[list[int]]:
        """The paths of a ``tree_choices`` value: a preset name (``auto`` chooses per device) or paths."""
        if self.medusa is None:
            raise ValueError(f"medusa is unavailable: {self.unavailable_reason('medusa')}")
        if value == AUTO:
            return self.medusa_auto_tree()[0].choices
        if isinstance(value, str) and value in TREE_PRESETS:
            return preset_choices(value, self.medusa.num_heads)
        return [list(p) for p in parse_tree_choices(value, num_heads=self.medusa.num_heads)]

    def medusa_tree_description(self, value) -> str:
        """One line saying which tree ``value`` (a preset name, a JSON string or a list of paths)
        means here, for the UI and the benchmark.

        Raises:
            ValueError / TreeChoicesError: Medusa unavailable, or a malformed tree.
        """
        if value == AUTO:
            choice, info = self.medusa_auto_tree()
            return f"auto: {choice.describe()}; head accuracy: {info['accuracy_source']}"
        paths = self.medusa_tree(value)
        depth = max(len(p) for p in paths)
        name = value if isinstance(value, str) and value in TREE_PRESETS else "custom"
        return f"{name}: {len(paths)} {'node' if len(paths) == 1 else 'nodes'}, depth {depth}"

    def available_methods(self) -> list[str]:
        return [m for m in METHODS if self.unavailable_reason(m) is None]

    def knob_defaults(self, method: str) -> dict:
        """Knob values that replace the global defaults for ``method`` with the loaded models: for
        draft_model, the ones saved with the draft (``draft_model.DRAFT_KNOBS_FILE``); else {}."""
        if method == "draft_model" and self.draft is not None:
            return dict(getattr(self.draft, "knob_defaults", None) or {})
        return {}

    def with_defaults(self, spec: MethodSpec) -> MethodSpec:
        """``spec`` with :meth:`knob_defaults` filling the knobs it leaves unset (what runs)."""
        return MethodSpec(spec.name, {**self.knob_defaults(spec.name), **spec.params})

    def make_drafter(self, spec: MethodSpec) -> Drafter:
        """A fresh drafter for ``spec`` (unset knobs: :meth:`knob_defaults`, then the global defaults).

        Raises:
            ValueError: unknown method, bad knob, or a method that cannot run here.
        """
        params = self.with_defaults(spec).checked_params()
        reason = self.unavailable_reason(spec.name)
        if reason:
            raise ValueError(f"{spec.name} is unavailable: {reason}")
        if spec.name in _registry.METHODS:
            return _registry.METHODS[spec.name].build(self, params)
        return build_with_budget(self, params, lambda p: self._legacy_drafter(spec, p), spec.name)

    def _legacy_drafter(self, spec: MethodSpec, params: dict) -> Drafter:
        factories: dict[str, Callable[[], Drafter]] = {
            BASELINE: lambda: AutoregressiveDrafter(),
            "prompt_lookup": lambda: PromptLookupDrafter(**params),
            "draft_model": lambda: self._draft_model_drafter(params),
            "lookahead": lambda: LookaheadDrafter(**params),
            "medusa": lambda: MedusaDrafter(self.medusa, self.medusa_tree(params["tree_choices"]), params["acceptance"],
                                            params["posterior_threshold"], params["posterior_alpha"]),
        }
        return factories[spec.name]()

    def _draft_model_drafter(self, params: dict) -> Drafter:
        params = dict(params)
        if params.pop("proposer", DRAFT_PROPOSER_KNOB.default) == "medusa_heads":
            if self.draft_medusa is None:
                raise ValueError("draft_model's proposer medusa_heads needs Medusa heads trained on the draft "
                                 "model (--draft-medusa PATH_OR_HUB_ID); none are loaded")
            params.pop("confidence", None)  # the heads propose in one pass: no per-token stop
            return MedusaDraftDrafter(self.draft_lm, self.draft_medusa,
                                      token_map=getattr(self.draft, "token_map", None), **params)
        return DraftModelDrafter(self.draft_lm, token_map=getattr(self.draft, "token_map", None), **params)

    # ----- prompts -------------------------------------------------------------------
    def encode_prompt(self, prompt: str | list[dict], chat: bool = True) -> list[int]:
        """Token ids of a prompt, with the target's chat template applied when it has one.

        Args:
            prompt: a user message, or a whole conversation as ``[{"role", "content"}, ...]``.
            chat: apply the chat template (False: plain text, e.g. code completion).

        Raises:
            ValueError: empty prompt, or a prompt longer than the target's context.
        """
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ValueError("the prompt is empty: type something to generate from")
            messages = [{"role": "user", "content": prompt}]
        else:
            messages = prompt
            if not messages or not str(messages[-1].get("content", "")).strip():
                raise ValueError("the prompt is empty: type something to generate from")
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

    # ----- runs ----------------------------------------------------------------------
    def check_prompt_ids(self, prompt_ids) -> list[int]:
        """``prompt_ids`` as a list of ints, checked against the target's vocabulary.

        Raises:
            TypeError: text or anything but a sequence of integer token ids (encode text with
                :meth:`encode_prompt` first).
            ValueError: an empty prompt, or an id outside ``[0, vocab_size)``.
        """
        if isinstance(prompt_ids, torch.Tensor):
            prompt_ids = prompt_ids.reshape(-1).tolist()
        if isinstance(prompt_ids, (str, bytes)) or not all(isinstance(t, int) for t in prompt_ids):
            raise TypeError("prompt_ids must be a list of integer token ids: encode text with "
                            "Engine.encode_prompt first")
        ids = [int(t) for t in prompt_ids]
        if not ids:
            raise ValueError("the prompt is empty: type something to generate from")
        vocab = self.target.model.get_input_embeddings().num_embeddings
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the target's vocabulary of {vocab} tokens")
        return ids

    def run_one(self, prompt_ids: list[int], spec: MethodSpec, settings: GenerationSettings,
                cancel: threading.Event | None = None) -> Iterator[StepEvent]:
        """Events of one method on one prompt (each step holds the engine's lock).

        Raises:
            TypeError, ValueError: bad ``prompt_ids`` (:meth:`check_prompt_ids`) or bad knobs;
                raised before any step runs.
        """
        return self._steps(self.check_prompt_ids(prompt_ids), spec.name, self.make_drafter(spec), settings, cancel)

    def _steps(self, prompt_ids: list[int], method: str, drafter: Drafter, settings: GenerationSettings,
               cancel: threading.Event | None) -> Iterator[StepEvent]:
        """The events of ``drafter`` on checked ``prompt_ids``, each step under the engine's lock."""
        gen = decode(self.target_lm, drafter, prompt_ids, settings, eos_token_ids=self.target.eos_token_ids,
                     tokenizer=self.target.tokenizer, context_length=self.target.context_length,
                     cancel=cancel, method=method)
        while True:
            with self.lock:
                event = next(gen, None)
            if event is None:
                return
            yield event

    def run(self, prompt_ids: list[int], specs: list[MethodSpec], settings: GenerationSettings,
            cancel: threading.Event | None = None) -> Iterator[StepEvent]:
        """Run several methods side by side, round-robin, one step each in turn.

        Args:
            prompt_ids: ``(prompt_len,)`` token ids (see :meth:`encode_prompt`).
            specs: the methods to run (distinct names).
            settings: shared generation settings (every method gets the same seed).
            cancel: set it to stop every method before its next step.

        Yields:
            Each method's :class:`StepEvent` in turn until all have finished.

        Raises:
            ValueError: no method, duplicate methods, bad knobs, an unavailable method, an
                empty prompt, a token id outside the vocabulary, or a prompt that does not fit
                the context; raised before any step runs.
            TypeError: ``prompt_ids`` is not a sequence of integer ids (e.g. text).
        """
        if not specs:
            raise ValueError("choose at least one method")
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"each method can run once per comparison, got {names}")
        prompt_ids = self.check_prompt_ids(prompt_ids)
        ctx = self.target.context_length
        if len(prompt_ids) + settings.max_new_tokens > ctx:
            raise ValueError(f"the prompt is {len(prompt_ids)} tokens; with max_new_tokens={settings.max_new_tokens} "
                             f"it exceeds the model's context of {ctx} tokens")
        drafters = [self.make_drafter(s) for s in specs]  # every knob checked before the first step
        streams = [self._steps(prompt_ids, s.name, d, settings, cancel) for s, d in zip(specs, drafters)]
        while streams:
            for stream in list(streams):
                event = next(stream, None)
                if event is None:
                    streams.remove(stream)
                    continue
                yield event
                if event.finished:
                    streams.remove(stream)
