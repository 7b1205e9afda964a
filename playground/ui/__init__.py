"""The web UI: Gradio layout, token rendering and Plotly charts.

Calls only the engine's public API; loads no model (entry points do that).
"""

from .app import build_demo, input_names, launch_options, run_arguments

__all__ = ["build_demo", "input_names", "launch_options", "run_arguments"]
