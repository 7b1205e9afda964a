"""The budget replay (playground.bench.replay) reproduces real greedy runs step for step."""

from __future__ import annotations

import pytest
import torch

from helpers import FakeLoaded, clear_greedy_baseline, run_events, tiny_llama
from playground.bench.replay import check_replayable, replay
from playground.engine import Engine, MethodSpec
from playground.engine import StepCost, VerifyCost

COST = StepCost(VerifyCost({1: 1.0, 2: 1.08, 5: 1.3, 9: 1.6, 17: 2.2, 33: 3.5}),
                VerifyCost({1: 1.0, 2: 1.1, 5: 1.35, 9: 1.7, 17: 2.4, 33: 3.8}), 20,
                VerifyCost({1: 1.0, 2: 1.2, 5: 1.5, 9: 1.9, 17: 2.6, 33: 4.0}),
                VerifyCost({1: 1.0, 2: 1.2, 5: 1.55, 9: 2.0, 17: 2.8, 33: 4.3}), 60)


@pytest.mark.parametrize("spec", ["prompt_lookup", "prompt_lookup:budget=off", "suffix",
                                  "mixture:members=suffix+prompt_lookup"])
def test_replay_matches_the_decoding_loop_step_for_step(spec):
    """Against the baseline's output, the replay makes the same steps as the real loop (the same
    proposal sizes and accepted tokens, the budget included), over seeds, and its time is the sum
    of the curve's costs of those steps."""
    from playground.bench.cli import method_spec

    model = tiny_llama(2)
    g = torch.Generator().manual_seed(3)
    for seed in range(6):
        engine = Engine(FakeLoaded(model))
        engine._persistent["step_cost"] = COST  # both runs price steps with one curve
        _, ms = method_spec(spec)
        prompt, baseline, _ = clear_greedy_baseline(engine.target_lm, g, 24, 5, 32)
        events = run_events(engine.target_lm, engine.make_drafter(ms), prompt, 32)
        engine.forget("learned/")
        out = replay(engine.make_drafter(ms), prompt, baseline, 32, COST)
        steps = [e for e in events if e.step > 0]
        assert out["new_tokens"] == len(baseline)
        assert [(q, a) for q, a, _, _ in out["trace"]] == [(1 + e.proposed, e.accepted) for e in steps], seed
        assert out["steps"] == len(steps) and out["proposed"] == sum(e.proposed for e in steps)
        assert out["time"] == pytest.approx(1 + sum(COST(q, chain, ctx) for q, _, chain, ctx in out["trace"]))
        assert any(q > 1 for q, *_ in out["trace"])  # something was drafted


def test_replay_refuses_drafters_that_need_the_target():
    check_replayable(MethodSpec("mixture", {"members": "suffix,prompt_lookup"}))
    for spec in (MethodSpec("recycling", {}), MethodSpec("mixture", {}), MethodSpec("eagle", {})):
        with pytest.raises(ValueError, match="cannot replay"):
            check_replayable(spec)
    with pytest.raises(ValueError, match="baseline"):
        replay(None, [1, 2], [], 8, COST)


def test_step_cost_round_trips_through_json(tmp_path):
    """The replay's --cost file: StepCost.as_dict / from_dict keep every curve and context."""
    import json
    back = StepCost.from_dict(json.loads(json.dumps(COST.as_dict())))
    for q in (1, 2, 4, 9, 30):
        for chain in (True, False):
            for ctx in (None, 10, 40, 200):
                assert back(q, chain, ctx) == pytest.approx(COST(q, chain, ctx))
    short = StepCost(COST.chain, COST.tree, 20)
    assert StepCost.from_dict(short.as_dict()).long_chain is None


def test_first_turn_rows_in_either_turn_numbering():
    """Records number turns from 0 (since 2026-12-02) or from 1 (older files): the replay takes each
    question's lowest turn of the baseline, never a second turn's row (whose prompt it cannot rebuild)."""
    from playground.bench.replay import first_turn_rows

    def row(q, turn, method="autoregressive"):
        return {"question_id": q, "turn": turn, "method": method, "output_ids": [q, turn]}
    new = [row(81, 0), row(81, 1), row(82, 0), row(81, 0, "suffix"), row(161, 0)]
    assert [(r["question_id"], r["turn"]) for r in first_turn_rows(new)] == [(81, 0), (82, 0), (161, 0)]
    old = [row(81, 1), row(81, 2), row(161, 1)]
    assert [(r["question_id"], r["turn"]) for r in first_turn_rows(old)] == [(81, 1), (161, 1)]
    assert first_turn_rows([row(81, 0, "suffix")]) == []


def test_cli_refuses_records_without_a_baseline(tmp_path, capsys):
    """No autoregressive rows: a clear error and exit 2, before any model loads."""
    import json

    from playground.bench.replay import main

    records = tmp_path / "r.jsonl"
    records.write_text(json.dumps({"question_id": 81, "turn": 0, "method": "suffix", "output_ids": [1]}) + "\n")
    assert main(["--records", str(records), "--questions", "assets/bench/spec_bench_dev.jsonl",
                 "--methods", "prompt_lookup"]) == 2
    assert "no autoregressive rows" in capsys.readouterr().err


def test_a_saved_curve_is_the_budgets_curve_too(tmp_path):
    """With a cost file, every drafter's per-step budget prunes with the file's curve (not one timed on
    the spot, which moves with the machine's load), and a missing file is written from one timing, its
    folder made."""
    import json

    from playground.bench.replay import replay_cost

    path = tmp_path / "cost.json"
    path.write_text(json.dumps(COST.as_dict()))
    engine = Engine(FakeLoaded(tiny_llama(2)))
    cost = replay_cost(engine, str(path))
    assert cost.as_dict() == COST.as_dict()
    drafter = engine.make_drafter(MethodSpec("prompt_lookup"))  # budget auto
    assert drafter.budget_cost is cost
    fresh = tmp_path / "artifacts" / "fresh.json"  # in a folder not made yet (a clone has no artifacts/)
    timed = replay_cost(Engine(FakeLoaded(tiny_llama(2))), str(fresh))
    from playground.engine import StepCost
    assert StepCost.from_dict(json.loads(fresh.read_text())).as_dict() == timed.as_dict()
