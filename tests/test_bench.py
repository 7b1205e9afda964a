"""Tests of the benchmark command line (playground/bench.py).

The summary tests use hand-made records; the end-to-end test runs the real embedded model on
three short turns and then the reviewers' checker, /work/shared/tools/check_bench.py (located
beside the repository; skipped when absent).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import skip_unless_ci

from playground import bench

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(__file__).resolve().parents[2] / "shared"
CHECK_BENCH = SHARED / "tools" / "check_bench.py"
CONTRACT_FIELDS = ("question_id", "category", "turn", "method", "params", "new_tokens", "steps", "wall_s",
                   "ttft_s", "tokens_per_s", "mean_accepted_tokens", "acceptance_rate", "output_ids",
                   "output_text")


def rec(qid, method, tokens, seconds, steps, ids, *, category="qa", turn=0, proposed=0, accepted=0,
        margins=None, dtype="float32", temperature=0.0):
    return {"question_id": qid, "category": category, "turn": turn, "method": method, "params": {},
            "new_tokens": tokens, "steps": steps, "wall_s": seconds, "ttft_s": 0.1,
            "tokens_per_s": tokens / seconds, "mean_accepted_tokens": tokens / steps,
            "acceptance_rate": accepted / proposed if proposed else None, "proposed": proposed,
            "accepted": accepted, "output_ids": ids, "output_text": "", "dtype": dtype,
            "temperature": temperature, "margins": margins if margins is not None else [5.0] * len(ids)}


def row(rows, category, method):
    return next(r for r in rows if r["category"] == category and r["method"] == method)


# ----- summary -------------------------------------------------------------------------------
def test_summary_speedup_and_tau_are_totals_over_totals():
    """Speedup = (total tokens / total seconds) over the baseline's, tau = total tokens / total
    steps, alpha = total accepted / total proposed: per category and overall, as check_bench.py."""
    records = [
        rec(1, "autoregressive", 10, 1.0, 10, [1] * 10, category="qa"),
        rec(1, "prompt_lookup", 10, 0.5, 4, [1] * 10, category="qa", proposed=10, accepted=6),
        rec(2, "autoregressive", 30, 3.0, 30, [2] * 30, category="rag"),
        rec(2, "prompt_lookup", 30, 1.0, 10, [2] * 30, category="rag", proposed=30, accepted=20),
    ]
    rows = bench.summarize(records)
    assert [(r["category"], r["method"]) for r in rows] == [
        ("qa", "autoregressive"), ("qa", "prompt_lookup"), ("rag", "autoregressive"), ("rag", "prompt_lookup"),
        ("overall", "autoregressive"), ("overall", "prompt_lookup")]
    assert row(rows, "qa", "prompt_lookup")["speedup"] == pytest.approx(2.0)
    assert row(rows, "rag", "prompt_lookup")["speedup"] == pytest.approx(3.0)
    overall = row(rows, "overall", "prompt_lookup")
    assert overall["tokens_per_s"] == pytest.approx(40 / 1.5)
    assert overall["speedup"] == pytest.approx((40 / 1.5) / (40 / 4.0))  # not the mean of 2.0 and 3.0
    assert overall["tau"] == pytest.approx(40 / 14)
    assert overall["alpha"] == pytest.approx(26 / 40)
    assert row(rows, "overall", "autoregressive")["speedup"] == pytest.approx(1.0)
    assert row(rows, "overall", "autoregressive")["alpha"] is None
    assert overall["lossless"] == "yes"
    table = bench.format_table(rows)
    assert "== qa ==" in table and "== overall ==" in table and "2.67x" in table


def test_summary_lossless_detection_with_near_ties():
    """A lossless method differing from the baseline is reported as "no (d/n differ; ...)",
    separating divergences at near-ties (baseline top-2 margin below the dtype's noise) from real
    ones, and counting a later turn after a differing turn apart (its conversation differed)."""
    base_margins = [5.0, 5.0, 0.0001, 5.0]
    records = [
        rec(1, "autoregressive", 4, 1.0, 4, [1, 2, 3, 4], margins=base_margins),
        rec(1, "prompt_lookup", 4, 1.0, 2, [1, 2, 9, 9], proposed=2, accepted=2),  # near-tie at 2
        rec(1, "autoregressive", 4, 1.0, 4, [5, 6, 7, 8], turn=1),
        rec(1, "prompt_lookup", 4, 1.0, 4, [5, 0, 0, 0], turn=1),  # follows a differing turn
        rec(2, "autoregressive", 4, 1.0, 4, [1, 2, 3, 4]),
        rec(2, "prompt_lookup", 4, 1.0, 4, [1, 7, 3, 4]),  # margin 5: a real mismatch
        rec(3, "autoregressive", 4, 1.0, 4, [1, 2, 3, 4]),
        rec(3, "prompt_lookup", 4, 1.0, 4, [1, 2, 3, 4]),
    ]
    cell = row(bench.summarize(records), "overall", "prompt_lookup")
    assert cell["lossless"] == "no (3/4 differ; 1 at near-ties; 1 after an earlier turn differed)"
    assert cell["lossless_detail"] == {"compared": 4, "differ": 3, "near_ties": 1, "after_earlier_turn": 1}
    # In bf16 a margin of 0.3 is within rounding noise (threshold 0.5), so q2 becomes a near-tie.
    records[4].update(dtype="bfloat16", margins=[5.0, 0.3, 5.0, 5.0])
    cell = row(bench.summarize(records), "overall", "prompt_lookup")
    assert cell["lossless"] == "no (3/4 differ; 2 at near-ties; 1 after an earlier turn differed)"


def test_summary_not_applicable_cases():
    """Losslessness is not judged under sampling, nor for methods not declared lossless; a
    missing baseline gives no speedup."""
    sampled = [rec(1, "autoregressive", 4, 1.0, 4, [1, 2, 3, 4], temperature=0.7),
               rec(1, "prompt_lookup", 4, 1.0, 4, [4, 3, 2, 1], temperature=0.7)]
    assert row(bench.summarize(sampled), "overall", "prompt_lookup")["lossless"] == "-"
    typical = dict(rec(1, "medusa", 4, 1.0, 2, [2]), params={"acceptance": "typical"})  # lossy by design
    lossy = [rec(1, "autoregressive", 4, 1.0, 4, [1]), typical]
    assert row(bench.summarize(lossy), "overall", "medusa")["lossless"] == "-"
    exact = [rec(1, "autoregressive", 4, 1.0, 4, [1]), rec(1, "medusa", 4, 1.0, 2, [2])]  # exact: judged
    assert row(bench.summarize(exact), "overall", "medusa")["lossless"].startswith("no")
    alone = bench.summarize([rec(1, "prompt_lookup", 4, 2.0, 2, [1])])
    assert alone[0]["speedup"] is None and alone[0]["lossless"] == "-"
    assert "-" in bench.format_table(alone)


def test_summary_reads_check_bench_records_without_extras():
    """Records holding only the contract fields summarise too (alpha from acceptance_rate)."""
    records = [{k: v for k, v in r.items() if k in CONTRACT_FIELDS} for r in (
        rec(1, "autoregressive", 8, 1.0, 8, [1] * 8),
        rec(1, "prompt_lookup", 8, 0.5, 4, [1] * 8, proposed=8, accepted=4))]
    out = row(bench.summarize(records), "overall", "prompt_lookup")
    assert out["speedup"] == pytest.approx(2.0) and out["alpha"] == pytest.approx(0.5)
    assert out["lossless"] == "yes"


# ----- questions -----------------------------------------------------------------------------
def test_parse_both_question_formats(tmp_path):
    """Spec-Bench rows keep their turns; HumanEval rows become one chat turn holding the code."""
    f = tmp_path / "q.jsonl"
    f.write_text(
        json.dumps({"question_id": 81, "category": "writing", "turns": ["Write.", "Rewrite."]}) + "\n\n" +
        json.dumps({"task_id": "HumanEval/0", "prompt": "def f(x):\n    \"\"\"Double x.\"\"\"\n"}) + "\n")
    qs = bench.load_questions(f)
    assert qs[0] == bench.Question(81, "writing", ("Write.", "Rewrite."))
    assert qs[1].question_id == "HumanEval/0" and qs[1].category == "humaneval"
    assert qs[1].turns == ("Complete the following Python function:\n```python\ndef f(x):\n"
                           "    \"\"\"Double x.\"\"\"\n```",)
    assert bench.load_questions(f, categories=["humaneval"]) == [qs[1]]
    assert bench.load_questions(f, limit=1) == [qs[0]]


def test_builtin_sets_match_the_shared_dev_data():
    """assets/bench/ holds the dev question files; both parse in full."""
    assert len(bench.load_questions("spec_bench")) == 240
    assert len(bench.load_questions("humaneval")) == 82
    if SHARED.is_dir():
        for name in ("spec_bench_dev.jsonl", "humaneval_dev.jsonl"):
            assert (REPO / "assets" / "bench" / name).read_bytes() == (SHARED / "data" / name).read_bytes()


@pytest.mark.parametrize("content, message", [
    ("not json\n", "not valid JSON"),
    ('{"id": 1, "text": "hi"}\n', "neither a Spec-Bench row"),
    ('{"question_id": 1, "category": "qa", "turns": []}\n', "non-empty list"),
    ('{"question_id": 1, "category": "qa", "turns": ["a"]}\n{"question_id": 1, "turns": ["b"]}\n', "duplicate"),
    ("\n", "has no questions"),
])
def test_bad_question_files(tmp_path, content, message):
    f = tmp_path / "q.jsonl"
    f.write_text(content)
    with pytest.raises(bench.BenchError, match=message):
        bench.load_questions(f)


# ----- command-line errors (all before any model loads) ----------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["--methods", "autoregressive,nonsense"], "unknown method nonsense; available methods: autoregressive"),
    (["--questions", "/no/such/file.jsonl"], "cannot read questions file"),
    (["--num-pred-tokens", "0"], "num_pred_tokens must be in [1, 16], got 0"),
    (["--k", "4"], "--k is not a setting of any chosen method"),
    (["--temperature", "-1"], "temperature must be in"),
    (["--limit", "0"], "--limit must be at least 1"),
    (["--methods", "autoregressive,draft_model", "--draft", "none"], "draft_model needs a draft model: add --draft MODEL"),
])
def test_usage_errors_exit_2_with_one_line(argv, message, capsys, tmp_path):
    assert bench.main(argv + ["--out", str(tmp_path / "r.jsonl")]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_model_load_error_exits_2_without_traceback(tmp_path):
    """A target that cannot load is one clear line and exit status 2 (run as the real command)."""
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": ["Hi"]}) + "\n")
    p = subprocess.run([sys.executable, "-m", "playground.bench", "--questions", str(q), "--target",
                        str(tmp_path / "missing-model"), "--out", str(tmp_path / "r.jsonl"), "--no-progress"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert "could not load model" in p.stderr and "Traceback" not in p.stderr


def test_knob_flags_map_onto_each_methods_params():
    params = bench.method_params(["autoregressive", "prompt_lookup"],
                                 {"max_ngram_size": 2, "num_pred_tokens": 5, "k": None})
    assert params == {"autoregressive": {}, "prompt_lookup": {"max_ngram_size": 2, "num_pred_tokens": 5}}
    assert bench.parse_methods("prompt_lookup") == ["autoregressive", "prompt_lookup"]
    from playground.engine.compare import METHODS

    if "lookahead" in METHODS:  # --ngram and --guess set whichever spelling the method declares
        names = {k.name for k in METHODS["lookahead"].knobs}
        got = bench.method_params(["lookahead"], {"window": 4, "ngram": 3, "guess": 2})["lookahead"]
        assert set(got) <= names and sorted(got.values()) == [2, 3, 4]


# ----- end to end on the real default model ----------------------------------------------------
def test_end_to_end_on_the_default_model(tmp_path, capsys):
    """Two Spec-Bench questions (one two-turn, one single-turn), autoregressive and prompt lookup,
    16 new tokens, greedy fp32: every contract field is present, prompt lookup equals the baseline
    token for token, and the reviewers' checker accepts the file."""
    rows = [json.loads(line) for line in (REPO / "assets" / "bench" / "spec_bench_dev.jsonl").open()]
    picked = [rows[0], next(r for r in rows if r["category"] == "summarization")]
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps(r) + "\n" for r in picked))
    out = tmp_path / "results.jsonl"
    code = bench.main(["--questions", str(questions), "--methods", "autoregressive,prompt_lookup",
                       "--max-new-tokens", "16", "--dtype", "float32", "--out", str(out), "--no-progress"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    records = [json.loads(line) for line in out.read_text().splitlines()]
    keys = [(r["question_id"], r["turn"], r["method"]) for r in records]
    a, b = picked[0]["question_id"], picked[1]["question_id"]
    assert keys == [(a, 0, "autoregressive"), (a, 0, "prompt_lookup"), (a, 1, "autoregressive"),
                    (a, 1, "prompt_lookup"), (b, 0, "autoregressive"), (b, 0, "prompt_lookup")]
    for r in records:
        assert set(CONTRACT_FIELDS) <= set(r)
        assert 0 < r["new_tokens"] == len(r["output_ids"]) <= 16 and r["output_text"]
        assert r["steps"] >= 1 and r["wall_s"] > 0 and 0 < r["ttft_s"] <= r["wall_s"]
        assert r["mean_accepted_tokens"] == pytest.approx(r["new_tokens"] / r["steps"])
    assert records[0]["params"] == {} and records[0]["acceptance_rate"] is None
    assert set(records[1]["params"]) == {"max_ngram_size", "num_pred_tokens"}
    for base, pl in zip(records[::2], records[1::2]):
        assert pl["output_ids"] == base["output_ids"]
    assert "== writing ==" in captured.out and "== overall ==" in captured.out
    assert "prompt_lookup" in captured.out and "yes" in captured.out
    if not CHECK_BENCH.is_file():
        skip_unless_ci(f"{CHECK_BENCH} is absent (shared/ is not beside the repository)")
    p = subprocess.run([sys.executable, str(CHECK_BENCH), str(out), "--lossless", "prompt_lookup"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip().splitlines()[-1].startswith("OK")


def test_other_cpu_load_from_proc_stat(monkeypatch):
    """Busy cores = busy ticks / all ticks over the interval x cores; None where /proc/stat is unreadable."""
    samples = iter([(100.0, 1000.0), (175.0, 1100.0)])  # 75 of 100 ticks busy
    monkeypatch.setattr(bench, "_cpu_times", lambda: next(samples))
    monkeypatch.setattr(bench.os, "cpu_count", lambda: 2)
    assert bench.other_cpu_load(0.0) == pytest.approx(1.5)
    monkeypatch.setattr(bench, "_cpu_times", lambda: None)
    assert bench.other_cpu_load(0.0) is None
