"""The shipped EAGLE head loads in vLLM's ``eagle3`` speculative method (needs a vLLM environment).

Runs with the Python of ``.venv-vllm`` (``scripts/setup.sh --vllm``; ``PLAYGROUND_VLLM_PYTHON`` names
another); skipped without one unless ``PLAYGROUND_REQUIRE_VLLM`` is set (vLLM cannot share this
virtualenv: it pins another transformers). vLLM builds the draft from ``config.json`` and loads
``model.safetensors`` through ``Eagle3LlamaForCausalLM.load_weights``, so a wrong name, shape or config
field fails here.
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from helpers import require_vllm
from playground.engine.eagle import DEFAULT_EAGLE_DIR


@pytest.mark.vllm
@pytest.mark.skipif(not (DEFAULT_EAGLE_DIR / "config.json").is_file(), reason="no shipped EAGLE head")
def test_shipped_head_loads_in_vllm_eagle3(real_target, tmp_path):
    """vLLM starts the default target with the shipped head as its eagle3 draft and generates greedily
    on one prompt."""
    require_vllm()  # skips without .venv-vllm; fails instead when CI requires vLLM
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
    from playground.backends.vllm.server import vllm_python

    out = subprocess.run([str(vllm_python()), str(path)], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "SPEC" in out.stdout
