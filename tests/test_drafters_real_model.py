"""Suffix decoding, token recycling, REST and the mixture on the real embedded model (SmolLM2-135M-Instruct,
fp32, CPU): greedy output equals the autoregressive baseline token for token on benchmark prompts,
with the budget on (this machine's measured step cost) and off, learning across the prompts; the
streamed text equals the decoded ids."""

from __future__ import annotations

import pytest

from helpers import bench_prompts
from playground.engine import MethodSpec, check_lossless
from playground.engine.decoding import GenerationSettings

pytestmark = [pytest.mark.real_model, pytest.mark.usefixtures("torch_single_thread")]

MAX_NEW = 40
PROMPTS = bench_prompts()[:6]
SPECS = [MethodSpec("autoregressive"), MethodSpec("suffix"), MethodSpec("recycling"), MethodSpec("rest"),
         MethodSpec("mixture"),
         MethodSpec("prompt_lookup"), MethodSpec("mixture", {"budget": "off"})]


@pytest.mark.skipif(not PROMPTS, reason="no benchmark prompts (shared/data/ or assets/bench/) found")
def test_new_methods_equal_baseline_on_benchmark_prompts(real_engine):
    """On 6 benchmark prompts, one after another in one engine (so the suffix caches and recycling
    tables learn across them), each new method (budget auto; the mixture also with budget off) and
    prompt lookup with the budget equal the baseline token for token, streamed text equals
    tokenizer.decode of the ids, and across the prompts each new method accepted drafted tokens."""
    tok = real_engine.target.tokenizer
    accepted = {}
    for label, prompt, chat in PROMPTS:
        ids = real_engine.encode_prompt(prompt, chat=chat)
        for budget_off in (False, True):
            specs = [s for s in SPECS if (s.params.get("budget") == "off") == budget_off or s.name == "autoregressive"]
            out = {}
            for event in real_engine.run(ids, specs, GenerationSettings(max_new_tokens=MAX_NEW)):
                o = out.setdefault(event.method, {"ids": [], "margins": [], "text": "", "acc": 0})
                o["ids"] += event.tokens
                o["margins"] += event.margins
                o["text"] += "".join(t for t, _ in event.pieces)
                o["acc"] += event.accepted
            base = out["autoregressive"]
            for name, o in out.items():
                verdict = check_lossless(base["ids"], base["margins"], o["ids"])
                assert verdict.matched, f"{label} {name} budget_off={budget_off}: {verdict.message()}"
                assert o["text"] == tok.decode(o["ids"], skip_special_tokens=True), f"{label} {name}"
                accepted[(name, budget_off)] = accepted.get((name, budget_off), 0) + o["acc"]
    assert all(accepted[(m, False)] > 0 for m in ("suffix", "recycling", "rest", "mixture")), accepted
