"""Shared pytest configuration: markers, the real default model (loaded once), thread settings."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from helpers import skip_unless_ci
import torch

# Make `import helpers` work for every test module under tests/, whatever the import mode.
sys.path.insert(0, str(Path(__file__).resolve().parent))


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "real_model: uses the embedded default model (SmolLM2-135M-Instruct, fp32, CPU); "
        "deselect with -m 'not real_model'")
    config.addinivalue_line(
        "markers", "vllm: starts real vLLM servers from .venv-vllm (scripts/setup.sh --vllm); skips without it "
        "unless PLAYGROUND_REQUIRE_VLLM is set; deselect with -m 'not vllm'")


@pytest.fixture(scope="module")
def torch_single_thread():
    """Run a test module on one intra-op thread (restored afterwards); module-scoped so that
    module-scoped model fixtures run single-threaded too.

    Tiny models gain nothing from a second thread, and on a busy 2-core machine OpenMP
    synchronisation made some small matrix products 1000x slower.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def real_target():
    """The embedded default model in float32 on CPU, loaded once per session (skips when absent)."""
    from playground.engine import ModelLoadError, load_model

    try:
        return load_model("default", "cpu", torch.float32)
    except ModelLoadError as e:
        skip_unless_ci(f"the default model is not available: {e}")


@pytest.fixture(scope="session")
def real_engine(real_target):
    """An :class:`Engine` over the default model with the target itself as its draft
    (the only draft available offline)."""
    from playground.engine import Engine

    return Engine(real_target, draft=real_target)
