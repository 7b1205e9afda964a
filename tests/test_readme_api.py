"""README's Python API example runs as written on the embedded default model, and its three
methods agree token for token."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

pytestmark = [pytest.mark.real_model, pytest.mark.usefixtures("torch_single_thread")]

README = Path(__file__).resolve().parents[1] / "README.md"


def _api_example() -> str:
    section = README.read_text().split("## Python API", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_python_api_example_runs():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(_api_example(), "README.md (Python API)", "exec"), {})
    lines = out.getvalue().splitlines()
    assert [line.split()[0] for line in lines] == ["autoregressive", "eagle", "mixture"]
    assert all(line.endswith("same as baseline: True") for line in lines), lines
