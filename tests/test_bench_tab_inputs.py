"""The Benchmark tab's Run handler on its inputs, without a model (a stand-in runs nothing).

Sampling is per category (the first N of each ticked category, in file order); the file is read
before anything else, so a missing or broken file says so (naming the file the user chose and the
line, never the server's upload path); a file over the size limit, too many questions, and
wrong types are refused with a message, never an exception.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from playground.ui import bench_tab

SPEC = "Spec-Bench dev (bundled)"


def _knobs():
    return [k.default for _, k in bench_tab.knob_keys()]


def _run(set_name, upload, categories, methods=("autoregressive",), per_category=2, max_new=4):
    """(messages shown, questions the stand-in was asked to run)."""
    seen: list[list[dict]] = []

    def stream(key, questions, specs, settings, warmup):
        seen.append(questions)
        yield {"type": "start", "runs": 0}

    methods = methods if isinstance(methods, str) else list(methods)
    out = list(bench_tab.run_benchmark(object(), set_name, upload, categories, methods, per_category, max_new,
                                       False, *_knobs(), stream=stream))
    return [html.unescape(re.sub(r"<[^>]+>", "", o[0])) for o in out], (seen[0] if seen else None)


@pytest.fixture(autouse=True)
def _no_engine_registry(monkeypatch):
    monkeypatch.setattr(bench_tab.worker, "register", lambda engine: "stand-in")


def test_per_category_sample_takes_the_first_n_of_each_category():
    """2 per category over 3 categories: 6 questions, 2 of each, in file order."""
    _, questions = _run(SPEC, None, ["writing", "math", "coding"])
    cats = [q["category"] for q in questions]
    assert len(questions) == 6 and {c: cats.count(c) for c in set(cats)} == {"writing": 2, "math": 2, "coding": 2}
    every = [json.loads(line) for line in Path(bench_tab.bench.BUILTIN_SETS["spec_bench"]).read_text().splitlines()]
    first_writing = [r["question_id"] for r in every if r["category"] == "writing"][:2]
    assert [q["question_id"] for q in questions if q["category"] == "writing"] == first_writing


def test_too_many_questions_and_bad_numbers_are_refused():
    shown, ran = _run(SPEC, None, bench_tab.category_choices(SPEC, None)[0], per_category=bench_tab.MAX_PAGE_QUESTIONS)
    assert ran is None and "at most 40" in shown[0]
    for bad in (0, "two", None, 1.5, True):
        shown, ran = _run(SPEC, None, ["writing"], per_category=bad)
        assert ran is None and len(shown) == 1 and shown[0].count("Questions per category") == 1, (bad, shown)
        assert "per_category" not in shown[0]
    shown, ran = _run(SPEC, None, "writing", methods="autoregressive")  # a bare string: one name
    assert ran is not None and len(ran) == 2


def test_upload_messages_name_the_chosen_file_not_the_server_path(tmp_path):
    """No file: choose one. A broken file: its own name and line (the category box says it too),
    checked before "no category is ticked". Too large: refused with the limit."""
    shown, _ = _run(bench_tab.UPLOAD, None, [])
    assert "choose a file" in shown[0] and "no category" not in shown[0]

    upload_dir = tmp_path / "gradio" / "0123abcd"
    upload_dir.mkdir(parents=True)
    broken = upload_dir / "my set.jsonl"
    broken.write_text(json.dumps({"question_id": 1, "category": "a", "turns": ["Hi"]}) + "\n"
                      + json.dumps({"question_id": 2, "category": "a"}) + "\n")
    shown, _ = _run(bench_tab.UPLOAD, str(broken), [])
    assert "my set.jsonl, line 2:" in shown[0] and str(tmp_path) not in shown[0], shown[0]
    cats, note = bench_tab.category_choices(bench_tab.UPLOAD, str(broken))
    assert cats == [] and "my set.jsonl, line 2:" in note and str(tmp_path) not in note

    big = upload_dir / "big.jsonl"
    with open(big, "wb") as f:
        f.truncate(bench_tab.MAX_UPLOAD_BYTES + 1)
    shown, _ = _run(bench_tab.UPLOAD, str(big), ["a"])
    assert "'big.jsonl' is 5.0 MiB" in shown[0] and "5 MiB" in shown[0] and str(tmp_path) not in shown[0]
    assert bench_tab.launch_options()["max_file_size"] == bench_tab.MAX_UPLOAD_BYTES


def test_page_words_for_columns_categories_and_methods():
    assert bench_tab.column_title("math_reasoning speedup") == "Math reasoning speedup"
    assert bench_tab.column_title("tau") == "τ (tokens per step)"
    assert bench_tab.column_title("mean_accepted_tokens") == "τ (mean accepted tokens)"
    assert [bench_tab.category_title(c) for c in ("translation", "overall", "math_reasoning")] == \
        ["Translation", "Overall", "Math reasoning"]
    assert bench_tab.category_title("qa") == "QA" and bench_tab.method_title("prompt_lookup") == "Prompt lookup"
    assert "_" not in "".join(bench_tab.column_title(c) for c in bench_tab.DETAIL_HEADER)


def test_ticks_move_the_progress_note_while_every_method_steps_on_a_question():
    """Round-robin runs send a tick about every half second while the methods step on a question (the
    records come at its end): the progress bar names the question and nothing else changes."""
    def stream(key, questions, specs, settings, warmup):
        yield {"type": "start", "runs": 2}
        yield {"type": "tick", "question_id": 81, "turn": 0}

    out = list(bench_tab.run_benchmark(object(), SPEC, None, ["writing"], ["autoregressive"], 1, 4, False,
                                       *_knobs(), stream=stream))
    tick = out[1]
    assert len(tick) == 8 and "question 81, turn 1: every method in turn" in html.unescape(str(tick[1]))
    assert tick[0] is not tick[1] and all(t == bench_tab.gr.skip() for t in (tick[0], *tick[2:]))


def test_a_turns_records_reach_the_page_together():
    """Round-robin records of one turn come back to back: the page shows (and saves) them in one update,
    so a Stop can never leave part of a turn in the tables and downloads."""
    def rec(qid, method):
        return {"question_id": qid, "category": "writing", "turn": 0, "method": method, "params": {},
                "new_tokens": 4, "steps": 4, "wall_s": 0.1, "steady_steps": 4.0, "ttft_s": 0.01,
                "tokens_per_s": 40.0, "mean_accepted_tokens": 1.0, "acceptance_rate": None, "output_ids": [1, 2, 3, 4],
                "output_text": "abcd"}

    def stream(key, questions, specs, settings, warmup):
        yield {"type": "start", "runs": 4}
        for qid in (81, 82):
            for m in ("autoregressive", "prompt_lookup"):
                yield {"type": "record", "record": rec(qid, m)}

    out = list(bench_tab.run_benchmark(object(), SPEC, None, ["writing"], ["autoregressive", "prompt_lookup"], 2, 4,
                                       False, *_knobs(), stream=stream))
    progress = [html.unescape(re.sub(r"<[^>]+>", "", str(o[1]))) for o in out[1:]]
    assert len(out) == 4, progress  # start, one update per turn, done
    assert "question 81, turn 1: every method done" in progress[0] and "question 82" in progress[1]


def test_a_benchmark_that_shared_the_machine_says_so_when_done():
    """A page run in flight while the benchmark ran (checked in on the server's record): the Done
    line says the speeds are less reliable; the same benchmark alone does not."""
    from playground.ui.run_control import OVERLAPS, SHARED_NOTE

    def stream(key, questions, specs, settings, warmup):
        yield {"type": "start", "runs": 1}
        yield {"type": "record", "record": {
            "question_id": 81, "category": "writing", "turn": 0, "method": "autoregressive", "params": {},
            "new_tokens": 4, "steps": 4, "wall_s": 0.1, "steady_steps": 4.0, "ttft_s": 0.01, "tokens_per_s": 40.0,
            "mean_accepted_tokens": 1.0, "acceptance_rate": None, "output_ids": [1, 2, 3, 4], "output_text": "abcd"}}

    def done_line():
        out = list(bench_tab.run_benchmark(object(), SPEC, None, ["writing"], ["autoregressive"], 1, 4, False,
                                           *_knobs(), stream=stream))
        return html.unescape(str(out[-1][0]))

    alone = done_line()
    assert alone.count("Done:") == 1 and SHARED_NOTE not in alone
    page_run = OVERLAPS.begin()
    try:
        assert SHARED_NOTE in done_line()
    finally:
        OVERLAPS.end(page_run)


def test_the_benchmark_runs_in_a_thread_that_ends_with_it():
    """The benchmark's runs are pulled in a thread of their own, never in the handler's (Gradio's
    reused worker thread would keep an OpenMP team that slows every later run), and that thread
    ends with the benchmark."""
    import threading

    seen = []

    def stream(key, questions, specs, settings, warmup):
        seen.append(threading.current_thread())
        yield {"type": "start", "runs": 1}

    caller = threading.current_thread()
    out = list(bench_tab.run_benchmark(object(), SPEC, None, ["writing"], ["autoregressive"], 1, 4, False,
                                       *_knobs(), stream=stream))
    assert "Done" in str(out[-1][0])
    assert seen and seen[0] is not caller
    seen[0].join(5)
    assert not seen[0].is_alive()


def test_a_stopped_run_keeps_its_counts_and_says_stopped():
    """Once a run's event ends, a bar still marked running (a Stop ended it mid-question; it kept
    "question N, turn 1: every method in turn") keeps its counts and says "stopped"; a finished
    run's bar and a bar that is not a running one are left as they are."""
    bar = bench_tab.progress_html(7, 20, "question 81, turn 1: every method in turn", running=True)
    after = bench_tab.ended_progress(bar)
    assert after == bench_tab.progress_html(7, 20, "stopped")
    assert "7/20 runs (35%) stopped" in after and "question 81" not in after
    for left in (bench_tab.progress_html(20, 20, "done"), bench_tab.progress_html(0, 0, "not started"), None):
        assert bench_tab.ended_progress(left) == bench_tab.gr.skip()
    # No runs yet: an empty bar (max 0 drew it full), counts as written.
    assert '<progress max="1" value="0"' in bench_tab.progress_html(0, 0, "not started")
    assert bench_tab.ended_progress(bench_tab.progress_html(0, 0, "warm-up", running=True)) == \
        bench_tab.progress_html(0, 0, "stopped")


def test_alpha_reads_as_a_percentage_as_on_the_playground():
    """The detail table shows alpha as the Playground's stats line does (``52%``), not as the CLI's
    fraction; the numbers underneath stay as the benchmark printed them (the downloads keep fractions)."""
    header = list(bench_tab.DETAIL_HEADER)
    line = ["writing", "prompt_lookup", 2, 128, "21.9", "1.36x", "1.58", "0.523", "yes"]
    assert len(line) == len(header)
    shown = bench_tab.table_value(header, [line, [*line[:7], "-", "yes"]]).to_html()
    assert "52%" in shown and "0.523" not in shown and "1.36×" in shown
    assert [bench_tab.render.percent_text(x) for x in (0.5234, "1.000", "-", None, float("nan"))] == \
        ["52%", "100%", "-", "-", "-"]


class _TimedEngine:
    """An engine whose per-step budget timed a plain step of 50 ms (20 tokens/s)."""

    def persisted(self, key):
        from playground.engine.budget import StepCost
        from playground.engine.theory import VerifyCost

        if key != "step_cost":
            return None
        curve = VerifyCost({1: 1.0, 2: 1.1}, {1: 0.05, 2: 0.055})
        return StepCost(curve, curve, short_context=48)


def test_the_plan_under_run_counts_runs_and_bounds_the_time():
    """Writing has two-turn questions (MT-bench): 2 questions, 4 turns; 3 methods -> 12 runs of up to 64
    tokens, about 12 * 64 * 0.05 s = 38 s at plain decoding's 20 tokens/s."""
    text = html.unescape(re.sub(r"<[^>]+>", "", bench_tab.plan(_TimedEngine(), SPEC, None, ["writing"],
                                                              ["autoregressive", "prompt_lookup", "suffix"], 2, 64)))
    assert text.startswith("Next run: 2 questions (4 turns) × 3 methods (autoregressive included) = 12 runs of up "
                           "to 64 new tokens") and "about 38 s on this machine" in text and "20.0 tokens/s" in text
    # Not timed yet (models loaded on the Models tab): no duration, and when one will show; the baseline is
    # counted when not ticked.
    text = bench_tab.plan(object(), SPEC, None, ["qa"], ["suffix"], 3, 128)
    assert "3 questions × 2 methods" in text and "= 6 runs of up to 128 new tokens; " in text and "about" not in text
    assert "once these models have run" in text
    # What Run would refuse, it says here first.
    for inputs, words in (((["writing"], [], 2, 64), "no method is ticked"), (([], ["suffix"], 2, 64), "no category"),
                          ((["writing"], ["suffix"], 0, 64), "Questions per category must be in [1, 40]"),
                          ((bench_tab.category_choices(SPEC, None)[0], ["suffix"], 40, 64), "at most 40")):
        text = html.unescape(bench_tab.plan(_TimedEngine(), SPEC, None, *inputs))
        assert "Run would stop here: " in text and words in text, text


def test_columns_are_as_wide_as_their_longest_word():
    """Each column fits its longest word, of the title or of a cell; numbers count as six characters."""
    from playground.ui.bench_view import CELL_PAD_PX, CHAR_PX, column_widths

    widths = column_widths(["Method", "Summarization speedup", "τ"], [["Autoregressive", 1.0, 1.0], ["Suffix decoding", 1.37, 1.6]])
    px = [float(w.removesuffix("px")) for w in widths]
    assert px == [round(CELL_PAD_PX + CHAR_PX * n) for n in (len("Autoregressive"), len("Summarization"), 6)]
