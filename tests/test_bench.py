"""Tests of the benchmark package (playground/bench/): questions, runner, summary, records, cli.

The summary tests use hand-made records; the end-to-end test runs the real embedded model on
three short turns and checks the records with the project's own code (``bench.check_records``,
the contract fields, the summary's lossless cell). The reviewers' checker,
``shared/tools/check_bench.py`` beside the repository, is only a reviewer's aid: run when it is
there; when it is absent the test is skipped, or fails under ``CI``. The checks that need loaded
models (context, Medusa tree, draft heads, errors during runs) run ``cli.main`` on tiny random
models instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from helpers import ByteTokenizer, FakeLoaded, noisy_copy, tiny_llama

from playground import bench
from playground.bench import cli, runner

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(__file__).resolve().parents[2] / "shared"
CHECK_BENCH = SHARED / "tools" / "check_bench.py"
CHECK_BENCH_ABSENT = "check_bench.py is absent (shared/ is not beside the repository)"
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


def test_summary_speedup_reads_steady_steps_of_round_robin_records():
    """Records of ``scripts/bench_interleaved.py`` carry ``steady_steps`` (time in the baseline's
    contemporaneous steps): the speedup is then read from those (as the script's own table and
    ``playground.measure`` do), tokens/s still from seconds; one record without them: seconds."""
    records = [
        dict(rec(1, "autoregressive", 10, 4.0, 10, [1] * 10, category="qa"), steady_steps=10.0),
        dict(rec(1, "prompt_lookup", 10, 0.5, 4, [1] * 10, category="qa"), steady_steps=5.0),
    ]
    overall = row(bench.summarize(records), "overall", "prompt_lookup")
    assert overall["speedup"] == pytest.approx(2.0) and overall["tokens_per_s"] == pytest.approx(20.0)
    del records[1]["steady_steps"]
    assert row(bench.summarize(records), "overall", "prompt_lookup")["speedup"] == pytest.approx(8.0)


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


def test_per_category_takes_the_first_n_of_each_category_in_file_order(tmp_path):
    """--per-category N keeps the first N rows of every category, in file order, before --limit; the
    built-in Spec-Bench set (MT-bench first) then holds every category."""
    f = tmp_path / "q.jsonl"
    cats = ["writing", "writing", "qa", "writing", "qa", "math"]
    f.write_text("".join(json.dumps({"question_id": i, "category": c, "turns": [f"q{i}"]}) + "\n"
                         for i, c in enumerate(cats)))
    assert [q.question_id for q in bench.load_questions(f, per_category_n=1)] == [0, 2, 5]
    assert [q.question_id for q in bench.load_questions(f, per_category_n=2)] == [0, 1, 2, 4, 5]
    assert [q.question_id for q in bench.load_questions(f, ["qa", "math"], per_category_n=1)] == [2, 5]
    assert [q.question_id for q in bench.load_questions(f, per_category_n=2, limit=3)] == [0, 1, 2]
    with pytest.raises(bench.BenchError, match="--per-category must be at least 1, got 0"):
        bench.load_questions(f, per_category_n=0)
    sample = bench.load_questions("spec_bench", per_category_n=2)
    every = {q.category for q in bench.load_questions("spec_bench")}
    assert {q.category for q in sample} == every and len(sample) == 2 * len(every)


def test_check_records_reads_a_results_file_as_a_review_does():
    """The project's own check: contract fields, lossless by output_ids against the baseline,
    speedup as total tokens over total seconds, tau as total tokens over total steps."""
    records = [rec(1, "autoregressive", 10, 2.0, 10, [1, 2]), rec(1, "prompt_lookup", 10, 1.0, 4, [1, 2]),
               rec(2, "autoregressive", 10, 2.0, 10, [3]), rec(2, "prompt_lookup", 10, 1.0, 4, [4])]
    assert bench.check_records(records[:2], ["prompt_lookup"], {"prompt_lookup": 1.9}, {"prompt_lookup": 2.5}) == []
    problems = bench.check_records(records, ["prompt_lookup"], {"prompt_lookup": 2.5}, {"prompt_lookup": 3.0})
    assert problems == ["prompt_lookup: 1/2 outputs differ from autoregressive (e.g. ('2', 0))",
                        "prompt_lookup: speedup 2.00 below 2.5", "prompt_lookup: tau 2.50 below 3.0"]
    assert bench.check_records(records[1:2]) == ["no autoregressive records"]
    partial = {k: v for k, v in records[0].items() if k != "ttft_s"}
    assert bench.check_records([partial]) == ["record 1 lacks ttft_s"]


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
    (["--per-category", "0"], "--per-category must be at least 1"),
    (["--methods", "autoregressive,draft_model", "--draft", "none"], "draft_model needs a draft model: add --draft MODEL"),
    (["--methods", "autoregressive,medusa", "--tree", "[[0], [0, 0"],
     "--tree: the tree is not valid JSON: Expecting ',' delimiter at line 1, column 12"),
])
def test_usage_errors_exit_2_with_one_line(argv, message, capsys, tmp_path):
    assert cli.main(argv + ["--out", str(tmp_path / "r.jsonl")]) == 2
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
    params = cli.method_params(["autoregressive", "prompt_lookup"],
                                 {"max_ngram_size": 2, "num_pred_tokens": 5, "k": None})
    assert params == {"autoregressive": {}, "prompt_lookup": {"max_ngram_size": 2, "num_pred_tokens": 5}}
    assert cli.parse_methods("prompt_lookup") == ["autoregressive", "prompt_lookup"]
    from playground.engine import METHODS

    if "lookahead" in METHODS:  # --ngram and --guess set whichever spelling the method declares
        names = {k.name for k in METHODS["lookahead"].knobs}
        got = cli.method_params(["lookahead"], {"window": 4, "ngram": 3, "guess": 2})["lookahead"]
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
    code = cli.main(["--questions", str(questions), "--methods", "autoregressive,prompt_lookup",
                       "--max-new-tokens", "16", "--dtype", "float32", "--out", str(out), "--no-progress"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    records = [json.loads(line) for line in out.read_text().splitlines()]
    keys = [(r["question_id"], r["turn"], r["method"]) for r in records]
    a, b = picked[0]["question_id"], picked[1]["question_id"]
    assert keys == [(a, 0, "autoregressive"), (a, 0, "prompt_lookup"), (a, 1, "autoregressive"),
                    (a, 1, "prompt_lookup"), (b, 0, "autoregressive"), (b, 0, "prompt_lookup")]
    for r in records:
        assert set(CONTRACT_FIELDS) <= set(r) and not bench.missing_fields(r)
        assert 0 < r["new_tokens"] == len(r["output_ids"]) <= 16 and r["output_text"]
        assert r["steps"] >= 1 and r["wall_s"] > 0 and 0 < r["ttft_s"] <= r["wall_s"]
        assert r["mean_accepted_tokens"] == pytest.approx(r["new_tokens"] / r["steps"])
        assert r["steady_steps"] > 0  # round-robin by default: time in the baseline's steps
    assert records[0]["params"] == {} and records[0]["acceptance_rate"] is None
    assert set(records[1]["params"]) == {"max_ngram_size", "num_pred_tokens", "budget"}
    for base, pl in zip(records[::2], records[1::2]):
        assert pl["output_ids"] == base["output_ids"]
    assert "== writing ==" in captured.out and "== overall ==" in captured.out
    assert "prompt_lookup" in captured.out and "yes" in captured.out
    # The project's own check of the file, as a review reads it.
    assert bench.read_records(out) == records
    assert bench.check_records(records, lossless=["prompt_lookup"]) == []
    assert row(bench.summarize(records), "overall", "prompt_lookup")["lossless"] == "yes"
    # The reviewers' checker beside the repository, when it is there (a reviewer's aid only).
    if not CHECK_BENCH.is_file():
        if os.environ.get("CI"):
            pytest.fail(CHECK_BENCH_ABSENT)
        pytest.skip(CHECK_BENCH_ABSENT)
    p = subprocess.run([sys.executable, str(CHECK_BENCH), str(out), "--lossless", "prompt_lookup"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip().splitlines()[-1].startswith("OK")


def test_other_cpu_load_from_proc_stat(monkeypatch):
    """Busy cores = busy ticks / all ticks over the interval x cores; None where /proc/stat is unreadable."""
    samples = iter([(100.0, 1000.0), (175.0, 1100.0)])  # 75 of 100 ticks busy
    monkeypatch.setattr(runner, "_cpu_times", lambda: next(samples))
    monkeypatch.setattr(runner.os, "cpu_count", lambda: 2)
    assert runner.other_cpu_load(0.0) == pytest.approx(1.5)
    monkeypatch.setattr(runner, "_cpu_times", lambda: None)
    assert runner.other_cpu_load(0.0) is None


# ----- checks that need the models, on tiny random models (no download) --------------------------
class _TextTokenizer(ByteTokenizer):
    """ByteTokenizer with the call interface ``Engine.encode_prompt`` uses for templateless text."""

    chat_template = None

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": self.encode(text)}


@dataclass
class _Loaded(FakeLoaded):
    """FakeLoaded plus what the benchmark prints (dtype, device) and a draft's saved knob values."""

    dtype: torch.dtype = torch.float32
    device: str = "cpu"
    knob_defaults: dict = field(default_factory=dict)


@pytest.fixture(scope="module")
def tiny_models():
    """A tiny random target over the byte vocabulary (260 ids) and a noisy copy as its draft."""
    target = tiny_llama(3, vocab_size=260)
    return target, noisy_copy(target, 0.03, 4)


@dataclass
class _BenchRun:
    code: int
    out: str
    err: str
    forwards: int  # target forward passes (0: stopped before any run or warm-up)
    loaded: bool  # load_engine was called
    results: Path


@pytest.fixture
def tiny_bench(tiny_models, torch_single_thread, monkeypatch, tmp_path, capsys):
    """``run(argv, turns=..., context_length=64, medusa_heads=None, draft_knobs=None) -> _BenchRun``:
    cli.main with load_engine replaced by an engine over the tiny models (and, when asked,
    ``medusa_heads`` untrained Medusa heads), on a questions file of the given first turns."""
    from playground.engine import Engine, MedusaHeads

    target_model, draft_model = tiny_models
    monkeypatch.setattr(runner, "other_cpu_load", lambda seconds=0.5: None)

    def run(argv, turns=("Hi there", "Say more"), context_length=64, medusa_heads=None, draft_knobs=None):
        loaded = []

        def load_engine(args, methods):
            loaded.append(methods)
            tok = _TextTokenizer()
            heads = None
            if medusa_heads:
                cfg = target_model.config
                heads = MedusaHeads(cfg.hidden_size, cfg.vocab_size, medusa_heads, 1).attach_lm_head(
                    target_model.get_output_embeddings()).eval().requires_grad_(False)
            return Engine(_Loaded(target_model, tok, context_length=context_length),
                          _Loaded(draft_model, tok, context_length=context_length, knob_defaults=draft_knobs or {}),
                          medusa=heads)
        monkeypatch.setattr(cli, "load_engine", load_engine)
        questions = tmp_path / "q.jsonl"
        questions.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [t]}) + "\n"
                                     for i, t in enumerate(turns)))
        results = tmp_path / "r.jsonl"
        calls = [0]
        hook = target_model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        try:
            code = cli.main(["--questions", str(questions), "--out", str(results), "--no-progress",
                               "--max-new-tokens", "8"] + argv)
        finally:
            hook.remove()
        captured = capsys.readouterr()
        return _BenchRun(code, captured.out, captured.err, calls[0], bool(loaded), results)
    return run


def _one_line_error(r: _BenchRun, message: str) -> None:
    """Exit status 2 and one ``error:`` line holding ``message``; no traceback, no table."""
    assert r.code == 2, r.err
    errors = [line for line in r.err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and message in errors[0], r.err
    assert "Traceback" not in r.err and "== overall ==" not in r.out


def test_tiny_benchmark_runs_and_skips_what_does_not_fit(tiny_bench):
    """The happy path on the tiny models: a question that fits runs (exit 0, records written), one
    whose prompt with --max-new-tokens exceeds the context is skipped with a note."""
    r = tiny_bench([], turns=("Hi", "x" * 60), context_length=64)
    assert r.code == 0, r.err
    assert "skipping question 1 from turn 0" in r.err and "exceeds the context of 64" in r.err
    records = [json.loads(line) for line in r.results.read_text().splitlines()]
    assert [(x["question_id"], x["method"]) for x in records] == [(0, "autoregressive"), (0, "prompt_lookup")]
    assert "== overall ==" in r.out


def test_medusa_tree_deeper_than_the_heads_fails_before_any_run(tiny_bench):
    """A custom --tree deeper than the heads loaded is one error line naming --tree and the depth,
    raised once the heads are loaded and before the warm-up or the baseline runs a forward pass."""
    tree = "[[0],[0,0],[0,0,0],[0,0,0,0],[0,0,0,0,0]]"
    r = tiny_bench(["--methods", "autoregressive,medusa", "--tree", tree], medusa_heads=4)
    _one_line_error(r, "medusa cannot run: --tree: path [0, 0, 0, 0, 0] has depth 5, beyond the 4 Medusa heads")
    assert r.loaded and r.forwards == 0 and not r.results.exists()


def test_draft_proposer_medusa_heads_without_draft_heads(tiny_bench):
    """--proposer medusa_heads without --draft-medusa fails before the models load; the same
    setting reaching the engine another way (a draft's saved values) fails after loading, before
    any forward pass, with the engine's reason."""
    r = tiny_bench(["--methods", "autoregressive,draft_model", "--proposer", "medusa_heads"])
    _one_line_error(r, "--proposer medusa_heads needs Medusa heads trained on the draft model: add --draft-medusa")
    assert not r.loaded
    r = tiny_bench(["--methods", "autoregressive,draft_model"], draft_knobs={"proposer": "medusa_heads"})
    _one_line_error(r, "draft_model cannot run: the draft model's proposer 'Medusa heads on the draft' needs Medusa heads")
    assert r.loaded and r.forwards == 0


def test_max_new_tokens_filling_the_context_is_refused_up_front(tiny_bench):
    """--max-new-tokens at least the target's context leaves no room for any prompt: refused once the
    model (and so its context) is known, before any forward pass."""
    r = tiny_bench(["--max-new-tokens", "64"], context_length=64)
    _one_line_error(r, "--max-new-tokens 64 leaves no room for the prompt: tiny's context holds 64 tokens")
    assert r.forwards == 0


def test_no_question_fitting_the_context_is_an_error(tiny_bench, monkeypatch):
    """When every question's first prompt with --max-new-tokens exceeds the context, the benchmark
    says so before running (naming the largest --max-new-tokens that would fit); and should every
    question still be skipped during the runs, it exits 2 instead of reporting an empty table."""
    long_turns = ("y" * 50, "z" * 52)
    r = tiny_bench(["--max-new-tokens", "20"], turns=long_turns, context_length=64)
    _one_line_error(r, "no question fits tiny's context of 64 tokens with --max-new-tokens 20: the shortest "
                       "first prompt is 50 tokens, so use --max-new-tokens 14 or fewer")
    assert r.forwards == 0
    monkeypatch.setattr(runner, "check_runnable", lambda *args: None)  # the last line of defence
    r = tiny_bench(["--max-new-tokens", "20", "--warmup", "0"], turns=long_turns, context_length=64)
    _one_line_error(r, "no question could be run: each was skipped because its prompt with --max-new-tokens 20 "
                       "exceeds tiny's context of 64 tokens")
    assert r.err.count("skipping question") == 2


@pytest.mark.parametrize("how,flags", [("step_method", []), ("run_method", ["--sequential"])])
def test_engine_value_errors_during_runs_are_one_line_but_bugs_are_not_hidden(tiny_bench, monkeypatch, how, flags):
    """A ValueError from the engine in the middle of the runs (a message about the user's input)
    becomes one error line with exit status 2; any other exception still propagates. Round-robin
    runs step each method with ``step_method`` (the second method fails after its first step, with
    the baseline mid-answer), ``--sequential`` ones run it with ``run_method``."""
    real = getattr(runner, how)
    calls = []

    def failing(kind):
        def start(engine, ids, spec, settings, scope=None):
            calls.append(spec.name)
            if len(calls) != 2:
                return real(engine, ids, spec, settings)
            if how == "run_method":
                raise kind("the engine's reason")

            def one_step_then_fail():
                yield next(real(engine, ids, spec, settings))
                raise kind("the engine's reason")
            return one_step_then_fail()
        return start
    monkeypatch.setattr(runner, how, failing(ValueError))
    _one_line_error(tiny_bench(["--warmup", "0"] + flags), "run failed: the engine's reason")
    calls.clear()
    monkeypatch.setattr(runner, how, failing(RuntimeError))
    with pytest.raises(RuntimeError, match="the engine's reason"):
        tiny_bench(["--warmup", "0"] + flags)


def test_stop_strings_end_every_method_at_the_same_place(tiny_bench):
    """--stop (repeatable) reaches every run as GenerationSettings(stop_strings=...): each answer ends at
    its first stop string (kept), finish reason "stop", the lossless methods still equal to the baseline."""
    argv = ["--warmup", "0", "--max-new-tokens", "40"]
    r = tiny_bench(argv, turns=("Hi there",))
    assert r.code == 0, r.err
    plain = [json.loads(line) for line in r.results.read_text().splitlines()]
    ids, text = plain[0]["output_ids"], plain[0]["output_text"]
    # Two printable ASCII bytes after the first few tokens: a stop string spanning two tokens.
    start = next(i for i in range(3, len(ids) - 1) if all(32 <= t < 127 for t in ids[i:i + 2]))
    stop = bytes(ids[start:start + 2]).decode()
    r = tiny_bench(argv + ["--stop", stop, "--stop", "\x00never"], turns=("Hi there",))
    assert r.code == 0, r.err
    records = [json.loads(line) for line in r.results.read_text().splitlines()]
    end = text.index(stop) + len(stop)
    for x in records:
        assert x["finish_reason"] == "stop" and x["output_text"] == text[:end], x
        assert x["stop_strings"] == [stop, "\x00never"]
    assert records[1]["output_ids"] == records[0]["output_ids"]


def test_the_runner_checks_once_for_every_caller(tiny_models, torch_single_thread):
    """bench.prepare (the page's and the CLI's one place for run checks) refuses a method the loaded
    models cannot run and a bad setting, in the page's words; a prepared benchmark runs turn by turn."""
    from playground.engine import Engine, GenerationSettings, MethodSpec

    tok = _TextTokenizer()
    engine = Engine(_Loaded(tiny_models[0], tok, context_length=64))
    qs = [bench.Question(1, "qa", ("Hi", "More"))]
    settings = GenerationSettings(8)
    with pytest.raises(bench.BenchError, match="draft_model cannot run: no draft model is loaded"):
        bench.prepare(engine, qs, [MethodSpec("autoregressive"), MethodSpec("draft_model")], settings)
    with pytest.raises(bench.BenchError, match="num_pred_tokens must be in"):
        bench.prepare(engine, qs, [MethodSpec("prompt_lookup", {"num_pred_tokens": 0})], settings)
    with pytest.raises(bench.BenchError, match="^max new tokens 64 leaves no room for the prompt"):
        bench.prepare(engine, qs, [MethodSpec("autoregressive")], GenerationSettings(64))
    run = bench.prepare(engine, qs, [MethodSpec(m) for m in bench.order_methods(["prompt_lookup"])], settings)
    assert run.total_runs == 4 and run.extra == {"temperature": 0.0, "dtype": "float32", "target": "tiny"}
    items = list(run.iter())
    assert [(kind, x["turn"], x["method"]) for kind, x, _ in items] == [
        ("record", 0, "autoregressive"), ("record", 0, "prompt_lookup"),
        ("record", 1, "autoregressive"), ("record", 1, "prompt_lookup")]


def test_help_names_every_default_in_plain_words():
    """--help gives each option's default (the knobs' from the engine's limits) and uses the names a
    user types (methods, presets), not internal parameter names."""
    from playground.engine import K_KNOB, LOOKAHEAD_WINDOW_KNOB, METHODS, TREE_PRESETS

    parser = cli.build_parser()
    for action in parser._actions:
        if action.dest != "help":
            assert "default" in (action.help or ""), f"{action.option_strings} does not say its default"
    text = " ".join(parser.format_help().split())
    assert "(default: autoregressive,prompt_lookup)" in text
    assert f"(1 to {int(K_KNOB.maximum)}, default {K_KNOB.default}," in text
    assert f"default {LOOKAHEAD_WINDOW_KNOB.default})" in text
    assert "among " + ", ".join(METHODS) + ";" in text
    assert cli.TREE_PRESET_NAMES == tuple(TREE_PRESETS)
    for internal in ("tree_choices", "guess_set_size", "ngram_size", "num_pred_tokens", "max_ngram_size"):
        assert internal not in text


def test_medusa_summary_names_the_tree_and_each_heads_acceptance():
    """The benchmark's Medusa lines after the tables: the tree used and per-head acceptance (it called
    an Engine method that the redesign moved, and crashed after the records were written)."""
    from types import SimpleNamespace

    from playground.bench.summary import medusa_summary

    engine = SimpleNamespace(medusa=SimpleNamespace(num_heads=4))
    records = [{"method": "medusa", "accepted_at": [5, 2], "proposed_at": [10, 10]},
               {"method": "autoregressive"}]
    text = medusa_summary(engine, records, "depth3")
    assert text.startswith("medusa tree: depth3: 4 nodes, depth 3\n")
    assert "head 1 50.0% (50.0%), head 2 20.0% (40.0%)" in text
