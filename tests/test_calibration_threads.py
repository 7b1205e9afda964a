"""One-time calibrations run once per engine, under its lock, however many threads ask at once
(issue 21, item 4): Medusa's ``auto`` tree, the verify-cost curve (one curve for the Theory tab and
EAGLE's ``auto`` tree size) and the per-step budget's step-cost curve."""

from __future__ import annotations

import threading
import time

import pytest

import playground.engine.medusa as medusa_pkg
import playground.engine.step_cost as step_cost
import playground.engine.theory as theory
from helpers import FakeLoaded, tiny_llama
from playground.engine import Engine, MethodSpec
from test_eagle import tiny_head
from test_medusa import random_heads

pytestmark = pytest.mark.usefixtures("torch_single_thread")

THREADS = 6


def _counted(monkeypatch, module, name: str, counts: dict, lock_state: dict, engine_ref: list):
    """Replace ``module.name`` by a wrapper that counts calls, checks the engine's step lock is held
    and sleeps a little first (widening any race between a check and the work)."""
    real = getattr(module, name)

    def wrapper(*args, **kwargs):
        counts[name] = counts.get(name, 0) + 1
        lock = engine_ref[0].exclusive()
        lock_state[name] = lock._is_owned()  # RLock: held by this thread
        time.sleep(0.05)
        return real(*args, **kwargs)
    monkeypatch.setattr(module, name, wrapper)


def test_calibrations_run_once_under_the_lock_with_many_threads(monkeypatch):
    """Six threads build Medusa (auto tree), EAGLE (auto total_tokens) and draft-model (budget auto)
    drafters and ask for the verify-cost curve at the same moment: each calibration runs exactly once,
    while its thread holds the engine's step lock, and every thread gets the same objects. EAGLE reads
    the engine's one step-cost curve, the budget's (it once kept a second, module-level one)."""
    model = tiny_llama(0)
    heads = random_heads(model, 3)
    heads.top_k_accuracy = [[0.6, 0.7, 0.75] + [0.8] * 7, [0.4, 0.5] + [0.6] * 8, [0.3] * 10]
    engine = Engine(FakeLoaded(model), FakeLoaded(tiny_llama(1)), medusa=heads, eagle=tiny_head(model, 0))
    counts, owned, ref = {}, {}, [engine]
    _counted(monkeypatch, medusa_pkg, "auto_tree", counts, owned, ref)
    _counted(monkeypatch, theory, "measure_verify_cost", counts, owned, ref)
    _counted(monkeypatch, step_cost, "measure_step_cost", counts, owned, ref)
    barrier = threading.Barrier(THREADS)
    results, errors = [], []

    def ask():
        try:
            barrier.wait()
            medusa = engine.make_drafter(MethodSpec("medusa", {"tree_choices": "auto", "budget": "off"}))
            eagle = engine.make_drafter(MethodSpec("eagle", {"total_tokens": "auto"}))
            draft = engine.make_drafter(MethodSpec("draft_model", {"budget": "auto"}))
            results.append((medusa_pkg.medusa_auto_tree(engine), engine.verify_cost(), draft.budget_cost,
                            eagle.verify_cost))
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=ask) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert errors == [] and len(results) == THREADS
    assert counts == {"auto_tree": 1, "measure_verify_cost": 1, "measure_step_cost": 1}
    assert all(owned.values()), owned
    first = results[0]
    for r in results[1:]:
        assert r[0] is first[0] and r[1] is first[1] and r[2] is first[2] and r[3] is first[3]
    assert first[3] is first[2]  # EAGLE prices its tree with the budget's step cost
    assert set(first[1].table) <= set(theory.VERIFY_COST_SIZES)
    assert {"medusa_auto_tree", "verify_cost", "step_cost"} <= set(engine.calibrations)
    assert set(engine.calibrations.values()) == {1}, engine.calibrations  # learned state made once too
