"""The Benchmark tab: the benchmark of ``python -m playground.bench``, run from the page.

Questions come from the bundled sets (``assets/bench/``) or an uploaded JSONL in either format
(Spec-Bench or HumanEval rows), parsed by ``bench.load_questions``; the runs, and every check
of them, are the benchmark runner's (``bench.prepare``, through :func:`worker.stream_bench`);
the table and its numbers are ``bench.summarize`` / ``bench.table_cells`` /
``bench.leaderboard``: the functions the command line prints with, so the page and the CLI
cannot disagree. Downloads hold the same records the CLI writes (JSONL) and the same as CSV
(``bench.to_jsonl``, ``bench.to_csv``).
"""

from __future__ import annotations

import html
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Iterator

import gradio as gr

from playground import bench
from playground.engine import BASELINE, METHODS, Knob, MethodSpec

from . import charts, models_tab, render, worker
from .knobs import LooseCheckboxGroup, knob_input
from .run_control import OVERLAPS, SHARED_NOTE, EventPump, StopSignals
from .bench_view import (category_title, column_title, column_widths, ended_progress, load_leaderboard,  # noqa: F401
                         method_title, number_text, plan_html, plan_problem_html, progress_html, speedup_text,
                         status_text, write_files)
from .toast import warning

SETS = {"Spec-Bench dev (bundled)": "spec_bench", "HumanEval dev (bundled)": "humaneval"}
UPLOAD = "Upload a JSONL file"
MAX_PAGE_QUESTIONS = 40
"""Most questions one benchmark from the page may run (the CLI has no such bound)."""
MAX_PAGE_NEW_TOKENS = 512
"""Most new tokens per run in a benchmark from the page."""
MAX_UPLOAD_BYTES = 5 * 1024 * 1024
"""Largest question file the tab accepts (5 MiB: the whole of Spec-Bench is under 1 MiB). Gradio
refuses larger uploads itself (``launch(max_file_size=...)``, see :func:`launch_options`) and
:func:`questions_path` checks again for API clients."""
PER_CATEGORY_KNOB = Knob("per_category", "Questions per category", 1, MAX_PAGE_QUESTIONS, 2,
                         info="The first N questions of each ticked category, in the file's order, so every "
                              "category is sampled alike; every turn of a multi-turn question (MT-bench's two) "
                              "is run.")
NEW_TOKENS_KNOB = Knob("max_new_tokens", "Max new tokens", 1, MAX_PAGE_NEW_TOKENS, 64,
                       info="Per run; greedy decoding, so lossless methods can be checked.")
DETAIL_HEADER = ["category", *bench.TABLE_HEADER]
"""Columns of :func:`tables`' detail lines (the benchmark's printed table, with the category first)."""
SPEED_TITLE, TAU_TITLE = "Speedup over autoregressive, by category", "Tau per method"
"""Titles of the tab's two charts before a run (the charts of a run have their own)."""


def launch_options() -> dict:
    """Keyword arguments for ``demo.launch()`` that guard the server: the upload size limit, and
    ``show_error`` so that a request Gradio refuses before any handler runs (an API call with
    missing inputs) is answered with Gradio's message instead of an error without text (every
    handler of the page catches its own errors and shows them as warnings)."""
    return {"max_file_size": MAX_UPLOAD_BYTES, "show_error": True}


def upload_name(upload) -> str:
    """The name of the file the user chose (Gradio keeps it as the last part of its upload path),
    never the server's folder."""
    return Path(str(upload)).name or "the uploaded file"


def _user_message(error: Exception, upload) -> str:
    """A question-file error as the page shows it: the server's upload path replaced by the name of
    the file the user chose, ``name:3: ...`` and ``name: line 3: ...`` as ``name, line 3: ...``."""
    text = str(error)
    if upload:
        name = upload_name(upload)
        for path in (str(upload), os.path.dirname(str(upload))):
            if path:
                text = text.replace(repr(path), repr(name)).replace(path, name)
        text = re.sub(re.escape(name) + r":(?: line)? ?(\d+):", lambda m: f"{name}, line {m.group(1)}:", text)
    return text


def questions_path(set_name: str, upload: str | None) -> str:
    """The file (or built-in set name) ``bench.load_questions`` should read.

    Raises:
        bench.BenchError: upload chosen but no file given, or a file over :data:`MAX_UPLOAD_BYTES`
            (the message names the file the user chose, never the server's path).
    """
    if set_name == UPLOAD:
        if not upload:
            raise bench.BenchError("choose a file to upload: one JSON object a line, Spec-Bench questions "
                                   "or HumanEval tasks")
        try:
            size = os.path.getsize(str(upload))
        except OSError:
            raise bench.BenchError(f"cannot read {upload_name(upload)!r}: upload it again") from None
        if size > MAX_UPLOAD_BYTES:
            raise bench.BenchError(f"{upload_name(upload)!r} is {size / 2**20:.1f} MiB; the largest question file "
                                   f"the page takes is {MAX_UPLOAD_BYTES / 2**20:.0f} MiB")
        return str(upload)
    return SETS.get(set_name, "spec_bench")


def read_questions(set_name: str, upload: str | None) -> list:
    """Every question of the chosen set or uploaded file, in file order.

    Raises:
        bench.BenchError: as :func:`questions_path` and ``bench.read_questions``, the message naming
            the file the user chose and the line at fault.
    """
    try:
        return bench.read_questions(questions_path(set_name, upload))
    except bench.BenchError as e:
        raise bench.BenchError(_user_message(e, upload if set_name == UPLOAD else None)) from None


def category_choices(set_name: str, upload: str | None) -> tuple[list[str], str]:
    """``(categories in file order, message)``; an unreadable file gives no categories and the reason."""
    try:
        qs = read_questions(set_name, upload)
    except bench.BenchError as e:
        return [], str(e)
    cats = list(dict.fromkeys(q.category for q in qs))
    return cats, f"{render.plural(len(qs), 'question')} in {render.plural(len(cats), 'category', 'categories')}"


def table_value(header: list[str], lines: list[list]):
    """A read-only table's value: the numbers as they are (``value["data"]``), shown formatted through
    a pandas Styler (Gradio's display values): speedups ``1.47×``, alpha ``52%``, others ``1.20``.

    ``header`` holds the benchmark's column names (``tau``, ``writing speedup``); the table shows
    them as :func:`column_title` words, and method names as their page labels."""
    import pandas as pd

    titles = [column_title(c) for c in header]
    shown = [[method_title(v) if c == "method" else category_title(v) if c == "category" else v
              for c, v in zip(header, line)] for line in lines]
    df = pd.DataFrame(shown, columns=titles)
    formats = {t: speedup_text if "speedup" in c else render.percent_text if c == "alpha" else number_text
               for c, t in zip(header, titles) if c in ("speedup", "tau", "tokens/s", "alpha") or c.endswith(" speedup")}
    return df.style.format(formats, na_rep="-").hide(axis="index")


def _chart_rows(rows: list[dict]) -> list[dict]:
    """Summary rows for the charts: page labels for methods, categories as page words, escaped
    (Plotly reads tags such as ``<b>`` in labels; it shows ``&lt;b&gt;`` as the text ``<b>``)."""
    return [{**r, "method": method_title(r["method"]),
             "category": html.escape(category_title(r["category"]), quote=False)} for r in rows]


def tables(records: list[dict]) -> tuple[list[dict], list[str], list[list], list[list]]:
    """``(summary rows, leaderboard header, leaderboard lines, detail lines)`` of the records.

    Detail lines are ``[category, *bench.table_cells(row)]``: the cells the CLI prints; the page
    shows both tables through :func:`table_value` (speedups with ×, two decimals).
    """
    rows = bench.summarize(records)
    header, lines = bench.leaderboard(rows)
    return rows, header, lines, [[r["category"], *bench.table_cells(r)] for r in rows]


def _frame(header: list[str], lines: list[list]):
    """A results table's update: :func:`table_value`, columns as wide as their longest word."""
    shown = table_value(header, lines)
    return gr.Dataframe(value=shown, headers=[column_title(c) for c in header],
                        column_widths=column_widths(list(shown.data.columns), shown.data.values.tolist()))


def _outputs(status: str, bar, records: list[dict], files=(None, None)) -> tuple:
    """(status, progress, leaderboard, detail table, speedup figure, tau figure, csv, jsonl)."""
    if not records:
        return (status, bar, gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip())
    rows, header, lines, detail = tables(records)
    shown = _chart_rows(rows)
    return (status, bar, _frame(header, lines), _frame(DETAIL_HEADER, detail),
            charts.bench_speedup_figure(shown, baseline=method_title(BASELINE)),
            charts.bench_tau_figure(shown, category_title("overall")),
            files[0], files[1])


def _checked(knob: Knob, value):
    """``knob.check(value)``, its message naming the knob by its page label.

    Raises:
        ValueError: out of range or not a number (``Questions per category must be in [1, 40], got 0``).
    """
    try:
        return knob.check(value)
    except ValueError as e:
        raise ValueError(str(e).replace(knob.name, knob.label, 1)) from None


def knob_keys() -> list[tuple[str, Knob]]:
    """``(method, knob)`` of each knob input of the tab, in order."""
    return [(m, k) for m, info in METHODS.items() for k in info.knobs]


RUNS = StopSignals()
"""The sessions whose benchmark run is on (armed by Run, released when its event ends): ``RUNS.armed``."""


def choose(set_name, upload, categories, methods, per_category, max_new_tokens) -> tuple[list, list[str], int]:
    """``(questions, method names in run order with the baseline first, max new tokens)`` of the tab's inputs
    (as :func:`run_benchmark` takes them).

    Raises:
        bench.BenchError, ValueError, TypeError: an input the page refuses; the message says which and why.
    """
    per_cat, max_new = (int(_checked(k, v)) for k, v in ((PER_CATEGORY_KNOB, per_category),
                                                         (NEW_TOKENS_KNOB, max_new_tokens)))
    every = read_questions(set_name, upload)  # the file first: its own error, not "no category"
    if isinstance(categories, str):
        categories = [categories]
    if not categories:
        raise bench.BenchError("no category is ticked: choose at least one")
    present = {q.category for q in every}
    missing = [c for c in categories if c not in present]
    if missing:
        raise bench.BenchError(f"no questions in categories {', '.join(map(str, missing))}")
    wanted = set(categories)
    questions = bench.per_category([q for q in every if q.category in wanted], per_cat)
    if len(questions) > MAX_PAGE_QUESTIONS:
        raise bench.BenchError(f"that is {len(questions)} questions; a benchmark from the page runs at most "
                               f"{MAX_PAGE_QUESTIONS}: tick fewer categories or ask fewer per category")
    if isinstance(methods, str):
        methods = [methods]
    chosen = [m for m in METHODS if m in (methods or [])]
    if not chosen:
        raise bench.BenchError("no method is ticked: choose at least one (the baseline is added)")
    names = bench.order_methods(chosen)
    return questions, names, max_new


def plan(engine, *inputs) -> str:
    """The line under Run (``#bench-plan``): what Run would do with ``inputs`` (:func:`choose`'s), and for
    how long at most on ``engine``'s device (its plain step as the per-step budget timed it, if it has);
    or why Run would refuse them."""
    try:
        questions, names, max_new = choose(*inputs)
    except (bench.BenchError, ValueError, TypeError) as e:
        return plan_problem_html(str(e))
    steps = getattr(engine, "persisted", lambda key: None)("step_cost")  # None: an engine without its timing
    return plan_html(sum(len(q.turns) for q in questions), len(questions), len(names), max_new,
                     steps.chain.seconds.get(1) if steps is not None else None)


def run_benchmark(engine, set_name, upload, categories, methods, per_category, max_new_tokens, warmup,
                  *knob_values, stream=None) -> Iterator[tuple]:
    """The tab's Run handler: stream progress, the tables, the charts and the downloads.

    Args:
        set_name: a key of :data:`SETS` or :data:`UPLOAD`; ``upload``: the uploaded file's path.
        categories: the ticked categories; ``methods``: the ticked method names.
        per_category: questions per category (the first N of each, in file order).
        max_new_tokens: per run; ``warmup``: run one untimed round first.
        knob_values: the method knobs, in :func:`knob_keys` order.

    Bad input (no file, a broken or too large file, unknown category, no method, a knob out of
    range, too many questions, a method that cannot run: the page's own inputs here, every run
    check in the runner) yields one warning message and ends; it never raises.
    """
    stream = stream or worker.BENCH
    records: list[dict] = []
    items = ticket = None  # the benchmark's EventPump, once started; its OVERLAPS ticket
    warn = (lambda msg: (f'<span class="bench-warning">⚠ {html.escape(msg)}</span>', gr.skip(), *(gr.skip(),) * 6))
    try:
        try:
            questions, names, max_new = choose(set_name, upload, categories, methods, per_category, max_new_tokens)
            values = dict(zip([(m, k.name) for m, k in knob_keys()], knob_values))
            specs = [MethodSpec(m, {k.name: values[(m, k.name)] for k in METHODS[m].knobs}) for m in names]
        except (bench.BenchError, ValueError, TypeError) as e:
            warning(str(e))
            yield warn(str(e))
            return
        total = sum(len(q.turns) for q in questions) * len(specs)
        ticket = OVERLAPS.begin()
        folder = Path(tempfile.mkdtemp(prefix="bench-"))
        t0 = time.perf_counter()
        settings = {"max_new_tokens": max_new, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0}
        done = 0
        qdicts = [bench.question_dict(q) for q in questions]
        # Pulled in a thread of its own that ends with the benchmark: run in Gradio's worker threads,
        # which Gradio keeps and reuses, the model would leave OpenMP teams there that slow every later
        # run (run_control.in_joined_thread says why).
        # In lockstep: the benchmark's steps never run while this tab renders its progress.
        items = EventPump(stream(worker.register(engine), qdicts, worker.spec_dicts(specs), settings,
                                 1 if warmup else 0), lockstep=True)
        for item in items:
            if item is None:  # nothing new yet
                continue
            if item["type"] == "start":  # every run check passed
                total = item["runs"]
                bar = progress_html(0, total, "warming up…" if warmup else "starting…", running=True)
                yield (status_text(f"Running {', '.join(method_title(m) for m in names)} on "
                                   f"{render.plural(len(questions), 'question')}…"), bar, *(gr.skip(),) * 6)
                continue
            if item["type"] == "warning":
                warning(item["message"])
                yield warn(item["message"])
                return
            if item["type"] == "tick":  # every method stepping in turn on a question; records come at its end
                note = f"question {item['question_id']}, turn {item['turn'] + 1}: every method in turn"
                yield (gr.skip(), progress_html(done, total, note, running=True), *(gr.skip(),) * 6)
                continue
            if item["type"] == "skip":
                done += item["runs"]
                yield (status_text(item["message"]), progress_html(done, total, "skipped", running=True), *(gr.skip(),) * 6)
                continue
            rec = item["record"]
            records.append(rec)
            done += 1
            if len(records) % len(specs):  # a turn's records come together: show them (and save them) at once
                continue
            note = f"question {rec['question_id']}, turn {rec['turn'] + 1}: every method done"
            yield _outputs(status_text(f"Running… {render.plural(len(records), 'run')} done"),
                           progress_html(done, total, note, running=True), records, write_files(records, folder))
        done_text = (f"Done: {render.plural(len(records), 'run')} in {time.perf_counter() - t0:.0f} s "
                     f"(greedy, max new tokens {max_new}).")
        if OVERLAPS.shared(ticket):
            warning(SHARED_NOTE)
            done_text += " " + SHARED_NOTE
        yield _outputs(status_text(done_text), progress_html(done, total, "done"),
                       records, write_files(records, folder) if records else (None, None))
    except Exception as e:  # never let a benchmark take the server down
        message = f"Unexpected error: {type(e).__name__}: {_user_message(e, upload)}"
        warning(message)
        yield warn(message)
    finally:  # Stop or the page went away: the benchmark ends at its next tick or record
        if items is not None:
            items.close()
        if ticket is not None:
            OVERLAPS.end(ticket)


def _category_options(categories: list[str]) -> list[tuple[str, str]]:
    """``(page word, category)`` choices of the categories box."""
    return [(category_title(c), c) for c in categories]


def methods_update(engine) -> dict:
    """The methods box for ``engine``: every method it can run offered (page labels) and ticked, the
    baseline aside (it always runs: a tick of its own did nothing)."""
    offered = [m for m in METHODS if m != BASELINE and engine.unavailable_reason(m) is None]
    return gr.update(choices=[(METHODS[m].label, m) for m in offered], value=offered)


def follow_models(engine) -> list:
    """Updates after the session's models change: the methods box (:func:`methods_update`), then per
    knob input (:func:`knob_keys` order) whether it can be changed, its value (the one saved with the
    models, else the knob's default) and the options the models serve (``models_tab.knob_update``)."""
    return [methods_update(engine), *(models_tab.knob_update(engine, None, m, k.name, reset=True)
                                      for m, k in knob_keys())]


def build(engine, models=None) -> None:
    """Lay the tab out: question set, categories, methods (every loaded one ticked) and knobs,
    questions per category (``#bench-per-category``) and max new tokens,
    Run (``#bench-run``) / Stop (``#bench-stop``), progress (``#bench-progress``), the leaderboard
    (``#bench-table``), the detail table (``#bench-detail``), charts (``#bench-speedup``, ``#bench-tau``),
    downloads (``#bench-csv``, ``#bench-jsonl``) and the published leaderboard (``#bench-reference``).

    With ``models`` (the Models tab's :class:`~.models_tab.ModelsPanel`) the benchmark runs on the
    session's engine (its ``key`` state is the handler's last input) and the methods and knobs follow
    a load; without it, on ``engine``."""
    available = [m for m in METHODS if engine.unavailable_reason(m) is None]
    gr.Markdown("Runs a benchmark on this machine: the same questions through every ticked method, greedy "
                "decoding, the methods taking one step each in turn on each question, each method's clock "
                "counting only its own steps. Each step is timed against the autoregressive steps of the same "
                "moment, so a machine that speeds up or slows down mid-run does not favour any method. Speedup "
                "is total tokens over that total time against autoregressive on the same questions; τ is total "
                "tokens over total steps.")
    cats0, note0 = category_choices(next(iter(SETS)), None)
    with gr.Row(equal_height=False):
        with gr.Column(scale=2):
            qset = gr.Radio([*SETS, UPLOAD], value=next(iter(SETS)), label="Questions", elem_id="bench-set")
            # Shown only while "Upload a JSONL file" is chosen.
            upload = gr.File(label=f"Questions file (JSON Lines, at most {MAX_UPLOAD_BYTES // 2**20} MiB): "
                                   "Spec-Bench questions (question_id, category, turns) or HumanEval tasks "
                                   "(task_id, prompt)", file_types=[".jsonl", ".json"], type="filepath",
                             elem_id="bench-upload", visible=qset.value == UPLOAD)
            cats = LooseCheckboxGroup(_category_options(cats0), value=cats0, label="Categories", info=note0,
                                    elem_id="bench-categories")
            offered = [m for m in available if m != BASELINE]  # the baseline always runs (methods_update)
            methods = LooseCheckboxGroup([(METHODS[m].label, m) for m in offered], value=offered, elem_id="bench-methods",
                                         label="Methods, each compared with autoregressive (the baseline, always run)")
        with gr.Column(scale=2):
            per_category = knob_input(PER_CATEGORY_KNOB, "bench-per-category")
            max_new = knob_input(NEW_TOKENS_KNOB, "bench-max-new-tokens")
            warmup = gr.Checkbox(True, label="Warm-up round first (untimed: every method once, so the first "
                                             "timed run does not pay for start-up)", elem_id="bench-warmup")
            with gr.Row():
                run_btn = gr.Button("Run benchmark", variant="primary", elem_id="bench-run")
                stop_btn = gr.Button("Stop", variant="stop", elem_id="bench-stop", interactive=False)
            plan_line = gr.HTML(elem_id="bench-plan")
            knob_inputs = []
            with gr.Accordion("Method settings", open=False, elem_id="bench-knobs"):
                for m, k in knob_keys():
                    knob_inputs.append(knob_input(k, f"bench-{m}-{k.name}", m in available,
                                                  engine.knob_defaults(m).get(k.name),
                                                  label=f"{METHODS[m].label}: {k.label}"))
    status = gr.HTML("", elem_id="bench-status")
    bar = gr.HTML(progress_html(0, 0, "not started"), elem_id="bench-progress")
    gr.Markdown("### Results on this machine")
    table = gr.Dataframe(headers=[column_title(c) for c in ("method", "overall speedup", "tau", "tokens/s",
                                                            "lossless")], value=None,
                         label="Leaderboard (speedup per category and overall, as Spec-Bench lays it out; each step "
                               "timed against the baseline's steps around it, so a slow spell of the machine cancels: "
                               "tokens/s, wall-clock, can rank close methods the other way)", elem_id="bench-table",
                         interactive=False, wrap=True)
    with gr.Row():
        speed_plot = gr.Plot(charts.empty_figure(SPEED_TITLE, "run a benchmark"),
                             show_label=False, elem_id="bench-speedup")
        tau_plot = gr.Plot(charts.empty_figure(TAU_TITLE, "run a benchmark"), show_label=False,
                           elem_id="bench-tau")
    detail = gr.Dataframe(headers=[column_title(c) for c in DETAIL_HEADER], value=None, label="Per category",
                          elem_id="bench-detail", interactive=False, wrap=True)
    with gr.Row():
        csv_file = gr.File(label="Results as CSV", elem_id="bench-csv", interactive=False)
        jsonl_file = gr.File(label="Results as JSON Lines (one record per run)", elem_id="bench-jsonl",
                             interactive=False)
    header, rows = load_leaderboard()
    with gr.Accordion("Published Spec-Bench leaderboard: measured elsewhere on other hardware", open=False,
                      elem_id="bench-reference"):
        gr.Markdown("**For reference only: measured elsewhere on other hardware** (RTX 3090 and A100 GPUs, "
                    "Vicuna-7B/13B/33B-v1.3, fp16, greedy, batch 1, mean of 3 runs), not on this machine and not "
                    "with this playground's models. Speedups per category over autoregressive. Source: the "
                    "Spec-Bench leaderboard (Xia et al. 2024, github.com/hemingkx/Spec-Bench, Apache-2.0).")
        titles = [column_title(c) for c in header]
        gr.Dataframe(value=rows or None, headers=titles or None, interactive=False, elem_id="bench-reference-table",
                     wrap=True, column_widths=column_widths(titles, rows) if rows else None)

    def refresh(set_name, up):
        choices, note = category_choices(set_name, up)
        return gr.CheckboxGroup(choices=_category_options(choices), value=choices, info=note)

    # On load and on every change of an input; the latest change always wins (a value function's default
    # "once" dropped a change made while one was pending: the line kept the last question set's categories).
    session = [models.key] if models is not None else []
    gr.on(None, lambda *v: plan(models.cache.get(v[-1]) if models is not None else engine, *v[:6]),
          [qset, upload, cats, methods, per_category, max_new, *session], plan_line, trigger_mode="always_last",
          queue=False, show_progress="hidden", api_visibility="private")
    qset.change(lambda name, up: (refresh(name, up), gr.File(visible=name == UPLOAD)), [qset, upload],
                [cats, upload], api_visibility="private", queue=False)
    upload.change(lambda up: (UPLOAD, refresh(UPLOAD, up)) if up else (gr.skip(), gr.skip()), upload, [qset, cats],
                  api_visibility="private", queue=False)

    def run(*values):  # the last value: the session's engine key (with a Models tab)
        if models is None:
            yield from run_benchmark(engine, *values)
        else:
            yield from models.run(run_benchmark, *values)

    key = [models.key] if models is not None else []
    if models is not None:
        models.follow(lambda e, _key: follow_models(e), [], [methods, *knob_inputs])
    # Stop is enabled only while a benchmark runs (as on the Playground): pressed with nothing running
    # it said "Stopped" beside "0/0 runs, not started".
    # Run clears the last run's results (after a Stop they read as this run's), unless it refuses the inputs;
    # the session's run is in RUNS until it ends (the Models tab loads nothing meanwhile).
    def arm(set_name, up, categories, chosen, per_cat, max_new_tokens, request: gr.Request):
        try:
            choose(set_name, up, categories, chosen, per_cat, max_new_tokens)
        except (bench.BenchError, ValueError, TypeError):
            return (gr.skip(),) * 8
        RUNS.arm(getattr(request, "session_hash", None))
        running = "running: results come as each question ends"
        return (gr.Button(interactive=False), gr.Button(interactive=True),
                gr.Dataframe(value=None, headers=table.headers, column_widths=column_widths(table.headers, [])),
                gr.Dataframe(value=None, headers=detail.headers, column_widths=column_widths(detail.headers, [])),
                charts.empty_figure(SPEED_TITLE, running), charts.empty_figure(TAU_TITLE, running), None, None)
    results = [table, detail, speed_plot, tau_plot, csv_file, jsonl_file]
    armed = run_btn.click(arm, [qset, upload, cats, methods, per_category, max_new], [run_btn, stop_btn, *results],
                          api_visibility="private", queue=False)
    event = armed.then(run, [qset, upload, cats, methods, per_category, max_new, warmup, *knob_inputs, *key],
                       [status, bar, *results], api_name="benchmark", concurrency_id="engine")
    # A bar still "running" then says "stopped" (set here: a last update would overwrite Stop's).
    def idle(b, request: gr.Request):
        RUNS.forget(getattr(request, "session_hash", None))
        return gr.Button(interactive=True), gr.Button(interactive=False), ended_progress(b)
    event.then(idle, bar, [run_btn, stop_btn, bar], api_visibility="private", queue=False)
    event.failure(idle, bar, [run_btn, stop_btn, bar], api_visibility="private", queue=False)  # .then skips errors
    # Run comes back when the cancelled run has ended (.then above; a click while it was pending was dropped).
    stopped = ("Stopped. Downloads hold every turn that all methods finished.",
               "Stopped before every method had finished a turn: nothing to download.")
    stop_btn.click(lambda done: (stopped[not done], gr.Button(interactive=False)), csv_file, [status, stop_btn],
                   cancels=[event], api_visibility="private", queue=False)
