"""The distilled draft: reduced-vocabulary token maps, the training pieces, and the draft shipped
for the embedded default (issue 5).

Properties checked: a reduced-vocabulary draft keeps greedy draft-model decoding equal to the
baseline token for token and keeps the target's distribution under sampling; the training
data is aligned (position p - 1 + j is taught the answer's j-th token); a short training run
lowers the held-out loss; the shipped draft loads as the default target's draft, passes the
tokenizer check, is under 20 MB, and is lossless on real prompts.
"""

from __future__ import annotations

import json

import time
from pathlib import Path

import pytest
import torch

from helpers import (FakeLoaded, bench_prompts, chi_square_gof, clear_greedy_baseline, noisy_copy, output_ids,
                     run_events, tiny_llama)
from playground.engine import Engine, MethodSpec
from playground.engine import GenerationSettings, decode
from playground.engine import TokenMap
from playground.engine.draft_model import DraftModelDrafter
from playground.engine import DEFAULT_DRAFT_DIR, default_draft_spec
from playground.engine import SamplingConfig, logits_to_probs
from playground.engine.target import CausalLM
from playground.training import draft as train_draft

ALPHA = 1e-4


# ----------------------------------------------------------------------------------------------
# TokenMap
# ----------------------------------------------------------------------------------------------

def test_token_map_translates_both_ways():
    """Target ids map to draft ids (unknown ones to the -1 slot); draft logits spread onto the
    target vocabulary with -inf where the draft has no token."""
    m = TokenMap([-1, 5, 2, 7], target_vocab=10)
    assert m.unknown_id == 0
    assert m.draft_ids(torch.tensor([5, 2, 7, 3])).tolist() == [1, 2, 3, 0]
    out = m.target_logits(torch.tensor([9.0, 1.0, 2.0, 3.0]))
    assert out.shape == (10,)
    assert out[5] == 1.0 and out[2] == 2.0 and out[7] == 3.0
    assert torch.isinf(out[[0, 1, 3, 4, 6, 8, 9]]).all()


@pytest.mark.parametrize("ids, message", [
    ([1, 2, 3], "exactly one -1"),
    ([-1, 2, -1], "exactly one -1"),
    ([-1, 2, 2], "distinct"),
    ([-1, 2, 10], "distinct and in"),
])
def test_token_map_rejects_bad_maps(ids, message):
    with pytest.raises(ValueError, match=message):
        TokenMap(ids, target_vocab=10)


def test_token_map_save_load_round_trip(tmp_path):
    TokenMap([-1, 4, 1], 8).save(tmp_path)
    loaded = TokenMap.load(tmp_path, 8)
    assert loaded.to_target.tolist() == [-1, 4, 1]
    assert TokenMap.load(tmp_path / "missing", 8) is None


# ----------------------------------------------------------------------------------------------
# Reduced-vocabulary drafts on tiny random models
# ----------------------------------------------------------------------------------------------

def _restricted_copy(target: torch.nn.Module, token_map: TokenMap, noise: float, seed: int) -> torch.nn.Module:
    """The target cut down to the map's vocabulary (embedding and output rows of the kept ids; the
    unknown slot gets a zero row), with N(0, noise^2) added to the blocks: a draft that agrees
    with the target often, but never where the target's next token is outside its vocabulary."""
    draft = noisy_copy(target, noise, seed)
    rows = token_map.to_target.clamp(min=0)
    with torch.no_grad():
        emb = draft.model.embed_tokens.weight[rows].clone()
        emb[token_map.unknown_id] = 0
        head = draft.lm_head.weight[rows].clone()
        draft.resize_token_embeddings(len(rows))
        draft.model.embed_tokens.weight.copy_(emb)
        draft.lm_head.weight.copy_(head)
    return draft


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("confidence", [0.0, 0.6])
def test_reduced_vocab_draft_greedy_equals_baseline(seed, confidence):
    """Greedy draft-model decoding with a reduced-vocabulary draft (the target cut to 40 of its 64
    ids, with noise) equals the autoregressive baseline token for token, for K in 1..6
    (seed-dependent), with and without the confidence stop, while drafts are accepted."""
    vocab = 64
    model = tiny_llama(seed, vocab_size=vocab)
    target = CausalLM(model)
    g = torch.Generator().manual_seed(seed)
    prompt, base, _ = clear_greedy_baseline(target, g, 8, 12, 40)
    kept = torch.randperm(vocab, generator=g)[:39].tolist()
    token_map = TokenMap([-1] + kept, vocab)
    draft = _restricted_copy(model, token_map, 0.02, seed)
    drafter = DraftModelDrafter(CausalLM(draft), 1 + seed % 6, token_map, confidence=confidence)
    events = run_events(target, drafter, prompt, len(base))
    assert output_ids(events) == base
    assert sum(e.accepted for e in events) > 0


@pytest.mark.parametrize("confidence", [0.0, 0.5])
def test_greedy_pick_in_draft_ids_matches_the_spread_row(confidence):
    """The greedy drafter picks in the draft's own ids: the same token and probability as the argmax
    and softmax of the row spread onto the target's vocabulary (``TokenMap.target_logits``), with
    the out-of-vocabulary slot never proposed, even when it holds the largest logit."""
    g = torch.Generator().manual_seed(0)
    token_map = TokenMap([-1] + torch.randperm(90, generator=g)[:29].tolist(), 90)
    drafter = DraftModelDrafter(None, 2, token_map, confidence=confidence)
    for i in range(20):
        logits = torch.randn(30, generator=g) * 3
        if i % 4 == 0:
            logits[token_map.unknown_id] = 100.0
        spread = token_map.target_logits(logits)
        token, q = drafter._greedy_pick(logits, 90)
        assert token == int(spread.argmax())
        want = float(torch.softmax(spread, -1).max()) if confidence > 0 else 1.0
        assert q == pytest.approx(want, rel=1e-6)
    plain = DraftModelDrafter(None, 2, None, confidence=confidence)
    logits = torch.randn(96, generator=g)
    logits[92] = 50.0  # a padded id past the target's vocabulary is never proposed
    assert plain._greedy_pick(logits, 90)[0] == int(logits[:90].argmax())


VOCAB = 6
PROMPT = [0, 1, 2, 3, 4, 5, 0, 1]


@torch.inference_mode()
def _exact_first_two(model, prompt: list[int], cfg: SamplingConfig) -> torch.Tensor:
    """Exact ``(V, V)`` joint of the first two sampled tokens after the sampling transform."""
    def next_probs(prefixes):
        return logits_to_probs(model(input_ids=torch.tensor(prefixes)).logits[:, -1].float(), cfg).double()
    return next_probs([prompt])[0][:, None] * next_probs([prompt + [a] for a in range(VOCAB)])


@pytest.mark.parametrize("confidence", [0.0, 0.45])
def test_reduced_vocab_draft_sampling_keeps_target_distribution(confidence):
    """Speculative sampling with a draft that lacks two of the target's six tokens (they have
    q = 0, so they only ever come from the residual) still follows the target's exact joint
    distribution of the first two tokens (chi-square, false-alarm odds 1e-4), with drafts both
    accepted and rejected; also with the confidence stop, which then cuts some drafts short
    (it looks at the draft's distribution only, never at the drawn token)."""
    target = tiny_llama(7, vocab_size=VOCAB, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                        intermediate_size=32, head_std=0.3)
    draft = tiny_llama(8, vocab_size=5, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                       intermediate_size=32, head_std=0.3)
    token_map = TokenMap([-1, 0, 2, 3, 5], VOCAB)
    cfg = SamplingConfig(temperature=1.0)
    lm, draft_lm = CausalLM(target), CausalLM(draft)
    counts = torch.zeros(VOCAB, VOCAB)
    accepted = proposed = 0
    for seed in range(1500):
        settings = GenerationSettings(max_new_tokens=3, sampling=SamplingConfig(temperature=1.0, seed=seed))
        out = []
        for event in decode(lm, DraftModelDrafter(draft_lm, 2, token_map, confidence=confidence), PROMPT, settings):
            out += event.tokens
            accepted += event.accepted
            proposed += event.proposed
            if len(out) >= 2:
                break
        counts[out[0], out[1]] += 1
    result = chi_square_gof(counts, _exact_first_two(target, PROMPT, cfg))
    assert result.p_value > ALPHA, str(result)
    assert 0 < accepted < proposed
    if confidence:
        assert proposed < 2 * 1500  # some steps drafted fewer than K = 2 tokens


# ----------------------------------------------------------------------------------------------
# Training pieces
# ----------------------------------------------------------------------------------------------

def _fake_records(n: int, seed: int, vocab: int = 64, k: int = 4) -> list[dict]:
    """Conversations of a toy 'target' that counts upwards mod 50 (prompt: 5 random ids)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        prompt = torch.randint(0, 50, (5,), generator=g).tolist()
        answer = [(prompt[-1] + 1 + j) % 50 for j in range(12)]
        top = [[t] + [(t + 7 + i) % vocab for i in range(k - 1)] for t in answer]
        logprobs = [[-0.1] + [-3.0] * (k - 1) for _ in answer]
        out.append({"input_ids": prompt + answer, "prompt_len": 5, "teacher_top_ids": top,
                    "teacher_top_logprobs": logprobs})
    return out


def test_build_vocab_puts_unknown_and_specials_first():
    records = _fake_records(4, 0)
    vocab = train_draft.build_vocab(records, 20, keep_ids=[63, 62])
    assert vocab[:3] == [-1, 63, 62] and len(vocab) == 20 and len(set(vocab)) == 20
    with pytest.raises(ValueError, match="at least 4"):
        train_draft.build_vocab(records, 3, keep_ids=[63, 62])


def test_examples_align_teacher_with_positions():
    """Position prompt_len - 1 + j is taught answer token j (hard) and the teacher's top-k (soft);
    prompt positions are weighted PROMPT_LOSS_WEIGHT."""
    records = _fake_records(1, 1)
    token_map = TokenMap([-1] + list(range(64)), 64)
    (ex,) = train_draft.make_examples(records, token_map, max_len=100)
    r = records[0]
    p = r["prompt_len"]
    assert ex["x"].tolist() == [t + 1 for t in r["input_ids"][:-1]]
    assert ex["y"][p - 1:].tolist() == [t + 1 for t in r["input_ids"][p:]]
    assert ex["soft_ids"][p - 1].tolist() == [t + 1 for t in r["teacher_top_ids"][0]]
    assert torch.allclose(ex["soft_p"][p - 1:].sum(-1), torch.ones(len(r["input_ids"]) - p))
    assert ex["w"][:p - 1].eq(train_draft.PROMPT_LOSS_WEIGHT).all() and ex["w"][p - 1:].eq(1.0).all()


def test_short_training_run_lowers_the_loss():
    """Fifty steps of distillation on the toy counting data lower the held-out loss and raise the
    greedy agreement with the teacher."""
    torch.manual_seed(0)
    target = tiny_llama(3, vocab_size=64, hidden_size=32)
    records = _fake_records(40, 2)
    token_map = TokenMap(train_draft.build_vocab(records[:32], 60, keep_ids=[]), 64)
    draft = train_draft.init_draft(target, token_map, hidden=32, layers=1, intermediate=64, heads=4, kv_heads=2)
    train, held = (train_draft.make_examples(r, token_map, 64) for r in (records[:32], records[32:]))
    before = train_draft.evaluate(draft, held)
    opt = torch.optim.AdamW(draft.parameters(), lr=1e-2)
    for step in range(50):
        batch = train_draft.collate(train[(step * 8) % 32:(step * 8) % 32 + 8])
        loss = train_draft.loss_fn(draft(input_ids=batch["x"], attention_mask=batch["mask"]).logits, batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
    after = train_draft.evaluate(draft, held)
    assert after["loss"] < 0.7 * before["loss"]
    assert after["top1_agreement"] > before["top1_agreement"] + 0.3


def test_command_line_fits_the_schedule_to_the_time_budget(tmp_path, monkeypatch):
    """``python -m playground.training.draft --minutes M`` with far more epochs than fit: the
    learning-rate schedule follows the time, so the run ends on time with the learning rate
    decayed to its floor (10 %), and saves a draft with its summary."""
    import json

    target = tiny_llama(3, vocab_size=64, hidden_size=32)

    class _Tokenizer:
        all_special_ids = [60]

        def save_pretrained(self, folder):
            (Path(folder) / "tokenizer_config.json").write_text("{}")

    class _Loaded(FakeLoaded):
        pass

    monkeypatch.setattr("playground.engine.load_model",
                        lambda *a, **k: _Loaded(target, _Tokenizer(), eos_token_ids=[61]))
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _fake_records(40, 1)))
    out = tmp_path / "draft"
    started = time.perf_counter()
    rc = train_draft.main(["--data", str(data), "--out", str(out), "--vocab", "60", "--hidden", "32",
                           "--layers", "1", "--intermediate", "64", "--heads", "4", "--kv-heads", "2",
                           "--batch-size", "4", "--epochs", "100000", "--minutes", "0.1"])
    assert rc == 0 and time.perf_counter() - started < 30
    summary = json.loads((out / "training_summary.json").read_text())
    state = torch.load(out.with_name("draft.ckpt") / "state.pt", weights_only=False)
    assert 0 < summary["steps"] == state["step"] < 100000 * 9 and summary["epochs"] < 100000
    assert state["sched"]["_last_lr"][0] == pytest.approx(0.1 * 3e-3, rel=0.01)
    assert (out / "config.json").exists() and (out / "draft_vocab.json").exists()

    # --init: a second run continues from the saved draft (same vocabulary and architecture; its
    # --hidden is ignored) over two data files, and starts where the first one ended.
    more = tmp_path / "more.jsonl"
    more.write_text("".join(json.dumps(r) + "\n" for r in _fake_records(10, 2)))
    rc = train_draft.main(["--data", str(data), str(more), "--out", str(tmp_path / "again"), "--init", str(out),
                           "--hidden", "16", "--batch-size", "4", "--epochs", "1", "--lr", "1e-9"])
    assert rc == 0
    again = json.loads((tmp_path / "again" / "training_summary.json").read_text())
    assert again["init"] == str(out) and again["hidden"] == 32 and again["conversations"] == 50
    assert (tmp_path / "again" / "draft_vocab.json").read_text() == (out / "draft_vocab.json").read_text()
    from safetensors.torch import load_file  # a learning rate of 1e-9: the weights it started from
    first, second = load_file(str(out / "model.safetensors")), load_file(str(tmp_path / "again" / "model.safetensors"))
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    assert train_draft.main(["--data", str(data), "--out", str(tmp_path / "x"), "--init", str(tmp_path)]) == 2
    # A device this machine does not have is refused before any work, with its name in the message.
    assert train_draft.main(["--data", str(data), "--out", str(tmp_path / "y"), "--device", "tpu"]) == 2


# ----------------------------------------------------------------------------------------------
# The draft shipped for the embedded default
# ----------------------------------------------------------------------------------------------

# The draft ships in assets/draft/default, so these tests never skip for want of it.


def test_shipped_draft_is_small_and_documented():
    size = sum(f.stat().st_size for f in DEFAULT_DRAFT_DIR.iterdir() if f.is_file())
    assert size < 20e6, f"the shipped draft is {size / 1e6:.1f} MB"
    summary = json.loads((DEFAULT_DRAFT_DIR / "training_summary.json").read_text())
    assert summary["held_out_top1_agreement"] > summary["held_out_top1_agreement_before"]
    assert default_draft_spec("default") == str(DEFAULT_DRAFT_DIR)
    assert default_draft_spec("default", "none") is None
    assert default_draft_spec("some/hub-id") is None


@pytest.fixture(scope="module")
def shipped_engine(real_target):
    from playground.engine import load_draft

    from playground.engine import cpu_linear

    draft = load_draft(default_draft_spec("default"), real_target)
    assert draft.token_map is not None
    # Named as the shipped draft, not by its folder ("default", like the default target).
    assert draft.name.startswith("SmolLM2 distilled draft (shipped, vocabulary of ")
    # On a CPU in float32 its layers read int8 weight copies (the tests below run them).
    assert isinstance(draft.model.lm_head, cpu_linear.Int8WeightLinear) or not cpu_linear.int8_weights_available()
    return Engine(real_target, draft)


@pytest.mark.real_model
@pytest.mark.usefixtures("torch_single_thread")
@pytest.mark.parametrize("index", [0, 3, 7])
def test_shipped_draft_greedy_equals_baseline(shipped_engine, index):
    """Greedy draft-model decoding with the shipped draft (K = 4, every step drafting: budget off, so
    the draft gate's timing cannot skip it) equals the baseline token for token on benchmark prompts
    (fp32, 48 new tokens), and some drafted tokens are accepted."""
    prompts = bench_prompts()
    assert prompts, "no benchmark prompts: assets/bench/ ships them"
    label, prompt, chat = prompts[index % len(prompts)]
    ids = shipped_engine.encode_prompt(prompt, chat=chat)
    out = {"autoregressive": [], "draft_model": []}
    accepted = 0
    for event in shipped_engine.run(ids, [MethodSpec("autoregressive"), MethodSpec("draft_model", {"k": 4, "budget": "off"})],
                                    GenerationSettings(max_new_tokens=48)):
        out[event.method] += event.tokens
        if event.method == "draft_model":
            accepted += event.accepted
    assert out["draft_model"] == out["autoregressive"], label
    assert accepted > 0, label


@pytest.mark.real_model
@pytest.mark.usefixtures("torch_single_thread")
def test_shipped_draft_sampling_keeps_target_distribution(shipped_engine):
    """With the real target and the shipped draft at temperature 1 and top-k 3 (so the first two
    tokens have at most 9 outcomes), speculative sampling with K = 2 gives the target's exact
    joint distribution of the first two tokens (computed from the target's logits; chi-square,
    false-alarm odds 1e-4)."""
    cfg = SamplingConfig(temperature=1.0, top_k=3)
    ids = shipped_engine.encode_prompt("Name a colour.")
    model = shipped_engine.target.model
    with torch.inference_mode():
        p1 = logits_to_probs(model(input_ids=torch.tensor([ids])).logits[0, -1].float(), cfg).double()
        firsts = p1.nonzero().flatten().tolist()
        rows = model(input_ids=torch.tensor([ids + [a] for a in firsts])).logits[:, -1].float()
        p2 = logits_to_probs(rows, cfg).double()
    seconds = sorted({int(t) for t in p2.nonzero()[:, 1]})
    exact = torch.zeros(len(firsts), len(seconds), dtype=torch.double)
    for i, a in enumerate(firsts):
        for j, b in enumerate(seconds):
            exact[i, j] = p1[a] * p2[i, b]
    counts = torch.zeros_like(exact)
    accepted = proposed = 0
    drafter_lm = shipped_engine.draft_lm
    for seed in range(400):
        settings = GenerationSettings(max_new_tokens=3, sampling=SamplingConfig(temperature=1.0, top_k=3, seed=seed))
        out = []
        for event in decode(shipped_engine.target_lm, DraftModelDrafter(drafter_lm, 2, shipped_engine.draft.token_map),
                            ids, settings):
            out += event.tokens
            accepted += event.accepted
            proposed += event.proposed
            if len(out) >= 2:
                break
        counts[firsts.index(out[0]), seconds.index(out[1])] += 1
    result = chi_square_gof(counts, exact)
    assert result.p_value > ALPHA, str(result)
    assert proposed > 0 and accepted > 0


@pytest.mark.parametrize("seed", range(6))
def test_medusa_heads_on_a_reduced_vocab_draft(seed):
    """Medusa as a draft on a reduced-vocabulary draft (heads predicting draft ids, mapped back by
    the token map): greedy output equals the baseline with drafts accepted; at temperature 1 a
    run completes with draft probabilities over the target's vocabulary (one-hot rows for the
    heads' tokens)."""
    from test_medusa import random_heads

    from playground.engine.draft_model import MedusaDraftDrafter

    vocab = 64
    model = tiny_llama(seed, vocab_size=vocab)
    target = CausalLM(model)
    g = torch.Generator().manual_seed(seed)
    prompt, base, _ = clear_greedy_baseline(target, g, 8, 12, 32)
    token_map = TokenMap([-1] + torch.randperm(vocab, generator=g)[:39].tolist(), vocab)
    draft = _restricted_copy(model, token_map, 0.02, seed)
    heads = random_heads(draft, 2, scale=0.02, seed=seed)
    drafter = MedusaDraftDrafter(CausalLM(draft), heads, k=3, token_map=token_map)
    events = run_events(target, drafter, prompt, len(base))
    assert output_ids(events) == base
    assert sum(e.accepted for e in events) > 0
    settings = GenerationSettings(max_new_tokens=12, sampling=SamplingConfig(temperature=1.0, seed=seed))
    state_probs = []
    original = drafter.propose

    def spy(state):
        cand = original(state)
        state_probs.append(cand.draft_probs)
        return cand
    drafter.propose = spy
    sampled = run_events(target, drafter, prompt, settings=settings)
    assert 0 < len(output_ids(sampled)) <= 12
    rows = torch.cat([p for p in state_probs if p is not None])
    assert rows.shape[1] == vocab and torch.allclose(rows.sum(1), torch.ones(len(rows)), atol=1e-5)
