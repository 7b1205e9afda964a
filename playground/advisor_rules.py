"""The method advisor's rules, as data: each rule's id, the guidance it encodes and its source.

:mod:`playground.advisor` applies them (``advise``) and re-exports everything here; every reason it
gives names the rule it follows. The guidance is shown on the Advisor tab, so it says things in the
page's words: no rule ids, method keys or command lines (:data:`EAGLE_TRAIN_COMMAND` is the command,
for programs and the docs). Step 1 of the advice, the first choice by the rules, is here too
(:func:`loaded_choice`, :func:`rules_choice`). This module imports no UI code and loads no model.
"""

from __future__ import annotations

from dataclasses import dataclass

from playground.advisor_figures import figure
from playground.engine import METHODS


@dataclass(frozen=True)
class Rule:
    """One piece of guidance: ``id`` (named in reasons), the guidance, and its source."""

    id: str
    guidance: str
    source: str


RULES: dict[str, Rule] = {r.id: r for r in (
    Rule("eagle_head", "On a GPU, EAGLE-3 comes first when a head for the target is loaded or training one is "
         "acceptable: a one-layer head reads the target's own low, middle and high features and drafts a tree. "
         "It is the strongest published drafter: Li et al. 2025 report up to 6.5x over plain decoding, about "
         "1.4x EAGLE-2's speedup, ahead of Medusa and the other drafters they compare. Published EAGLE-3 heads "
         "exist for common targets; the project's EAGLE trainer trains one for any Llama-architecture target "
         "(the EAGLE documentation gives the command). vLLM serves EAGLE-3 heads (its eagle3 method). Medusa "
         "heads stay as the comparison.",
         "Li et al. 2025 (EAGLE-3); Li et al. 2024 (EAGLE-2's dynamic tree)"),
    Rule("no_draft_medusa", "A new deployment with no draft model, willing to train: Medusa heads trained on the "
         "target verify their tree of guesses in one pass. On a GPU EAGLE-3 comes first and Medusa is the "
         "comparison; without training neither is advised (Lookahead or prompt lookup instead).",
         "Cai et al. 2024 (Medusa)"),
    Rule("same_family_draft", "A smaller model of the same family (same tokenizer) is available: use draft-model "
         "speculative decoding.", "Leviathan et al. 2023; Chen et al. 2023"),
    Rule("draft_size", "Pick a draft 5-10x smaller than the target: 70B -> 7B, 33B -> 7B, 13B -> 1B. A bigger "
         "draft costs too much per token; a much smaller one is rarely accepted.",
         "Leviathan et al. 2023 and Chen et al. 2023 (their pairings); project guidance for the exact ratios"),
    Rule("target_too_small", "A target too small for a 5-10x smaller draft to exist or to pay off: use a trained "
         "head (EAGLE-3 on a GPU, else Medusa) or Lookahead instead of a draft model, unless a draft made for "
         "this target is loaded.", "project guidance"),
    Rule("zero_training", "No training wanted and no draft: Lookahead decoding or prompt lookup; both are "
         "lossless and need nothing but the target.", "Fu et al. 2024; Saxena 2023"),
    Rule("copy_tasks", "Code editing, summarisation, RAG and extraction repeat text from the prompt: prompt lookup "
         "copies it almost for free.", "Saxena 2023; Spec-Bench (Xia et al. 2024)"),
    Rule("k_defaults", "K (tokens drafted per step): 2 conservative, 4 default, 8 aggressive; on a CPU at most the "
         "K that the verify cost makes fastest (Theory tab); a loaded draft that carries its own measured K uses "
         "that K.", "Leviathan et al. 2023 (optimal K); project guidance"),
    Rule("loaded_draft", "Use draft-model speculative decoding with the draft's own K (the embedded default ships a "
         "draft distilled for it, sharing its tokenizer): it was measured on this target, so the measurement beats "
         "the size rules and the appetite presets.",
         "Leviathan et al. 2023; Chen et al. 2023; project measurements"),
    Rule("loaded_medusa", "No training is needed: compare Medusa with the other loaded drafters on the Playground "
         "tab. Where the project measured them on a CPU like this one, the faster comes first.",
         "Cai et al. 2024 (Medusa); project measurements"),
    Rule("loaded_eagle", "No training is needed (the embedded default ships a head): compare EAGLE-3 with the "
         "other loaded drafters on the Playground tab. Where the project measured them on a CPU like this one, "
         "the fastest of the loaded ones comes first; on a GPU EAGLE-3 does.", "Li et al. 2025 (EAGLE-3); project measurements"),
    Rule("lookahead_size", "Lookahead window W and n-gram size N by model size: 7B (15, 5), 13B (10, 5), 33B and up "
         "(7, 5), with guess set size G = W.", "Fu et al. 2024, their GPU settings"),
    Rule("medusa_threshold", "Medusa's posterior threshold (epsilon) and alpha matter only with typical acceptance, "
         "which keeps a head's token when the target gives it probability above min(epsilon, alpha * "
         "exp(-entropy)). Higher = stricter (closer to the target's greedy output, fewer tokens accepted); lower = "
         "more tokens per step but output drifts further from greedy. Medusa's defaults are epsilon 0.09, alpha "
         "0.3. The advisor keeps exact acceptance (lossless), where they change nothing.",
         "Cai et al. 2024, section 2.3.1"),
    Rule("medusa_tree", "Medusa's candidate tree: on a GPU a large tree verifies almost for free; where verifying "
         "more tokens costs more (CPUs), a tree sized by this device's measured verify cost and the heads' "
         "accuracy.", "Cai et al. 2024 (tree attention); project measurements"),
    Rule("measured_run", "What the Playground tab measured on this device beats the rules and the project's "
         "figures: of the methods the loaded models can run, the one that ran fastest against the baseline "
         "comes first.", "project measurements"),
    Rule("measured_figures", "Before a run on this page, for the embedded default model on a CPU like one the "
         "project measured (Spec-Bench), the method that measured fastest there comes first.",
         "project measurements"),
    Rule("measured_variant", "Before a run on this page, where the project also measured a method with other "
         "settings (the mixture with an EAGLE-3 head among its members) and those ran faster than its defaults "
         "on a CPU like this one, the advice sets them, when the loaded models can run every member.",
         "project measurements"),
)}
"""The advisor's rules, by id."""

EAGLE_TRAIN_COMMAND = ("python -m playground.training.eagle --target MODEL --data DATA --out DIR --device cuda")
"""The command that trains an EAGLE-3 head for a Llama-architecture target (docs/eagle.md); the advice
carries it (``Advice.train_command``) when it advises EAGLE-3 without a loaded head."""

DRAFT_RATIO_RANGE = (5.0, 10.0)
"""A good draft is this many times smaller than the target (rule ``draft_size``)."""
DRAFT_SIZE_EXAMPLES_B = {70.0: 7.0, 33.0: 7.0, 13.0: 1.0}
"""Target size -> the draft size of the classic pairings, e.g. Llama-2-70B with Llama-2-7B (billions of parameters)."""
MIN_TARGET_FOR_DRAFT_B = 3.0
"""Below this target size (billions) the advisor prefers a trained head or Lookahead (rule ``target_too_small``):
a 5x smaller draft would have under 0.6 B parameters, where fixed per-call overheads dominate."""
COPY_TASKS = ("code", "summarization", "rag", "extraction")
"""Task types where the answer repeats the prompt (rule ``copy_tasks``)."""
TASKS = ("chat", "code", "summarization", "rag", "extraction", "translation", "math")
ASSUMED_ALPHA = {"conservative": 0.6, "default": 0.7, "aggressive": 0.8}
"""On a CPU without a measured draft, the acceptance rate each appetite bets on when K is capped by the
verify cost (with draft cost :data:`ASSUMED_DRAFT_COST`)."""
ASSUMED_DRAFT_COST = 0.05
"""A same-family draft 5-10x smaller costs about this fraction of a target forward per drafted token."""
MAX_TARGET_B = 10_000.0
"""The largest target size (billions of parameters) the advisor accepts; sizes must also be > 0."""
CPU_ISAS = ("avx512", "avx2")
"""CPU instruction sets the project's measurements distinguish (``isa`` of a machine in the measurements file)."""


_LOADED = (("draft_model", "draft_loaded", "loaded_draft", "the draft"), ("medusa", "medusa_loaded", "loaded_medusa",
           "Medusa"), ("eagle", "eagle_loaded", "loaded_eagle", "EAGLE-3"))
"""The trained drafters that may be loaded here: (method, Situation flag, rule id, name in a reason)."""
_LOADED_TEXT = {
    "draft_model": ("a draft with the target's tokenizer is loaded: draft-model speculative decoding",
                    "a draft with the target's tokenizer is loaded too"),
    "medusa": ("Medusa heads for the target are loaded: Medusa, with no training needed",
               "Medusa heads are loaded too"),
    "eagle": ("an EAGLE-3 head for the target is loaded: EAGLE-3, with no training needed",
              "an EAGLE-3 head is loaded too")}
"""Per loaded drafter: the reason when it comes first, and when another does."""


def loaded_choice(s, reasons: list) -> tuple[str | None, list[str]]:
    """``(primary, the other loaded drafters to compare)`` among the loaded trained drafters, or ``(None, [])``;
    appends its ``(rule id, text)`` reasons to ``reasons``. ``s``: a :class:`playground.advisor.Situation`.

    1. On a GPU a loaded EAGLE-3 head comes first (rule ``eagle_head``); else the first loaded of the
       draft, Medusa, EAGLE-3 (the draft was measured on this target with its own K).
    2. Each other loaded one is compared with it; on a CPU, one that the project measured faster on a CPU
       like this one (the measurements file's figures) takes its place (rules ``loaded_*``).
    """
    loaded = [(m, rule, name) for m, flag, rule, name in _LOADED if getattr(s, flag)]
    if not loaded:
        return None, []
    names = {m: name for m, _, name in loaded}
    if s.device == "gpu" and s.eagle_loaded:
        first = "eagle"
        reasons.append(("eagle_head", "an EAGLE-3 head for the target is loaded: on a GPU EAGLE-3 first, the "
                                      "strongest published drafter"))
    else:
        first = loaded[0][0]
        reasons.append((loaded[0][1], _LOADED_TEXT[first][0]))
    primary = first
    for m, rule, name in loaded:
        if m == first:
            continue
        mine, lead = (figure(s.cpu_isa, m), figure(s.cpu_isa, primary)) if s.device == "cpu" else (None, None)
        if mine and lead and mine["speedup"] > lead["speedup"]:
            reasons.append((rule, f"{_LOADED_TEXT[m][1]}, and on {mine['machine']} {name} measured faster than "
                                  f"{names[primary]} ({mine['speedup']:.2f}x against {lead['speedup']:.2f}x): {name}"))
            primary = m
        else:
            reasons.append((rule, f"{_LOADED_TEXT[m][1]}: compare with {names[primary]}"))
    return primary, [m for m, _, _ in loaded if m != primary]


def rules_choice(s, reasons: list) -> tuple[str, list[str]]:
    """``(primary, methods to compare)`` by the rules, with nothing trained loaded: on a GPU with training
    acceptable EAGLE-3 (``eagle_head``) with the draft or Medusa as the comparison; else a same-family
    draft, then Medusa or Lookahead by size and appetite for training. Appends its reasons to ``reasons``;
    ``s``: a :class:`playground.advisor.Situation`."""
    big_enough = s.target_b >= MIN_TARGET_FOR_DRAFT_B
    if s.willing_to_train and s.device == "gpu":
        reasons.append(("eagle_head", "on a GPU with training acceptable, EAGLE-3 first: train a head on the target "
                                      "with the project's EAGLE trainer (the EAGLE documentation gives the command) "
                                      "or take a published EAGLE-3 head for it"))
        if s.draft_b is not None and big_enough:
            reasons.append(("same_family_draft", f"a same-family {s.draft_b:g} B model is available: compare "
                                                 "draft-model speculative decoding with EAGLE-3"))
            return "eagle", ["draft_model"]
        reasons.append(("target_too_small", f"a {s.target_b:g} B target is below {MIN_TARGET_FOR_DRAFT_B:g} B: "
                                            "trained heads instead of a draft model; Medusa heads as the comparison")
                       if not big_enough else
                       ("no_draft_medusa", "no draft model: Medusa heads, the other head trained on the target, as "
                                           "the comparison"))
        return "eagle", ["medusa"]
    if s.draft_b is not None and big_enough:
        reasons.append(("same_family_draft", f"a same-family {s.draft_b:g} B model is available: draft-model "
                                             "speculative decoding"))
        return "draft_model", []
    if not big_enough:
        primary = "medusa" if s.willing_to_train else "lookahead"
        reasons.append(("target_too_small", f"a {s.target_b:g} B target is below {MIN_TARGET_FOR_DRAFT_B:g} B "
                                            f"and no draft made for it is loaded: {METHODS[primary].label} instead "
                                            "of a draft model"))
        return primary, []
    if s.willing_to_train:
        reasons.append(("no_draft_medusa", "no draft model: train Medusa heads on the target"))
        return "medusa", []
    reasons.append(("zero_training", "no draft and no training: Lookahead decoding (or prompt lookup)"))
    return "lookahead", []
