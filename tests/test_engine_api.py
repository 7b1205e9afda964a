"""The engine's public API: argument errors, the lossless check, run statistics, round-robin runs."""

from __future__ import annotations

import pytest
import torch

from helpers import ByteTokenizer, FakeLoaded, noisy_copy, tiny_llama
from playground.engine.autoregressive import AutoregressiveDrafter
from playground.engine import METHODS, Engine, MethodSpec, check_lossless
from playground.engine import GenerationSettings, decode, generate
from playground.engine.draft_model import DraftModelDrafter
from playground.engine import RunStats
from playground.engine import MAX_SPECULATIVE_TOKENS
from playground.engine.limits import K_KNOB
from playground.engine.prompt_lookup import PromptLookupDrafter
from playground.engine.target import CausalLM

pytestmark = pytest.mark.usefixtures("torch_single_thread")

PROMPT = [1, 2, 3, 1, 2, 3, 4]


@pytest.fixture(scope="module")
def models():
    target = tiny_llama(8)
    return target, noisy_copy(target, 0.03, 9)


@pytest.fixture
def engine(models):
    target, draft = models
    return Engine(FakeLoaded(target, context_length=64), FakeLoaded(draft, context_length=64))


def _count_forwards(model) -> list[int]:
    calls = [0]
    model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


# ----------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("specs, message", [
    ([], "choose at least one method"),
    ([MethodSpec("autoregressive"), MethodSpec("autoregressive")], "each method can run once per comparison"),
    ([MethodSpec("autoregressive"), MethodSpec("medusa_x")], "unknown method 'medusa_x'; choose from autoregressive"),
    ([MethodSpec("draft_model", {"k": 0})], r"k must be in \[1, 16\], got 0"),
    ([MethodSpec("draft_model", {"k": 17})], r"k must be in \[1, 16\], got 17"),
    ([MethodSpec("draft_model", {"k": 2.5})], r"k must be an integer, got 2.5"),
    ([MethodSpec("prompt_lookup", {"max_ngram_size": 9})], r"max_ngram_size must be in \[1, 8\], got 9"),
    ([MethodSpec("prompt_lookup", {"num_pred_tokens": 0})], r"num_pred_tokens must be in \[1, 16\], got 0"),
    ([MethodSpec("prompt_lookup", {"k": 3})], "prompt_lookup has no setting k; its settings are max_ngram_size"),
])
def test_engine_run_rejects_bad_method_lists(engine, specs, message):
    """Engine.run raises ValueError with a message naming the problem (and the bound, for knobs)
    before any step runs: no method, a duplicate, an unknown method, a knob out of range or of
    the wrong type, or a setting the method does not have."""
    calls = _count_forwards(engine.target.model)
    with pytest.raises(ValueError, match=message):
        next(engine.run(PROMPT, specs, GenerationSettings(max_new_tokens=8)))
    assert calls[0] == 0


def test_draft_model_without_a_draft_says_why(models):
    """Asking for draft_model when no draft is loaded raises ValueError explaining that no draft
    is loaded and how to load one; the method is not listed as available."""
    engine = Engine(FakeLoaded(models[0]))
    available = engine.available_methods()
    assert "draft_model" not in available and {"autoregressive", "prompt_lookup"} <= set(available)
    with pytest.raises(ValueError, match=r"draft_model is unavailable: no draft model is loaded .*--draft"):
        next(engine.run(PROMPT, [MethodSpec("autoregressive"), MethodSpec("draft_model")], GenerationSettings()))


def test_empty_and_too_long_prompts_are_rejected(engine, models):
    """An empty prompt, or a prompt that with max_new_tokens does not fit the context, raises
    ValueError saying so (Engine.run, encode_prompt and decode alike)."""
    settings = GenerationSettings(max_new_tokens=8)
    with pytest.raises(ValueError, match="the prompt is empty"):
        next(engine.run([], [MethodSpec("autoregressive")], settings))
    with pytest.raises(ValueError, match="the prompt is empty"):
        engine.encode_prompt("   \n")
    with pytest.raises(ValueError, match="the prompt is empty"):
        engine.encode_prompt([{"role": "user", "content": " "}])
    with pytest.raises(ValueError, match=r"the prompt is 60 tokens; with 8 max new tokens it exceeds the model's "
                                         r"context of 64 tokens"):
        next(engine.run([1] * 60, [MethodSpec("autoregressive")], settings))
    target = CausalLM(models[0])
    with pytest.raises(ValueError, match="the prompt is empty"):
        next(decode(target, AutoregressiveDrafter(), [], settings))
    with pytest.raises(ValueError, match="exceeds the model's context of 10 tokens"):
        next(decode(target, AutoregressiveDrafter(), [1] * 5, settings, context_length=10))
    byte_engine = Engine(FakeLoaded(models[0], tokenizer=_PlainTokenizer(), context_length=16))
    with pytest.raises(ValueError, match="the prompt is 20 tokens, longer than the model's context of 16 tokens"):
        byte_engine.encode_prompt("x" * 20)


def test_prompt_ids_that_are_not_token_ids_are_rejected(engine):
    """Text instead of ids raises TypeError pointing at encode_prompt; an id outside the
    target's vocabulary raises ValueError naming it (not an IndexError from the embedding),
    in Engine.run and Engine.run_one alike; a tensor of ids is accepted."""
    settings = GenerationSettings(max_new_tokens=4)
    calls = _count_forwards(engine.target.model)
    for run in (lambda ids: engine.run(ids, [MethodSpec("autoregressive")], settings),
                lambda ids: engine.run_one(ids, MethodSpec("autoregressive"), settings)):
        with pytest.raises(TypeError, match="encode text with Engine.encode_prompt first"):
            next(run("Hello"))
        with pytest.raises(TypeError, match="list of integer token ids"):
            next(run([1.5, 2]))
        with pytest.raises(ValueError, match="token id 1000000 is outside the target's vocabulary of 64 tokens"):
            next(run([1, 10**6]))
        with pytest.raises(ValueError, match="outside the target's vocabulary"):
            next(run([-1]))
    assert calls[0] == 0
    assert next(engine.run(torch.tensor(PROMPT), [MethodSpec("autoregressive")], settings)).tokens


class _PlainTokenizer(ByteTokenizer):
    """ByteTokenizer with the call interface encode_prompt uses for plain (templateless) text."""

    chat_template = None

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": self.encode(text)}


def test_generation_settings_and_drafters_check_bounds():
    """Bounds live once (limits.py) and every constructor checks them with the same message."""
    with pytest.raises(ValueError, match=r"max_new_tokens must be in \[1, 2048\], got 0"):
        GenerationSettings(max_new_tokens=0)
    with pytest.raises(ValueError, match=rf"k must be in \[1, {MAX_SPECULATIVE_TOKENS}\], got 0"):
        DraftModelDrafter(None, 0)
    with pytest.raises(ValueError, match=r"max_ngram_size must be in \[1, 8\], got 0"):
        PromptLookupDrafter(0, 3)
    with pytest.raises(ValueError, match="k must be a number, got 'four'"):
        K_KNOB.check("four")
    assert MethodSpec("draft_model").checked_params() == {"k": K_KNOB.default, "confidence": 0.0, "proposer": "model",
                                                          "budget": "auto"}
    with pytest.raises(ValueError, match=r"confidence must be in \[0.0, 1.0\], got 1.5"):
        DraftModelDrafter(None, 4, confidence=1.5)
    assert METHODS["draft_model"].needs_draft and not METHODS["prompt_lookup"].needs_draft


# ----------------------------------------------------------------------------------------------
# check_lossless
# ----------------------------------------------------------------------------------------------


def test_check_lossless_matched_near_tie_and_real_mismatch():
    """check_lossless reports a match; a divergence at a near-tie (baseline top-2 margin under the
    dtype's rounding noise: 1e-3 in fp32, 0.5 in bf16) as rounding; a divergence at a clear
    margin as a real mismatch; and a length difference at the first missing position."""
    base, margins = [5, 6, 7, 8], [3.0, 2.0, 4e-4, 0.3]
    ok = check_lossless(base, margins, [5, 6, 7, 8])
    assert ok.matched and ok.position is None and "matches" in ok.message()
    tie = check_lossless(base, margins, [5, 6, 9, 8])
    assert (tie.matched, tie.position, tie.baseline_margin, tie.near_tie) == (False, 2, 4e-4, True)
    assert "near-tie" in tie.message() and "not a bug" in tie.message()
    real = check_lossless(base, margins, [5, 1, 7, 8])
    assert (real.matched, real.position, real.near_tie) == (False, 1, False)
    assert "NOT a near-tie" in real.message()
    # the same margin of 0.3 is a near-tie in bf16 but not in fp32
    assert check_lossless(base, margins, [5, 6, 7, 2], torch.bfloat16).near_tie
    assert not check_lossless(base, margins, [5, 6, 7, 2], torch.float32).near_tie
    short = check_lossless(base, margins, [5, 6])
    assert (short.matched, short.position) == (False, 2)
    longer = check_lossless(base, margins, base + [1])
    assert (longer.matched, longer.position, longer.baseline_margin) == (False, 4, None)


# ----------------------------------------------------------------------------------------------
# RunStats
# ----------------------------------------------------------------------------------------------


def test_run_stats_tau_counts_bonus_and_alpha_is_accepted_over_proposed():
    """tau = new tokens / steps with the prefill a step and the bonus token counted; alpha =
    accepted / proposed (None when nothing was proposed); per-position acceptance counts steps
    whose i-th drafted token was accepted among steps that drafted one."""
    stats = RunStats()
    stats.record_step(seconds=0.5, emitted=1, prefill=True)
    assert (stats.tau, stats.alpha) == (1.0, None)
    stats.record_step(seconds=0.25, emitted=4, proposed=5, accepted=3, draft_s=0.1, verify_s=0.15, proposed_depth=5)
    stats.record_step(seconds=0.25, emitted=1, proposed=2, accepted=0, draft_s=0.1, verify_s=0.15, proposed_depth=2)
    assert (stats.new_tokens, stats.steps, stats.proposed, stats.accepted) == (6, 3, 7, 3)
    assert stats.tau == 2.0 and stats.alpha == 3 / 7
    assert stats.per_position_acceptance == [0.5, 0.5, 1.0, 0.0, 0.0]
    assert stats.ttft_s == 0.5 and stats.elapsed_s == 1.0 and stats.tokens_per_s == 6.0
    assert stats.decode_tokens_per_s == 10.0  # 5 tokens after the first, in 0.5 s
    assert [n for _, n in stats.timeline] == [1, 5, 6]
    d = stats.as_dict()
    assert (d["tau"], d["alpha"], d["new_tokens"]) == (2.0, 3 / 7, 6)


def test_decode_statistics_follow_the_definitions(models):
    """In a real run, each event's totals satisfy tau = new_tokens / steps (bonus included) and
    alpha = accepted / proposed, and they add up the per-event counts, also when the events
    are read after the run (each keeps the totals after its own step); the baseline has tau 1
    and alpha None."""
    target, draft = (CausalLM(m) for m in models)
    settings = GenerationSettings(max_new_tokens=30)
    events = list(decode(target, DraftModelDrafter(draft, 4), PROMPT, settings))
    new = proposed = accepted = 0
    for i, e in enumerate(events):
        new, proposed, accepted = new + len(e.tokens), proposed + e.proposed, accepted + e.accepted
        totals = (e.stats.new_tokens, e.stats.steps, e.stats.proposed, e.stats.accepted)
        assert totals == (new, i + 1, proposed, accepted)
        assert e.stats.tau == new / (i + 1)
        assert e.stats.alpha == (accepted / proposed if proposed else None)
        assert len(e.tokens) == e.accepted + 1 or e.finished  # accepted drafts + the bonus token
    _, base = generate(target, AutoregressiveDrafter(), PROMPT, settings)
    assert base.tau == 1.0 and base.alpha is None


# ----------------------------------------------------------------------------------------------
# Round-robin side-by-side runs
# ----------------------------------------------------------------------------------------------


def test_round_robin_interleaves_methods_and_keeps_separate_statistics(engine, models):
    """Engine.run with three methods yields their events interleaved in a fixed cycle (a method
    drops out of the cycle once finished); each method's statistics count only its own steps,
    tokens and time; all three finish; each method's output equals its standalone run."""
    # budget off: the step counts compared below must not depend on this machine's measured step cost
    specs = [MethodSpec("autoregressive"),
             MethodSpec("prompt_lookup", {"max_ngram_size": 2, "num_pred_tokens": 5, "budget": "off"}),
             MethodSpec("draft_model", {"k": 4, "budget": "off"})]
    settings = GenerationSettings(max_new_tokens=24)
    events = list(engine.run(PROMPT, specs, settings))
    per_method = {s.name: [e for e in events if e.method == s.name] for s in specs}
    # The expected order: cycle through the methods still running.
    remaining = {name: len(evs) for name, evs in per_method.items()}
    expected = []
    while any(remaining.values()):
        for s in specs:
            if remaining[s.name]:
                expected.append(s.name)
                remaining[s.name] -= 1
    assert [e.method for e in events] == expected
    assert [e.method for e in events[:3]] == [s.name for s in specs]
    assert len({len(evs) for evs in per_method.values()}) > 1  # the methods took different step counts
    target, draft = (CausalLM(m) for m in models)
    drafters = {"autoregressive": AutoregressiveDrafter(), "prompt_lookup": PromptLookupDrafter(2, 5),
                "draft_model": DraftModelDrafter(draft, 4)}
    for name, evs in per_method.items():
        last = evs[-1]
        assert last.finished and all(not e.finished for e in evs[:-1])
        assert [e.step for e in evs] == list(range(len(evs)))
        assert last.stats.steps == len(evs)
        assert last.stats.new_tokens == sum(len(e.tokens) for e in evs) == 24
        assert last.stats.proposed == sum(e.proposed for e in evs)
        assert last.stats.elapsed_s == pytest.approx(sum(e.seconds for e in evs))
        alone, _ = generate(target, drafters[name], PROMPT, settings)
        assert [t for e in evs for t in e.tokens] == alone, name


def test_numbers_that_are_not_usable_are_refused_with_the_bound():
    """Temperatures too small to divide by, infinities and booleans are refused with a ValueError that
    names the setting and its range (they used to crash inside torch, raise OverflowError, or run as 1)."""
    from playground.engine import K_KNOB, SamplingConfig

    with pytest.raises(ValueError, match=r"temperature must be 0 \(greedy\) or in \[0.001, 2.0\], got 1e-40"):
        SamplingConfig(temperature=1e-40)
    with pytest.raises(ValueError, match=r"k must be in \[1, 16\], got inf"):
        K_KNOB.check(float("inf"))
    with pytest.raises(ValueError, match="k must be a number, got True"):
        K_KNOB.check(True)
    assert SamplingConfig(temperature=0.001).temperature == 0.001
