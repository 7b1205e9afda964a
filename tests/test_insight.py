"""Insight views: theory formulas, the advisor's rules, presets, the Benchmark tab against the CLI,
CSV/JSONL export, and the ZeroGPU path (a stand-in ``spaces`` module that forks like ZeroGPU).

Formula tests compare with values computed by hand (shown in each test). Model tests use the
embedded default model with a few new tokens only and assert on tokens and counts, never on timings.
"""

from __future__ import annotations

import html
import multiprocessing
import pickle
import re
import sys
import types
from pathlib import Path

import pytest

from playground import advisor, bench, presets
from playground.engine import theory
from playground.engine import LOOKAHEAD_PRESETS

sys.path.insert(0, str(Path(__file__).resolve().parent))


# ----- theory: hand-computed values ----------------------------------------------------------
def test_expected_tokens_per_step_hand_values():
    """(1 - a^(K+1)) / (1 - a): a = 0.8, K = 4 -> (1 - 0.32768) / 0.2 = 3.3616; a = 1 -> K + 1;
    a = 0 -> 1; K = 0 -> 1; a = 0.5, K = 1 -> 1.5."""
    assert theory.expected_tokens_per_step(0.8, 4) == pytest.approx(3.3616)
    assert theory.expected_tokens_per_step(1.0, 4) == 5.0
    assert theory.expected_tokens_per_step(0.0, 7) == 1.0
    assert theory.expected_tokens_per_step(0.6, 0) == 1.0
    assert theory.expected_tokens_per_step(0.5, 1) == pytest.approx(1.5)
    # Continuous at alpha -> 1.
    assert theory.expected_tokens_per_step(0.999999, 4) == pytest.approx(5.0, rel=1e-5)


def test_expected_speedup_hand_values():
    """Paper's form (verify cost 1): 3.3616 / (4 * 0.05 + 1) = 2.80133. With the table {1: 1, 8: 2}
    verify_cost(5) = 1 + 4/7 = 1.571429 (linear), so 3.3616 / (0.2 + 1.571429) = 1.897677."""
    assert theory.expected_speedup(0.8, 4, 0.05) == pytest.approx(3.3616 / 1.2)
    table = theory.VerifyCost({1: 1.0, 8: 2.0})
    assert table(5) == pytest.approx(1 + 4 / 7)
    assert table(1) == 1.0 and table(8) == 2.0
    assert table(15) == pytest.approx(3.0)  # extrapolated along the last segment
    assert theory.expected_speedup(0.8, 4, 0.05, table) == pytest.approx(3.3616 / (0.2 + 1 + 4 / 7))
    assert theory.expected_speedup(0.8, 4, 0.05, {1: 1.0, 8: 2.0}) == pytest.approx(1.897677, abs=1e-6)
    assert theory.step_cost(3, 0.1, lambda n: 2.0) == pytest.approx(2.3)
    assert theory.expected_speedup(0.3, 0, 0.5) == 1.0


def test_verify_cost_made_monotone():
    """A dip in a measured table (4 tokens cheaper than 1 and 2, 16 cheaper than 8) is pooled with its
    neighbours (isotonic regression; 2 and 8, each above both neighbours, are first capped at the larger), so
    the fit is non-decreasing and never below the unit; a monotone table is left as it is."""
    measured = theory.VerifyCost({1: 1.0, 2: 1.2, 4: 0.94, 8: 1.3, 16: 1.25}, {1: 0.064}, source="probe")
    fixed = measured.monotone()
    costs = [fixed.table[n] for n in sorted(fixed.table)]
    assert costs == sorted(costs) and costs[0] == 1.0
    assert fixed.table[2] == fixed.table[4] == 1.0 and fixed.table[8] == fixed.table[16] == 1.25
    assert fixed.seconds == {1: 0.064} and "non-decreasing" in fixed.source
    assert dict(theory.VerifyCost({1: 1.0, 8: 2.0}).monotone().table) == {1: 1.0, 8: 2.0}
    assert theory.isotonic([1, 3, 2, 4]) == [1, 2.5, 2.5, 4]


def test_one_outlier_cannot_lift_the_verify_cost_curve():
    """Issue 20: one noisy sample (2 tokens timed 2.58 between 1.0 and 1.25) lifted every later point to
    2.58 with a running maximum; the robust fit caps it at its neighbours and leaves the rest as timed."""
    raw = theory.VerifyCost({1: 1.0, 2: 2.58, 3: 1.25, 5: 1.4, 9: 1.8, 17: 2.6}, source="measured on this device (t)", origin="forwards")
    fit = raw.monotone()
    assert dict(fit.table) == {1: 1.0, 2: 1.25, 3: 1.25, 5: 1.4, 9: 1.8, 17: 2.6}
    spike_late = theory.VerifyCost({1: 1.0, 2: 1.1, 3: 1.2, 5: 9.0, 9: 1.6, 17: 2.2}).monotone()
    assert spike_late(9) == pytest.approx(1.6) and spike_late(5) == pytest.approx(1.6) and spike_late(3) == 1.2


def test_optimal_k_hand_values():
    """a = 0.8, c = 0.05, cost 1: K=7 -> 4.16114/1.35 = 3.08233, K=8 -> 4.32891/1.40 = 3.09208,
    K=9 -> 4.46313/1.45 = 3.07802, so K = 8. With a CPU-like table (8 tokens 2.0x, 64 tokens 4.975x,
    MKL's float32 layers on the development machine) larger K costs more: K = 4
    (1.8977 vs K=3: 2.9520/(0.15+1.4286)=1.8700 and K=5: 3.6893/(0.25+1.7143)=1.8782)."""
    k, s = theory.optimal_k(0.8, 0.05)
    assert k == 8 and s == pytest.approx(4.3289134 / 1.4, rel=1e-6)
    cpu = theory.VerifyCost({1: 1.0, 8: 2.0, 64: 4.975})
    k, s = theory.optimal_k(0.8, 0.05, cpu)
    assert k == 4 and s == pytest.approx(1.897677, abs=1e-6)
    sug = theory.suggest_k(0.8, 0.05, cpu)
    assert sug.k == 4 and sug.pays_off and sug.tokens_per_step == pytest.approx(3.3616)
    # A useless draft: alpha 0 and a costly draft -> best K is 1 and it does not pay.
    sug = theory.suggest_k(0.0, 0.5)
    assert sug.k == 1 and not sug.pays_off and sug.speedup == pytest.approx(1 / 1.5)


def test_draft_cost_ratio_and_lookahead_pass():
    """c = (1.0 s / 40 drafted) / (2.0 s / 10 steps) = 0.025 / 0.2 = 0.125; Lookahead 7B setting
    (15, 5, 15): 1 + 15*4 + 15*4 = 121 tokens; CPU setting (2, 3, 3): 1 + 4 + 6 = 11."""
    assert theory.draft_cost_ratio(1.0, 40, 2.0, 10) == pytest.approx(0.125)
    assert theory.draft_cost_ratio(1.0, 0, 2.0, 10) is None
    assert theory.lookahead_tokens_per_pass(15, 5, 15) == 121
    assert theory.lookahead_tokens_per_pass(**LOOKAHEAD_PRESETS["cpu"]) == 11  # W2 N3 G3: 1 + 4 + 6


def test_theory_bad_input_names_the_bound():
    with pytest.raises(ValueError, match=r"alpha must be in \[0, 1\], got 1.5"):
        theory.expected_tokens_per_step(1.5, 2)
    with pytest.raises(ValueError, match=r"k must be in \[0, 16\], got 17"):
        theory.expected_speedup(0.5, 17, 0.1)
    with pytest.raises(ValueError, match="c .* must be >= 0"):
        theory.expected_speedup(0.5, 2, -1)
    with pytest.raises(ValueError, match="ngram_size must be an integer >= 2"):
        theory.lookahead_tokens_per_pass(5, 1, 5)
    with pytest.raises(ValueError, match="n >= 1"):
        theory.VerifyCost({0: 1.0})


@pytest.mark.real_model
def test_measure_verify_cost_on_the_default_model(real_target):
    """The measured table is relative to one token (exactly 1.0 at n = 1), covers every size asked for,
    and round-trips through plain data (what ZeroGPU pickles)."""
    cost = theory.measure_verify_cost(real_target, sizes=(2, 5), prefix_len=32, repeats=1)
    assert set(cost.table) == {1, 2, 5} and cost.table[1] == 1.0
    assert all(v > 0 for v in cost.table.values()) and all(s > 0 for s in cost.seconds.values())
    assert "measured on this device" in cost.source and cost.origin == theory.ORIGIN_FORWARDS
    again = theory.VerifyCost.from_dict(pickle.loads(pickle.dumps(cost.as_dict())))
    assert again.table == cost.table and again.origin == theory.ORIGIN_FORWARDS and again.measured_here


def test_verify_cost_origin_survives_the_fit_and_plain_data():
    """Panels tell a curve measured here (and by which timing) from the project's by ``origin``, never by
    the words of its source: the origin is kept by the monotone fit and through plain data, the project's
    curve has none, and an unknown origin is refused."""
    steps = theory.VerifyCost({1: 1.0, 2: 1.3, 3: 1.2}, {1: 0.04}, source="any words", origin=theory.ORIGIN_STEPS)
    for cost in (steps.monotone(), theory.VerifyCost.from_dict(steps.as_dict())):
        assert cost.origin == theory.ORIGIN_STEPS and cost.measured_here
    assert not theory.FALLBACK.measured_here and not theory.VerifyCost({1: 1.0}, source="measured on this device").measured_here
    assert theory.VerifyCost.from_dict({"table": {1: 1.0}}).origin == ""
    with pytest.raises(ValueError, match="origin"):
        theory.VerifyCost({1: 1.0}, origin="guessed")


@pytest.mark.parametrize("target_b,draft_b", [(-5, 0), (0, 0), (None, 0), (float("nan"), 0), (1e9, 0),
                                              (7, -1), (7, 13)])
def test_advisor_tab_bad_input_clears_the_advice(target_b, draft_b):
    """Out-of-range sizes give a message saying what is allowed and no advice (Apply then has nothing stale)."""
    from playground.ui import advisor_tab

    md, state = advisor_tab.advise(_FakeEngine(), target_b, draft_b, False, "chat", "default", "cpu", False, False)
    assert state is None and "Cannot advise" in md and "Allowed" in md and "Recommended" not in md


class _FakeEngine:
    """Just what the Advisor tab asks of an engine: no models loaded, every method available."""

    draft = medusa = None

    def unavailable_reason(self, method):
        return None


def test_advisor_tab_number_boxes_leave_bounds_to_the_handler_and_apply_confirms():
    """The size boxes have no Gradio minimum/maximum (which raised a server traceback and kept old advice);
    Apply's confirmation names the methods and the settings it set."""
    import gradio as gr
    import torch

    from playground.engine import METHODS
    from playground.ui import advisor_tab
    from playground.ui.app import _knob_keys

    engine = _FakeEngine()
    engine.target = types.SimpleNamespace(device=torch.device("cpu"), model=torch.nn.Embedding(1000, 135))
    with gr.Blocks() as demo:
        use = {m: gr.Checkbox(False) for m in METHODS}
        knobs = {key: gr.Textbox() for key in _knob_keys()}
        advisor_tab.build(engine, use, knobs)
    numbers = [b for b in demo.blocks.values() if isinstance(b, gr.Number)]
    assert numbers and all(b.minimum is None and b.maximum is None for b in numbers)
    adv = advisor.advise(advisor.Situation(0.135, 0.00747, device="cpu", draft_loaded=True, draft_k=2))
    out = advisor_tab.apply_values(engine, {"methods": adv.methods, "params": adv.params}, _knob_keys())
    assert out[-1].startswith("**Applied to the Playground tab:**") and "Draft model (K = 2)" in out[-1]
    assert "Nothing applied" in advisor_tab.apply_values(engine, None, _knob_keys())[-1]


def test_theory_tab_without_a_usable_alpha_or_c_still_draws_its_curves_and_says_why():
    """An emptied, non-numeric or out-of-range alpha or c (typed in the number box) gives a message
    naming the input and its range instead of the optimal K, and the curves are still drawn (Gradio's
    stock slider raised in preprocess: a server traceback, an error toast and no chart)."""
    from playground.ui import knobs, theory_tab

    for alpha, c, said in ((None, 0.05, "Acceptance rate α: give a number from 0 to 1 (got nothing)"),
                           ("abc", 0.05, "Acceptance rate α: give a number from 0 to 1 (got abc)"),
                           (1.5, 0.05, "Acceptance rate α: give a number from 0 to 1 (got 1.5)"),
                           (0.7, -0.3, "Draft cost c: give a number from 0 to 1 (got -0.3)")):
        fig, md = theory_tab.render(alpha, c, [2, 4], [0.05], theory_tab.CONSTANT, None, "test-theory-inputs")
        assert said in md and "Optimal K" not in md and "Cannot compute" not in md, md
        assert len(fig.data) == 2
    fig, md = theory_tab.render(0.7, 0.05, [2, 4], [0.05], theory_tab.CONSTANT, None, "test-theory-inputs")
    assert "Optimal K for α = 70%, c = 0.05" in md
    # The page's inputs leave the range check to the tab (and clamp a typed value with a message).
    assert knobs.KnobSlider(0, 1).preprocess(None) is None and knobs.KnobSlider(0, 1).preprocess(1.5) == 1.5


def test_theory_tab_shows_a_non_decreasing_verify_cost():
    """A measured spike (2 tokens timed far above 1 and 3, as on a busy machine) is shown capped at its
    neighbours, with the raw timing and a word that such timings are noisy; it does not lift 3 and 5."""
    from playground.ui import insight, theory_tab

    key = "test-theory-monotone"
    insight.VERIFY_COSTS[key] = theory.VerifyCost({1: 1.0, 2: 2.58, 3: 1.25, 5: 1.8}, {1: 0.06, 2: 0.15, 3: 0.075,
                                                  5: 0.11}, source="measured on this device (test)", origin="forwards").as_dict()
    try:
        _, md = theory_tab.render(0.7, 0.05, [2], [0.05], theory_tab.MEASURED, None, key)
    finally:
        del insight.VERIFY_COSTS[key]
    assert "2: 1.25 | 3: 1.25 | 5: 1.80" in md and "2 tokens timed 2.58, fitted 1.25" in md
    assert "noisy" in md and "measured on this device" in md and "3: 2.58" not in md


def test_every_panel_reads_the_engines_one_verify_cost_curve():
    """Issue 20: the Theory tab's row, the "why this speed" lines and the draft panel read one curve (the
    engine's kept Engine.verify_cost, else the project's) and name the same source."""
    from collections import Counter

    from playground.ui import insight, step_inspector, theory_tab, worker

    curve = theory.VerifyCost({1: 1.0, 2: 1.1, 3: 1.37, 5: 1.6, 9: 2.0, 17: 3.0}, {1: 0.05},
                              source="measured on this device (cpu, float32, probe) at 12:46:00",
                              origin="forwards")

    class _Engine:
        def has_persistent(self, key):
            return key == "verify_cost"

        def verify_cost(self):
            return curve

    key = worker.register(_Engine())
    try:
        assert insight.verify_cost_for(key) is curve
        cost, used = step_inspector._cost_curve(None, key)
        assert cost(3, True) == pytest.approx(1.37) and used.table == curve.monotone().table
        _, md = theory_tab.render(0.7, 0.05, [2], [0.05], theory_tab.MEASURED, None, key)
        assert "3: 1.37" in md and "at 12:46:00" in md
        store = step_inspector.RunSteps(["draft_model"])
        store.stats = {"draft_model": {"steps": 5, "new_tokens": 9, "proposed": 8, "alpha": 0.5, "elapsed_s": 1.0,
                                       "ttft_s": 0.2, "draft_s": 0.1, "verify_s": 0.7, "tokens_per_s": 9.0, "tau": 1.8}}
        store.pass_sizes["draft_model"] = Counter({3: 4})
        why = step_inspector.why_markdown(None, key, store)
        assert "verifying 1.37 for a pass over 3.0 tokens" in why and "at 12:46:00" in why
        panel = insight.draft_panel_markdown(store.stats["draft_model"], 2, insight.verify_cost_for(key))
        assert "at 12:46:00" in panel and "1.37" in panel
        before = step_inspector.why_markdown(None, "no-such-engine", store)
        assert "not on this device" in before and insight.verify_cost_source(theory.FALLBACK) in before
    finally:
        del worker.ENGINES[key]


def test_the_budgets_step_cost_stands_in_for_the_theory_tabs_curve():
    """Before the Theory tab measures, the page reads the chain curve the per-step budget timed on this
    device at the first run (not the project's curve from another CPU)."""
    from playground.engine import StepCost
    from playground.ui import insight, step_inspector, worker

    chain = theory.VerifyCost({1: 1.0, 2: 1.12, 5: 1.31}, {1: 0.045}, origin="steps",
                              source="decoding steps verifying a chain of q - 1 nodes (lower quartiles, a monotone "
                                     "piecewise-linear fit), relative to plain steps")  # as step_cost words it
    steps = StepCost(chain, theory.VerifyCost({1: 1.0, 2: 1.2}), 48)

    class _Engine:
        def has_persistent(self, key):
            return key == "step_cost"

        def persisted(self, key):
            return steps if key == "step_cost" else None

    key = worker.register(_Engine())
    try:
        cost = insight.verify_cost_for(key)
        assert insight.measured_here(cost) and cost.table == chain.table and "verifying a chain" in cost.source
        store = step_inspector.RunSteps(["draft_model"])
        store.stats = {"draft_model": {"steps": 5, "new_tokens": 9, "proposed": 8, "alpha": 0.5, "elapsed_s": 1.0,
                                       "ttft_s": 0.2, "draft_s": 0.1, "verify_s": 0.7, "tokens_per_s": 9.0, "tau": 1.8}}
        why = step_inspector.why_markdown(None, key, store)
        assert "not on this device" not in why
        # One pair of brackets inside the header's, not three ("... fit), relative to plain steps))").
        assert "verify cost measured on this device (decoding steps verifying a chain of q - 1 nodes, relative to " \
               "plain steps)):" in why and "fit)" not in why
    finally:
        del worker.ENGINES[key]


def test_presets_and_command_line():
    p = presets.PRESETS
    assert p["default"].target == "default" and p["default"].offline
    assert p["smollm2-1.7b"].drafts == ("HuggingFaceTB/SmolLM2-360M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct")
    assert p["qwen2.5-7b"].draft == "Qwen/Qwen2.5-0.5B-Instruct"
    assert p["vicuna-7b-medusa"].medusa == "FasterDecoding/medusa-vicuna-7b-v1.3"
    assert p["llama-2-70b"].draft.startswith("meta-llama/Llama-2-7b")
    import app

    args = app.parse_args(["--preset", "qwen2.5-7b"])
    assert (args.target, args.draft) == ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct")
    assert app.parse_args(["--preset", "qwen2.5-7b", "--target", "default"]).target == "default"
    with pytest.raises(SystemExit):
        app.parse_args(["--preset", "no-such-preset"])


def test_hub_preset_fails_with_the_loaders_message(monkeypatch, tmp_path):
    """Without a hub, a hub preset raises ModelLoadError (a message, not a crash)."""
    from playground.engine import ModelLoadError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(ModelLoadError):
        presets.load_preset("qwen2.5-7b", "cpu", "float32")
    with pytest.raises(ValueError, match="unknown preset"):
        presets.load_preset("nope")


# ----- benchmark tab = CLI; export round trip -----------------------------------------------------
def _record(qid, cat, turn, method, tokens, steps, wall, ids, text="x", proposed=0, accepted=0):
    return {"question_id": qid, "category": cat, "turn": turn, "method": method, "params": {},
            "new_tokens": tokens, "steps": steps, "wall_s": wall, "ttft_s": 0.01, "tokens_per_s": tokens / wall,
            "mean_accepted_tokens": tokens / steps, "acceptance_rate": accepted / proposed if proposed else None,
            "proposed": proposed, "accepted": accepted, "output_ids": ids, "output_text": text,
            "finish_reason": "length", "margins": [1.0] * len(ids), "temperature": 0.0, "dtype": "float32",
            "target": "t"}


RECORDS = [
    _record(1, "writing", 0, "autoregressive", 8, 8, 1.0, [1, 2, 3]),
    _record(1, "writing", 0, "prompt_lookup", 8, 4, 0.5, [1, 2, 3], proposed=10, accepted=4),
    _record("HumanEval/0", "humaneval", 0, "autoregressive", 6, 6, 2.0, [4, 5], text='say "hi",\nthen ✓'),
    _record("HumanEval/0", "humaneval", 0, "prompt_lookup", 6, 2, 0.5, [4, 6], text="", proposed=8, accepted=4),
]


def test_bench_tab_table_equals_the_cli_table():
    """The tab's detail lines are the CLI's printed cells, and its leaderboard holds the summary's numbers."""
    from playground.ui import bench_tab

    rows, header, lines, detail = bench_tab.tables(RECORDS)
    printed = bench.format_table(bench.summarize(RECORDS))
    cli_lines = [re.split(r"\s{2,}", ln.strip()) for ln in printed.splitlines()
                 if ln and not ln.startswith("==") and not ln.startswith("method")]
    assert [d[1:] for d in detail] == cli_lines
    # writing: 8/0.5 over 8/1.0 = 2.0x; humaneval: 12 over 3 = 4.0x; overall 14/1.0 over 14/3.0 = 3.0x.
    assert header == ["method", "writing speedup", "humaneval speedup", "overall speedup", "tau", "tokens/s",
                      "lossless"]
    pl = next(ln for ln in lines if ln[0] == "prompt_lookup")
    assert pl[1:4] == [2.0, 4.0, 3.0] and pl[4] == round(14 / 6, 2) and pl[5] == 14.0
    assert pl[6].startswith("no (1/2 differ")


def test_export_round_trip():
    """JSONL is byte for byte what the CLI writes, and CSV gives back equal records (ids, None,
    quotes, newlines, unicode, string ids, empty text)."""
    jsonl = bench.to_jsonl(RECORDS)
    assert jsonl == "".join(bench.record_line(r) for r in RECORDS)
    assert bench.from_jsonl(jsonl) == RECORDS
    assert bench.from_csv(bench.to_csv(RECORDS)) == RECORDS
    with pytest.raises(ValueError, match="line 1"):
        bench.from_jsonl("[1]\n")


@pytest.mark.real_model
def test_bench_tab_run_matches_the_cli_summary(real_target, tmp_path):
    """A tiny benchmark from the tab (1 question, 8 new tokens): its JSONL download read back and
    summarised by the CLI's functions gives exactly the tab's table."""
    from playground.engine import Engine
    from playground.ui import bench_tab

    engine = Engine(real_target)
    knobs = [k.default for _, k in bench_tab.knob_keys()]
    updates = list(bench_tab.run_benchmark(engine, "Spec-Bench dev (bundled)", None, ["writing"],
                                           ["autoregressive", "prompt_lookup"], 1, 8, False, *knobs))
    final = updates[-1]
    assert "Done: 4 runs" in final[0], final[0]
    csv_path, jsonl_path = final[6], final[7]
    records = bench.from_jsonl(Path(jsonl_path).read_text(encoding="utf-8"))
    assert len(records) == 4 and {r["method"] for r in records} == {"autoregressive", "prompt_lookup"}
    assert bench.from_csv(Path(csv_path).read_text(encoding="utf-8")) == records
    rows = bench.summarize(records)
    # The page shows the same cells, with page labels for the methods and the categories ("Writing").
    label = {"autoregressive": "Autoregressive", "prompt_lookup": "Prompt lookup"}
    assert final[3].value["data"] == [[r["category"].capitalize(), label[r["method"]], *bench.table_cells(r)[1:]]
                                      for r in rows]
    assert final[2].value["data"] == [[label[ln[0]], *ln[1:]] for ln in bench.leaderboard(rows)[1]]
    assert final[2].value["headers"][:2] == ["Method", "Writing speedup"]
    # Both charts drew the run (tau's bars went missing when the categories were titled "Overall").
    speed, tau = final[4], final[5]
    assert [t.name for t in speed.data] == ["Prompt lookup"] and list(speed.data[0].x) == ["Writing", "Overall"]
    assert list(tau.data[0].x) == ["Autoregressive", "Prompt lookup"]
    # Bad input: a message, never an exception.
    bad = list(bench_tab.run_benchmark(engine, "Spec-Bench dev (bundled)", None, [], ["autoregressive"], 1, 8,
                                       False, *knobs))
    assert len(bad) == 1 and "no category is ticked" in bad[0][0]
    # A method the loaded models cannot run: the runner's check (the CLI's), one message, nothing runs.
    bad = list(bench_tab.run_benchmark(engine, "Spec-Bench dev (bundled)", None, ["writing"],
                                       ["autoregressive", "draft_model"], 1, 8, False, *knobs))
    assert len(bad) == 1 and "draft_model cannot run: no draft model is loaded" in bad[0][0]


# ----- ZeroGPU: a stand-in `spaces` that forks ------------------------------------------------------
def _child(fn, conn):
    """In the forked child: read pickled args, run ``fn``, send each pickled item, then ("done",)."""
    try:
        args, kwargs = pickle.loads(conn.recv_bytes())
        result = fn(*args, **kwargs)
        if isinstance(result, types.GeneratorType):
            for item in result:
                conn.send_bytes(pickle.dumps(("item", item)))
        else:
            conn.send_bytes(pickle.dumps(("item", result)))
        conn.send_bytes(pickle.dumps(("done", None)))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        conn.send_bytes(pickle.dumps(("error", f"{type(e).__name__}: {e}")))
    finally:
        conn.close()


def make_spaces_standin() -> types.ModuleType:
    """A module with ``GPU(duration=...)`` that runs the function in a forked process (multiprocessing
    'fork'), pickling the arguments and every yielded value through a pipe, as ZeroGPU does."""
    mod = types.ModuleType("spaces")
    mod.calls = []

    def GPU(duration=60):  # noqa: N802 - the real API's name
        def wrap(fn):
            is_gen = fn.__code__.co_flags & 0x20

            def run(*args, **kwargs):
                seconds = duration(*args, **kwargs) if callable(duration) else duration
                mod.calls.append((fn.__name__, seconds))
                ctx = multiprocessing.get_context("fork")
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_child, args=(fn, child), daemon=True)
                proc.start()
                child.close()
                parent.send_bytes(pickle.dumps((args, kwargs)))
                try:
                    while True:
                        kind, item = pickle.loads(parent.recv_bytes())
                        if kind == "done":
                            return
                        if kind == "error":
                            raise RuntimeError(f"in the GPU process: {item}")
                        yield item
                finally:
                    parent.close()
                    proc.join(timeout=60)

            if is_gen:
                return run

            def call(*args, **kwargs):
                return next(run(*args, **kwargs))
            return call
        return wrap

    mod.GPU = GPU
    return mod


@pytest.mark.real_model
def test_zerogpu_forked_path_equals_the_normal_path(real_target):
    """The run handler gives the same panels, badges and per-step counts whether the model runs in
    this process or in a forked one behind the stand-in ``@spaces.GPU`` (everything pickled)."""
    import torch

    from playground.engine import Engine
    from playground.ui import worker
    from playground.ui.app import run_arguments, run_comparison

    torch.set_num_threads(1)
    engine = Engine(real_target)
    spaces = make_spaces_standin()
    gpu_run = worker.decorate(worker.stream_run, worker.run_duration, spaces_module=spaces)
    gpu_measure = worker.decorate(worker.measure, 60, spaces_module=spaces)
    # budget off: the budget's choices follow wall-clock step costs, which differ between two runs and
    # would cut the steps differently; this test is about the forked path carrying everything over.
    args = run_arguments("Repeat: the cat sat on the mat. The cat sat on the mat.",
                         ["autoregressive", "prompt_lookup"], {"prompt_lookup": {"budget": "off"}},
                         max_new_tokens=10)

    def final(stream):
        out = list(run_comparison(engine, *args, stream=stream))
        return out[-1]

    normal, forked = final(None), final(gpu_run)
    assert [c for c in spaces.calls if c[0] == "stream_run"], "the decorated function was not used"
    assert spaces.calls[0][1] == worker.run_duration("k", "", [{}, {}], {"max_new_tokens": 10})
    assert "Done in" in html.unescape(forked[0])
    for i in (1, 3, 4, 6):  # panels' HTML and the lossless badges
        assert forked[i] == normal[i]
    assert "matches the baseline" in forked[6]
    assert forked[-1]["methods"]["prompt_lookup"]["tokens_per_step"] == \
        normal[-1]["methods"]["prompt_lookup"]["tokens_per_step"]
    cost = gpu_measure(worker.register(engine), [2])
    assert cost["table"][1] == 1.0 and set(cost["table"]) == {1, 2}


def test_draft_panel_and_lookahead_line():
    """The draft panel states c as measured (draft s per drafted token / verify s per step = (1/40)/(2/10)
    = 0.125), converts it to single-token forwards (x verify_cost(5) = 1.5714 -> 0.196) and suggests the
    K theory.suggest_k gives for those numbers (the advisor's K: advisor.measure_draft); Lookahead's line shows 1 + W(N-1) + G(N-1)."""
    from playground.ui import insight

    stats = {"alpha": 0.8, "draft_s": 1.0, "verify_s": 2.0, "proposed": 40, "steps": 11}
    md = insight.draft_panel_markdown(stats, 4, theory.FALLBACK)
    cost = theory.FALLBACK.monotone()  # the draft panel, the advisor and the Theory tab use it non-decreasing
    c = 0.125 * cost(5)
    sug = theory.suggest_k(0.8, c, cost)
    assert "= 0.125" in md and f"{c:.3f}" in md and f"Suggested K = {sug.k}**" in md
    assert "drafting 1.00 s (33%)" in md
    assert "Leviathan" in md and "the one in the Draft model panel's stats line" in md  # which speedup to trust
    assert "Nothing was drafted" in insight.draft_panel_markdown({**stats, "alpha": None, "proposed": 0}, 4,
                                                                 theory.FALLBACK)
    assert "= **121**" in insight.lookahead_pass_markdown(15, 5, 15)
    assert insight.preset_of(15, 5, 15) == "7b" and insight.preset_of(6, 5, 15) == insight.CUSTOM


def test_draft_panel_says_when_the_advisor_leaves_the_draft_out():
    """A draft as large as its target (the Models tab's "the target itself") is a check of the machinery:
    the Advisor leaves it out, so the draft panel does not say the Advisor uses its K."""
    from types import SimpleNamespace

    from playground.ui import insight, worker

    stats = {"steps": 5, "new_tokens": 9, "proposed": 8, "alpha": 0.5, "elapsed_s": 1.0, "ttft_s": 0.2,
             "draft_s": 0.1, "verify_s": 0.7, "tokens_per_s": 9.0, "tau": 1.8}
    summary = {"methods": {"draft_model": {"stats": stats, "params": {"k": 2}, "label": "Draft model",
                                           "tokens_per_step": [2, 1, 2]}}}

    class Sized:
        def __init__(self, draft_params):
            self.target = SimpleNamespace(name="t")
            self.draft = SimpleNamespace(name="d")
            self.sizes = {"target": 135e6, "draft": draft_params}

        def parameter_count(self, part):
            return int(self.sizes[part])

        def unavailable_reason(self, method):
            return None

    for draft_params, advised in ((135e6, False), (30e6, True)):
        key = worker.register(Sized(draft_params))
        try:
            md = insight.after_run(summary, key)[-1]
        finally:
            del worker.ENGINES[key]
        assert ("The Advisor tab uses this K." in md) is advised, md
        assert ("leaves this draft out" in md) is not advised


def test_theory_curves_take_their_dash_from_k_and_their_grey_from_c():
    """3 K x 3 c: curves of one K share a dash pattern, curves of one c share a grey, and no two curves
    look alike (the curves cycled through six styles in drawing order: 20 curves read as noise)."""
    from playground.ui import theory_tab

    fig, _ = theory_tab.render(0.7, 0.05, [2, 4, 8], [0.0, 0.05, 0.2], theory_tab.CONSTANT, None, "test-theory-styles")
    lines = {t.name: (t.line.dash, t.line.color) for t in fig.data}
    assert len(lines) == 9 and len(set(lines.values())) == 9
    for k in (2, 4, 8):
        assert len({lines[f"K={k}, c={c:g}"][0] for c in (0.0, 0.05, 0.2)}) == 1
    for c in (0.0, 0.05, 0.2):
        assert len({lines[f"K={k}, c={c:g}"][1] for k in (2, 4, 8)}) == 1
