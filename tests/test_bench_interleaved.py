"""scripts/bench_interleaved.py's A/B of trained parts: ``METHOD@alt`` runs on a second engine given by
``--alt PART=SPEC``; what it refuses before loading any model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from playground.engine import MethodSpec

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench_interleaved.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_interleaved", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_alt_suffix_names_the_second_engine(bench):
    label, spec, on_alt = bench.parse_method("eagle@alt")
    assert (label, on_alt) == ("eagle@alt", True) and spec.name == "eagle" and spec == MethodSpec("eagle")
    label, spec, on_alt = bench.parse_method("mixture:members=eagle+rest@alt")
    assert on_alt and label == "mixture:members=eagle+rest@alt"
    assert spec.name == "mixture" and spec.params == {"members": "eagle,rest"}
    label, spec, on_alt = bench.parse_method("prompt_lookup:budget=off")
    assert not on_alt and spec.params == {"budget": "off"}


@pytest.mark.parametrize("argv, message", [
    (["--methods", "autoregressive,eagle@alt"], "needs --alt"),
    (["--methods", "autoregressive,eagle", "--alt", "tokenizer=x"], "parts are draft, medusa and eagle"),
])
def test_bad_alt_use_is_refused_before_any_model_loads(bench, capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        bench.main(["--questions", "unused.jsonl", *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err
