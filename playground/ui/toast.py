"""Toast messages that show their text as text.

Gradio renders a toast's message (``gr.Warning``) as sanitised HTML: scripts are dropped, but
``<b>`` and the like still render. The page's warnings quote what users typed (a stop string, a
tree) and what uploaded files hold (a category, a question id), so every toast goes through
:func:`warning`, which escapes the message first.
"""

from __future__ import annotations

import html

import gradio as gr


def warning(message) -> None:
    """Show ``message`` (any object; ``str()`` of it) as a warning toast, HTML-escaped."""
    gr.Warning(html.escape(str(message)))
