"""Medusa-1 training: a short run on a tiny random model lowers the loss and raises head accuracy;
the command line trains and saves heads in the reference format that the engine loads."""

from __future__ import annotations

import json
import math

import pytest
import torch

from helpers import FakeLoaded, tiny_llama
from playground.engine import MedusaHeads, load_heads
from playground.training.medusa import (IGNORE, LabelVocab, _positions, collect_features, evaluate, head_losses,
                                        train_heads)

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def _greedy_records(model, n: int, length: int, seed: int) -> list[dict]:
    """Conversations whose answers are the model's own greedy continuations (self-distillation)."""
    g = torch.Generator().manual_seed(seed)
    records = []
    for _ in range(n):
        prompt = torch.randint(0, 64, (6,), generator=g).tolist()
        ids = model.generate(torch.tensor([prompt]), max_new_tokens=length, do_sample=False,
                             pad_token_id=0)[0].tolist()
        records.append({"input_ids": ids, "prompt_len": len(prompt)})
    return records


def _random_trained_heads():
    """A tiny frozen model and two one-block heads on its lm_head with random (non-identity) weights."""
    torch.manual_seed(0)
    model = tiny_llama(0).requires_grad_(False)
    heads = MedusaHeads(32, 64, 2, 1).attach_lm_head(model.get_output_embeddings())
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, 0.3)
    return model, heads


def test_positions_and_labels():
    """Positions run from the last prompt token to the third-last token; head k's label is the
    token k + 2 ahead (IGNORE past the end)."""
    positions, labels = _positions([10, 11, 12, 13, 14, 15], prompt_len=3, num_heads=2)
    assert positions == [2, 3]
    assert labels == [[14, 15], [15, IGNORE]]


def test_label_vocab_loss_matches_the_full_softmax():
    """Over every token the label-vocabulary loss equals the full-vocabulary loss; over the labels'
    tokens only it is the same cross-entropy with the other tokens left out of the normaliser."""
    model, heads = _random_trained_heads()
    hidden = torch.randn(12, 32)
    labels = torch.randint(0, 64, (12, 2))
    labels[3, 1] = IGNORE
    full = head_losses(heads, hidden, labels)
    everything = LabelVocab.from_labels(heads, torch.arange(64)[:, None].expand(64, 2))
    torch.testing.assert_close(head_losses(heads, hidden, everything.index(labels), everything), full)
    vocab = LabelVocab.from_labels(heads, labels)
    assert torch.equal(vocab.ids, torch.unique(labels[labels != IGNORE]))
    rows = vocab.index(labels)
    assert torch.equal(vocab.ids[rows[rows != IGNORE]], labels[labels != IGNORE]) and rows[3, 1] == IGNORE
    logits = heads(hidden)[..., vocab.ids]
    expected = torch.stack([torch.nn.functional.cross_entropy(logits[:, k], rows[:, k], ignore_index=IGNORE)
                            for k in range(2)])
    torch.testing.assert_close(head_losses(heads, hidden, rows, vocab), expected)
    missing = next(t for t in range(64) if t not in vocab.ids.tolist())  # 23 labels: some token is missing
    with pytest.raises(ValueError, match="not in the label vocabulary"):
        vocab.index(torch.full((1, 2), missing))
    with pytest.raises(ValueError, match="share an attached lm_head"):
        LabelVocab.from_labels(MedusaHeads(32, 64, 2, 1, share_lm_head=False), labels)


def test_distillation_loss_against_the_teachers_top_k():
    """KD over the stored top-k: a teacher sure of the label gives the plain cross-entropy; a
    teacher that spreads its mass gives the cross-entropy against that renormalised distribution
    (by hand); ``distill`` mixes the two; absent rows (IGNORE) and teacher tokens outside the label
    vocabulary drop out; a weight outside [0, 1] is refused."""
    model, heads = _random_trained_heads()
    hidden = torch.randn(6, 32)
    labels = torch.randint(0, 64, (6, 2))
    ce = head_losses(heads, hidden, labels)
    sure_ids = torch.stack([labels, torch.full_like(labels, IGNORE)], -1)  # (6, 2, 2): label, then absent
    sure = (sure_ids, torch.zeros(6, 2, 2))
    torch.testing.assert_close(head_losses(heads, hidden, labels, teacher=sure, distill=1.0), ce)
    spread_ids = torch.stack([labels, (labels + 1) % 64], -1)
    lp = torch.log(torch.tensor([0.6, 0.2])).expand(6, 2, 2)  # renormalised: 0.75 / 0.25
    logp = heads(hidden).float().log_softmax(-1)
    by_hand = -(0.75 * logp.gather(-1, spread_ids[..., :1]) + 0.25 * logp.gather(-1, spread_ids[..., 1:])).squeeze(-1)
    kd = head_losses(heads, hidden, labels, teacher=(spread_ids, lp), distill=1.0)
    torch.testing.assert_close(kd, by_hand.mean(0))
    torch.testing.assert_close(head_losses(heads, hidden, labels, teacher=(spread_ids, lp), distill=0.25),
                               0.75 * ce + 0.25 * kd)
    torch.testing.assert_close(head_losses(heads, hidden, labels, teacher=(spread_ids, lp), distill=0.0), ce)
    none = (torch.full((6, 2, 2), IGNORE), torch.zeros(6, 2, 2))
    torch.testing.assert_close(head_losses(heads, hidden, labels, teacher=none, distill=1.0), ce)
    vocab = LabelVocab.from_labels(heads, labels)
    outside = torch.tensor([t for t in range(64) if t not in vocab.ids.tolist()][:1])
    assert torch.equal(vocab.index(torch.cat([vocab.ids[:2], outside]), outside_ok=True)[-1], torch.tensor(IGNORE))
    with pytest.raises(ValueError, match=r"distill must be in \[0, 1\]"):
        head_losses(heads, hidden, labels, teacher=sure, distill=1.5)


@pytest.mark.parametrize("label_vocab", [True, False])
def test_short_training_run_lowers_the_loss(label_vocab):
    """40 steps on self-distilled data of a tiny model lower the weighted loss (mean of the last
    10 steps below 80% of the first 10) and raise head 1's held-out top-1 accuracy above the
    identity heads' (zero-initialised blocks)."""
    model = tiny_llama(0).requires_grad_(False)
    records = _greedy_records(model, 24, 40, seed=1)
    train = collect_features(model, records[:20], num_heads=2, batch_size=4, progress=False)
    held = collect_features(model, records[20:], num_heads=2, batch_size=4, progress=False)
    heads = MedusaHeads(32, 64, 2, 1).attach_lm_head(model.get_output_embeddings())
    before, _ = evaluate(heads, held)
    history = train_heads(heads, train, max_steps=40, batch_size=32, lr=1e-2, progress=False, label_vocab=label_vocab)
    after, _ = evaluate(heads, held)
    first, last = sum(history[:10]) / 10, sum(history[-10:]) / 10
    assert last < 0.8 * first, (first, last)
    assert after[0][0] > before[0][0], (before[0][0], after[0][0])
    # Proposing from the training labels only: held-out labels outside them are misses, and the
    # loss stays finite (it leaves them out).
    heads.set_proposal_vocab(torch.unique(train.labels[train.labels != IGNORE])[:20])
    accuracy, losses = evaluate(heads, held)
    assert all(math.isfinite(x) for x in losses) and 0 <= accuracy[0][0] <= 1


def test_command_line_trains_and_saves(tmp_path, monkeypatch):
    """``python -m playground.training.medusa`` on a tiny model folder and a JSONL file writes
    config.json and medusa_lm_head.safetensors (no per-head projection with the shared lm_head)
    with the held-out accuracy, and the engine loads the result."""
    from playground.training import medusa as trainer

    model = tiny_llama(0)
    folder = tmp_path / "tiny"
    model.save_pretrained(folder)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _greedy_records(model, 8, 20, seed=2)))

    class _Loaded(FakeLoaded):
        spec = str(folder)
        device = torch.device("cpu")

    monkeypatch.setattr("playground.engine.load_model", lambda *a, **k: _Loaded(model))
    out = tmp_path / "heads"
    rc = trainer.main(["--target", str(folder), "--data", str(data), "--out", str(out), "--heads", "3",
                       "--max-steps", "5", "--batch-size", "16", "--no-progress"])
    assert rc == 0
    config = json.loads((out / "config.json").read_text())
    assert config["medusa_num_heads"] == 3 and config["medusa_num_layers"] == 1
    assert len(config["top_k_accuracy"]) == 3 and len(config["top_k_accuracy"][0]) == 10
    heads = load_heads(out, FakeLoaded(model))
    assert heads.share_lm_head and heads.num_heads == 3 and heads.top_k_accuracy is not None


def test_warm_start_keeps_the_heads_and_adds_identity_blocks():
    """Heads warm-started from trained ones, with one more block per head and one more head,
    compute exactly what the trained heads did (the extra block is the identity; the extra head is
    an identity head); mismatches are refused."""
    from playground.training.medusa import warm_start

    model, init = _random_trained_heads()
    heads = warm_start(MedusaHeads(32, 64, 3, 2).attach_lm_head(model.get_output_embeddings()), init)
    hidden = torch.randn(5, 32)
    with torch.no_grad():
        torch.testing.assert_close(heads(hidden)[:, :2], init(hidden), rtol=0, atol=0)
        torch.testing.assert_close(heads(hidden)[:, 2], model.get_output_embeddings()(hidden))
    with pytest.raises(ValueError, match="cannot hold them"):
        warm_start(MedusaHeads(32, 64, 1, 1), init)
    with pytest.raises(ValueError, match="hidden size 32"):
        warm_start(MedusaHeads(16, 64, 2, 1), init)
    with pytest.raises(ValueError, match="agree on sharing"):
        warm_start(MedusaHeads(32, 64, 2, 1, share_lm_head=False), init)


def test_command_line_init_fine_tunes_saved_heads(tmp_path, monkeypatch):
    """``--init`` starts from saved heads and the result is deeper when ``--layers`` says so (saved
    in float16 with ``--save-dtype``, loaded in the target's dtype); a bad ``--init`` exits with a message."""
    from playground.training import medusa as trainer

    model = tiny_llama(0)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _greedy_records(model, 8, 20, seed=2)))

    class _Loaded(FakeLoaded):
        spec = "tiny"
        device = torch.device("cpu")

    monkeypatch.setattr("playground.engine.load_model", lambda *a, **k: _Loaded(model))
    common = ["--data", str(data), "--heads", "2", "--batch-size", "16", "--no-progress"]
    assert trainer.main(common + ["--out", str(tmp_path / "a"), "--max-steps", "20", "--lr", "1e-2"]) == 0
    assert trainer.main(common + ["--out", str(tmp_path / "b"), "--max-steps", "5", "--layers", "2",
                                  "--init", str(tmp_path / "a"), "--save-dtype", "float16"]) == 0
    config = json.loads((tmp_path / "b" / "config.json").read_text())
    assert config["medusa_num_layers"] == 2
    from safetensors.torch import load_file

    assert {t.dtype for t in load_file(str(tmp_path / "b" / "medusa_lm_head.safetensors")).values()} == {torch.float16}
    assert next(load_heads(tmp_path / "b", FakeLoaded(model)).parameters()).dtype == torch.float32
    assert set(json.loads((tmp_path / "a" / "config.json").read_text())["proposal_vocab"]) <= set(config["proposal_vocab"])
    assert trainer.main(common + ["--out", str(tmp_path / "c"), "--max-steps", "1", "--heads", "1",
                                  "--init", str(tmp_path / "a")]) == 2


def _no_model(*args, **kwargs):
    raise AssertionError("the target must not load")


@pytest.mark.parametrize("argv, message", [
    (["--heads", "0"], "argument --heads: must be in [1, 16], got 0"),
    (["--heads", "17"], "argument --heads: must be in [1, 16], got 17"),
    (["--layers", "0"], "argument --layers: must be at least 1, got 0"),
    (["--lr", "-1"], "argument --lr: must be > 0, got -1"),
    (["--lr", "nan"], "argument --lr: must be a finite number, got nan"),
    (["--distill", "2"], "argument --distill: must be in [0, 1], got 2"),
    (["--max-steps", "0"], "argument --max-steps: must be at least 1, got 0"),
    (["--epochs", "0"], "argument --epochs: must be > 0, got 0"),
    (["--batch-size", "0"], "argument --batch-size: must be at least 1, got 0"),
    (["--held-out", "0"], "argument --held-out: must be in (0, 1), got 0"),
    (["--held-out", "1"], "argument --held-out: must be in (0, 1), got 1"),
    (["--max-conversations", "0"], "argument --max-conversations: must be at least 1, got 0"),
    (["--heads", "two"], "argument --heads: must be an integer, got 'two'"),
])
def test_command_line_refuses_bad_numbers_before_loading(tmp_path, monkeypatch, capsys, argv, message):
    """Every number is checked by the parser: status 2 and argparse's error line, no target loaded,
    nothing saved (``--max-steps 0`` used to save untrained identity heads)."""
    from playground.training import medusa as trainer

    monkeypatch.setattr("playground.engine.load_model", _no_model)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"input_ids": [1, 2, 3, 4, 5], "prompt_len": 2}) + "\n" for _ in range(4)))
    assert trainer.main(["--data", str(data), "--out", str(tmp_path / "heads")] + argv) == 2
    err = capsys.readouterr().err
    assert message in err and "error:" in err and "Traceback" not in err
    assert not (tmp_path / "heads").exists()


def test_command_line_refuses_an_out_that_is_a_file(tmp_path, monkeypatch, capsys):
    from playground.training import medusa as trainer

    monkeypatch.setattr("playground.engine.load_model", _no_model)
    out = tmp_path / "heads.safetensors"
    out.write_text("not a folder")
    assert trainer.main(["--data", str(tmp_path / "missing.jsonl"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --out {str(out)!r} is a file") and err.count("\n") == 1
    assert out.read_text() == "not a folder"


def test_help_shows_every_option_with_its_default(capsys):
    from playground.training import medusa as trainer

    assert all(a.help for a in trainer.build_parser()._actions)
    assert trainer.main(["--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for text in ("--epochs EPOCHS passes over", "(default: 1.0)", "(default: 0.001)", "(default: 64)",
                 "(default: 0.05)", "(default: auto)", "(default: 0)", "number of heads, 1 to 16"):
        assert text in out, text
    assert "(default: None)" not in out and "(default: False)" not in out


@pytest.mark.parametrize("trainer_name", ["medusa", "draft", "eagle"])
def test_every_trainer_answers_a_missing_or_wrong_data_file_with_one_line(tmp_path, capsys, trainer_name):
    """Found by a new user: the draft and EAGLE trainers answered a missing --data file, or a file of
    other records (a benchmark's), with a traceback; now, as the Medusa trainer did, one line and exit
    status 2, before any model loads."""
    import importlib

    trainer = importlib.import_module(f"playground.training.{trainer_name}")
    wrong = tmp_path / "results.jsonl"
    wrong.write_text(json.dumps({"question_id": 81, "method": "autoregressive"}) + "\n")
    for data, said in ((tmp_path / "missing.jsonl", "No such file"), (wrong, "needs input_ids and prompt_len")):
        assert trainer.main(["--data", str(data), "--out", str(tmp_path / "out"), "--target", "/no/such/model"]) == 2
        err = capsys.readouterr().err
        assert f"error: cannot read --data {data}: " in err and said in err and "Traceback" not in err
