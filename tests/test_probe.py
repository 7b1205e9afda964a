"""The EAGLE probe (``python -m playground.training.probe``): benchmark records are read as the
baseline's answers, the shipped head agrees with the real default target far above chance on real
questions, the chain figures are consistent, and bad input is a clear error."""

from __future__ import annotations

import gzip
import json

import pytest
import torch

from playground.training.probe import format_table, main, probe, read_baseline_answers

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def _write(path, rows):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def test_read_baseline_answers_keeps_the_longest_greedy_first_turn_answer(tmp_path):
    a, b = tmp_path / "a.jsonl.gz", tmp_path / "b.jsonl"
    _write(a, [{"question_id": 1, "method": "autoregressive", "output_ids": [5, 6], "prompt_tokens": 9},
               {"question_id": 1, "method": "eagle", "output_ids": [9, 9, 9, 9]},
               {"question_id": 1, "method": "autoregressive", "turn": 1, "output_ids": [4, 4, 4, 4, 4]},
               {"question_id": 1, "method": "autoregressive", "temperature": 0.7, "output_ids": [3, 3, 3, 3, 3]},
               {"question_id": 2, "method": "autoregressive", "output_ids": [7]}])
    _write(b, [{"question_id": 1, "method": "autoregressive", "turn": 0, "temperature": 0.0,
                "output_ids": [5, 6, 8], "prompt_tokens": 9}])
    assert read_baseline_answers([a, b]) == {1: (9, [5, 6, 8]), 2: (-1, [7])}


def test_read_baseline_answers_rejects_bad_files(tmp_path):
    only_eagle = tmp_path / "e.jsonl"
    _write(only_eagle, [{"question_id": 1, "method": "eagle", "output_ids": [1]}])
    with pytest.raises(ValueError, match="no greedy first-turn autoregressive rows"):
        read_baseline_answers([only_eagle])
    with pytest.raises(ValueError, match="could not read"):
        read_baseline_answers([tmp_path / "missing.jsonl"])
    broken = tmp_path / "broken.jsonl"
    broken.write_text("{not json\n")
    with pytest.raises(ValueError, match="could not read"):
        read_baseline_answers([broken])
    no_ids = tmp_path / "no_ids.jsonl"
    _write(no_ids, [{"question_id": 1, "method": "autoregressive"}])
    with pytest.raises(ValueError, match="without question_id and output_ids"):
        read_baseline_answers([no_ids])


def test_cli_rejects_bad_input_before_loading_a_model(tmp_path, capsys):
    assert main(["--records", str(tmp_path / "missing.jsonl")]) == 2
    assert "could not read benchmark records" in capsys.readouterr().err
    assert main(["--questions", str(tmp_path / "none.jsonl")]) == 2
    assert "none.jsonl" in capsys.readouterr().err
    assert main(["--json", str(tmp_path / "no" / "such" / "folder.json")]) == 2
    assert "--json: no folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # --records needs at least one file
        main(["--records"])
    with pytest.raises(SystemExit):  # the target's dtype is one the engine loads
        main(["--dtype", "float64"])


@pytest.mark.real_model
def test_shipped_head_agrees_with_the_real_target_on_real_questions(real_target):
    """Greedy answers of the real default target (float32) to two real requests: the shipped head's
    top-1 agrees with the target on well over a fifth of the answer positions at depth 1 (a random
    head over 8192 draft ids: about 0.0001), each chain figure is at most the one before, and the
    per-category rows add up to the overall row."""
    from playground.engine.eagle import DEFAULT_EAGLE_DIR, load_eagle
    if not (DEFAULT_EAGLE_DIR / "config.json").is_file():
        pytest.skip("no shipped EAGLE head")
    head = load_eagle(DEFAULT_EAGLE_DIR).float().attach_embedding(real_target.model.get_input_embeddings())
    tok = real_target.tokenizer
    records = []
    for cat, text in (("math", "A farmer has 12 cows and buys 7 more. How many cows does he have now?"),
                      ("writing", "Write a short note inviting a friend to a picnic on Saturday.")):
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                      return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = real_target.model.generate(ids, max_new_tokens=40, do_sample=False)[0].tolist()
        records.append({"input_ids": out, "prompt_len": ids.shape[1], "category": cat})
    hooks = lambda: sum(len(m._forward_hooks) for m in real_target.model.modules())
    before = hooks()  # the shared model may carry other tests' (the engine's) feature hooks
    result = probe(head, real_target.model, records, steps=3)
    assert set(result) == {"math", "writing", "overall"}
    overall = result["overall"]
    assert overall["records"] == 2
    assert overall["answer_tokens"] == result["math"]["answer_tokens"] + result["writing"]["answer_tokens"]
    assert overall["top1_per_depth"][0] > 0.2
    assert 0.5 < overall["in_draft_vocab"] <= 1.0
    chain = overall["chain_acceptance_per_depth"]
    assert all(later <= earlier for earlier, later in zip(chain, chain[1:]))
    # The teacher's forward hooks are gone: the shared model is as it was.
    assert hooks() == before
    table = format_table(result)
    assert table.splitlines()[-1].startswith("| overall | 2 |")
    with pytest.raises(ValueError, match="at least one answer token"):
        probe(head, real_target.model, [{"input_ids": records[0]["input_ids"][:5], "prompt_len": 5}])


@pytest.mark.real_model
def test_command_line_answers_questions_and_reads_records(real_target, tmp_path, capsys):
    """One writing question answered on the spot (8 tokens) and one roleplay question whose answer comes
    from a benchmark record: both are probed, the JSON file holds the figures, and a record whose prompt
    length does not match this tokenizer's prompt is skipped with a message."""
    from playground.bench.questions import load_questions
    from playground.engine.eagle import DEFAULT_EAGLE_DIR
    if not (DEFAULT_EAGLE_DIR / "config.json").is_file():
        pytest.skip("no shipped EAGLE head")
    qs = load_questions("spec_bench", ["roleplay", "humanities"], per_category_n=1)
    tok = real_target.tokenizer
    ids = tok.apply_chat_template([{"role": "user", "content": qs[0].turns[0]}], add_generation_prompt=True,
                                  return_tensors="pt")["input_ids"]
    with torch.no_grad():
        answer = real_target.model.generate(ids, max_new_tokens=8, do_sample=False)[0, ids.shape[1]:].tolist()
    rec = tmp_path / "runs.jsonl"
    _write(rec, [{"question_id": qs[0].question_id, "method": "autoregressive", "turn": 0,
                  "prompt_tokens": ids.shape[1], "output_ids": answer},
                 {"question_id": qs[1].question_id, "method": "autoregressive", "prompt_tokens": 3,
                  "output_ids": answer}])
    out = tmp_path / "probe.json"
    assert main(["--categories", "roleplay", "humanities", "writing", "--per-category", "1",
                 "--max-new-tokens", "8", "--records", str(rec), "--json", str(out)]) == 0
    text = capsys.readouterr()
    assert "2 questions (1 answered here, 1 from --records)" in text.out
    assert f"skipped question {qs[1].question_id}" in text.err
    result = json.loads(out.read_text())["result"]
    assert set(result) == {"roleplay", "writing", "overall"}
    assert result["roleplay"]["answer_tokens"] == len(answer) and result["overall"]["records"] == 2
