"""The method advisor (playground.advisor): one test per rule, its figures from assets/measurements.json,
EAGLE-3 among the loaded drafters and on a GPU, the deployment line (what the vLLM backend serves), and
the command that rewrites the figures file (playground.measure)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from playground import advisor, measure
from playground.engine import theory
from playground.engine.lookahead import LOOKAHEAD_PRESETS

ROOT = Path(__file__).resolve().parents[1]
MEASUREMENTS_FILE = ROOT / "assets" / "measurements.json"


# ----- the advisor: one test per rule -----------------------------------------------------------
def test_rule_no_draft_means_medusa():
    """No draft, training acceptable: Medusa heads, on a CPU first, on a GPU as EAGLE-3's comparison (this
    test asserted Medusa first on a GPU before the EAGLE-3 rule); without training neither."""
    adv = advisor.advise(advisor.Situation(7, None, willing_to_train=True, device="cpu"))
    assert adv.primary == "medusa" and "no_draft_medusa" in adv.rule_ids()
    assert adv.methods[0] == "autoregressive"
    adv = advisor.advise(advisor.Situation(7, None, willing_to_train=True))
    assert adv.methods == ["autoregressive", "eagle", "medusa"] and "no_draft_medusa" in adv.rule_ids()
    adv = advisor.advise(advisor.Situation(7, None, willing_to_train=False))
    assert not {"medusa", "eagle"} & set(adv.methods) and "no_draft_medusa" not in adv.rule_ids()


def test_rule_same_family_draft_and_size_rule():
    """70B -> 7B, 33B -> 7B, 13B -> 1B are inside the rule; a 2x smaller draft is not."""
    for target_b, draft_b in ((70, 7), (33, 7), (13, 1)):
        adv = advisor.advise(advisor.Situation(target_b, draft_b))
        assert adv.primary == "draft_model", (target_b, draft_b)
        assert "same_family_draft" in adv.rule_ids() and "draft_size" in adv.rule_ids()
        assert advisor.suggested_draft_size_b(target_b) == draft_b
        assert advisor.draft_ratio_ok(target_b, draft_b)
    # A ratio outside 5-10x that the rule's examples allow is not called "inside the 5-10x rule"
    # (Llama-2-70B with a 6.8 B draft: 10.3x).
    assert "inside the 5-10x rule" in dict(advisor.advise(advisor.Situation(60, 7)).reasons)["draft_size"]
    said = dict(advisor.advise(advisor.Situation(70, 6.8)).reasons)["draft_size"]
    assert "10.3x" in said and "inside" not in said and "70 B -> 7 B" in said, said
    assert not advisor.draft_ratio_ok(7, 3.5)
    adv = advisor.advise(advisor.Situation(7, 3.5))
    assert "too large" in dict(adv.reasons)["draft_size"]


def test_rule_target_too_small_means_medusa_or_lookahead():
    adv = advisor.advise(advisor.Situation(1.7, 0.36))
    assert adv.primary == "lookahead" and "target_too_small" in adv.rule_ids()
    adv = advisor.advise(advisor.Situation(0.135, None, willing_to_train=True, device="cpu"))
    assert adv.primary == "medusa" and "target_too_small" in adv.rule_ids()
    adv = advisor.advise(advisor.Situation(0.135, None, willing_to_train=True))  # a GPU: EAGLE-3, Medusa beside it
    assert adv.methods == ["autoregressive", "eagle", "medusa"] and "target_too_small" in adv.rule_ids()


def test_rule_zero_training_means_lookahead_or_prompt_lookup():
    adv = advisor.advise(advisor.Situation(7, None, willing_to_train=False))
    assert adv.primary == "lookahead" and "zero_training" in adv.rule_ids()
    assert "prompt_lookup" in adv.methods


@pytest.mark.parametrize("task", ["code", "summarization"])
def test_rule_copy_tasks_add_prompt_lookup(task):
    adv = advisor.advise(advisor.Situation(70, 7, task=task))
    assert "prompt_lookup" in adv.methods and "copy_tasks" in adv.rule_ids()
    adv = advisor.advise(advisor.Situation(7, None, task=task))  # zero training + copying: prompt lookup first
    assert adv.primary == "prompt_lookup"
    assert "copy_tasks" not in advisor.advise(advisor.Situation(70, 7, task="chat")).rule_ids()
    # A run that measured Lookahead fastest is not overruled by the copy rule (the page showed
    # "Recommended: Prompt lookup" beside the measurement's "Lookahead first").
    adv = advisor.advise(advisor.Situation(7, None, task=task, run_speedups={"lookahead": 1.3, "prompt_lookup": 1.1}))
    assert adv.primary == "lookahead" and "prompt_lookup" in adv.methods


@pytest.mark.parametrize("appetite,k", [("conservative", 2), ("default", 4), ("aggressive", 8)])
def test_rule_k_defaults(appetite, k):
    adv = advisor.advise(advisor.Situation(70, 7, appetite=appetite))
    assert adv.params["draft_model"] == {"k": k} and "k_defaults" in adv.rule_ids()


@pytest.mark.parametrize("size,w,n", [(7, 15, 5), (13, 10, 5), (33, 7, 5), (70, 7, 5)])
def test_rule_lookahead_size(size, w, n):
    la = advisor.lookahead_settings(size)
    assert (la["window"], la["ngram_size"], la["guess_set_size"]) == (w, n, w)
    adv = advisor.advise(advisor.Situation(size, None))
    assert adv.params["lookahead"]["window"] == w and "lookahead_size" in adv.rule_ids()


def test_medusa_advice_lists_no_knob_that_does_nothing():
    """Medusa is advised with exact acceptance (lossless), where the posterior threshold and alpha change
    nothing: they are neither set nor named in the reasons; the rule still explains them."""
    for s in (advisor.Situation(7, None, willing_to_train=True), advisor.Situation(0.135, None, medusa_loaded=True),
              advisor.Situation(0.135, 0.00747, device="cpu", draft_loaded=True, draft_k=2, medusa_loaded=True,
                                cpu_isa="avx2")):
        adv = advisor.advise(s)
        assert "medusa" in adv.methods
        assert not {"posterior_threshold", "posterior_alpha", "acceptance"} & set(adv.params.get("medusa", {}))
        assert "medusa_threshold" not in adv.rule_ids()
        assert not any("posterior" in text or "threshold" in text for _, text in adv.reasons)
    assert "stricter" in advisor.RULES["medusa_threshold"].guidance


def test_cpu_k_follows_the_verify_cost():
    """On a CPU, K is the appetite's K capped at the K that the verify cost makes fastest (the Theory
    tab's formula, theory.optimal_k), and the note says so; a flat cost (a GPU's) leaves the presets."""
    steep = theory.VerifyCost({1: 1.0, 2: 1.5, 3: 2.0, 5: 3.0, 9: 5.0}, source="measured on this device (test)", origin="forwards")
    adv = advisor.advise(advisor.Situation(70, 7, device="cpu", appetite="aggressive"), verify_cost=steep)
    k_best, _ = theory.optimal_k(advisor.ASSUMED_ALPHA["aggressive"], advisor.ASSUMED_DRAFT_COST, steep)
    assert adv.params["draft_model"] == {"k": min(8, k_best)} and k_best < 8
    assert any(f"K = {k_best} rather than the aggressive K = 8" in n for n in adv.measured_notes)
    flat = theory.VerifyCost({1: 1.0, 64: 1.0}, source="measured on this device (test)", origin="forwards")
    adv = advisor.advise(advisor.Situation(70, 7, device="cpu", appetite="aggressive"), verify_cost=flat)
    assert adv.params["draft_model"] == {"k": 8}


def test_loaded_draft_keeps_its_own_k_whatever_the_appetite():
    """A loaded draft with a measured K (the shipped draft's K = 2) keeps it for every appetite, so the
    advisor does not recommend K = 8 where the page's measurements say a small K (issue 20)."""
    for appetite in advisor.APPETITES:
        adv = advisor.advise(advisor.Situation(0.135, 0.00747, device="cpu", draft_loaded=True, draft_k=2,
                                               appetite=appetite, task="code"))
        assert adv.params["draft_model"] == {"k": 2}, appetite


def test_measurements_here_disagree_on_cpu():
    """On a CPU the advice says where our measurements disagree (the verify cost, small Lookahead window)."""
    adv = advisor.advise(advisor.Situation(70, 7, device="cpu"))
    assert "not on this device" in adv.measured_notes[0]
    adv = advisor.advise(advisor.Situation(7, None, device="cpu"))
    assert adv.params["lookahead"] == LOOKAHEAD_PRESETS["cpu"]
    assert any("121 tokens" in n for n in adv.measured_notes)
    assert not advisor.advise(advisor.Situation(70, 7, device="gpu")).measured_notes


def test_bad_situation_is_a_clear_error():
    with pytest.raises(ValueError, match="target size must be > 0 and at most 10000"):
        advisor.advise(advisor.Situation(0))
    with pytest.raises(ValueError, match="target size must be > 0"):
        advisor.advise(advisor.Situation(-5))
    with pytest.raises(ValueError, match="draft must be smaller"):
        advisor.advise(advisor.Situation(7, 13))
    with pytest.raises(ValueError, match="task must be one of"):
        advisor.advise(advisor.Situation(7, task="poetry"))
    for name in ("eagle_loaded", "draft_loaded", "medusa_loaded", "willing_to_train"):
        for bad in ("yes", 1, None):
            with pytest.raises(ValueError, match=f"{name} must be True or False, got {bad!r}"):
                advisor.advise(advisor.Situation(7, **{name: bad}))


def test_loaded_draft_wins_over_the_size_rules():
    """A target with a loaded draft of its tokenizer (the embedded default with its shipped distilled draft)
    gets the draft model with the draft's own K, not Lookahead, where no measured figure applies (CPU
    unknown); with Medusa heads loaded too, both are compared. Heads alone mean Medusa without training."""
    default = dict(target_b=0.135, draft_b=0.00747, device="cpu", draft_loaded=True, draft_k=2)
    adv = advisor.advise(advisor.Situation(**default))
    assert adv.primary == "draft_model" and "loaded_draft" in adv.rule_ids()
    assert "target_too_small" not in adv.rule_ids() and adv.params["draft_model"] == {"k": 2}
    adv = advisor.advise(advisor.Situation(**default, medusa_loaded=True))
    assert adv.primary == "draft_model" and adv.methods == ["autoregressive", "draft_model", "medusa"]
    adv = advisor.advise(advisor.Situation(0.135, None, medusa_loaded=True))
    assert adv.primary == "medusa" and "loaded_medusa" in adv.rule_ids()


def test_measured_figures_put_the_fastest_measured_method_first():
    """Issue 20: before a run, the advice for the embedded default on a measured CPU leads with the method
    the project measured fastest there (assets/measurements.json), not the draft; its note calls that
    method the fastest and lists the others fastest first; the loaded draft's K says where it comes from."""
    from playground.advisor_figures import MEASURED

    default = dict(target_b=0.135, draft_b=0.00747, device="cpu", draft_loaded=True, draft_k=2, medusa_loaded=True)
    for isa in ("avx512", "avx2"):
        figs = MEASURED[isa]
        best = max((m for m in figs if ":" not in m), key=lambda m: figs[m]["speedup"])  # at its defaults
        adv = advisor.advise(advisor.Situation(**default, cpu_isa=isa))
        assert adv.primary == best and "measured_figures" in adv.rule_ids(), isa
        assert {"draft_model", "medusa"} <= set(adv.methods)
        note = next(n for n in adv.measured_notes if n.startswith("This CPU has"))
        assert re.search(rf"measured fastest( at its defaults)? \({figs[best]['speedup']:.2f}x\)", note)
        listed = next(n for n in adv.measured_notes if n.startswith("Spec-Bench"))
        speeds = [float(x) for x in re.findall(r"(?<!against) (\d\.\d+)x", listed.split("fastest first: ")[1].split(". On")[0])]
        assert speeds == sorted(speeds, reverse=True)
        assert any("the one the project measured it with (before a run here" in t for _, t in adv.reasons)
    # Only what the loaded models can run: without the suffix and mixture methods, the next fastest leads.
    avail = tuple(m for m in advisor.METHODS if m not in ("suffix", "mixture"))
    adv = advisor.advise(advisor.Situation(**default, cpu_isa="avx512", available=avail))
    assert adv.primary == max((m for m in MEASURED["avx512"] if m in avail), key=lambda m: MEASURED["avx512"][m]["speedup"])


def test_a_run_beats_the_figures_and_every_runnable_method_counts():
    """After a run, the fastest method of that run leads (even one the rules did not pick), and the
    reason quotes the run's figures."""
    s = advisor.Situation(0.135, 0.00747, device="cpu", draft_loaded=True, draft_k=2, cpu_isa="avx512",
                          run_speedups={"draft_model": 0.8, "prompt_lookup": 1.3, "suffix": 1.1})
    adv = advisor.advise(s)
    assert adv.primary == "prompt_lookup" and "measured_run" in adv.rule_ids()
    assert any("1.30x the baseline, the fastest" in t for _, t in adv.reasons)


# ----- EAGLE-3 ---------------------------------------------------------------------------------
DEFAULT = dict(target_b=0.135, draft_b=0.00747, draft_loaded=True, draft_k=2)
"""The embedded default model with its shipped distilled draft loaded."""


def test_eagle_runs_only_with_its_head():
    """Without an explicit list of runnable methods, EAGLE-3 runs only with a head loaded (as the draft
    model and Medusa need theirs); an explicit list decides alone."""
    assert not advisor.Situation(7).can_run("eagle") and advisor.Situation(7, eagle_loaded=True).can_run("eagle")
    assert advisor.Situation(7, available=("eagle",)).can_run("eagle")
    assert not advisor.Situation(7, eagle_loaded=True, available=("medusa",)).can_run("eagle")


def test_rule_eagle_head_puts_eagle_first_on_a_gpu():
    """On a GPU a loaded EAGLE-3 head comes first, with the other loaded drafters as the comparison; with
    no head but training acceptable EAGLE-3 still comes first (Medusa, or an available same-family draft,
    beside it) and the advice carries the trainer's command; without training EAGLE-3 is not advised."""
    adv = advisor.advise(advisor.Situation(**DEFAULT, medusa_loaded=True, eagle_loaded=True))
    assert adv.primary == "eagle" and adv.rule_ids()[0] == "eagle_head"
    assert adv.methods == ["autoregressive", "eagle", "draft_model", "medusa"]
    assert {"loaded_draft", "loaded_medusa"} <= set(adv.rule_ids()) and adv.train_command is None
    adv = advisor.advise(advisor.Situation(7, eagle_loaded=True))
    assert adv.primary == "eagle" and adv.methods == ["autoregressive", "eagle"]
    adv = advisor.advise(advisor.Situation(7, None, willing_to_train=True))
    text = dict(adv.reasons)["eagle_head"]
    assert adv.primary == "eagle" and "trainer" in text and "published" in text
    assert adv.train_command == advisor.EAGLE_TRAIN_COMMAND and "playground.training.eagle" in adv.train_command
    adv = advisor.advise(advisor.Situation(70, 7, willing_to_train=True))
    assert adv.methods == ["autoregressive", "eagle", "draft_model"] and adv.params["draft_model"] == {"k": 4}
    for s in (advisor.Situation(70, 7), advisor.Situation(7),
              advisor.Situation(7, device="cpu", willing_to_train=True)):
        assert "eagle" not in advisor.advise(s).methods, s


def test_loaded_eagle_on_a_cpu_follows_the_measurements():
    """On a CPU a loaded EAGLE-3 head is compared with the loaded draft and Medusa heads; where the project
    measured it faster on a CPU like this one it comes first among them (rule loaded_eagle), and before a
    run the fastest measured method of all still decides (rule measured_figures: mixture 1.52x over
    EAGLE-3 1.42x on the AVX-512 machine when those figures were taken). With no figure for this CPU
    the draft keeps its place."""
    from playground.advisor_figures import MEASURED

    for isa in ("avx512", "avx2"):
        figs = MEASURED[isa]
        loaded = ("draft_model", "medusa", "eagle")
        fastest_loaded = max(loaded, key=lambda m: figs[m]["speedup"])
        best = max((m for m in figs if ":" not in m), key=lambda m: figs[m]["speedup"])  # the loaded can all run
        adv = advisor.advise(advisor.Situation(**DEFAULT, device="cpu", medusa_loaded=True, eagle_loaded=True,
                                               cpu_isa=isa))
        assert adv.primary == best and "measured_figures" in adv.rule_ids(), isa
        assert adv.methods[:3] == ["autoregressive", best, fastest_loaded] and set(loaded) <= set(adv.methods)
        assert fastest_loaded == "eagle" and "EAGLE-3 measured faster than" in dict(adv.reasons)["loaded_eagle"]
        # Without the methods that need nothing loaded, the loaded ones compete alone: EAGLE-3 first.
        adv = advisor.advise(advisor.Situation(**DEFAULT, device="cpu", eagle_loaded=True, cpu_isa=isa,
                                               available=("autoregressive", "draft_model", "eagle")))
        assert adv.primary == "eagle" and adv.methods == ["autoregressive", "eagle", "draft_model"]
    adv = advisor.advise(advisor.Situation(**DEFAULT, device="cpu", eagle_loaded=True))
    assert adv.primary == "draft_model" and adv.methods == ["autoregressive", "draft_model", "eagle"]
    assert dict(adv.reasons)["loaded_eagle"].endswith("compare with the draft")


def test_a_measured_mixture_variant_sets_the_members_when_they_can_run(monkeypatch):
    """Before a run on a CPU, where the project measured the mixture with EAGLE-3 as a member faster than
    the mixture at its defaults, the advice sets those members (rule measured_variant, both figures
    named, members in words) when an EAGLE-3 head is loaded, and leaves the default members otherwise;
    Apply sets the Members knob to them."""
    from playground.advisor_figures import MEASURED, fastest_variant
    from playground.engine import METHODS
    from playground.ui.advisor_tab import apply_values

    for isa in ("avx512", "avx2"):
        figs = MEASURED[isa]
        # Against the mixture at its defaults in the variant's own run (a newer run may hold the defaults alone).
        variants = [m for m in figs if m.startswith("mixture:") and figs[m]["speedup"] > figs[m]["base_speedup"]]
        assert variants, isa  # the measurements file holds the variant, faster there
        fig = figs[max(variants, key=lambda m: figs[m]["speedup"])]
        adv = advisor.advise(advisor.Situation(**DEFAULT, device="cpu", eagle_loaded=True, cpu_isa=isa))
        assert adv.primary == "mixture" and adv.params["mixture"] == fig["params"]
        text = dict(adv.reasons)["measured_variant"]
        assert f"{fig['speedup']:.2f}x against {fig['base_speedup']:.2f}x at its defaults in the same run" in text
        assert "EAGLE-3" in text
        assert "prompt_lookup" not in text and "prompt lookup" in text
        adv = advisor.advise(advisor.Situation(**DEFAULT, device="cpu", cpu_isa=isa))
        assert adv.primary == "mixture" and "mixture" not in adv.params
        assert fastest_variant(isa, "mixture", lambda m: m != "eagle") is None
    # Without REST (no datastore) among what can run, the variant is declined; a faster variant that sets no
    # members (or has no params) is not a variant of the members.
    avail = tuple(m for m in METHODS if m != "rest")
    adv = advisor.advise(advisor.Situation(**DEFAULT, device="cpu", eagle_loaded=True, cpu_isa="avx512", available=avail))
    assert adv.primary == "mixture" and "mixture" not in adv.params
    base = MEASURED["avx512"]["mixture"]
    monkeypatch.setitem(MEASURED["avx512"], "mixture:budget=off", {**base, "speedup": 9.0, "params": {"budget": "off"}})
    monkeypatch.setitem(MEASURED["avx512"], "mixture:odd", {k: v for k, v in base.items() if k != "params"} | {"speedup": 9.5})
    adv = advisor.advise(advisor.Situation(**DEFAULT, device="cpu", eagle_loaded=True, cpu_isa="avx512"))
    assert adv.params["mixture"] == {"members": "eagle,rest,suffix,prompt_lookup"}
    monkeypatch.undo()
    # A newer run's figure of the defaults above the variant's: the variant is not advised over it (it was,
    # at 1.54x beside a quoted 1.59x: compared with its own run's 1.46x only).
    monkeypatch.setitem(MEASURED["avx2"], "mixture", {**MEASURED["avx2"]["mixture"], "speedup": 9.0})
    assert fastest_variant("avx2", "mixture", lambda m: True) is None
    adv = advisor.advise(advisor.Situation(**DEFAULT, device="cpu", eagle_loaded=True, cpu_isa="avx2"))
    assert adv.primary == "mixture" and "mixture" not in adv.params
    monkeypatch.undo()
    # After a run on the page, that run decides: no variant from the file.
    adv = advisor.advise(advisor.Situation(**DEFAULT, device="cpu", eagle_loaded=True, cpu_isa="avx512",
                                           run_speedups={"mixture": 1.3, "eagle": 1.2}))
    assert adv.primary == "mixture" and "mixture" not in adv.params

    class Engine:
        def unavailable_reason(self, method):
            return None

    adv = advisor.advise(advisor.Situation(**DEFAULT, device="cpu", eagle_loaded=True, cpu_isa="avx512"))
    out = apply_values(Engine(), {"methods": adv.methods, "params": adv.params, "primary": adv.primary},
                       [("mixture", "members")])
    assert out[list(METHODS).index("mixture")] is True and out[len(METHODS)] == adv.params["mixture"]["members"]


# ----- deploying on vLLM -------------------------------------------------------------------------
@pytest.fixture
def vllm_serves(monkeypatch):
    """Make the vLLM backend serve exactly the given methods (its own reason for the others): the advisor
    asks ``unsupported_reason`` and must follow it, whatever the backend serves today."""
    from playground.backends.vllm import methods

    real = methods.unsupported_reason

    def serve(*served):
        monkeypatch.setattr(methods, "unsupported_reason",
                            lambda m: None if m in served else real(m) or f"not served in this test: {m}")
    return serve


def test_deploy_line_says_how_vllm_serves_eagle(vllm_serves):
    """EAGLE-3 first and served: the line names vLLM's eagle3 method and the head."""
    vllm_serves("autoregressive", "prompt_lookup", "draft_model", "eagle")
    adv = advisor.advise(advisor.Situation(7, eagle_loaded=True))
    assert adv.deploy_method == "eagle" and "vLLM's eagle3 method" in adv.deploy
    assert "the head loaded here" in adv.deploy
    adv = advisor.advise(advisor.Situation(7, willing_to_train=True))
    assert adv.deploy_method == "eagle" and "published" in adv.deploy


def test_deploy_line_names_the_fastest_served_method_when_the_first_is_not_served(vllm_serves):
    """Mixture first (measured fastest) but not served: the line gives the backend's reason and names the
    fastest measured method it serves (EAGLE-3 on the AVX-512 machine), with its figure; serving no EAGLE,
    the next fastest served one. Unmeasured advised methods come after measured ones, said to be
    unmeasured; a method measured at 1x or below is never named; none served: plain decoding."""
    from playground.advisor_figures import MEASURED
    from playground.backends.vllm import methods

    vllm_serves("autoregressive", "prompt_lookup", "draft_model", "eagle")
    s = advisor.Situation(**DEFAULT, device="cpu", medusa_loaded=True, eagle_loaded=True, cpu_isa="avx512")
    adv = advisor.advise(s)
    assert adv.primary == "mixture" and adv.deploy_method == "eagle"
    figs = MEASURED["avx512"]
    assert methods.unsupported_reason("mixture") in adv.deploy and "vLLM's eagle3 method" in adv.deploy
    eagle = figs["eagle"]
    assert f"the fastest it serves is EAGLE-3 ({eagle['speedup']:.2f}x on {eagle['machine']}" in adv.deploy
    vllm_serves("autoregressive", "prompt_lookup", "draft_model")
    adv = advisor.advise(s)
    served = [m for m in ("prompt_lookup", "draft_model") if figs[m]["speedup"] > 1.0]
    assert adv.deploy_method == max(served, key=lambda m: figs[m]["speedup"])
    assert methods.unsupported_reason("eagle") in advisor.advise(dataclasses.replace(s, available=(
        "autoregressive", "eagle", "draft_model"))).deploy
    adv = advisor.advise(advisor.Situation(7))  # Lookahead first, not served: prompt lookup, advised beside it
    assert adv.primary == "lookahead" and adv.deploy_method == "prompt_lookup" and "not measured here" in adv.deploy
    run = advisor.Situation(**DEFAULT, device="cpu", medusa_loaded=True, task="code",
                            run_speedups={"draft_model": 0.8, "medusa": 1.2})
    adv = advisor.advise(run)
    assert adv.primary == "medusa" and adv.deploy_method == "prompt_lookup"  # the draft ran slower than plain
    vllm_serves("autoregressive")
    adv = advisor.advise(run)
    assert adv.deploy_method is None and "without speculation" in adv.deploy


def test_the_advisor_imports_without_vllm_and_loads_no_model():
    """`playground.advisor` imports and advises (its deployment line included) with vLLM unimportable, and
    neither imports vLLM nor builds a model: the backend's method table is plain Python."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "class NoVLLM:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'vllm': raise ImportError('no vllm here')\n"
        "sys.meta_path.insert(0, NoVLLM())\n"
        "from playground import advisor\n"
        "adv = advisor.advise(advisor.Situation(7, eagle_loaded=True))\n"
        "assert adv.deploy and 'vllm' not in sys.modules\n"
        "import torch\n"
        "assert not any(isinstance(o, torch.nn.Module) for o in __import__('gc').get_objects())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]


def test_rule_guidance_reads_in_page_words():
    """The Advisor tab lists every rule's guidance: no rule id, method key, snake_case name or command line
    (the trainer's command is data, ``EAGLE_TRAIN_COMMAND``)."""
    snake = re.compile(r"\b[a-z0-9]+(?:_[a-z0-9]+)+\b")
    for rule in advisor.RULES.values():
        assert not snake.search(rule.guidance) and "python -m" not in rule.guidance, rule.id
        assert not re.search(r"(?<![\w-])--[a-z]", rule.guidance), rule.id
    assert "eagle3" in advisor.RULES["eagle_head"].guidance and "Li et al. 2025" in advisor.RULES["eagle_head"].source


def test_the_target_as_its_own_draft_is_no_draft_to_advise_on():
    """The Models tab's "the target itself" draft (a check of the machinery) left the Advisor tab
    in an error ("the draft must be smaller than the target"): it counts as no draft there; a
    smaller draft still counts, with its size and K."""
    from types import SimpleNamespace

    from playground.ui import advisor_tab

    sizes = {"target": 135_000_000, "draft": 135_000_000}
    engine = SimpleNamespace(draft=SimpleNamespace(knob_defaults={"k": 4}), medusa=None, eagle=None,
                             unavailable_reason=lambda m: None, target=SimpleNamespace(device="cpu"),
                             parameter_count=lambda part="target": sizes[part])
    assert advisor_tab.loaded_draft_b(engine) == advisor_tab.NO_DRAFT
    assert advisor_tab.loaded_models(engine) == (False, False, None, False)
    values = advisor_tab.situation_values(engine)
    assert values[:3] == (0.135, advisor_tab.NO_DRAFT, False)
    md, adv = advisor_tab.advise(engine, *values[:2], False, "chat", "default", "cpu", *values[2:4])
    assert "Cannot advise" not in md and adv["primary"]
    sizes["draft"] = 7_470_000
    assert advisor_tab.loaded_draft_b(engine) == 0.00747
    assert advisor_tab.loaded_models(engine) == (True, False, 4, False)


def test_the_loaded_here_boxes_clear_for_another_deployment():
    """Typing another target size or device clears the "loaded here" boxes (the advice kept "the loaded
    draft's own K", measured on the 135M default, for a 7B target's draft); typing the loaded target's
    size back on its device brings them back."""
    from types import SimpleNamespace

    from playground.ui import advisor_tab

    sizes = {"target": 135_000_000, "draft": 7_470_000}
    engine = SimpleNamespace(draft=SimpleNamespace(knob_defaults={"k": 2}), medusa=object(), eagle=object(),
                             unavailable_reason=lambda m: None, target=SimpleNamespace(device="cpu"),
                             parameter_count=lambda part="target": sizes[part])
    assert advisor_tab.loaded_here(engine, 0.135, "cpu") == (True, True, True)
    for size, device in ((7, "cpu"), (0.135, "gpu"), (None, "cpu"), ("", "cpu")):
        assert advisor_tab.loaded_here(engine, size, device) == (False, False, False), (size, device)
    engine.medusa = None
    assert advisor_tab.loaded_here(engine, "0.135", "cpu") == (True, False, True)


def test_advisor_tab_has_the_eagle_box_and_shows_the_deploy_line():
    """The tab reads a loaded EAGLE-3 head from the engine, passes the box last (a caller without it still
    works: not loaded), and shows the deployment line in page words (no snake_case, no backticks)."""
    import html
    from types import SimpleNamespace

    from playground.ui import advisor_tab

    engine = SimpleNamespace(draft=None, medusa=None, eagle=object(), unavailable_reason=lambda m: None,
                             target=SimpleNamespace(device="cpu"))
    assert advisor_tab.loaded_models(engine) == (False, False, None, True)
    md, adv = advisor_tab.advise(engine, 7, 0, False, "chat", "default", "gpu", False, False, True)
    assert adv["primary"] == "eagle" and "**On vLLM:**" in md
    md, adv = advisor_tab.advise(engine, 0.135, 0.00747, False, "chat", "default", "cpu", True, True)
    assert "eagle" not in adv["methods"] and "**On vLLM:**" in md  # the box left out: no head
    text = html.unescape(md)
    assert not re.search(r"\b[a-z0-9]+(?:_[a-z0-9]+)+\b", text) and "`" not in text, text
    assert advisor_tab.page_words("vLLM's draft_model method") == "vLLM's draft model method"


def test_cpu_notes_quote_the_measurements_file_and_name_the_machine():
    """The default model's notes quote the figures of assets/measurements.json, each with the machine it was
    measured on; nothing from another machine is called "measured here"; a measured verify cost of this
    device is quoted as such."""
    data = json.loads(MEASUREMENTS_FILE.read_text())
    adv = advisor.advise(advisor.Situation(0.135, 0.00747, device="cpu", draft_loaded=True, draft_k=2))
    notes = " ".join(adv.measured_notes)
    newest: set = set()  # (machine, method) of the figures quoted as the method's own
    for run in data["benchmarks"]:
        assert data["machines"][run["machine"]]["label"] in notes
        for method, fig in run["methods"].items():
            if (run["machine"], method) in newest:  # an older run keeps it for its variants: quoted beside them
                assert f"against {fig['speedup']:.2f}x at its defaults in the same run, {run['when']}" in notes, fig
                continue
            newest.add((run["machine"], method))
            assert f"{fig['speedup']:.2f}x (" in notes and f"τ {fig['tau']:.2f}" in notes, fig
    cost, _ = theory.fallback_record(data)  # the newest on a CPU like this one
    assert data["machines"][cost["machine"]]["label"] in adv.measured_notes[0]
    assert f"{cost['relative']['9']:.1f}x" in adv.measured_notes[0]
    assert theory.FALLBACK.table == {int(n): v for n, v in cost["relative"].items()}
    for s in (advisor.Situation(0.135, device="cpu"), advisor.Situation(7, device="cpu"),
              advisor.Situation(70, 7, device="cpu")):
        assert not any("Measured here" in n for n in advisor.advise(s).measured_notes)
    cost = theory.VerifyCost({1: 1.0, 9: 1.5, 17: 2.0}, {1: 0.05}, source="measured on this device (cpu)", origin="forwards")
    notes = advisor.advise(advisor.Situation(7, device="cpu"), verify_cost=cost).measured_notes
    assert "Measured on this device" in notes[0] and "1.50x" in notes[0]
    # the budget's step-cost curve: its fit reaches 65 queries, but the note quotes only what was timed
    table = {1: 1.0, 9: 1.3, 17: 1.6, 33: 2.2, 65: 3.4}
    cost = theory.VerifyCost(table, {1: 0.04, 9: 0.052, 17: 0.064, 33: 0.088},
                             source="timed steps, relative to plain steps", origin="steps")
    notes = advisor.advise(advisor.Situation(7, device="cpu"), verify_cost=cost).measured_notes
    assert "(the budget)" in notes[0] and "33 tokens 2.20x" in notes[0] and "65 tokens" not in notes[0]


def test_no_code_cites_readme():
    """Measured figures live in assets/measurements.json; no module under playground/ cites README (the
    question sets' attribution file, assets/bench/README.md, is a data file's licence, not a citation)."""
    hits = [str(p.relative_to(ROOT)) for p in (ROOT / "playground").rglob("*.py")
            if "README" in p.read_text().replace("assets/bench/README.md", "")]
    assert not hits, hits


def test_rule_sources_cite_real_sources():
    """No internal jargon ("the seed") in the rules or the advisor's documentation: each rule cites a paper
    or the project's own guidance or measurements."""
    import inspect

    for rule in advisor.RULES.values():
        assert "seed" not in rule.source.lower() and rule.source, rule.id
        assert re.search(r"et al\. 20\d\d|Saxena 2023|project", rule.source), rule.id
    assert "seed" not in inspect.getsource(advisor).lower()


def test_measure_command_stores_benchmark_figures(tmp_path):
    """`python -m playground.measure --bench` turns benchmark records into per-method figures (speedup as
    total tokens over total seconds against autoregressive, tau as tokens over steps, alpha as accepted
    over proposed, lossless by output_ids) and, run again, replaces this machine's figures of those methods."""
    rec = dict(question_id=1, category="writing", turn=0, params={}, temperature=0.0, dtype="float32",
               target="default")
    rows = [dict(rec, method="autoregressive", new_tokens=10, steps=10, wall_s=1.0, output_ids=[1, 2]),
            dict(rec, method="prompt_lookup", new_tokens=10, steps=5, wall_s=0.5, proposed=8, accepted=5,
                 output_ids=[1, 2])]
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    file = tmp_path / "measurements.json"
    file.write_text(MEASUREMENTS_FILE.read_text())
    before = len(json.loads(file.read_text())["benchmarks"])
    ident, _ = measure.this_machine()
    for _ in range(2):  # the second run replaces the first's record
        assert measure.main(["--bench", str(results), "--bench-command", "python -m playground.bench ...",
                             "--file", str(file)]) == 0
    data = json.loads(file.read_text())
    first = data["benchmarks"][0]
    assert first["machine"] == ident and ident in data["machines"]
    assert first["command"] == "python -m playground.bench ..."
    assert first["methods"] == {"prompt_lookup": {"speedup": 2.0, "tau": 2.0, "alpha": 0.625, "tokens_per_s": 20.0,
                                                  "lossless": True, "params": {}}}
    # An older record of this machine keeps prompt lookup only beside its variant (prompt_lookup:budget=off),
    # for a comparison within that run.
    mine = [r for r in data["benchmarks"] if r["machine"] == ident and "prompt_lookup" in r["methods"]
            and not any(m.startswith("prompt_lookup:") for m in r["methods"])]
    assert len(mine) == 1 and len(data["benchmarks"]) <= before + 1



def test_measure_speedup_reads_steady_steps_where_every_record_has_them():
    """Round-robin records carry ``steady_steps`` (time in the baseline's contemporaneous steps): the
    speedup is then tokens over those, so a slow spell that hit only the baseline does not count;
    tokens/s stay wall-clock figures. Records without them fall back to seconds."""
    rec = dict(question_id=1, category="writing", turn=0, params={}, output_ids=[1])
    rows = [dict(rec, method="autoregressive", new_tokens=64, steps=64, wall_s=4.0, steady_steps=64.0),
            dict(rec, method="suffix", new_tokens=64, steps=40, wall_s=1.0, steady_steps=48.0)]
    base_tps, methods = measure.benchmark_methods(rows)
    assert base_tps == 16.0 and methods["suffix"]["speedup"] == round(64 / 48, 3)
    assert methods["suffix"]["tokens_per_s"] == 64.0
    del rows[1]["steady_steps"]
    assert measure.benchmark_methods(rows)[1]["suffix"]["speedup"] == 4.0



def test_gpu_with_training_adds_eagle_beside_loaded_heads():
    """On a GPU, loaded Medusa heads come first, but with training acceptable EAGLE-3 is advised beside
    them (rule eagle_head), and the deployment line serves it, since vLLM lacks the playground's Medusa format."""
    a = advisor.advise(advisor.Situation(7, None, willing_to_train=True, medusa_loaded=True, device="gpu"))
    assert a.primary == "medusa" and "eagle" in a.methods and "eagle_head" in a.rule_ids()
    assert a.deploy_method == "eagle" and "eagle3" in a.deploy
    b = advisor.advise(advisor.Situation(7, None, willing_to_train=False, medusa_loaded=True, device="gpu"))
    assert "eagle" not in b.methods


def test_a_loaded_drafters_reason_does_not_repeat_itself():
    """Each reason line names its rule's title and source, not its guidance (listed under "The advisor's
    rules"): with Medusa heads loaded the Why list read "Medusa heads are loaded: Medusa heads for the
    target are loaded: no training is needed ...", and a task's reason repeated its rule word for word."""
    import html
    from types import SimpleNamespace

    from playground.ui import advisor_tab

    engine = SimpleNamespace(draft=None, medusa=object(), eagle=object(), unavailable_reason=lambda m: None,
                             target=SimpleNamespace(device="cpu"))
    md, _ = advisor_tab.advise(engine, 0.135, 0, False, "chat", "default", "cpu", False, True, True)
    text = html.unescape(md)
    for phrase in ("heads for the target are loaded", "head for the target is loaded"):
        assert text.count(phrase) <= 1, text
    md, _ = advisor_tab.advise(engine, 0.135, 0, False, "summarization", "default", "cpu", False, True, True)
    why = html.unescape(md).split("**Why**")[1].split("**What the measurements say**")[0]
    assert why.count("prompt lookup copies it almost for free") == 1, why
    assert "**Tasks that copy from the prompt**:" in why and "(Saxena 2023" in why


def test_the_verify_cost_before_a_measurement_is_from_a_cpu_like_this_one():
    """Until this device is measured, the advice, the Theory tab and the draft panel use the project's
    newest CPU verify cost on a machine with this CPU's vector instructions (an AVX2 CPU quoted an
    AVX-512 machine's 23-ms step, a third of its own), else the newest on any CPU."""
    data = {"machines": {"a": {"label": "A", "isa": "avx512"}, "b": {"label": "B", "isa": "avx2"}},
            "verify_cost": [{"machine": "g", "device": "cuda", "relative": {"1": 1.0}},
                            {"machine": "a", "relative": {"1": 1.0, "9": 1.2}},
                            {"machine": "b", "relative": {"1": 1.0, "9": 1.4}},
                            {"machine": "b", "relative": {"1": 1.0, "9": 1.9}}]}
    assert theory.fallback_record(data, "avx2") == (data["verify_cost"][2], data["machines"]["b"])
    assert theory.fallback_record(data, "avx512")[0] is data["verify_cost"][1]
    assert theory.fallback_record(data, "sve")[0] is data["verify_cost"][1]  # none like it: the newest CPU one
    assert theory.fallback_record({"machines": {}, "verify_cost": data["verify_cost"][:1]}, "avx2") is None
    real = measure.load()
    record, machine = theory.fallback_record(real)
    if advisor.cpu_isa() in {m.get("isa") for m in real["machines"].values()}:
        assert machine["isa"] == advisor.cpu_isa()
    assert theory.FALLBACK.table == {int(n): v for n, v in record["relative"].items()}


def test_the_methods_to_compare_include_the_next_fastest_measured():
    """The advice names the next fastest measured methods ("then EAGLE-3 1.45x, Suffix decoding 1.38x,
    Prompt lookup 1.36x"); the methods it ticks for comparison include them (it ticked the slower
    draft model and Medusa, and left out suffix decoding and prompt lookup); from a run on the page,
    only those that beat the baseline."""
    from playground.advisor_figures import fastest_measured

    for isa in ("avx2", "avx512"):
        s = advisor.Situation(**DEFAULT, device="cpu", cpu_isa=isa, medusa_loaded=True, eagle_loaded=True)
        adv = advisor.advise(s)
        figs = fastest_measured(isa, [m for m in advisor.METHODS if s.can_run(m)])
        assert adv.primary == figs[0][0]
        assert all(m in adv.methods for m, f in figs[1:4] if f["speedup"] > 1.0), (adv.methods, figs[:4])
    ran = {"suffix": 1.3, "eagle": 1.5, "prompt_lookup": 1.2, "recycling": 0.9, "rest": 0.95}
    adv = advisor.advise(advisor.Situation(**DEFAULT, device="cpu", cpu_isa="avx2", eagle_loaded=True,
                                           run_speedups=ran))
    assert adv.primary == "eagle" and {"suffix", "prompt_lookup"} <= set(adv.methods)
    assert "recycling" not in adv.methods and "rest" not in adv.methods
