"""How the Benchmark tab shows a run under way: its progress bar and its status line (HTML)."""

from __future__ import annotations

import html
import re

import gradio as gr


def progress_html(done: int, total: int, text: str, running: bool = False) -> str:
    """A progress bar with ``done / total`` runs and a note, marked while a benchmark is ``running``."""
    pct, mark = (100 * done / total if total else 0), (' data-running="1"' if running else "")
    return (f'<div id="bench-bar"{mark} style="display:flex;align-items:center;gap:10px">'
            f'<progress max="{total}" value="{done}" style="width:260px;height:14px"></progress>'
            f"<span>{done}/{total} runs ({pct:.0f}%) {html.escape(text)}</span></div>")


def ended_progress(bar: str | None):
    """The bar (:func:`progress_html`'s HTML) once a benchmark's event has ended: as it is if its run
    finished, else (a Stop, a warning or an error ended it) its counts with the note "stopped"."""
    if 'data-running="1"' not in (bar or ""):
        return gr.skip()
    m = re.search(r'<progress max="(\d+)" value="(\d+)"', bar)
    done, total = (int(m.group(2)), int(m.group(1))) if m else (0, 0)
    return progress_html(done, total, "stopped")


def status_text(text: str) -> str:
    """The tab's status line: the text escaped (a question id or category from an uploaded file is
    shown as it is, never as markup)."""
    return f'<span class="bench-status-text">{html.escape(text)}</span>'
