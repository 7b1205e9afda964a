"""scripts/gpu_check.sh (issue 21, item 8): without CUDA it says so and exits 3 before any work; its
CPU dry run (``--device cpu --quick``) builds random models, runs every method against the baseline
and exits 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def _run(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_it_exits_with_a_clear_message():
    proc = _run()
    assert proc.returncode == 3, proc.stderr
    assert "CUDA is not available" in proc.stderr and "--device cpu --quick" in proc.stderr


def test_bad_option_is_refused():
    proc = _run("--fast")
    assert proc.returncode == 2 and "unknown option --fast" in proc.stderr


def test_cpu_dry_run_checks_every_method():
    proc = _run("--device", "cpu", "--quick")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "cpu float32: 1 prompts x 9 methods, 0 mismatches" in proc.stdout
    for method in ("draft_model", "prompt_lookup", "lookahead", "medusa", "eagle", "suffix", "recycling", "rest",
                   "mixture"):
        assert f"cpu float32 {method}" in proc.stdout
