"""The engine on the real embedded model (SmolLM2-135M-Instruct, fp32, CPU).

Loaded once per session (``real_target`` in conftest.py); every test here is marked
``real_model``. Prompts come from ``shared/data/`` beside the repository, else from
``assets/bench/``; without either the benchmark test is skipped.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from helpers import OracleChainDrafter, ScriptedModel, bench_prompts, output_ids, run_events, streamed_text
from playground.engine import Engine, MethodSpec, check_lossless
from playground.engine import GenerationSettings
from playground.engine.target import CausalLM

pytestmark = [pytest.mark.real_model, pytest.mark.usefixtures("torch_single_thread")]

MAX_NEW = 48
PROMPTS = bench_prompts()
BASELINE_AND_LOOKUP = [MethodSpec("autoregressive"), MethodSpec("prompt_lookup")]
SELF_DRAFT = MethodSpec("draft_model", {"k": 4})


def _run(engine: Engine, prompt_ids: list[int], specs: list[MethodSpec], max_new: int):
    """Every method's events, ids, margins, streamed text and last event from one round-robin run."""
    out = {s.name: {"ids": [], "margins": [], "text": "", "last": None, "steps": []} for s in specs}
    for event in engine.run(prompt_ids, specs, GenerationSettings(max_new_tokens=max_new)):
        o = out[event.method]
        o["steps"].append(event)
        o["ids"] += event.tokens
        o["margins"] += event.margins
        o["text"] += "".join(text for text, _ in event.pieces)
        o["last"] = event
    return out


@pytest.mark.skipif(not PROMPTS, reason="no benchmark prompts (shared/data/ or assets/bench/) found")
@pytest.mark.parametrize("index", range(len(PROMPTS)), ids=[p[0] for p in PROMPTS])
def test_greedy_methods_equal_baseline_on_benchmark_prompts(real_engine, index):
    """On 10 benchmark prompts (the shortest Spec-Bench question of 7 categories with the chat
    template, and 3 HumanEval prompts as plain completion), in fp32, 48 new tokens, round-robin
    in one Engine.run: greedy prompt lookup equals the autoregressive baseline token for token,
    and on every other prompt (to fit the CI budget) so does draft-model decoding with the
    target as its own draft, whose steps (but the last, cut at EOS or the limit) accept at
    least 95% of the drafted tokens (all but fp32 near-ties). Every method's streamed text
    equals tokenizer.decode of its ids."""
    label, prompt, chat = PROMPTS[index]
    specs = BASELINE_AND_LOOKUP + ([SELF_DRAFT] if index % 2 == 0 else [])
    ids = real_engine.encode_prompt(prompt, chat=chat)
    out = _run(real_engine, ids, specs, MAX_NEW)
    base = out["autoregressive"]
    assert base["last"].finish_reason in ("eos", "length") and 0 < len(base["ids"]) <= MAX_NEW
    tok = real_engine.target.tokenizer
    for spec in specs:
        o = out[spec.name]
        assert o["text"] == tok.decode(o["ids"], skip_special_tokens=True), f"{label}: {spec.name} stream"
        verdict = check_lossless(base["ids"], base["margins"], o["ids"])
        assert verdict.matched, f"{label}: {spec.name} {verdict.message()}"
    if SELF_DRAFT in specs:  # steps but the prefill and the last (cut at EOS or the limit)
        steps = out["draft_model"]["steps"][1:-1]
        assert sum(e.accepted for e in steps) >= 0.95 * sum(e.proposed for e in steps), label


def test_streamed_text_equals_final_text_on_a_translation_prompt(real_engine):
    """With the real tokenizer on a translation prompt full of accents, Chinese and emoji, every
    method's concatenated streamed pieces equal tokenizer.decode(output ids,
    skip_special_tokens=True), and the answer itself contains non-ASCII text."""
    prompt = ("Translate into French, then into Chinese, keeping the emoji: "
              "\"The café near the station serves crème brûlée 🍮 and green tea 🍵 — 北京 is far.\"")
    ids = real_engine.encode_prompt(prompt)
    assert "北京" in real_engine.target.tokenizer.decode(ids)
    out = _run(real_engine, ids, BASELINE_AND_LOOKUP, MAX_NEW)
    tok = real_engine.target.tokenizer
    for name, o in out.items():
        assert o["text"] == tok.decode(o["ids"], skip_special_tokens=True), name
    assert any(ord(ch) > 127 for ch in out["autoregressive"]["text"])


def test_scripted_stream_with_real_tokenizer_stops_at_eos(real_target):
    """A scripted target whose greedy continuation is a fixed non-ASCII text (real token ids,
    multi-byte characters split across tokens), then EOS, then more text: with a drafter that
    proposes it all in blocks of 3, the streamed text equals the decoded text before EOS, with
    no half characters and nothing from after EOS."""
    tok = real_target.tokenizer
    eos = real_target.eos_token_ids[0]
    text = "Le café près de la gare 🍮 — 北京很远! naïve 😊"
    script = tok.encode(text, add_special_tokens=False)
    prompt = tok.encode("Translate:", add_special_tokens=False)
    after = tok.encode(" AFTER", add_special_tokens=False)
    model = ScriptedModel(len(tok), len(prompt), script + [eos] + after, filler=after[0])
    events = run_events(CausalLM(model), OracleChainDrafter(script + [eos] + after, 3), prompt, 64,
                        eos_token_ids=(eos,), tokenizer=tok)
    assert output_ids(events) == script + [eos]  # EOS is the last id; nothing after it
    assert events[-1].finish_reason == "eos"
    assert streamed_text(events) == tok.decode(script, skip_special_tokens=True) == text
    assert all("\ufffd" not in piece for e in events for piece, _ in e.pieces)


def test_encode_prompt_applies_chat_template_and_checks_context(real_target, real_engine):
    """encode_prompt wraps a user message in the model's chat template (ending with the
    assistant header), plain mode does not, and a prompt at least as long as the context
    raises ValueError naming both lengths."""
    tok = real_target.tokenizer
    chat = tok.decode(real_engine.encode_prompt("What is 2 + 2?"))
    assert "<|im_start|>user\nWhat is 2 + 2?<|im_end|>" in chat and chat.endswith("<|im_start|>assistant\n")
    plain = tok.decode(real_engine.encode_prompt("def f(x):", chat=False))
    assert plain == "def f(x):"
    small = Engine(dataclasses.replace(real_target, context_length=32))
    with pytest.raises(ValueError, match=r"the prompt is \d+ tokens, longer than the model's context of 32 tokens"):
        small.encode_prompt("word " * 40)
    assert real_target.model.dtype == torch.float32
