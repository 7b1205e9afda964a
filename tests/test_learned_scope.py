"""Learning scopes (playground/engine/learned.py): what methods learn across runs stays with the scope
(the page's browser session) that learned it, so one visitor's outputs never feed another's drafts."""

from __future__ import annotations

import pytest
import torch

from helpers import FakeLoaded, tiny_llama
from playground.engine import Engine, GenerationSettings, MethodSpec
from playground.engine.learned import ScopeLRU, check_scope, scoped_key
from playground.ui import worker

SUFFIX = MethodSpec("suffix", {"budget": "off"})
MIXTURE = MethodSpec("mixture", {"members": "suffix,recycling,prompt_lookup", "budget": "off"})
PROMPT = [5, 6, 7, 8, 5, 6, 7, 9, 10, 11]


@pytest.fixture
def engine(torch_single_thread):
    return Engine(FakeLoaded(tiny_llama(0)))


def run(engine, spec, scope, prompt=PROMPT, tokens=12):
    return [t for e in engine.run(prompt, [spec], GenerationSettings(max_new_tokens=tokens), scope=scope)
            for t in e.tokens]


def suffix_cache(engine, scope):
    return engine.make_drafter(SUFFIX, scope).cache


def test_keys_and_checks():
    assert scoped_key("learned/suffix/x", "abc") == "learned@abc/suffix/x"
    assert scoped_key("learned/suffix/x", None) == "learned/suffix/x"
    assert scoped_key("step_cost", "abc") == "step_cost"  # device calibrations are everyone's
    assert check_scope(None) is None and check_scope("s1") == "s1"
    for bad in ("", "a/b", "x" * 201):
        with pytest.raises(ValueError, match="scope must be"):
            check_scope(bad)
    with pytest.raises(TypeError, match="scope must be a string"):
        check_scope(3)
    lru = ScopeLRU(2)
    assert lru.touch("a") == [] and lru.touch("b") == [] and lru.touch("a") == []
    assert lru.touch("c") == ["b"] and len(lru) == 2  # b was the least recently used


def test_a_scope_learns_from_its_own_runs_only(engine):
    out_a = run(engine, SUFFIX, "visitor-a")
    assert len(suffix_cache(engine, "visitor-a")) == 1
    assert len(suffix_cache(engine, "visitor-b")) == 0  # another visitor starts empty
    assert len(suffix_cache(engine, None)) == 0  # and so do runs without a scope
    out_b = run(engine, SUFFIX, "visitor-b")
    assert out_b == out_a  # same prompt, same (lossless) output
    assert len(suffix_cache(engine, "visitor-a")) == 1 and len(suffix_cache(engine, "visitor-b")) == 1
    run(engine, SUFFIX, None)
    assert len(suffix_cache(engine, None)) == 1 and len(suffix_cache(engine, "visitor-a")) == 1


def test_a_mixtures_members_learn_in_its_scope(engine):
    run(engine, MIXTURE, "visitor-a")
    keys = [k for k in engine._persistent if "learned" in k]
    assert keys and all(k.startswith("learned@visitor-a/") for k in keys), keys
    assert any("/suffix/" in k for k in keys) and any("/recycling/" in k for k in keys)


def test_forget_learned_drops_one_scope(engine):
    for scope in ("visitor-a", "visitor-b", None):
        run(engine, SUFFIX, scope)
    engine.forget("learned/")  # the benchmark's warm-up forgetting: unscoped state only
    assert len(suffix_cache(engine, None)) == 0 and len(suffix_cache(engine, "visitor-a")) == 1
    engine.forget_learned("visitor-a")
    assert len(suffix_cache(engine, "visitor-a")) == 0 and len(suffix_cache(engine, "visitor-b")) == 1


def test_least_recently_used_scope_is_dropped(engine):
    engine._scopes = ScopeLRU(2)
    run(engine, SUFFIX, "a")
    run(engine, SUFFIX, "b")
    run(engine, SUFFIX, "a")  # a used again: b is now the oldest
    run(engine, SUFFIX, "c")
    assert not any(k.startswith("learned@b/") for k in engine._persistent)
    assert len(suffix_cache(engine, "a")) == 2  # a kept both its outputs


def test_bad_scope_is_refused_before_any_step(engine):
    with pytest.raises(ValueError, match="scope must be"):
        engine.run(PROMPT, [SUFFIX], GenerationSettings(max_new_tokens=4), scope="a/b")
    with pytest.raises(TypeError, match="scope must be a string"):
        engine.run_one(PROMPT, SUFFIX, GenerationSettings(max_new_tokens=4), scope=1)


def test_page_benchmark_learns_in_a_scope_of_its_own(engine):
    """The Benchmark tab's runs neither wipe a visitor's learned state (its warm-up forgets only its
    own) nor leave theirs behind (its scope is dropped when it ends)."""
    run(engine, SUFFIX, "visitor-a")
    run(engine, SUFFIX, None)
    key = worker.register(engine)
    question = {"question_id": 1, "category": "writing", "turns": ["x"]}
    settings = worker.settings_dict(GenerationSettings(max_new_tokens=6))
    engine.encode_prompt = lambda text, chat=True: list(PROMPT)  # a tiny model has no tokenizer
    engine.target.dtype = torch.float32  # what a benchmark record names
    items = list(worker.stream_bench(key, [question, {**question, "question_id": 2}],
                                     [{"name": "autoregressive", "params": {}}, {"name": "suffix", "params": SUFFIX.params}],
                                     settings, warmup=1))
    assert sum(i["type"] == "record" for i in items) == 4, items
    assert not any(k.startswith("learned@bench-") for k in engine._persistent)
    assert len(suffix_cache(engine, "visitor-a")) == 1 and len(suffix_cache(engine, None)) == 1


def test_scoped_output_equals_the_baseline(engine):
    base = run(engine, MethodSpec("autoregressive"), None, tokens=16)
    for scope in ("a", "b", "a"):
        assert run(engine, MIXTURE, scope, tokens=16) == base
    with torch.inference_mode():
        assert run(engine, SUFFIX, "a", tokens=16) == base


def test_a_closed_tab_forgets_what_its_runs_learned(engine):
    """The page's unload handler (a tab closed or reloaded) drops that session's scope on every engine."""
    from types import SimpleNamespace

    from playground.ui.app import forget_session, session_scope

    worker.register(engine)
    mine, theirs = session_scope("tab-1"), session_scope("tab-2")
    run(engine, SUFFIX, mine)
    run(engine, SUFFIX, theirs)
    forget_session(SimpleNamespace(session_hash="tab-1"))
    assert len(suffix_cache(engine, mine)) == 0 and len(suffix_cache(engine, theirs)) == 1
    forget_session(SimpleNamespace(session_hash=None))  # an API call without a session: nothing to drop
    assert session_scope("a/b" * 100) == session_scope("a/b" * 100) and "/" not in session_scope("a/b")


def test_scoped_state_leaves_no_counts_behind(engine):
    run(engine, SUFFIX, "visitor-a")
    assert any(k.startswith("learned@visitor-a/") for k in engine.calibrations)
    engine.forget_learned("visitor-a")
    assert not any(k.startswith("learned@") for k in engine.calibrations)
