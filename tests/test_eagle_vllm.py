"""The shipped EAGLE head loads in vLLM's ``eagle3`` speculative method (needs a vLLM environment).

Skipped unless ``PLAYGROUND_VLLM_PYTHON`` names the Python of a virtualenv with vLLM (it cannot share
this one: vLLM pins another transformers). vLLM builds the draft from ``config.json`` and loads
``model.safetensors`` through ``Eagle3LlamaForCausalLM.load_weights``, so a wrong name, shape or config
field fails here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from playground.engine.eagle import DEFAULT_EAGLE_DIR

VLLM_PYTHON = os.environ.get("PLAYGROUND_VLLM_PYTHON")


@pytest.mark.skipif(not VLLM_PYTHON, reason="PLAYGROUND_VLLM_PYTHON (a Python with vLLM) is not set")
@pytest.mark.skipif(not (DEFAULT_EAGLE_DIR / "config.json").is_file(), reason="no shipped EAGLE head")
def test_shipped_head_loads_in_vllm_eagle3(real_target, tmp_path):
    """vLLM starts the default target with the shipped head as its eagle3 draft and generates greedily
    on one prompt."""
    folder = Path(real_target.model.config._name_or_path)
    script = textwrap.dedent(f"""
        from vllm import LLM, SamplingParams
        if __name__ == "__main__":
            p = SamplingParams(temperature=0, max_tokens=24)
            prompt = "Write two sentences about the sea."
            spec = LLM(model={str(folder)!r}, dtype="float32", max_model_len=1024, enforce_eager=True,
                       gpu_memory_utilization=0.1,
                       speculative_config={{"method": "eagle3", "model": {str(DEFAULT_EAGLE_DIR)!r},
                                            "num_speculative_tokens": 3}})
            print("SPEC", spec.generate([prompt], p)[0].outputs[0].token_ids)
    """)
    path = tmp_path / "run.py"
    path.write_text(script)
    out = subprocess.run([VLLM_PYTHON, str(path)], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "SPEC" in out.stdout
