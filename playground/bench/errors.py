"""The benchmark's one error type."""

from __future__ import annotations


class BenchError(Exception):
    """A usage error reported as one line (exit status 2 on the command line; a warning on the
    page), never a traceback: a bad file, an unknown method, a setting the loaded models cannot
    run, a ``max_new_tokens`` that leaves no question room in the context."""
