"""How the Benchmark tab shows a run: the plan under Run, its progress bar, its status line (HTML), and the
titles and numbers of its tables."""

from __future__ import annotations

import csv
import html
import re
from pathlib import Path

import gradio as gr

from playground import bench

from .render import plural
from .wording import method_label

LEADERBOARD_CSV = bench.ASSETS / "spec_bench_leaderboard.csv"
"""The published Spec-Bench leaderboard the tab shows for reference."""
COLUMN_TITLES = {"method": "Method", "category": "Category", "runs": "Runs", "tokens": "New tokens",
                 "tokens/s": "Tokens/s", "speedup": "Speedup", "overall speedup": "Overall speedup",
                 "tau": "τ (tokens per step)", "alpha": "α (acceptance rate)", "lossless": "Lossless",
                 "device": "GPU", "model": "Model", "mean_accepted_tokens": "τ (mean accepted tokens)",
                 "overall_speedup": "Overall speedup"}
"""Page titles of the table columns (the benchmark's own column names are short ids)."""
CATEGORY_TITLES = {"qa": "QA", "rag": "RAG", "stem": "STEM", "humaneval": "HumanEval", "mt_bench": "MT-bench"}


def category_title(category: str) -> str:
    """A category as the page shows it, in the tables, the charts and the category list alike:
    ``math_reasoning`` -> ``Math reasoning``, ``qa`` -> ``QA``, ``overall`` -> ``Overall``."""
    c = str(category)
    text = CATEGORY_TITLES.get(c, c.replace("_", " "))
    return text[:1].upper() + text[1:]


def column_title(name: str) -> str:
    """A column name as the page shows it (``overall speedup`` -> ``Overall speedup``,
    ``math_reasoning speedup`` -> ``Math reasoning speedup``)."""
    if name in COLUMN_TITLES:
        return COLUMN_TITLES[name]
    text = category_title(name.removesuffix(" speedup")) + (" speedup" if name.endswith(" speedup") else "")
    return text[:1].upper() + text[1:]


method_title = method_label
"""A method's page label (:func:`.wording.method_label`), under the name the Benchmark tab's titles use."""


def progress_html(done: int, total: int, text: str, running: bool = False) -> str:
    """A progress bar with ``done / total`` runs and a note, marked while a benchmark is ``running`` (with
    no runs it is drawn empty: a ``max`` of 0 drew it full)."""
    pct, mark = (100 * done / total if total else 0), (' data-running="1"' if running else "")
    return (f'<div id="bench-bar"{mark} style="display:flex;align-items:center;gap:10px">'
            f'<progress max="{max(total, 1)}" value="{done}" style="width:260px;height:14px"></progress>'
            f"<span>{done}/{total} runs ({pct:.0f}%) {html.escape(text)}</span></div>")


def ended_progress(bar: str | None):
    """The bar (:func:`progress_html`'s HTML) once a benchmark's event has ended: as it is if its run
    finished, else (a Stop, a warning or an error ended it) its counts with the note "stopped"."""
    if 'data-running="1"' not in (bar or ""):
        return gr.skip()
    m = re.search(r"<span>(\d+)/(\d+) runs", bar)  # the counts as written (the bar's max is at least 1)
    done, total = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    return progress_html(done, total, "stopped")


def status_text(text: str) -> str:
    """The tab's status line: the text escaped (a question id or category from an uploaded file is
    shown as it is, never as markup)."""
    return f'<span class="bench-status-text">{html.escape(text)}</span>'


def plan_html(turns: int, questions: int, methods: int, max_new_tokens: int, step_seconds: float | None) -> str:
    """What the next Run will do, shown under the Run button before it is pressed (``#bench-plan``).

    Args:
        turns: turns of the chosen questions (a multi-turn question counts each; each is one run per method).
        questions: the chosen questions.
        methods: methods run, the baseline included.
        max_new_tokens: the cap per run.
        step_seconds: seconds of one plain decoding step on this device (the per-step budget's timing),
            or None when not timed yet: then the line says when a duration will show.

    The duration is every run decoding to the cap at plain decoding's speed of the timing (after a
    short prompt): speculative methods take less, long prompts and the untimed warm-up more.
    """
    runs = turns * methods
    text = (f"Next run: {plural(questions, 'question')}" + (f" ({turns} turns)" if turns != questions else "")
            + f" × {plural(methods, 'method')} (autoregressive included) = {plural(runs, 'run')} of up to "
            f"{max_new_tokens} new tokens")
    if step_seconds and step_seconds > 0:
        minutes = runs * max_new_tokens * step_seconds / 60
        took = f"{minutes:.0f} min" if minutes >= 1.5 else f"{max(1, round(minutes * 60)):.0f} s"
        text += (f"; about {took} on this machine if every run went at plain decoding's "
                 f"{1 / step_seconds:.1f} tokens/s (speculative methods take less, long prompts more)")
    else:  # models loaded since the start (the Models tab) are timed when they first run
        text += "; how long it takes shows here once these models have run (their first run times this device)"
    return f'<span class="bench-plan-text">{html.escape(text)}.</span>'


def plan_problem_html(message: str) -> str:
    """The plan line when the chosen inputs cannot run (the message Run would give)."""
    return f'<span class="bench-plan-text">Run would stop here: {html.escape(message)}.</span>'


def speedup_text(x) -> str:
    """A speedup as the page shows it everywhere: two decimals and ×, ``-`` when there is none.
    Takes a number or the CLI's printed cell (``1.47x``)."""
    if isinstance(x, str):
        return x.removesuffix("x") + "×" if x.endswith("x") else x
    return "-" if x is None or x != x else f"{x:.2f}×"


def number_text(x) -> str:
    """A number with two decimals (``1.20``, not ``1.2``); ``-`` when there is none; a printed
    cell (already ``1.20``) stays as it is."""
    if isinstance(x, str):
        return x
    return "-" if x is None or x != x else f"{x:.2f}"


CHAR_PX, CELL_PAD_PX = 8.4, 22
"""Width of one character of a table header (bold, monospace) and a cell's padding and menu button, in px."""


def column_widths(titles: list[str], rows: list[list]) -> list[str]:
    """Widths (``"117px"``) for a read-only table's columns, each wide enough for the longest word of its
    title and cells, so a header wraps between words (Gradio sizes columns from the cells' text, and
    broke "Summarization" as "Summariz / ation"). Numbers count as six characters (``1.47×``, ``52%``)."""
    def longest(v) -> int:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return 6
        return max((len(w) for w in str(v).split()), default=1)
    return [f"{CELL_PAD_PX + CHAR_PX * max([longest(t), *(longest(r[i]) for r in rows if i < len(r))]):.0f}px"
            for i, t in enumerate(titles)]


def load_leaderboard(path: Path = LEADERBOARD_CSV) -> tuple[list[str], list[list[str]]]:
    """The published Spec-Bench leaderboard as ``(header, rows)``; empty when the file is missing."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            rows = list(csv.reader(f))
    except OSError:
        return [], []
    return (rows[0], rows[1:]) if rows else ([], [])


def write_files(records: list[dict], folder: Path) -> tuple[str, str]:
    """Write the records as ``results.jsonl`` and ``results.csv`` in ``folder``: ``(csv path, jsonl path)``."""
    jsonl, csv_path = folder / "results.jsonl", folder / "results.csv"
    jsonl.write_text(bench.to_jsonl(records), encoding="utf-8")
    csv_path.write_text(bench.to_csv(records), encoding="utf-8")
    return str(csv_path), str(jsonl)
