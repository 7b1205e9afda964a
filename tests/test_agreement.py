"""Teacher-forced agreement on benchmark answers (playground.training.agreement): prompts rebuilt
as the benchmark built them, draft agreement that matches what greedy draft-model decoding
accepts, head accuracy that matches the Medusa calibration measurement, and the command line."""

from __future__ import annotations

import json

import pytest

from playground import bench
from playground.bench import cli
from playground.engine import Engine, MethodSpec
from playground.engine import GenerationSettings
from playground.engine import load_heads
from playground.engine.medusa.heads import heads_spec
from playground.engine.medusa import measure_head_accuracy
from playground.engine import default_draft_spec, load_draft
from playground.training import agreement

pytestmark = [pytest.mark.real_model, pytest.mark.usefixtures("torch_single_thread")]

QUESTION = {"question_id": 7, "category": "writing",
            "turns": ["Write two sentences about the sea.", "Now make them rhyme."]}


@pytest.fixture(scope="module")
def engine(real_target):
    draft = load_draft(default_draft_spec("default"), real_target)
    return Engine(real_target, draft, medusa=load_heads(heads_spec("default"), real_target))


@pytest.fixture(scope="module")
def results(engine, tmp_path_factory):
    """A two-turn benchmark run of the baseline (16 new tokens a turn), as ``bench --out`` writes it."""
    folder = tmp_path_factory.mktemp("agreement")
    (folder / "q.jsonl").write_text(json.dumps(QUESTION) + "\n")
    out = folder / "runs.jsonl"
    assert cli.main(["--questions", str(folder / "q.jsonl"), "--methods", "autoregressive", "--max-new-tokens", "16",
                     "--out", str(out), "--no-progress", "--draft", "none", "--medusa", "none"]) == 0
    return folder, [json.loads(line) for line in out.read_text().splitlines()]


def test_prompts_are_rebuilt_as_the_benchmark_built_them(engine, results):
    folder, records = results
    seqs = agreement.bench_sequences(records, bench.load_questions(folder / "q.jsonl"), engine.encode_prompt)
    assert [(s.category, s.turn) for s in seqs] == [("writing", 0), ("writing", 1)]
    first, second = seqs
    assert first.prompt_ids == engine.encode_prompt(QUESTION["turns"][0])
    assert second.prompt_ids == engine.encode_prompt([
        {"role": "user", "content": QUESTION["turns"][0]},
        {"role": "assistant", "content": records[0]["output_text"]},
        {"role": "user", "content": QUESTION["turns"][1]}])
    assert [s.answer_ids for s in seqs] == [r["output_ids"] for r in records]
    # Another question file (different turns): the prompt lengths disagree with the records.
    other = [bench.Question(7, "writing", ("Hi.", "Now make them rhyme."))]
    with pytest.raises(ValueError, match="rebuilt prompt has"):
        agreement.bench_sequences(records, other, engine.encode_prompt)
    with pytest.raises(ValueError, match="no autoregressive records"):
        agreement.bench_sequences([dict(r, method="medusa") for r in records], other, engine.encode_prompt)


def test_draft_agreement_is_what_greedy_draft_decoding_accepts(engine):
    """With K = 1 every step drafts one token at the next output position; greedy verification
    accepts it exactly where the teacher-forced draft's argmax is the target's token."""
    prompt = engine.encode_prompt("Explain what a prime number is.")
    tokens, checked = [], []
    for event in engine.run_one(prompt, MethodSpec("draft_model", {"k": 1}), GenerationSettings(max_new_tokens=40)):
        if event.step > 0 and event.proposed == 1:
            checked.append((len(tokens), event.accepted == 1))
        tokens += event.tokens
    seq = agreement.TeacherSequence("x", 0, prompt, tokens)
    hits = agreement.draft_hits(engine.draft.model, engine.draft.token_map, seq)
    assert hits.shape == (len(tokens),) and len(checked) >= 10
    mismatches = sum(bool(hits[i]) != accepted for i, accepted in checked)
    assert mismatches <= 1, f"{mismatches} of {len(checked)} steps disagree"  # one near-tie allowed
    assert 0 < sum(a for _, a in checked) < len(checked)


def test_head_accuracy_matches_the_calibration_measurement(engine):
    """Head k's top-1 hits over the target's greedy answer equal the auto tree's calibration
    measurement (incremental decoding) on the same prompt."""
    prompt = engine.encode_prompt("List three uses of copper.")
    expected = measure_head_accuracy(engine.target_lm, engine.medusa, prompt, new_tokens=24, top_k=1)
    tokens = []
    for event in engine.run_one(prompt, MethodSpec("autoregressive"), GenerationSettings(max_new_tokens=24)):
        tokens += event.tokens
    assert len(tokens) == 24, "the answer ended early; pick a longer-winded prompt"
    cands = agreement.head_candidates(engine.target.model, engine.medusa,
                                      agreement.TeacherSequence("x", 0, prompt, tokens), engine.target_lm.vocab_size, 3)
    assert cands.shape == (24, engine.medusa.num_heads, 3)
    hits = agreement.head_hits(cands, tokens)
    assert [tot for _, tot in hits] == [24 - k - 1 for k in range(engine.medusa.num_heads)]
    for k, (hit, tot) in enumerate(hits):
        assert hit / tot == pytest.approx(expected[k][0], abs=1.01 / tot), k


def test_command_line_prints_the_table(results, capsys):
    folder, _ = results
    assert agreement.main(["--results", str(folder / "runs.jsonl"), "--questions", str(folder / "q.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "teacher-forced on 2 baseline answers (32 tokens)" in out
    lines = out.splitlines()
    assert lines[1].split() == ["category", "turn", "tokens", "draft", "head", "1", "head", "2", "head", "3",
                                "head", "4"]
    assert [ln.split()[:3] for ln in lines[2:7]] == [["writing", "0", "16"], ["writing", "1", "16"],
                                                     ["all", "0", "16"], ["all", "1", "16"], ["all", "all", "32"]]
    assert all(ln.split()[3].endswith("%") for ln in lines[2:7])
    # Then the teacher-forced tau of the auto tree's first n nodes, n = 1, 2, 4, ... 64.
    assert lines[7].startswith("nodes  depth  tau")
    rows = [ln.split() for ln in lines[8:]]
    assert [int(r[0]) for r in rows] == [1, 2, 4, 7, 11, 15, 23, 31, 64]
    assert all(1.0 <= float(r[2]) <= 5.0 and 1.0 <= float(r[3]) for r in rows)
    assert agreement.main(["--results", str(folder / "missing.jsonl"), "--questions", str(folder / "q.jsonl")]) == 2


def test_tree_walk_is_what_greedy_medusa_decoding_accepts(engine):
    """The teacher-forced walk over the baseline's answer accepts, step by step, what greedy
    Medusa decoding with the same tree accepted (one near-tie step allowed)."""
    from playground.engine import MEDUSA_TOP_K
    from playground.engine import greedy_tree, rank_probs_from_accuracy

    paths = [p for p, _ in greedy_tree(rank_probs_from_accuracy(engine.medusa.top_k_accuracy), 7)]
    prompt = engine.encode_prompt("Explain how a bicycle stays upright.")
    events = list(engine.run_one(prompt, MethodSpec("medusa", {"tree_choices": json.dumps(paths), "budget": "off"}),
                                 GenerationSettings(max_new_tokens=48)))
    tokens = [t for e in events for t in e.tokens]
    cands = agreement.head_candidates(engine.target.model, engine.medusa,
                                      agreement.TeacherSequence("x", 0, prompt, tokens), engine.target_lm.vocab_size,
                                      MEDUSA_TOP_K)
    walk = agreement.tree_accepts(tokens, cands, paths)
    decoded = [e.accepted for e in events[1:]]
    assert sum(walk) > 0 and len(walk) == len(tokens) - sum(walk)
    differ = sum(a != b for a, b in zip(walk, decoded)) + abs(len(walk) - 1 - len(decoded))
    assert differ <= 1, (walk, decoded)
