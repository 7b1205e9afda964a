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


def test_table_reads_steady_steps_and_keeps_raw_seconds_for_comparison(bench):
    """The table's speedups are tokens over ``steady_steps`` against the baseline's, per category and
    overall; the row ``raw seconds`` is the wall-clock figure; tokens/s are wall-clock; a method whose
    output differs from the baseline's is counted in ``mismatches``."""
    def rec(q, cat, method, steps, wall, steady, ids=(1, 2)):
        return {"question_id": q, "category": cat, "turn": 0, "method": method, "new_tokens": 64, "steps": steps,
                "wall_s": wall, "steady_steps": steady, "output_ids": list(ids)}
    records = [rec(1, "writing", "autoregressive", 64, 2.0, 64.0), rec(1, "writing", "fast", 32, 0.5, 32.0),
               rec(2, "math", "autoregressive", 64, 8.0, 64.0), rec(2, "math", "fast", 32, 2.0, 16.0, ids=(1, 3))]
    rows = {line.split()[0]: line.split()[1:] for line in bench.table(records, ["autoregressive", "fast"]).splitlines()}
    assert rows["writing"] == ["1.00x", "2.00x"] and rows["math"] == ["1.00x", "4.00x"]
    assert rows["overall"] == ["1.00x", "2.67x"]  # 128 / 48 steady steps against 128 / 128
    assert rows["raw"] == ["seconds", "1.00x", "4.00x"]  # 10 s against 2.5 s
    assert rows["tokens/s"] == ["12.8", "51.2"] and rows["tau"] == ["1.00", "2.00"]
    assert rows["mismatches"] == ["0", "1"]
    for r in records:
        del r["steady_steps"]
    assert bench.table(records, ["autoregressive", "fast"]).splitlines()[3].split()[1:] == ["1.00x", "4.00x"]


def test_one_setting_under_two_labels_is_found(bench):
    """Two labels that run one method with the same knobs on one engine (``mixture`` and the same
    members spelt out) would share learned state, so the script refuses them; another knob value,
    or the same method on the ``--alt`` engine, is a different run."""
    from helpers import FakeLoaded, tiny_llama
    from playground.engine import Engine
    from playground.engine.mixture import DEFAULT_MEMBERS

    engine, alt = Engine(FakeLoaded(tiny_llama(0))), Engine(FakeLoaded(tiny_llama(0)))
    runs = lambda *texts: [(*bench.parse_method(t)[:2], engine) for t in texts]  # noqa: E731
    spelt = "mixture:members=" + DEFAULT_MEMBERS.replace(",", "+")
    assert bench.same_settings(runs("autoregressive", "mixture", spelt)) == ("mixture", spelt)
    assert bench.same_settings(runs("suffix", "suffix:max_spec_factor=2.0")) == ("suffix", "suffix:max_spec_factor=2.0")
    assert bench.same_settings(runs("autoregressive", "suffix", "suffix:max_spec_factor=1", "mixture",
                                    "mixture:budget=off", "prompt_lookup", "prompt_lookup:budget=off")) is None
    assert bench.same_settings([("suffix", MethodSpec("suffix"), engine), ("suffix@alt", MethodSpec("suffix"), alt)]) is None
