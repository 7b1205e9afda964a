"""The method advisor: which method and settings suit a situation, and why.

The advisor (:func:`advise`) turns a :class:`Situation` into an :class:`Advice`: the methods to
tick, their knob values, the reasons and whether the first choice deploys on vLLM. Its rules are
data (:data:`RULES`, from :mod:`playground.advisor_rules`): each rule has an id, the guidance it
encodes and where the guidance comes from; every reason the advisor gives names the rule it
follows. The deployment line asks the vLLM backend what it serves (:mod:`playground.advisor_deploy`).
Where the project's own measurements disagree with a rule, the advice says so in ``measured_notes``,
naming the machine. Those figures are read from
``assets/measurements.json`` (:mod:`playground.measure`, which reruns them), never written here:
per-method Spec-Bench speedups by CPU instruction set, and the verify cost (this device's when
the page has measured it (Theory tab or the budget's timing), else the file's, ``theory.FALLBACK``).

On a CPU, K follows from the verify cost with the Theory tab's formula (``theory.optimal_k``), so
the advisor and the page agree. Knobs that do nothing in the mode advised (Medusa's posterior
threshold and alpha under exact acceptance) are not listed. This module imports no UI code and
loads no model at import time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from playground.engine import K_PRESETS, LOOKAHEAD_PRESETS, MAX_SPECULATIVE_TOKENS, theory
from playground.engine import AUTO_TREE, METHODS
from playground.advisor_figures import MEASURED, DraftMeasurement, measure_draft, measured_speedups  # noqa: F401
from playground.advisor_figures import describe_figure as _describe, fallback_verify_record, figure as _fig
from playground.advisor_figures import fastest_measured, fastest_variant
from playground.advisor_deploy import deployment, in_words
from playground.advisor_rules import (ASSUMED_ALPHA, ASSUMED_DRAFT_COST, COPY_TASKS, CPU_ISAS,  # noqa: F401
                                      DRAFT_RATIO_RANGE, DRAFT_SIZE_EXAMPLES_B, EAGLE_TRAIN_COMMAND, MAX_TARGET_B,
                                      MIN_TARGET_FOR_DRAFT_B, RULES, TASKS, Rule, loaded_choice, rules_choice)

APPETITES = tuple(K_PRESETS)


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
    return DRAFT_RATIO_RANGE[0] <= target_b / draft_b <= DRAFT_RATIO_RANGE[1]


def lookahead_settings(target_b: float, device: str = "gpu") -> dict[str, int]:
    """Lookahead (W, N, G) for a model size (rule ``lookahead_size``), as knob values.

    GPU: 7B and below (15, 5, 15), 13B (10, 5, 10), 33B and up (7, 5, 7). CPU: the small
    ``LOOKAHEAD_PRESETS["cpu"]`` setting (every extra query costs compute on a CPU).
    """
    if device == "cpu":
        return dict(LOOKAHEAD_PRESETS["cpu"])
    key = "33b" if target_b >= 30 else "13b" if target_b >= 10 else "7b"
    return dict(LOOKAHEAD_PRESETS[key])


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
        willing_to_train: whether training something (an EAGLE-3 head, Medusa heads) is acceptable.
        task: one of :data:`TASKS`.
        appetite: ``"conservative"``, ``"default"`` or ``"aggressive"`` (sets K).
        device: ``"gpu"`` or ``"cpu"``.
        draft_loaded: a draft sharing the target's tokenizer is loaded in this app (so the
            Playground tab can measure it), e.g. the distilled draft shipped for the embedded default.
        medusa_loaded: Medusa heads for the target are loaded in this app.
        draft_k: the K saved with the loaded draft (its ``draft_knobs.json``), or None.
        cpu_isa: on a CPU, ``"avx512"`` or ``"avx2"`` when known (see :func:`cpu_isa`), else None.
        draft_run: the loaded draft measured in a run on this page (:func:`measure_draft`, the draft
            panel's figures), or None: its suggested K then replaces the presets.
        run_speedups: method -> speedup over the baseline measured in that run (greedy), or None.
        available: see below.
        eagle_loaded: an EAGLE-3 head for the target is loaded in this app (the embedded default ships
            one, ``assets/eagle/default``). Last, so positional callers of the fields above still work.
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
    draft_run: DraftMeasurement | None = None
    run_speedups: dict[str, float] | None = None
    available: tuple[str, ...] | None = None
    """Methods the loaded models can run (None: every method, but the draft model only with
    ``draft_loaded``, Medusa only with ``medusa_loaded`` and EAGLE-3 only with ``eagle_loaded``)."""
    eagle_loaded: bool = False

    def can_run(self, method: str) -> bool:
        """Whether ``method`` can run with the loaded models (see :attr:`available`)."""
        if self.available is not None:
            return method in self.available
        return {"draft_model": self.draft_loaded, "medusa": self.medusa_loaded,
                "eagle": self.eagle_loaded}.get(method, method in METHODS)

    def check(self) -> None:
        """Raises ValueError naming a bad field and what is allowed (the yes/no fields must be bools)."""
        for name in ("willing_to_train", "draft_loaded", "medusa_loaded", "eagle_loaded"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
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


cpu_isa = theory.cpu_isa
"""``"avx512"`` or ``"avx2"`` for this CPU (None if neither or unknown): ``theory.cpu_isa``."""


@dataclass
class Advice:
    """The advisor's answer.

    Attributes:
        primary: the recommended method (a method name: ``eagle``, ``draft_model``, ``medusa``,
            ``lookahead``, ``prompt_lookup``, or whatever measured fastest).
        methods: methods to tick on the main tab, the baseline ``autoregressive`` first.
        params: method -> knob values to set.
        reasons: ``(rule id, text)`` pairs, in the order the rules applied.
        measured_notes: where measurements (this device's, or the measurements file's, naming the
            machine) disagree with a rule.
        deploy: whether the vLLM backend serves ``primary`` (vLLM's name for it), else why not and the
            fastest advised or measured method it serves (:func:`playground.advisor_deploy.deployment`).
        deploy_method: the method to serve on vLLM (``primary`` when served; None when none is).
        train_command: the command that trains what the advice needs when it advises EAGLE-3 with no
            head loaded (:data:`EAGLE_TRAIN_COMMAND`), else None. The page does not show command lines.
    """

    primary: str
    methods: list[str]
    params: dict[str, dict] = field(default_factory=dict)
    reasons: list[tuple[str, str]] = field(default_factory=list)
    measured_notes: list[str] = field(default_factory=list)
    deploy: str = ""
    deploy_method: str | None = None
    train_command: str | None = None

    def rule_ids(self) -> list[str]:
        return [r for r, _ in self.reasons]


def cpu_k(appetite: str, verify_cost) -> tuple[int, float]:
    """``(K, expected speedup)`` for ``appetite`` on a CPU: the appetite's K (``K_PRESETS``), capped at the
    K that ``verify_cost`` makes fastest for the appetite's :data:`ASSUMED_ALPHA` (``theory.optimal_k``,
    the Theory tab's formula)."""
    cost = verify_cost.monotone()
    best, _ = theory.optimal_k(ASSUMED_ALPHA[appetite], ASSUMED_DRAFT_COST, cost)
    k = min(K_PRESETS[appetite], best)
    return k, theory.expected_speedup(ASSUMED_ALPHA[appetite], k, ASSUMED_DRAFT_COST, cost)


def _verify_note(verify_cost) -> str:
    """The verify cost the advice is based on, where it was measured."""
    tail = ("where the rules assume a GPU on which it costs about 1x. So smaller K and smaller Lookahead "
            "windows win on a CPU.")
    if verify_cost is not theory.FALLBACK:  # measured here: the Theory tab's or the budget's curve (advise's contract)
        timed = [n for n in verify_cost.table if n <= max(verify_cost.seconds, default=0)]  # not the fit's extrapolation
        top = max(timed) if len(timed) > 1 else max(verify_cost.table)
        where = "the budget" if verify_cost.origin == theory.ORIGIN_STEPS else "Theory tab"
        return (f"Measured on this device ({where}): verifying 9 tokens costs {verify_cost(9):.2f}x and "
                f"{top} tokens {verify_cost(top):.2f}x one single-token forward, {tail}")
    found = fallback_verify_record()
    record, label = found if found else ({}, "another machine")
    ms = record.get("one_token_s")
    timing = (f" ({1000 * ms:.0f} / {1000 * ms * verify_cost(9):.0f} / {1000 * ms * verify_cost(64):.0f} ms)"
              if ms else "")
    return (f"Measured on {label} ({record.get('dtype', '?')}, {record.get('when', 'undated')}), not on this device "
            f"(open the Theory tab to measure it): verifying 9 tokens cost {verify_cost(9):.1f}x and 64 tokens "
            f"{verify_cost(64):.1f}x one single-token forward{timing}, {tail}")


def _spec_bench_notes(s: Situation, methods: list[str]) -> list[str]:
    """The measured Spec-Bench figures of the default model's methods, this CPU's instruction set first."""
    isas = sorted(MEASURED, key=lambda isa: (isa != s.cpu_isa, str(isa)))
    parts, lossless, setup = [], True, None
    names = {"draft_model": "the shipped distilled draft", "medusa": "Medusa with the shipped heads",
             "eagle": "EAGLE-3 with the head shipped at the time", "lookahead": "Lookahead", "prompt_lookup": "prompt lookup"}
    for isa in isas:
        figs = MEASURED[isa]
        if not figs:
            continue
        some = next(iter(figs.values()))
        setup = setup or some
        parts.append(f"On {some['machine']}, fastest first: " + ", ".join(
            f"{in_words(m, names)} {_describe(m, f)}" for m, f in sorted(figs.items(), key=lambda mf: -mf[1]["speedup"])))
        lossless &= all(f.get("lossless") for f in figs.values())
    if not parts:
        return []
    questions = str(setup["questions"]).replace("_", " ")  # category names in words (math reasoning)
    head = (f"Spec-Bench, the embedded default model, {questions}, greedy, {setup['dtype']}, "
            f"{setup['threads']} threads (the project's measurements)")
    notes = [f"{head}. " + ". ".join(parts) + "." + (" All lossless." if lossless else "")]
    figs = MEASURED.get(s.cpu_isa, {})
    if figs:
        # The fastest at its defaults, as the advice picks it (a variant, ``mixture:members=...``, is listed above).
        best = max(sorted(figs, key=lambda m: ":" in m), key=lambda m: (":" not in m, figs[m]["speedup"]))
        what = "AVX-512" if s.cpu_isa == "avx512" else "AVX2 but no AVX-512"
        shown = [m for m in methods if m in figs and m != best]
        tail = "".join(f"; {in_words(m, names)} {figs[m]['speedup']:.2f}x" for m in shown)
        defaults = " at its defaults" if any(m.startswith(best + ":") for m in figs) else ""
        notes.append(f"This CPU has {what}, like {figs[best]['machine']}, where {in_words(best, names)} measured "
                     f"fastest{defaults} ({figs[best]['speedup']:.2f}x){tail}.")
    return notes


def _cpu_notes(s: Situation, primary: str, methods: list[str], k: int | None, params: dict,
               verify_cost) -> list[str]:
    """Where measurements on a CPU disagree with the rules, each naming the machine it was measured on."""
    notes = [_verify_note(verify_cost)]
    if "draft_model" in methods and k is not None and k < K_PRESETS[s.appetite] and not s.draft_loaded:
        _, speedup = cpu_k(s.appetite, verify_cost)
        notes.append(f"On a CPU K = {k} rather than the {s.appetite} K = {K_PRESETS[s.appetite]}: with this verify "
                     f"cost, an acceptance rate of {ASSUMED_ALPHA[s.appetite]} and a draft costing "
                     f"{ASSUMED_DRAFT_COST} of a target forward, K = {k} is the fastest (expected {speedup:.2f}x; "
                     "the Theory tab draws the curves).")
    if "lookahead" in methods:
        gpu = lookahead_settings(max(s.target_b, 7.0), "gpu")
        n_gpu = theory.lookahead_tokens_per_pass(gpu["window"], gpu["ngram_size"], gpu["guess_set_size"])
        cpu = params["lookahead"]
        n_cpu = theory.lookahead_tokens_per_pass(cpu["window"], cpu["ngram_size"], cpu["guess_set_size"])
        cost = verify_cost.monotone()
        notes.append(f"Lookahead's GPU setting (W {gpu['window']}, N {gpu['ngram_size']}) puts {n_gpu} tokens "
                     f"in each forward pass, which at this verify cost costs about {cost(n_gpu):.1f} single-token "
                     f"forwards; the small setting ({n_cpu} tokens per pass, {cost(n_cpu):.2f}x) is used.")
    small = s.target_b <= 0.2
    if small:
        notes += _spec_bench_notes(s, methods)
    pl = _fig(s.cpu_isa, "prompt_lookup") or next((f["prompt_lookup"] for f in MEASURED.values()
                                                    if "prompt_lookup" in f), None)
    if not small and pl and (primary in ("lookahead", "prompt_lookup") or "prompt_lookup" in methods):
        notes.append(f"Measured on {pl['machine']} with the embedded default model: prompt lookup gave "
                     f"{_describe('prompt_lookup', pl)} on {str(pl['questions']).replace('_', ' ')}; it costs nothing to draft, so it "
                     "is the safe pick on a CPU.")
    return notes


def advise(s: Situation, verify_cost=None) -> Advice:
    """Recommend a method and its settings for situation ``s`` (rules: :data:`RULES`).

    Steps: 1. choose the primary method (a loaded draft, Medusa heads or EAGLE-3 head first, then
    EAGLE-3 on a GPU when training is acceptable, draft model / Medusa / Lookahead / prompt lookup;
    then what this page's run, or the project's figures, measured fastest; before a run, the mixture
    takes the members of its fastest measured variant when they are loaded); 2. add prompt lookup for
    copy-heavy tasks; 3. set K (the loaded draft's own K, else by appetite, on a CPU at most the verify
    cost's best K); 4. size Lookahead by the model; 5. Medusa keeps exact acceptance (no threshold
    knobs); 6. on a CPU, note where measurements disagree; 7. say whether the first choice deploys on
    vLLM, else the fastest advised or measured method that does (``Advice.deploy``).

    Args:
        s: the situation.
        verify_cost: this device's measured ``theory.VerifyCost`` (the Theory tab's), if any; else the
            measurements file's (``theory.FALLBACK``). On a CPU, K and the notes follow from it.

    Raises:
        ValueError: a bad :class:`Situation` field.
    """
    s.check()
    reasons: list[tuple[str, str]] = []
    params: dict[str, dict] = {}
    big_enough = s.target_b >= MIN_TARGET_FOR_DRAFT_B
    # 1. The primary method: what is loaded and measured here first, then the rules.
    primary, extra = loaded_choice(s, reasons)
    if primary is None:
        primary, extra = rules_choice(s, reasons)
    elif s.device == "gpu" and s.willing_to_train and "eagle" not in (primary, *extra):
        extra = [*extra, "eagle"]  # loaded drafters first, but on a GPU an EAGLE-3 head is worth training
        reasons.append(("eagle_head", "training is acceptable: on a GPU an EAGLE-3 head trained on the target (or a "
                                      "published one), the strongest published drafter, is worth comparing"))
    if s.draft_b is not None and big_enough and "draft_model" in (primary, *extra):
        ratio = s.target_b / s.draft_b
        if draft_ratio_ok(s.target_b, s.draft_b):
            lo, hi = DRAFT_RATIO_RANGE
            where = (f"inside the {lo:g}-{hi:g}x rule" if lo <= ratio <= hi else  # else one of the rule's examples
                     "as in the rule's examples (" + ", ".join(f"{t:g} B -> {d:g} B" for t, d in DRAFT_SIZE_EXAMPLES_B.items()) + ")")
            reasons.append(("draft_size", f"your draft is {ratio:.1f}x smaller than the target: {where}"))
        else:
            want = suggested_draft_size_b(s.target_b)
            side = "too large (slow to run)" if ratio < DRAFT_RATIO_RANGE[0] else "very small (rarely accepted)"
            reasons.append(("draft_size", f"your draft is {ratio:.1f}x smaller: {side}; the rule suggests about "
                                          f"{want:g} B for a {s.target_b:g} B target"))
    # 1b. Measurements beat the rules: this run's (any method the loaded models can run that beat the
    #     baseline), else, before a run, the project's figures for the embedded default on this CPU.
    ran = {m: x for m, x in (s.run_speedups or {}).items() if s.can_run(m)}
    figs = fastest_measured(s.cpu_isa, [m for m in METHODS if s.can_run(m)]) \
        if s.device == "cpu" and s.target_b <= 0.2 and not ran else []
    best = None
    if ran and max(ran.values()) > 1.0:
        best = max(ran, key=ran.get)
        if best != primary:
            others = ", ".join(f"{METHODS[m].label} {x:.2f}x" for m, x in sorted(ran.items(), key=lambda mx: -mx[1])
                               if m != best)
            reasons.append(("measured_run", f"in the last run on the Playground tab {METHODS[best].label} measured "
                                            f"{ran[best]:.2f}x the baseline, the fastest (then {others}): "
                                            f"{METHODS[best].label} first"))
    elif figs and figs[0][1]["speedup"] > 1.0:
        best, top = figs[0]
        if best != primary:
            others = ", ".join(f"{METHODS[m].label} {f['speedup']:.2f}x" for m, f in figs[1:4])
            reasons.append(("measured_figures", f"on {top['machine']} (Spec-Bench, the project's measurements) "
                                                f"{METHODS[best].label} measured fastest, {top['speedup']:.2f}x the "
                                                f"baseline (then {others}): {METHODS[best].label} first; a run on the "
                                                "Playground tab measures this device"))
    if best is not None and best != primary:
        extra = [primary] + [m for m in extra if m != best]
        primary = best
    if best is not None:  # the next fastest measured, which the reason names, are worth comparing too
        runners = [m for m, f in figs[1:4] if f["speedup"] > 1.0] if figs else \
            [m for m in sorted(ran, key=ran.get, reverse=True)[1:4] if ran[m] > 1.0]
        extra += [m for m in runners if m not in (primary, *extra)]
    if figs and primary == "mixture":  # a measured variant (EAGLE-3 as a member) beats its defaults
        fig = fastest_variant(s.cpu_isa, "mixture", s.can_run)
        if fig is not None:
            params["mixture"] = {"members": fig["params"]["members"]}
            members = ", ".join(in_words(m) for m in params["mixture"]["members"].split(","))
            reasons.append(("measured_variant", f"on {fig['machine']} the mixture of {members} measured "
                                                f"{fig['speedup']:.2f}x against {fig['base_speedup']:.2f}x "
                                                "at its defaults in the same run: those members"))
    methods = ["autoregressive", primary, *extra]
    # 2. Copy-heavy tasks.
    if s.task in COPY_TASKS:
        reasons.append(("copy_tasks", f"{s.task} repeats the prompt: prompt lookup copies it almost for free"))
        methods.append("prompt_lookup")
        if primary == "lookahead" and not s.willing_to_train and best is None:
            # the cheaper of the two zero-training methods fits a copy task best (a measurement that
            # put Lookahead first is not overruled)
            primary = "prompt_lookup"
    elif primary == "lookahead":
        methods.append("prompt_lookup")  # the other zero-training method, for comparison
    # 3. K: the loaded draft's own (measured) K, else by appetite, capped on a CPU by the verify cost.
    cost = theory.FALLBACK if verify_cost is None else verify_cost
    k = None
    if "draft_model" in methods:
        if s.draft_loaded and s.draft_run is not None:  # the draft panel's K, from the same function
            sug = s.draft_run.suggestion
            k = sug.k
            reasons.append(("k_defaults", f"K = {k}, the draft panel's suggestion from this run (measured "
                                          f"α {100 * s.draft_run.alpha:.0f}%, draft cost {s.draft_run.c:.3f} of a "
                                          f"target forward: expected {sug.speedup:.2f}x); the appetite presets "
                                          "are for drafts not measured here"))
        elif s.draft_loaded and s.draft_k is not None:
            k = s.draft_k
            reasons.append(("k_defaults", f"K = {k}, the loaded draft's own setting, the one the project measured "
                                          "it with (before a run here; after a run on the Playground tab, K "
                                          "follows that run; the appetite presets are for drafts without one)"))
        elif s.device == "cpu":
            k, _ = cpu_k(s.appetite, cost)
            reasons.append(("k_defaults", f"K = {k} ({s.appetite}, capped by this CPU's verify cost)"
                            if k < K_PRESETS[s.appetite] else f"K = {k} ({s.appetite})"))
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
    # 5. Medusa keeps exact acceptance (lossless): its posterior threshold and alpha would change nothing,
    #    so they are not listed (rule medusa_threshold explains them for typical acceptance). Its tree: with
    #    heads loaded here, the one fitted to this device's verify cost and the heads' accuracy.
    if "medusa" in methods and s.medusa_loaded:
        params["medusa"] = {"tree_choices": AUTO_TREE}
        reasons.append(("medusa_tree", "Medusa's tree: auto, the tree fitted to this device's measured verify cost "
                                       "and the loaded heads' accuracy"))
    # 6. Where the measurements disagree.
    notes = _cpu_notes(s, primary, methods, k, params, cost) if s.device == "cpu" else []
    # 7. Deployment on vLLM: the first choice if the vLLM backend serves it, else the fastest it serves.
    methods = list(dict.fromkeys(methods))
    speeds = ({m: (x, "in the last run on the Playground tab") for m, x in ran.items()} if ran else
              {m: (f["speedup"], f"on {f['machine']}, the project's measurements") for m, f in figs})
    deploy, deploy_method = deployment(primary, methods, speeds, s.eagle_loaded)
    train = EAGLE_TRAIN_COMMAND if "eagle" in methods and not s.eagle_loaded else None
    return Advice(primary, methods, params, reasons, notes, deploy, deploy_method, train)
