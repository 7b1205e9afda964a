"""Loading a model or heads never runs code from the checkpoint.

* Statically: no call anywhere in ``playground/`` or ``app.py`` turns ``trust_remote_code`` on;
  the model loader passes ``trust_remote_code=False`` and ``weights_only=True`` itself; every
  ``torch.load`` outside the trainers passes ``weights_only=True`` (the trainers' own resume
  files, written by the same trainer in its output folder, are the one exception).
* Dynamically: a ``pytorch_model.bin`` and a Medusa ``medusa_lm_head.pt`` whose pickle would
  create a file when unpickled are refused with the loaders' own errors and the file is never
  created (a negative control unpickles the same file unrestricted and sees the file appear); a
  checkpoint folder that asks for its own Python code (``auto_map``) is refused without
  importing that code.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

from helpers import tiny_llama

ROOT = Path(__file__).resolve().parents[1]
TRAINERS = ROOT / "playground" / "training"


def _sources() -> list[Path]:
    return sorted((ROOT / "playground").rglob("*.py")) + [ROOT / "app.py"]


def _calls(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Call):
            yield node


def _name(func) -> str:
    return ast.unparse(func)


def _keyword(call: ast.Call, name: str):
    return next((k.value for k in call.keywords if k.arg == name), None)


def test_no_loader_enables_remote_code_or_unrestricted_unpickling():
    """No trust_remote_code other than a literal False; torch.load with weights_only=True (trainers'
    resume files excepted); the model loader's from_pretrained calls say both explicitly."""
    bad = []
    for path in _sources():
        for call in _calls(path):
            where = f"{path.relative_to(ROOT)}:{call.lineno}"
            trust = _keyword(call, "trust_remote_code")
            if trust is not None and not (isinstance(trust, ast.Constant) and trust.value is False):
                bad.append(f"{where}: trust_remote_code={ast.unparse(trust)}")
            if any(k.arg is None for k in call.keywords) and _name(call.func).endswith("from_pretrained"):
                bad.append(f"{where}: from_pretrained(**...) hides its options")
            if _name(call.func) == "torch.load" and TRAINERS not in path.parents:
                only = _keyword(call, "weights_only")
                if not (isinstance(only, ast.Constant) and only.value is True):
                    bad.append(f"{where}: torch.load without weights_only=True")
    assert not bad, "\n".join(bad)

    models = ROOT / "playground" / "engine" / "models.py"
    loads = [c for c in _calls(models) if _name(c.func) in ("AutoModelForCausalLM.from_pretrained",
                                                           "AutoTokenizer.from_pretrained")
             and _keyword(c, "gguf_file") is None]
    assert len(loads) >= 2
    for call in loads:
        assert isinstance(_keyword(call, "trust_remote_code"), ast.Constant), ast.unparse(call)
        if "AutoModel" in _name(call.func):
            assert getattr(_keyword(call, "weights_only"), "value", None) is True, ast.unparse(call)


class _Payload:
    """Pickles as a call of ``open(marker, "w")``: unpickling it creates ``marker``."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _poisoned(path: Path, tensors: dict, marker: Path) -> Path:
    torch.save({**tensors, "payload": _Payload(marker)}, path)
    return path


def test_negative_control_the_payload_runs_when_unpickled_unrestricted(tmp_path):
    """The poisoned file is live: torch.load(weights_only=False) creates the marker file."""
    marker = tmp_path / "ran"
    path = _poisoned(tmp_path / "x.bin", {"w": torch.zeros(2)}, marker)
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_pickled_model_weights_are_refused_without_running_them(tmp_path):
    """A checkpoint folder whose pytorch_model.bin carries code: ModelLoadError, the code never ran."""
    from playground.engine import ModelLoadError, load_model

    model = tiny_llama(0)
    folder = tmp_path / "model"
    folder.mkdir()
    model.config.save_pretrained(folder)
    marker = tmp_path / "ran"
    _poisoned(folder / "pytorch_model.bin", model.state_dict(), marker)
    with pytest.raises(ModelLoadError, match="UnpicklingError"):
        load_model(str(folder), "cpu", torch.float32)
    assert not marker.exists(), "unpickling the checkpoint ran its code"


def test_pickled_medusa_heads_are_refused_without_running_them(tmp_path):
    """A Medusa folder whose medusa_lm_head.pt carries code: MedusaLoadError, the code never ran."""
    from playground.engine import MedusaLoadError, load_heads

    folder = tmp_path / "heads"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"medusa_num_heads": 1, "medusa_num_layers": 1}))
    marker = tmp_path / "ran"
    _poisoned(folder / "medusa_lm_head.pt", {"0.0.linear.weight": torch.zeros(4, 4)}, marker)
    with pytest.raises(MedusaLoadError, match="more than tensors"):
        load_heads(str(folder))
    assert not marker.exists(), "unpickling the heads ran their code"


def test_checkpoint_with_its_own_code_is_refused_without_importing_it(tmp_path):
    """config.json's auto_map names Python files of the checkpoint: the loader refuses the model
    and never imports them (they would create a marker file)."""
    from playground.engine import ModelLoadError, load_model

    folder = tmp_path / "custom"
    folder.mkdir()
    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'w').close()\nfrom transformers import LlamaConfig as BoomConfig\n"
    (folder / "configuration_boom.py").write_text(code)
    (folder / "modeling_boom.py").write_text(code)
    config = tiny_llama(0).config.to_dict()
    config.update(model_type="boom", architectures=["BoomForCausalLM"],
                  auto_map={"AutoConfig": "configuration_boom.BoomConfig",
                            "AutoModelForCausalLM": "modeling_boom.BoomForCausalLM"})
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="custom code"):
        load_model(str(folder), "cpu", torch.float32)
    assert not marker.exists(), "the checkpoint's own code was imported"
