"""Helpers shared by the UI tests (tests/test_ui.py) and the browser tests (tests/browser/).

Kept out of conftest.py on purpose: other test suites share that file. Tests import these
helpers and wrap them in their own fixtures.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
from typing import Iterator

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


@functools.lru_cache(maxsize=1)
def _default_target():
    import torch

    from playground.engine import load_model

    return load_model("default", "cpu", torch.float32)


def ui_engine(request):
    """An :class:`Engine` on the embedded default model, float32 on CPU, with **no draft**
    (so the page shows draft_model as unavailable).

    Reuses the session's ``real_target`` fixture (tests/conftest.py) when it is defined, so the
    whole suite holds one copy of the model; otherwise loads the model once per process.
    float32 because the lossless checks compare token ids with the baseline's exactly.
    """
    from playground.engine import Engine

    try:
        target = request.getfixturevalue("real_target")
    except pytest.FixtureLookupError:
        target = _default_target()
    return Engine(target)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(engine, vllm=None, **options) -> Iterator[str]:
    """Build the demo for ``engine`` (with a vLLM tab for a ``VLLMSession``; ``options`` such as
    ``lock_models`` go to ``build_demo``), serve it on a free local port, yield its URL, close it."""
    from playground.ui import build_demo, launch_options

    demo = build_demo(engine, vllm=vllm, **options)
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True,
                **launch_options())
    try:
        yield demo.local_url.rstrip("/")
    finally:
        demo.close()
