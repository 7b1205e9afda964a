"""Self-distillation data (playground.training.data): Magpie prefixes, the record format, the
teacher's top-k soft labels, and resuming an interrupted run without repeating a batch."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import FakeLoaded, tiny_llama
from playground.training.data import (FOLLOW_UP_OPENERS, SYSTEM_PROMPTS, USER_OPENERS, generate_conversations,
                                      load_answer_states, load_records, load_states_for, magpie_prefix,
                                      split_records)
from playground.training.medusa import collect_features

pytestmark = pytest.mark.real_model  # the default model's tokenizer and chat template


@pytest.fixture(scope="module")
def tokenizer(real_target):
    return real_target.tokenizer


def test_magpie_prefix_is_the_template_up_to_the_user_turn(tokenizer):
    prefix = magpie_prefix(tokenizer, SYSTEM_PROMPTS[0])
    assert prefix.endswith("<|im_start|>user\n")
    assert SYSTEM_PROMPTS[0] in prefix and "MAGPIE" not in prefix


def test_conversations_file_format_teacher_labels_and_resume(tokenizer, tmp_path, torch_single_thread):
    vocab = len(tokenizer)
    # Near-uniform next-token distributions (small output weights): requests are random text;
    # one id in ten ends a turn, so most rows stop well inside the caps.
    model = tiny_llama(0, vocab_size=vocab, head_std=0.02)
    stop_ids = [tokenizer.eos_token_id] + list(range(3, vocab, 10))
    out = tmp_path / "conv.jsonl"
    kwargs = dict(batch_size=6, question_tokens=40, answer_tokens=7, stop_ids=stop_ids, teacher_top_k=4,
                  keep_states=True, target_name="tiny", log=lambda _: None)

    have = generate_conversations(model, tokenizer, out, 4, **kwargs)
    first = load_records(out)
    assert have == len(first) >= 4
    for r in first:
        ids, n = r["input_ids"], r["prompt_len"]
        prompt = tokenizer.apply_chat_template([{"role": "system", "content": r["system"]},
                                                {"role": "user", "content": r["question"]}],
                                               tokenize=False, add_generation_prompt=True)
        assert ids[:n] == tokenizer(prompt, add_special_tokens=False)["input_ids"]
        answer = ids[n:]
        assert 1 <= len(answer) <= 7 and not any(t in stop_ids for t in answer[:-1])
        assert len(r["question"]) >= 12 and r["system"] in SYSTEM_PROMPTS
        # Greedy answers: every answer token is the teacher's top-1 at its position.
        assert [row[0] for row in r["teacher_top_ids"]] == answer
        assert all(len(row) == 4 for row in r["teacher_top_ids"])
        logprobs = torch.tensor(r["teacher_top_logprobs"])
        assert bool((logprobs <= 0).all()) and bool((logprobs[:, :-1] >= logprobs[:, 1:] - 1e-3).all())

    # Resume: new records continue after the last batch and never repeat a request.
    have = generate_conversations(model, tokenizer, out, have + 3, **kwargs)
    records = load_records(out)
    assert have == len(records) >= len(first) + 3
    assert records[:len(first)] == first
    last_batch = max(r["batch"] for r in first)
    assert all(r["batch"] > last_batch for r in records[len(first):])
    assert len({r["question"] for r in records}) == len(records)
    assert all(json.loads(line) for line in out.read_text().splitlines())

    # The saved hidden states are the ones the Medusa trainer would compute (bfloat16 storage).
    saved = load_answer_states(out, records, "tiny")
    assert all(s is not None and s.shape == (len(r["input_ids"]) - r["prompt_len"], 32)
               for s, r in zip(saved, records))
    for r, states in zip(records, saved):
        if len(r["input_ids"]) - r["prompt_len"] < 2:
            continue  # no position with a label two tokens ahead
        from_saved = collect_features(model, [r], 2, progress=False, saved_states=[states])
        computed = collect_features(model, [r], 2, progress=False)
        assert torch.equal(from_saved.labels, computed.labels)
        # The teacher row of head k's label is the distribution that chose it: its top-1 (greedy).
        valid = from_saved.labels != -100
        assert torch.equal(from_saved.teacher_ids[..., 0][valid], from_saved.labels[valid])
        assert bool((from_saved.teacher_ids[~valid] == -100).all())
        torch.testing.assert_close(from_saved.hidden.float(), computed.hidden.float(), atol=0.05, rtol=0.02)
    # States of another target are not used.
    assert load_answer_states(out, records, "another model") == [None] * len(records)


def test_num_must_be_positive(tokenizer, tmp_path):
    with pytest.raises(ValueError, match="num must be at least 1"):
        generate_conversations(tiny_llama(0), tokenizer, tmp_path / "x.jsonl", 0)


def test_multi_turn_conversations_with_openers(tokenizer, tmp_path, torch_single_thread):
    """``turns=2, openers=True``: each turn is a record; requests start with an opener; answers see the
    template's default system prompt; a follow-up's prompt is the whole conversation as the
    playground renders it; its states are saved under its own key; split keeps turns together."""
    vocab = len(tokenizer)
    model = tiny_llama(1, vocab_size=vocab, head_std=0.02)
    stop_ids = [tokenizer.eos_token_id] + list(range(3, vocab, 10))
    out = tmp_path / "mt.jsonl"
    have = generate_conversations(model, tokenizer, out, 6, batch_size=8, question_tokens=40, answer_tokens=6,
                                  stop_ids=stop_ids, teacher_top_k=3, keep_states=True, target_name="tiny",
                                  turns=2, openers=True, log=lambda _: None)
    records = load_records(out)
    assert have == len(records) >= 6
    first = {(r["batch"], r["row"]): r for r in records if r["turn"] == 0}
    follow = [r for r in records if r["turn"] == 1]
    assert first and follow and len(first) + len(follow) == len(records)
    for r in first.values():
        assert r["system"] == "" and r["question"].startswith(USER_OPENERS)
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": r["question"]}], tokenize=False,
                                               add_generation_prompt=True)
        assert r["input_ids"][:r["prompt_len"]] == tokenizer(prompt, add_special_tokens=False)["input_ids"]
    for r in follow:
        assert r["question"].startswith(FOLLOW_UP_OPENERS)
        before = first[(r["batch"], r["row"])]  # the same conversation's first turn
        chat = [{"role": "user", "content": before["question"]}, {"role": "assistant", "content": before["answer"]},
                {"role": "user", "content": r["question"]}]
        prompt = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        assert r["input_ids"][:r["prompt_len"]] == tokenizer(prompt, add_special_tokens=False)["input_ids"]
        assert [row[0] for row in r["teacher_top_ids"]] == r["input_ids"][r["prompt_len"]:]
    saved = load_answer_states(out, records, "tiny")
    assert all(s is not None and s.shape[0] == len(r["input_ids"]) - r["prompt_len"] for s, r in zip(saved, records))
    assert not torch.equal(saved[records.index(follow[0])][:1],
                           saved[records.index(first[(follow[0]["batch"], follow[0]["row"])])][:1])
    # Both turns of a conversation fall on the same side of the split.
    for held_out in (0.2, 0.5):
        train, held = split_records(records, held_out)
        assert held and train and len(train) + len(held) == len(records)
        sides = {}
        for side, part in (("train", train), ("held", held)):
            for r in part:
                assert sides.setdefault((r["batch"], r["row"]), side) == side


def test_several_data_files_load_in_order_with_their_states(tokenizer, tmp_path, torch_single_thread):
    vocab = len(tokenizer)
    model = tiny_llama(2, vocab_size=vocab, head_std=0.02)
    stop_ids = [tokenizer.eos_token_id] + list(range(3, vocab, 10))
    paths = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    for seed, path in enumerate(paths):
        generate_conversations(model, tokenizer, path, 2, batch_size=4, question_tokens=40, answer_tokens=4,
                               stop_ids=stop_ids, keep_states=True, target_name="tiny", seed=seed, log=lambda _: None)
    records = load_records(paths)
    assert records == [dict(r, source=str(p)) for p in paths for r in load_records(p)]
    assert load_records(paths[:1]) == load_records(paths[0])  # one file: no source field
    saved = load_states_for(paths, records, "tiny")
    direct = [s for p in paths for s in load_answer_states(p, load_records(p), "tiny")]
    assert len(saved) == len(direct) == len(records)
    assert all(a is not None and torch.equal(a, b) for a, b in zip(saved, direct))


def test_turns_must_be_positive(tokenizer, tmp_path):
    with pytest.raises(ValueError, match="turns must be at least 1"):
        generate_conversations(tiny_llama(0), tokenizer, tmp_path / "x.jsonl", 1, turns=0)


# --------------------------------------------------------------------------------------------
# Command line: bad input is refused before the model loads, with one error line and status 2
# --------------------------------------------------------------------------------------------


def _no_model(*args, **kwargs):
    raise AssertionError("the model must not load")


@pytest.mark.parametrize("argv, message", [
    (["--num", "0"], "argument --num: must be at least 1, got 0"),
    (["--turns", "0"], "argument --turns: must be at least 1, got 0"),
    (["--batch-size", "0"], "argument --batch-size: must be at least 1, got 0"),
    (["--answer-tokens", "0"], "argument --answer-tokens: must be at least 1, got 0"),
    (["--question-tokens", "0"], "argument --question-tokens: must be at least 13, got 0"),
    (["--question-tokens", "2"], "at least 12 characters and ends with the end-of-turn token"),
    (["--num", "many"], "argument --num: must be an integer, got 'many'"),
    (["--teacher-top-k", "-1"], "argument --teacher-top-k: must be at least 0, got -1"),
])
def test_command_line_refuses_bad_numbers_before_loading(tmp_path, monkeypatch, capsys, argv, message):
    from playground.training import data

    monkeypatch.setattr("playground.engine.load_model", _no_model)
    assert data.main(["--out", str(tmp_path / "c.jsonl")] + argv) == 2
    err = capsys.readouterr().err
    assert message in err and "error:" in err and "Traceback" not in err
    assert not (tmp_path / "c.jsonl").exists()


def test_question_token_minimum_follows_the_request_rule():
    from playground.training.data import MIN_QUESTION_TOKENS, MIN_REQUEST_CHARS

    assert MIN_QUESTION_TOKENS == MIN_REQUEST_CHARS + 1  # one-character tokens plus the end-of-turn token


@pytest.mark.parametrize("kwargs, message", [
    (dict(batch_size=0), "batch_size must be at least 1"), (dict(answer_tokens=0), "answer_tokens must be at least 1"),
    (dict(question_tokens=12), "question_tokens must be at least 13, got 12"),
    (dict(max_empty_batches=0), "max_empty_batches must be at least 1"),
])
def test_generate_conversations_refuses_bad_sizes(tmp_path, kwargs, message):
    """Checked before the model or tokenizer is used."""
    with pytest.raises(ValueError, match=message):
        generate_conversations(None, None, tmp_path / "x.jsonl", 1, **kwargs)


def test_command_line_refuses_an_out_file_that_is_not_conversations(tmp_path, monkeypatch, capsys):
    """A benchmark question file (or a folder) named as --out: a message, the file untouched, no model loaded."""
    from playground.training import data

    monkeypatch.setattr("playground.engine.load_model", _no_model)
    questions = tmp_path / "questions.jsonl"
    questions.write_text(json.dumps({"question_id": 81, "category": "writing", "turns": ["Compose a blog"]}) + "\n")
    before = questions.read_text()
    assert data.main(["--out", str(questions)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --out: ") and "is not a conversations file written by playground.training.data" in err
    assert "line 1" in err and "Traceback" not in err and questions.read_text() == before
    with pytest.raises(ValueError, match="not a conversations file"):
        generate_conversations(None, None, questions, 1)
    assert data.main(["--out", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err


def test_command_line_reports_a_target_that_does_not_load(tmp_path, monkeypatch, capsys):
    from playground.engine import ModelLoadError
    from playground.training import data

    def fail(spec, **kwargs):
        raise ModelLoadError(f"could not load model {spec!r}: not found locally")

    monkeypatch.setattr("playground.engine.load_model", fail)
    assert data.main(["--out", str(tmp_path / "c.jsonl"), "--target", "nope/nope"]) == 2
    err = capsys.readouterr().err
    assert err == "error: could not load model 'nope/nope': not found locally\n"


def test_help_shows_every_option_with_its_default(capsys):
    from playground.training import data

    parser = data.build_parser()
    assert all(a.help for a in parser._actions)
    assert data.main(["--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for text in ("--num NUM records wanted", "(default: 2000)", "(default: 32)", "(default: 64)", "(default: 192)",
                 "(default: auto)", "(default: 0)", "(default: 8)", "(default: True)", "at least 13"):
        assert text in out, text
    assert "USER_OPENERS" not in out and "(default: None)" not in out and "(default: False)" not in out


def _never_ending_requests(monkeypatch):
    """``_generate`` whose user turns never reach the end-of-turn token (as with a too small budget)."""
    from playground.training import data

    calls = []

    def fake(model, tokenizer, texts, max_new_tokens, *args, **kwargs):
        calls.append(len(texts))
        return [[tokenizer.encode(" word", add_special_tokens=False)[0]] * max_new_tokens for _ in texts], [], []

    monkeypatch.setattr(data, "_generate", fake)
    return calls


def test_generation_stops_when_no_request_ever_qualifies(tokenizer, tmp_path, monkeypatch):
    """Every batch logs progress, also one that made no record; after ``max_empty_batches`` such
    batches in a row the run stops with a message that says what to change."""
    from playground.training.data import NoRecordsError

    calls = _never_ending_requests(monkeypatch)
    logs = []
    with pytest.raises(NoRecordsError, match=r"3 batches in a row \(6 user requests\) produced no record.*"
                                             r"raise --question-tokens"):
        generate_conversations(None, tokenizer, tmp_path / "c.jsonl", 1, batch_size=2, question_tokens=13,
                               answer_tokens=8, max_empty_batches=3, log=logs.append)
    assert calls == [2, 2, 2] and len(logs) == 3
    assert all(line.startswith("[data] 0/1 records; batch ") for line in logs)
    assert "(3 such batches in a row)" in logs[-1]


def test_command_line_reports_a_run_that_makes_no_record(tokenizer, tmp_path, monkeypatch, capsys):
    from playground.training import data

    class _Loaded(FakeLoaded):
        spec = "tiny"

    _never_ending_requests(monkeypatch)
    monkeypatch.setattr("playground.engine.load_model",
                        lambda *a, **k: _Loaded(torch.nn.Identity(), tokenizer, eos_token_ids=(tokenizer.eos_token_id,)))
    rc = data.main(["--out", str(tmp_path / "c.jsonl"), "--question-tokens", "13", "--answer-tokens", "8",
                    "--batch-size", "2", "--num", "1"])
    assert rc == 2
    captured = capsys.readouterr()
    assert captured.out.count("no new request of 12+ characters ended within 13 tokens") == data.MAX_EMPTY_BATCHES
    assert captured.err.startswith(f"error: {data.MAX_EMPTY_BATCHES} batches in a row")
    assert captured.err.count("\n") == 1


def test_draft_trainer_help_describes_every_option(capsys):
    from playground.training import draft

    with pytest.raises(SystemExit) as exit_:
        draft.main(["--help"])
    assert exit_.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for text in ("--hidden HIDDEN draft hidden size", "(default: 384)", "--lr LR peak AdamW", "(default: 0.003)",
                 "--seed SEED random seed"):
        assert text in out, text
    assert "(default: None)" not in out and "(default: False)" not in out


def test_load_records_reads_the_committed_chunk_folders(tmp_path):
    """A folder of ``chunk_*.jsonl.gz`` (as ``playground.training.tasks`` writes ``data/selfgen/``)
    reads as its chunks in name order, each a source of its own; a gzip file reads as its text."""
    import gzip

    rows = [[{"input_ids": [1, 2, 3], "prompt_len": 1, "category": "qa"}],
            [{"input_ids": [4, 5], "prompt_len": 1}, {"input_ids": [6, 7, 8], "prompt_len": 2}]]
    folder = tmp_path / "selfgen"
    folder.mkdir()
    for k, part in reversed(list(enumerate(rows))):  # written out of order: read in name order
        with gzip.open(folder / f"chunk_{k:05d}.jsonl.gz", "wt") as f:
            f.write("".join(json.dumps(r) + "\n" for r in part))
    records = load_records(folder)
    assert [r["input_ids"] for r in records] == [[1, 2, 3], [4, 5], [6, 7, 8]]
    assert [r["source"] for r in records] == [str(folder / "chunk_00000.jsonl.gz")] + [str(folder / "chunk_00001.jsonl.gz")] * 2
    assert load_records(folder / "chunk_00001.jsonl.gz") == rows[1]
    assert load_records([folder]) == records
    assert load_states_for([folder], records, "tiny") == [None, None, None]  # no states saved: computed
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no chunk_"):
        load_records(tmp_path / "empty")


def test_progress_bar_reports_on_stderr(capsys, monkeypatch):
    """Enabled, the bar writes to stderr (tqdm, or plain lines where tqdm is missing); disabled, nothing."""
    import builtins

    from playground.training.cli import progress_bar

    bar = progress_bar(3, "quiet", False)
    bar.update(3)
    bar.close()
    real_import = builtins.__import__

    def no_tqdm(name, *args, **kwargs):
        if name == "tqdm":
            raise ImportError("no tqdm here")
        return real_import(name, *args, **kwargs)
    for hide in (False, True):
        with monkeypatch.context() as m:
            if hide:
                m.setattr(builtins, "__import__", no_tqdm)
            bar = progress_bar(3, f"features{int(hide)}", True)
            bar.update(3)
            bar.close()
    err = capsys.readouterr().err
    assert "features0" in err and "features1: 3/3" in err and "quiet" not in err


def test_round_samples_its_passages_at_the_passage_temperature(real_target, torch_single_thread):
    """``playground.training.tasks.generate_round``: at passage temperature 0 the passages (the
    ``writing`` records) are greedy, the same whatever the torch seed (rounds 0-107); at 0.8 they are
    sampled, the same for the same seed and round, not the greedy text, and marked ``sampled`` (so
    the draft and Medusa trainers and REST leave them out); ``passage_tokens`` bounds them."""
    from playground.training.tasks import generate_round

    model, tok = real_target.model.eval(), real_target.tokenizer
    saved = (tok.pad_token, tok.padding_side)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    stop = list(real_target.eos_token_ids)

    def passages(temperature):
        rows = generate_round(model, tok, 0, batch_size=3, answer_tokens=4, question_tokens=13, stop_ids=stop,
                              seed=0, carry=[], passage_tokens=10, passage_temperature=temperature)
        return [r for r in rows if r["category"] == "writing"], [r for r in rows if r["category"] != "writing"]

    try:
        greedy, others = passages(0.0)
        torch.manual_seed(1234)  # the round seeds its own sampling: an outside seed changes nothing
        sampled, _ = passages(0.8)
        again, _ = passages(0.8)
    finally:
        tok.pad_token, tok.padding_side = saved
    ids = lambda rows: [r["input_ids"][r["prompt_len"]:] for r in rows]
    assert len(greedy) == len(sampled) == 3 and all(1 <= len(p) <= 10 for p in ids(greedy) + ids(sampled))
    assert ids(again) == ids(sampled) and ids(sampled) != ids(greedy)
    assert all(r.get("sampled") is True for r in sampled)
    assert not any("sampled" in r for r in greedy + others)


def test_sampled_records_are_left_out_of_hard_label_training(tmp_path):
    """``load_records`` (the draft and Medusa trainers' reader) and REST's ``read_answers`` pass over
    records marked ``sampled``; the EAGLE trainer's reader keeps them (it learns the target's
    distribution at every position)."""
    import gzip

    from playground.engine.rest import read_answers
    from playground.training.eagle import read_records

    folder = tmp_path / "selfgen"
    folder.mkdir()
    rows = [{"input_ids": [1, 2, 3], "prompt_len": 1}, {"input_ids": [4, 5, 6], "prompt_len": 1, "sampled": True}]
    with gzip.open(folder / "chunk_00000.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    assert [r["input_ids"] for r in load_records(folder)] == [[1, 2, 3]]
    assert read_answers(folder) == [[2, 3]]
    assert [r["input_ids"] for r in read_records([folder])] == [[1, 2, 3], [4, 5, 6]]
