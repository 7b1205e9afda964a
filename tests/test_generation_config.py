"""The target's own generation settings (issue 21, item 2): a ``repetition_penalty`` in its
``generation_config`` applies to every method exactly as transformers' ``generate()`` applies it,
along each candidate path, so greedy speculative output still equals the baseline and the baseline
equals ``generate()``; the model's sampling defaults are reported, not forced."""

from __future__ import annotations

import copy
from contextlib import contextmanager

import pytest
import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from helpers import FakeLoaded, clear_greedy_baseline, exact_first_three, chi_square_gof, sample_first_three, tiny_llama
from playground.engine import (Engine, GenerationSettings, MethodSpec, SamplingConfig, apply_repetition_penalty,
                               check_lossless, model_generation_settings)
from playground.engine.autoregressive import AutoregressiveDrafter
from playground.engine.penalty import repetition_penalty_reference
from playground.engine.prompt_lookup import PromptLookupDrafter
from playground.engine.target import CausalLM

pytestmark = pytest.mark.usefixtures("torch_single_thread")


@contextmanager
def generation_config(model, **changes):
    """``model.generation_config`` replaced by a copy with ``changes`` inside the block."""
    before = model.generation_config
    config = copy.deepcopy(before)
    for name, value in changes.items():
        setattr(config, name, value)
    model.generation_config = config
    try:
        yield
    finally:
        model.generation_config = before


def _ids(events) -> list[int]:
    return [t for e in events for t in e.tokens]


# ----- the penalty itself ---------------------------------------------------------------------
def test_penalty_along_each_path_equals_transformers_processor():
    """On random trees, row r of :func:`apply_repetition_penalty` equals transformers'
    ``RepetitionPenaltyLogitsProcessor`` applied to the sequence ending at node r (the prefix plus
    the path to r), and equals the slow loop reference; penalty 1.0 does no work."""
    g = torch.Generator().manual_seed(0)
    vocab = 40
    for trial in range(20):
        n = int(torch.randint(0, 12, (), generator=g))
        parents = [int(torch.randint(-1, i, (), generator=g)) for i in range(n)]
        tokens = torch.randint(0, vocab, (n,), generator=g)
        context = torch.randint(0, vocab, (int(torch.randint(1, 15, (), generator=g)),), generator=g).tolist()
        logits = torch.randn(n + 1, vocab, generator=g) * 3
        penalty = [1.3, 0.7, 2.0][trial % 3]
        got = apply_repetition_penalty(logits, context, torch.tensor(parents) if n else None, tokens if n else None,
                                       penalty)
        sequences = [context]
        for i in range(n):
            path, node = [], i
            while node >= 0:
                path.append(int(tokens[node]))
                node = parents[node]
            sequences.append(context + path[::-1])
        processor = RepetitionPenaltyLogitsProcessor(penalty)
        want = torch.cat([processor(torch.tensor([s]), logits[r:r + 1].clone()) for r, s in enumerate(sequences)])
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        torch.testing.assert_close(got, repetition_penalty_reference(logits, sequences, penalty), rtol=0, atol=0)
    same = torch.randn(3, vocab)
    assert apply_repetition_penalty(same, [1, 2], torch.tensor([-1, 0]), torch.tensor([3, 4]), 1.0) is same


# ----- tiny models -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    """A tiny target whose greedy continuations repeat (so the penalty changes them)."""
    return tiny_llama(3)


def test_baseline_and_methods_follow_the_models_penalty(tiny):
    """With ``repetition_penalty = 1.3`` in the target's generation_config: the engine's baseline
    equals ``generate(do_sample=False, repetition_penalty=1.3)`` and differs from the unpenalised
    output; prompt lookup and Lookahead (chains and trees of candidates) equal the baseline; an
    explicit ``repetition_penalty`` overrides the model's; describe() says the penalty came from
    the model."""
    g = torch.Generator().manual_seed(5)
    prompt, _, _ = clear_greedy_baseline(CausalLM(tiny), g, 12, 5, 24)
    with generation_config(tiny, repetition_penalty=1.3):
        engine = Engine(FakeLoaded(tiny))
        settings = GenerationSettings(max_new_tokens=24, stop_on_eos=False)
        baseline = _ids(engine.run_one(prompt, MethodSpec("autoregressive"), settings))
        ref = tiny.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                            do_sample=False, max_new_tokens=24, repetition_penalty=1.3,
                            pad_token_id=0)[0, len(prompt):].tolist()
        plain = _ids(engine.run_one(prompt, MethodSpec("autoregressive"),
                                    GenerationSettings(max_new_tokens=24, stop_on_eos=False, repetition_penalty=1.0)))
        assert baseline == ref
        assert plain != baseline
        for name in ("prompt_lookup", "lookahead", "suffix", "recycling", "mixture"):
            out = _ids(engine.run_one(prompt, MethodSpec(name), settings))
            assert out == baseline, name
        assert engine.generation_defaults()["applied"] == {"repetition_penalty": 1.3}


def test_model_settings_reported_and_bad_ones_refused(tiny):
    """The model's sampling defaults are suggested, not applied (a run without sampling settings is
    greedy); settings the engine does not implement are listed as ignored; a model penalty outside
    the knob's bounds is refused with a message naming it."""
    engine = Engine(FakeLoaded(tiny))
    assert model_generation_settings(tiny) == {"applied": {}, "suggested": {}, "ignored": {}}
    with generation_config(tiny, do_sample=True, temperature=0.6, top_p=0.9, top_k=20, no_repeat_ngram_size=3):
        facts = engine.generation_defaults()
        assert facts["suggested"] == {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "top_k": 20}
        assert facts["ignored"] == {"no_repeat_ngram_size": 3}
        assert engine.resolve_settings(GenerationSettings()).sampling.greedy
    with generation_config(tiny, repetition_penalty=7.0):
        with pytest.raises(ValueError, match=r"generation_config sets repetition_penalty=7.0.*\[0.5, 3.0\]"):
            engine.run([1, 2, 3], [MethodSpec("autoregressive")], GenerationSettings(max_new_tokens=2))
        out = engine.run([1, 2, 3], [MethodSpec("autoregressive")],
                         GenerationSettings(max_new_tokens=2, repetition_penalty=1.0))
        assert len(_ids(out)) == 2


def test_sampling_with_penalty_keeps_the_penalised_distribution():
    """At temperature 1 with repetition penalty 2.5, the first three tokens of autoregressive
    sampling and of prompt lookup (one-hot speculative sampling over penalised target rows) follow
    the exact penalised joint distribution (chi-square, alpha = 1e-4 each: a correct implementation
    fails 1 time in 10,000 per check)."""
    vocab = 6
    target = tiny_llama(7, vocab_size=vocab, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                        intermediate_size=32, head_std=0.3)
    prompt = [0, 1, 2, 3, 0, 1]
    cfg = SamplingConfig(temperature=1.0)
    exact = _exact_penalised_first_three(target, prompt, 2.5, vocab)
    for factory in (lambda s: AutoregressiveDrafter(), lambda s: PromptLookupDrafter(2, 3)):
        counts, accepted, proposed = sample_first_three(target, factory, prompt, cfg, 700, vocab,
                                                        repetition_penalty=2.5)
        test = chi_square_gof(counts, exact)
        assert test.p_value > 1e-4, test
    unpenalised = exact_first_three(target, prompt, cfg, vocab)
    assert chi_square_gof(counts, unpenalised).p_value < 1e-4  # the penalty changed the distribution


@torch.inference_mode()
def _exact_penalised_first_three(model, prompt, penalty, vocab) -> torch.Tensor:
    processor = RepetitionPenaltyLogitsProcessor(penalty)

    def probs(seq):
        logits = model(input_ids=torch.tensor([seq])).logits[:, -1].float()
        return torch.softmax(processor(torch.tensor([seq]), logits), -1)[0].double()

    joint = torch.zeros(vocab, vocab, vocab, dtype=torch.float64)
    p1 = probs(prompt)
    for a in range(vocab):
        p2 = probs(prompt + [a])
        for b in range(vocab):
            joint[a, b] = p1[a] * p2[b] * probs(prompt + [a, b])
    return joint


# ----- the default model ---------------------------------------------------------------------------
LOSSLESS = ("draft_model", "prompt_lookup", "lookahead", "medusa", "eagle", "suffix", "recycling", "rest", "mixture")


@pytest.fixture(scope="module")
def full_engine(real_target):
    """The default target with its shipped draft, Medusa heads and EAGLE head."""
    from playground.engine import default_draft_spec, load_draft, load_heads
    from playground.engine.eagle import head_spec, load_eagle
    from playground.engine.medusa.heads import heads_spec

    draft = load_draft(default_draft_spec("default"), real_target)
    return Engine(real_target, draft, medusa=load_heads(heads_spec("default"), real_target),
                  eagle=load_eagle(head_spec("default", None), real_target))


@pytest.mark.real_model
def test_default_model_with_a_penalty_equals_generate(full_engine):
    """The default model with ``repetition_penalty = 1.3`` set on a copy of its generation_config,
    greedy, 24 new tokens: the baseline equals ``model.generate(do_sample=False,
    repetition_penalty=1.3)`` token for token (and differs from the unpenalised output), and every
    lossless method equals the baseline (fp32 near-ties excepted by check_lossless)."""
    model = full_engine.target.model
    ids = full_engine.encode_prompt("Say the word 'apple' ten times, separated by commas.")
    with generation_config(model, repetition_penalty=1.3):
        settings = GenerationSettings(max_new_tokens=24)
        events = list(full_engine.run_one(ids, MethodSpec("autoregressive"), settings))
        baseline, margins = _ids(events), [m for e in events for m in e.margins]
        ref = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=24,
                             repetition_penalty=1.3)[0, len(ids):].tolist()
        plain = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=24,
                               repetition_penalty=1.0)[0, len(ids):].tolist()
        assert baseline == ref and plain != ref
        failures = []
        for name in LOSSLESS:
            assert full_engine.unavailable_reason(name) is None, name
            out = _ids(full_engine.run_one(ids, MethodSpec(name), settings))
            verdict = check_lossless(baseline, margins, out)
            if not verdict.matched:
                failures.append(f"{name}: {verdict.message()}")
        assert failures == []
