"""The History tab: this browser tab's last runs, two of them side by side, and a run's records to download.

Each finished Playground run leaves its plain-data summary (``RunView.summary()`` in
:mod:`.run_view`) in the page's ``last_run`` state; :meth:`HistoryPanel.follow` adds it to a per-session
``gr.State`` list (at most :data:`MAX_RUNS`, newest last). Nothing is kept on the server.

A run downloads as the benchmark's records (:mod:`playground.bench.records`): one record per
method, built with ``bench.measured_fields`` like the benchmark's own, with ``question_id``
``playground-run-N``, ``category`` :data:`CATEGORY` and ``turn`` 0, plus the user's ``prompt``, the
run's ``speedup`` over its baseline and the page's ``lossless`` check when there are (fields that
hold nothing are left out, so a CSV cell is empty rather than ``null``);
as JSON lines (``bench.to_jsonl``, what ``bench.read_records`` reads) and CSV (``bench.to_csv``,
read back by ``bench.from_csv``). Everything the user typed is shown as escaped text.
"""

from __future__ import annotations

import html
import tempfile
import time
from pathlib import Path

import gradio as gr

from playground import bench
from playground.engine import BASELINE

MAX_RUNS = 10
"""Runs a session's history keeps (the oldest is dropped)."""
PROMPT_CHARS = 60
"""Characters of the prompt shown in the table (the whole prompt is the cell's tooltip)."""
CATEGORY = "playground"
"""The ``category`` of exported records."""

EMPTY = "<p class='history-empty'>No runs yet: each run on the Playground tab appears here.</p>"


def add_run(history: list[dict] | None, summary: dict | None, now: float | None = None) -> list[dict]:
    """A new history list with ``summary`` appended as run N+1 (the oldest dropped beyond :data:`MAX_RUNS`).

    A summary with no method statistics, or equal to the newest entry's (a run event that ended
    without a new run, e.g. refused input), leaves the history as it is.

    Raises:
        TypeError: ``summary`` is not a dict (or None).
    """
    history = list(history or [])
    if summary is None:
        return history
    if not isinstance(summary, dict):
        raise TypeError(f"a run summary is a dict, got {type(summary).__name__}")
    if not any(m.get("stats") for m in (summary.get("methods") or {}).values()):
        return history
    if history and history[-1]["summary"] == summary:
        return history
    number = history[-1]["number"] + 1 if history else 1
    when = time.strftime("%H:%M:%S", time.localtime(now))
    return (history + [{"number": number, "time": when, "summary": summary}])[-MAX_RUNS:]


def find(history: list[dict], number) -> dict | None:
    """The entry of run ``number`` (an int or its text), or None."""
    try:
        number = int(number)
    except (TypeError, ValueError):
        return None
    return next((e for e in history or [] if e["number"] == number), None)


def records(entry: dict) -> list[dict]:
    """The benchmark records of one history entry (one per method that produced statistics)."""
    s = entry["summary"]
    settings = s.get("settings") or {}
    out = []
    for m, d in (s.get("methods") or {}).items():
        if not d.get("stats"):
            continue
        rec = {"question_id": f"playground-run-{entry['number']}", "category": CATEGORY, "turn": 0, "method": m,
               "params": dict(d.get("params") or {})}
        rec.update(bench.measured_fields(d["stats"], d.get("output_ids") or [], d.get("output_text") or "",
                                         d.get("margins") or [], d.get("finish_reason")))
        rec.update({"temperature": settings.get("temperature", 0.0), "dtype": s.get("dtype"),
                    "target": s.get("target")})
        if settings.get("stop_strings"):
            rec["stop_strings"] = list(settings["stop_strings"])
        rec.update({"draft": s.get("draft"), "prompt": s.get("prompt", ""), "max_new_tokens":
                    settings.get("max_new_tokens"), "top_p": settings.get("top_p"), "top_k": settings.get("top_k"),
                    "seed": settings.get("seed")})
        base = s.get("baseline_tokens_per_s")
        if base:  # this run's speedup over its baseline (the baseline's own: 1.0)
            rec["speedup"] = (d["stats"].get("tokens_per_s") or 0.0) / base
        if d.get("lossless"):  # the page's check: "match", "near_tie" or "mismatch"
            rec["lossless"] = d["lossless"]
        # Fields outside the contract that hold nothing are left out (an empty CSV cell, not "null").
        out.append({k: v for k, v in rec.items() if v is not None or k in bench.CONTRACT_FIELDS})
    return out


def write_files(entry: dict, folder: Path | None = None) -> tuple[str, str]:
    """Write one run's records as JSON lines and CSV; return ``(jsonl path, csv path)``."""
    folder = Path(tempfile.mkdtemp(prefix="playground-run-")) if folder is None else folder
    recs = records(entry)
    name = f"playground-run-{entry['number']}"
    jsonl, csv_path = folder / f"{name}.jsonl", folder / f"{name}.csv"
    jsonl.write_text(bench.to_jsonl(recs), encoding="utf-8")
    csv_path.write_text(bench.to_csv(recs), encoding="utf-8")
    return str(jsonl), str(csv_path)


# ----- text for the page ------------------------------------------------------------------------
def _esc(value) -> str:
    return html.escape(str(value), quote=True)


def settings_text(settings: dict) -> str:
    """The generation settings in page terms: ``64 new tokens, greedy`` or ``…, temperature 0.7, top-p 0.9``,
    then a repetition penalty other than 1 and the number of stop strings."""
    parts = [f"{settings.get('max_new_tokens', '?')} new tokens"]
    t = settings.get("temperature") or 0.0
    if t > 0:
        parts.append(f"temperature {t:g}, top-p {settings.get('top_p', 1.0):g}, top-k {settings.get('top_k', 0)}, "
                     f"seed {settings.get('seed', 0)}")
    else:
        parts.append("greedy")
    penalty = settings.get("repetition_penalty")
    if penalty is not None and penalty != 1.0:  # None: the model's own (the page always sends a value)
        parts.append(f"repetition penalty {penalty:g}")
    stops = settings.get("stop_strings") or []
    if stops:
        parts.append(f"{len(stops)} stop string{'s' if len(stops) != 1 else ''}")
    return ", ".join(parts)


def method_figures(summary: dict, method: str) -> dict:
    """``{"label", "tokens_per_s", "speedup" (None without a baseline), "tau", "alpha", "new_tokens"}``."""
    d = summary["methods"][method]
    stats = d.get("stats") or {}
    base = summary.get("baseline_tokens_per_s")
    tps = stats.get("tokens_per_s") or 0.0
    return {"label": d.get("label", method), "tokens_per_s": tps, "speedup": tps / base if base else None,
            "tau": stats.get("tau"), "alpha": stats.get("alpha"), "new_tokens": stats.get("new_tokens")}


def _num(x, fmt: str = "{:.2f}", none: str = "–") -> str:
    return none if x is None else fmt.format(x)


def results_text(summary: dict) -> str:
    """One line per run: each method's speedup (or tokens/s without a baseline) and τ."""
    parts = []
    for m in summary.get("methods") or {}:
        f = method_figures(summary, m)
        if not (summary["methods"][m].get("stats")):
            continue
        speed = (f"{f['speedup']:.2f}×" if f["speedup"] is not None and m != BASELINE
                 else f"{f['tokens_per_s']:.1f} tok/s")
        parts.append(f"{f['label']} {speed}, τ {_num(f['tau'])}")
    return "; ".join(parts)


def _prompt_cell(prompt: str) -> str:
    short = prompt if len(prompt) <= PROMPT_CHARS else prompt[:PROMPT_CHARS].rstrip() + "…"
    return f'<td class="history-prompt" title="{_esc(prompt)}">{_esc(short)}</td>'


def table_html(history: list[dict]) -> str:
    """The history as an HTML table, newest first (every value escaped)."""
    if not history:
        return EMPTY
    rows = []
    for e in reversed(history):
        s = e["summary"]
        models = s.get("target", "") + (f" + {s['draft']}" if s.get("draft") else "")
        rows.append(f'<tr data-run="{e["number"]}"><td>{e["number"]}</td><td>{_esc(e["time"])}</td>'
                    f'{_prompt_cell(s.get("prompt", ""))}<td>{_esc(settings_text(s.get("settings") or {}))}</td>'
                    f'<td>{_esc(models)}</td><td>{_esc(results_text(s))}</td></tr>')
    return ('<table class="history-table"><thead><tr><th>Run</th><th>Time</th><th>Prompt</th><th>Settings</th>'
            '<th>Models</th><th>Speedup over the baseline and τ per method</th></tr></thead><tbody>'
            + "".join(rows) + "</tbody></table>")


def compare_html(history: list[dict], a, b) -> str:
    """Runs ``a`` and ``b`` side by side: per method tokens/s, speedup, τ and α of each (escaped)."""
    ea, eb = find(history, a), find(history, b)
    if ea is None or eb is None:
        return "<p>Pick two runs above to compare them.</p>"
    sa, sb = ea["summary"], eb["summary"]
    methods = list(dict.fromkeys([*(sa.get("methods") or {}), *(sb.get("methods") or {})]))

    def cells(summary: dict, m: str) -> list[str]:
        if m not in (summary.get("methods") or {}) or not summary["methods"][m].get("stats"):
            return ["–"] * 4
        f = method_figures(summary, m)
        return [_num(f["tokens_per_s"], "{:.1f}"), _num(f["speedup"], "{:.2f}×"), _num(f["tau"]),
                _num(None if f["alpha"] is None else 100 * f["alpha"], "{:.0f}%")]  # as on the stats line

    head = (f'<tr><th></th><th colspan="4">Run {ea["number"]}</th><th colspan="4">Run {eb["number"]}</th></tr>'
            '<tr><th>Method</th>' + "<th>tokens/s</th><th>speedup</th><th>τ</th><th>α</th>" * 2 + "</tr>")
    label = {m: (sa.get("methods") or {}).get(m, (sb.get("methods") or {}).get(m, {})).get("label", m)
             for m in methods}
    body = "".join(f'<tr data-method="{_esc(m)}"><td>{_esc(label[m])}</td>'
                   + "".join(f"<td>{c}</td>" for c in cells(sa, m) + cells(sb, m)) + "</tr>" for m in methods)
    about = "".join(f'<tr><td>Run {e["number"]}</td>{_prompt_cell(e["summary"].get("prompt", ""))}'
                    f'<td>{_esc(settings_text(e["summary"].get("settings") or {}))}</td></tr>' for e in (ea, eb))
    return (f'<table class="history-compare"><thead>{head}</thead><tbody>{body}</tbody></table>'
            f'<table class="history-about"><tbody>{about}</tbody></table>')


def run_choices(history: list[dict]) -> list[tuple[str, int]]:
    """Dropdown choices ``(label, run number)``, newest first (labels are shown as text by the dropdown)."""
    out = []
    for e in reversed(history or []):
        p = e["summary"].get("prompt", "")
        out.append((f"Run {e['number']} · {p[:40]}{'…' if len(p) > 40 else ''}", e["number"]))
    return out


# ----- the tab ------------------------------------------------------------------------------------
HISTORY_CSS = """
.history-table, .history-compare, .history-about { border-collapse: collapse; font-size: 0.92em; }
.history-table td, .history-table th, .history-compare td, .history-compare th, .history-about td {
  border: 1px solid var(--border-color-primary); padding: 3px 6px; text-align: left; }
.history-prompt { max-width: 28em; overflow-wrap: anywhere; }
"""


class HistoryPanel:
    """The History tab's components (build it inside a ``gr.Tab``), wired to runs by :meth:`follow`."""

    def __init__(self):
        self.state = gr.State([])
        gr.Markdown(f"The last {MAX_RUNS} runs of this browser tab, newest first (kept in this tab only).")
        self.table = gr.HTML(EMPTY, elem_id="history-table", css_template=HISTORY_CSS)
        gr.Markdown("### Compare two runs")
        with gr.Row():
            self.a = gr.Dropdown([], label="First run", elem_id="history-a")
            self.b = gr.Dropdown([], label="Second run", elem_id="history-b")
        self.compare = gr.HTML("", elem_id="history-compare", css_template=HISTORY_CSS)
        gr.Markdown("### Download a run\nOne record per method, in the format the benchmark writes its results in "
                    "(JSON lines, or CSV for a spreadsheet), so the benchmark's summaries read them.")
        self.pick = gr.Dropdown([], label="Run", elem_id="history-export")
        with gr.Row():
            self.jsonl = gr.File(label="JSON lines", elem_id="history-jsonl", interactive=False)
            self.csv = gr.File(label="CSV", elem_id="history-csv", interactive=False)
        self.a.change(lambda h, a, b: compare_html(h, a, b), [self.state, self.a, self.b], self.compare,
                      api_visibility="private", queue=False)
        self.b.change(lambda h, a, b: compare_html(h, a, b), [self.state, self.a, self.b], self.compare,
                      api_visibility="private", queue=False)
        self.pick.change(self.files, [self.state, self.pick], [self.jsonl, self.csv], api_visibility="private",
                         queue=False)

    @staticmethod
    def files(history: list[dict], number) -> tuple:
        """The two download files of run ``number`` (none when there is no such run)."""
        entry = find(history, number)
        return write_files(entry) if entry is not None else (None, None)

    def after_run(self, history: list[dict], summary: dict | None) -> tuple:
        """Add the finished run; refresh the table, the run pickers (the two newest compared, the
        newest offered for download) and the comparison."""
        new = add_run(history, summary)
        if new == list(history or []):
            return (gr.skip(),) * 6
        choices = run_choices(new)
        a = choices[1][1] if len(choices) > 1 else choices[0][1]
        b = choices[0][1]
        return (new, table_html(new), gr.update(choices=choices, value=a), gr.update(choices=choices, value=b),
                compare_html(new, a, b), gr.update(choices=choices, value=b))

    def follow(self, run_event, last_run) -> None:
        """Hang the history off a run event: ``run_event.then(...)`` reading the ``last_run`` state."""
        run_event.then(self.after_run, [self.state, last_run],
                       [self.state, self.table, self.a, self.b, self.compare, self.pick],
                       api_visibility="private", queue=False)
