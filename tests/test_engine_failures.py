"""Failure modes of the decoding loop: EOS inside a drafted block, the token limit, no EOS id,
a draft identical to the target, streamed text, cancellation."""

from __future__ import annotations

import threading

import pytest
import torch

from helpers import (ByteTokenizer, CountingLM, FakeLoaded, OracleChainDrafter, RandomTreeDrafter, ScriptedModel,
                     clear_greedy_baseline, noisy_copy, output_ids, run_events, streamed_text, tiny_llama)
from playground.engine.autoregressive import AutoregressiveDrafter
from playground.engine import Engine, MethodSpec
from playground.engine import GenerationSettings, decode, generate
from playground.engine.draft_model import DraftModelDrafter
from playground.engine.prompt_lookup import PromptLookupDrafter
from playground.engine import SamplingConfig
from playground.engine.target import CausalLM

pytestmark = pytest.mark.usefixtures("torch_single_thread")

TOK = ByteTokenizer()
EOS = TOK.eos_token_id  # 256
PROMPT = TOK.encode("Q: ")


def scripted(script: list[int], prompt_len: int = len(PROMPT), filler: int = ord("."), counting: bool = False):
    model = ScriptedModel(TOK.vocab_size, prompt_len, script, filler)
    return CountingLM(model) if counting else CausalLM(model)


# ----------------------------------------------------------------------------------------------
# EOS
# ----------------------------------------------------------------------------------------------


def test_eos_accepted_inside_drafted_block_ends_output_there():
    """When the target accepts a drafted block that contains EOS followed by more tokens, the
    output ends with that EOS (kept as the last output id, as transformers does, adding no text):
    that step's event carries the tokens up to and including EOS (their sources and margins too),
    nothing after it is emitted or streamed, it is the last event, finish_reason is "eos", the
    statistics count only the kept tokens, and the drafter is never asked again."""
    before, after = TOK.encode("Hi é!"), TOK.encode(" after EOS")
    target = scripted(before + [EOS] + after)
    drafter = OracleChainDrafter(before + [EOS] + after, k=16)
    events = run_events(target, drafter, PROMPT, 40, eos_token_ids=(EOS,), tokenizer=TOK)
    assert output_ids(events) == before + [EOS]
    assert [e.finished for e in events] == [False] * (len(events) - 1) + [True]
    last = events[-1]
    assert last.finish_reason == "eos"
    assert last.proposed > len(before) and last.tokens == before[1:] + [EOS]  # the whole block was proposed
    assert len(last.sources) == len(last.margins) == len(last.tokens) and set(last.sources) == {"oracle"}
    assert last.accepted == len(before)  # drafted tokens kept, EOS included (nothing after it counts)
    assert streamed_text(events) == "Hi é!"
    assert last.stats.new_tokens == len(before) + 1 and last.stats.accepted == len(before)
    assert drafter.calls == 1


@pytest.mark.parametrize("where", ["bonus", "prefill"])
def test_eos_as_bonus_or_first_token(where):
    """EOS as the target's own bonus token (after accepted drafts), or as the very first token,
    ends the run with finish_reason "eos", the EOS as the last output id and not in the text."""
    before = TOK.encode("ok") if where == "bonus" else []
    target = scripted(before + [EOS] + TOK.encode("zzz"))
    drafter = OracleChainDrafter(before, k=4)  # proposes up to, not including, EOS
    events = run_events(target, drafter, PROMPT, 20, eos_token_ids=(EOS,), tokenizer=TOK)
    assert output_ids(events) == before + [EOS]
    assert events[-1].finished and events[-1].finish_reason == "eos"
    assert streamed_text(events) == TOK.decode(before)


def test_no_eos_id_runs_to_max_new_tokens():
    """A model without an EOS id (eos_token_ids=()) still decodes: the run stops at
    max_new_tokens with reason "length", and a token that would be EOS elsewhere is ordinary
    output; stop_on_eos=False does the same with an EOS id given; Engine accepts a target with
    an empty EOS list."""
    script = TOK.encode("ab") + [EOS] + TOK.encode("cdefgh")
    for kwargs, settings in (({}, GenerationSettings(max_new_tokens=6)),
                             ({"eos_token_ids": (EOS,)}, GenerationSettings(max_new_tokens=6, stop_on_eos=False))):
        events = run_events(scripted(script), PromptLookupDrafter(), PROMPT, settings=settings, **kwargs)
        assert output_ids(events) == script[:6]
        assert events[-1].finish_reason == "length"
    model = tiny_llama(2)
    engine = Engine(FakeLoaded(model, eos_token_ids=[]), FakeLoaded(noisy_copy(model, 0.01, 1)))
    specs = [MethodSpec("autoregressive"), MethodSpec("prompt_lookup"), MethodSpec("draft_model", {"k": 3})]
    finals = [e for e in engine.run([1, 2, 3, 1, 2], specs, GenerationSettings(max_new_tokens=17)) if e.finished]
    assert sorted(e.method for e in finals) == sorted(s.name for s in specs)
    assert all(e.finish_reason == "length" and e.stats.new_tokens == 17 for e in finals)


# ----------------------------------------------------------------------------------------------
# The token limit
# ----------------------------------------------------------------------------------------------


def test_output_never_exceeds_max_new_tokens():
    """For every method (autoregressive, prompt lookup, draft model with a noisy draft and with
    the target itself, an oracle chain and a random tree drafter), greedy and sampled, and
    max_new_tokens in 1, 2, 3, 5, 8, 13, 21: the output has exactly max_new_tokens tokens (no
    EOS), the running total never exceeds it, and only the last event is finished ("length")."""
    model = tiny_llama(5)
    target = CausalLM(model)
    noisy, itself = CausalLM(noisy_copy(model, 0.01, 2)), CausalLM(model)
    prompt = [3, 1, 3, 1, 3, 2, 3, 1]
    reference, _ = generate(target, AutoregressiveDrafter(), prompt, GenerationSettings(max_new_tokens=21))
    factories = {
        "autoregressive": AutoregressiveDrafter,
        "prompt_lookup": lambda: PromptLookupDrafter(1, 10),
        "draft_model": lambda: DraftModelDrafter(noisy, 5),
        "draft_model_self": lambda: DraftModelDrafter(itself, 8),
        "oracle_chain": lambda: OracleChainDrafter(reference, 16),
        "random_tree": lambda: RandomTreeDrafter(reference, 64, torch.Generator().manual_seed(0)),
    }
    for temperature in (0.0, 1.0):
        for name, factory in factories.items():
            for max_new in (1, 2, 3, 5, 8, 13, 21):
                settings = GenerationSettings(max_new_tokens=max_new, sampling=SamplingConfig(temperature=temperature))
                events = run_events(target, factory(), prompt, settings=settings)
                totals = [e.stats.new_tokens for e in events]
                label = f"{name} T={temperature} max_new={max_new}"
                assert len(output_ids(events)) == max_new == totals[-1], label
                assert totals == sorted(totals) and max(totals) <= max_new, label
                assert [e.finished for e in events] == [False] * (len(events) - 1) + [True], label
                assert events[-1].finish_reason == "length", label


def test_drafter_ignoring_the_budget_is_an_error():
    """A drafter that proposes deeper than the tokens left is a bug the loop reports (instead of
    silently overrunning max_new_tokens)."""
    target = CausalLM(tiny_llama(0))
    drafter = OracleChainDrafter(list(range(40)), k=8, respect_budget=False)
    with pytest.raises(RuntimeError, match="deeper than the budget"):
        run_events(target, drafter, [1, 2, 3], 4)


# ----------------------------------------------------------------------------------------------
# The target as its own draft
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k, temperature", [(1, 0.0), (4, 0.0), (8, 0.0), (4, 1.0)])
def test_target_as_its_own_draft_accepts_everything(k, temperature):
    """With the target as its own draft every drafted token is accepted: each decode step
    proposes K, accepts K and emits K + 1 tokens (tau = K + 1 per step; max_new_tokens is
    chosen so that every step is full), greedy and at temperature 1 (where p == q up to
    rounding, so min(1, p/q) is 1 to within ~1e-6). Greedy output equals the baseline (a
    prompt whose baseline has no near-tie, so fp32 rounding cannot flip an argmax)."""
    model = tiny_llama(6)
    target = CausalLM(model)
    steps = 4
    max_new = 1 + steps * (k + 1)
    prompt, baseline, _ = clear_greedy_baseline(target, torch.Generator().manual_seed(k), 6, 10, max_new)
    settings = GenerationSettings(max_new_tokens=max_new, sampling=SamplingConfig(temperature=temperature, seed=3))
    events = run_events(target, DraftModelDrafter(CausalLM(model), k), prompt, settings=settings)
    assert len(events) == 1 + steps
    for e in events[1:]:
        assert (e.proposed, e.accepted, len(e.tokens)) == (k, k, k + 1)
        assert e.sources == ["draft"] * k + ["target"]
    stats = events[-1].stats
    assert stats.alpha == 1.0 and stats.tau == max_new / (1 + steps)
    if temperature == 0.0:
        assert output_ids(events) == baseline


# ----------------------------------------------------------------------------------------------
# Streaming
# ----------------------------------------------------------------------------------------------

TEXT = "Café crème, 北京 🎉 naïve — ok!"


@pytest.mark.parametrize("method", ["autoregressive", "prompt_lookup", "oracle_k3", "random_tree"])
def test_streamed_text_equals_final_text_with_multibyte_characters(method):
    """With a byte-level tokenizer (multi-byte characters split across tokens, and across
    steps), the concatenated streamed pieces equal decode(output ids) exactly, no piece shows a
    half character (U+FFFD), and each piece's source is one of the step's sources."""
    script = TOK.encode(TEXT)
    target = scripted(script + [EOS])
    factories = {
        "autoregressive": AutoregressiveDrafter,
        "prompt_lookup": lambda: PromptLookupDrafter(1, 4),
        "oracle_k3": lambda: OracleChainDrafter(script, 3),
        "random_tree": lambda: RandomTreeDrafter(script, 256, torch.Generator().manual_seed(1)),
    }
    events = run_events(target, factories[method](), PROMPT, 64, eos_token_ids=(EOS,), tokenizer=TOK)
    assert output_ids(events) == script + [EOS]
    assert streamed_text(events) == TOK.decode(script + [EOS], skip_special_tokens=True) == TEXT
    for e in events:
        assert all("\ufffd" not in text for text, _ in e.pieces)
        assert all(source in e.sources for _, source in e.pieces)


def test_stream_cut_inside_a_character_flushes_it():
    """A run that stops (max_new_tokens) in the middle of a multi-byte character still streams
    exactly decode(output ids): the held-back bytes are flushed (as U+FFFD) at the end."""
    script = TOK.encode("ab🎉")  # the emoji is 4 bytes
    events = run_events(scripted(script), AutoregressiveDrafter(), PROMPT, 4, tokenizer=TOK)
    assert output_ids(events) == script[:4]
    assert streamed_text(events) == TOK.decode(script[:4], skip_special_tokens=True) == "ab\ufffd"


# ----------------------------------------------------------------------------------------------
# Cancellation
# ----------------------------------------------------------------------------------------------


def test_cancellation_stops_before_the_next_step():
    """Setting the cancel event between steps ends the run before its next step: the next event
    is finished with reason "cancelled" and no tokens, no further forward pass of the target or
    the draft runs, and the generator then ends."""
    model = tiny_llama(1)
    target, draft = CountingLM(model), CountingLM(noisy_copy(model, 0.01, 4))
    cancel = threading.Event()
    gen = decode(target, DraftModelDrafter(draft, 3), [1, 2, 3, 4], GenerationSettings(max_new_tokens=50),
                 cancel=cancel)
    first, second = next(gen), next(gen)
    assert not first.finished and not second.finished
    forwards = (target.forwards, draft.forwards)
    cancel.set()
    last = next(gen)
    assert last.finished and last.finish_reason == "cancelled" and last.tokens == [] and last.pieces == []
    assert last.stats.new_tokens == len(first.tokens) + len(second.tokens)
    assert next(gen, None) is None
    assert (target.forwards, draft.forwards) == forwards


def test_cancellation_stops_every_method_of_a_comparison():
    """Engine.run: cancelling after the first round gives each method exactly one more event,
    "cancelled", and nothing after."""
    model = tiny_llama(1)
    engine = Engine(FakeLoaded(model), FakeLoaded(noisy_copy(model, 0.01, 4)))
    cancel = threading.Event()
    specs = [MethodSpec("autoregressive"), MethodSpec("prompt_lookup"), MethodSpec("draft_model")]
    events = []
    for event in engine.run([1, 2, 3, 4], specs, GenerationSettings(max_new_tokens=50), cancel=cancel):
        events.append(event)
        if len(events) == 3:
            cancel.set()
    tail = events[3:]
    assert [e.method for e in tail] == [s.name for s in specs]
    assert all(e.finished and e.finish_reason == "cancelled" and not e.tokens for e in tail)
