"""The method advisor (playground.advisor): one test per rule, its figures from assets/measurements.json,
and the command that rewrites that file (playground.measure)."""

from __future__ import annotations

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
    adv = advisor.advise(advisor.Situation(7, None, willing_to_train=True))
    assert adv.primary == "medusa" and "no_draft_medusa" in adv.rule_ids()
    assert adv.methods[0] == "autoregressive"


def test_rule_same_family_draft_and_size_rule():
    """70B -> 7B, 33B -> 7B, 13B -> 1B are inside the rule; a 2x smaller draft is not."""
    for target_b, draft_b in ((70, 7), (33, 7), (13, 1)):
        adv = advisor.advise(advisor.Situation(target_b, draft_b))
        assert adv.primary == "draft_model", (target_b, draft_b)
        assert "same_family_draft" in adv.rule_ids() and "draft_size" in adv.rule_ids()
        assert advisor.suggested_draft_size_b(target_b) == draft_b
        assert advisor.draft_ratio_ok(target_b, draft_b)
    assert not advisor.draft_ratio_ok(7, 3.5)
    adv = advisor.advise(advisor.Situation(7, 3.5))
    assert "too large" in dict(adv.reasons)["draft_size"]


def test_rule_target_too_small_means_medusa_or_lookahead():
    adv = advisor.advise(advisor.Situation(1.7, 0.36))
    assert adv.primary == "lookahead" and "target_too_small" in adv.rule_ids()
    adv = advisor.advise(advisor.Situation(0.135, None, willing_to_train=True))
    assert adv.primary == "medusa" and "target_too_small" in adv.rule_ids()


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
        assert f"measured fastest ({figs[best]['speedup']:.2f}x)" in note
        listed = next(n for n in adv.measured_notes if n.startswith("Spec-Bench"))
        speeds = [float(x) for x in re.findall(r" (\d\.\d+)x", listed.split("fastest first: ")[1].split(". On")[0])]
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


def test_cpu_notes_quote_the_measurements_file_and_name_the_machine():
    """The default model's notes quote the figures of assets/measurements.json, each with the machine it was
    measured on; nothing from another machine is called "measured here"; a measured verify cost of this
    device is quoted as such."""
    data = json.loads(MEASUREMENTS_FILE.read_text())
    adv = advisor.advise(advisor.Situation(0.135, 0.00747, device="cpu", draft_loaded=True, draft_k=2))
    notes = " ".join(adv.measured_notes)
    for run in data["benchmarks"]:
        assert data["machines"][run["machine"]]["label"] in notes
        for fig in run["methods"].values():
            assert f"{fig['speedup']:.2f}x (" in notes and f"τ {fig['tau']:.2f}" in notes, fig
    cost = data["verify_cost"][0]
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
    mine = [r for r in data["benchmarks"] if r["machine"] == ident and "prompt_lookup" in r["methods"]]
    assert len(mine) == 1 and len(data["benchmarks"]) <= before + 1

