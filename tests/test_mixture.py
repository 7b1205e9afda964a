"""Mixture: the merge against a slow reference (shared prefixes merged, first proposer's source kept),
extras carried through, then the checks every method passes (greedy equal to the baseline, EOS
inside a block, the token limit, no EOS id, streaming, sampling exactness)."""

from __future__ import annotations

import random

import pytest
import torch

import drafter_checks as checks
from playground.engine.budget import AcceptanceEstimator, node_paths
from playground.engine.drafter import Drafter, StepResult
from playground.engine.lookahead import LookaheadDrafter
from playground.engine.mixture import (MIXTURE_SUFFIX_SPEC_FACTOR, MixtureDrafter, merge_candidates, merged_keys,
                                       parse_members, reference_merge)
from playground.engine.prompt_lookup import PromptLookupDrafter
from playground.engine.recycling import RecyclingDrafter
from playground.engine.suffix import SuffixDrafter
from playground.engine.tree import Candidates

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def factory(vocab_size, budget_cost, lookahead: bool = False):
    members = [("suffix", SuffixDrafter(max_spec_factor=MIXTURE_SUFFIX_SPEC_FACTOR)),
               ("recycling", RecyclingDrafter(vocab_size)), ("prompt_lookup", PromptLookupDrafter())]
    if lookahead:
        members.append(("lookahead", LookaheadDrafter()))
    d = MixtureDrafter(members, AcceptanceEstimator())
    d.budget_cost = budget_cost
    return d


def _random_part(rng, source):
    n = rng.randint(0, 8)
    parents = [rng.randrange(-1, i) for i in range(n)]
    return Candidates(torch.tensor([rng.randint(0, 3) for _ in range(n)], dtype=torch.long),
                      torch.tensor(parents, dtype=torch.long), [source] * n,
                      accept_probs=torch.rand(n, generator=torch.Generator().manual_seed(n)))


def test_merge_equals_reference():
    """On 300 random sets of 1..4 trees, the merged tree holds exactly the union of their token paths,
    each once, with the source of the first tree proposing it, in topological order; each part's
    node maps to the merged node of the same path, whose estimate is the highest of those merged."""
    rng = random.Random(2)
    for _ in range(300):
        parts = [_random_part(rng, f"s{k}") for k in range(rng.randint(1, 4))]
        merged, maps = merge_candidates(parts)
        paths = node_paths(merged)
        assert len(set(paths)) == len(paths)
        assert dict(zip(paths, merged.sources)) == reference_merge(parts)
        for part, mapping in zip(parts, maps):
            for i, path in enumerate(node_paths(part)):
                assert paths[mapping[i]] == path
                assert float(merged.accept_probs[mapping[i]]) >= float(part.accept_probs[i]) - 1e-7


class _Fixed(Drafter):
    """Proposes the same chain every step with a fixed hopeful estimate (a member to calibrate)."""

    name = source = "fixed"

    def __init__(self, tokens, accept):
        self.tokens, self.accept = tokens, accept

    def propose(self, state):
        n = len(self.tokens)
        return Candidates(torch.tensor(self.tokens), torch.arange(-1, n - 1), [self.source] * n,
                          accept_probs=torch.full((n,), self.accept))


def test_merged_estimates_are_calibrated_by_verdicts():
    """Keys count the members agreeing on a node (up to 2) and its depth; a member promising 0.95
    whose first token the target always rejects is estimated far lower after 30 steps, and a node
    both members propose and the target always accepts stays high."""
    a, b = _Fixed([5, 6], 0.95), _Fixed([5, 7], 0.95)
    d = MixtureDrafter([("a", a), ("b", b)], AcceptanceEstimator())
    merged = d.propose(None)
    assert merged.tokens.tolist() == [5, 6, 7] and merged.parents.tolist() == [-1, 0, 0]
    assert merged_keys(*merge_candidates([a.propose(None), b.propose(None)]), [0.95] * 3) == [(9, 1, 2), (9, 2, 1), (9, 2, 1)]
    first = merged.accept_probs.tolist()
    for _ in range(30):
        c = d.propose(None)
        d.update(StepResult(c, [0], 9, [], None))  # 5 accepted, then neither 6 nor 7
    later = d.propose(None).accept_probs.tolist()
    assert later[0] > 0.85 and later[1] < 0.5 and later[2] < 0.5 and first[1] == pytest.approx(0.95)


def test_members_knob_checks_names():
    assert parse_members(" suffix , recycling") == "suffix,recycling"
    with pytest.raises(ValueError, match="members must be among"):
        parse_members("suffix,draft_model")
    with pytest.raises(ValueError, match="repeat"):
        parse_members("suffix,suffix")


def test_greedy_equals_baseline_over_many_seeds():
    """24 prompts on 4 tiny models, budget off and on: greedy mixture output (suffix, recycling,
    prompt lookup) equals the baseline token for token; tokens were accepted and rejected."""
    checks.greedy_sweep(factory)


def test_greedy_with_lookahead_window_equals_baseline():
    """With Lookahead as a member its Jacobi window rides in the pass as extra queries, re-indexed to
    the merged tree: still equal to the baseline, and the pool's tokens are accepted sometimes."""
    checks.greedy_sweep(lambda v, b: factory(v, b, lookahead=True), seeds=12)


def test_sources_are_kept_per_member():
    """Accepted tokens carry the source of the member that proposed them; info() counts them."""
    script = checks.TOK.encode("abcabcabcabcabcabcabc")
    prompt = checks.TOK.encode("Q: ") + script
    d = factory(checks.TOK.vocab_size, None)
    events = checks.run_events(checks.scripted(script, len(prompt)), d, prompt, 20)
    sources = {s for e in events for s in e.sources}
    assert sources - {"target"} and sources <= {"target", "suffix", "recycling", "prompt_lookup"}
    assert sum(d.info().values()) == sum(e.accepted for e in events)


def test_learned_state_is_never_shared_between_methods_or_settings():
    """Each method and setting has its own suffix cache and recycling table in the engine (runs of one
    setting share them, so it learns across runs); running two side by side, neither learns from the
    other's passes on the same prompt."""
    from helpers import FakeLoaded, tiny_llama
    from playground.engine import Engine, MethodSpec

    engine = Engine(FakeLoaded(tiny_llama(0)))
    build = lambda name, params=None: engine.make_drafter(MethodSpec(name, dict(params or {}, budget="off")))  # noqa: E731
    a, b = build("mixture"), build("mixture")
    c = build("mixture", {"members": "suffix,recycling"})
    suffix_alone, suffix_auto = build("suffix"), engine.make_drafter(MethodSpec("suffix"))
    cache = lambda mix: dict(mix.members)["suffix"].cache  # noqa: E731
    table = lambda mix: dict(mix.members)["recycling"].table  # noqa: E731
    assert cache(a) is cache(b) and table(a) is table(b)
    assert cache(a) is not cache(c) and table(a) is not table(c)
    d = engine.make_drafter(MethodSpec("mixture"))  # the same members with budget auto
    assert cache(a) is not cache(d) and table(a) is not table(d)
    assert cache(d) is cache(engine.make_drafter(MethodSpec("mixture")))
    assert len({id(cache(a)), id(suffix_alone.cache), id(suffix_auto.cache)}) == 3
    # acceptance calibrations too: kept across runs of one setting, never shared with another method
    lookup = build("prompt_lookup")
    assert build("prompt_lookup").estimator is lookup.estimator
    window = build("lookahead")
    window.begin([1, 2, 3])  # a new run keeps the calibration
    assert build("lookahead").estimator is window.estimator
    assert dict(a.members)["prompt_lookup"].estimator is not lookup.estimator
    assert dict(a.members)["suffix"].estimator is not suffix_alone.estimator


def test_learned_state_made_in_a_benchmark_still_learns_in_later_page_runs():
    """The benchmark runs under ``torch.inference_mode``; state it makes and the engine keeps (the
    recycling table, the suffix cache) must keep working in the page's and API's runs outside it:
    a recycling table made as an inference tensor failed every later run with "Inplace update to
    inference tensor outside InferenceMode" (found by a user running the Benchmark tab, then the
    Playground), for every visitor of the server."""
    import torch

    from helpers import FakeLoaded, tiny_llama
    from playground.engine import Engine, GenerationSettings, MethodSpec

    engine = Engine(FakeLoaded(tiny_llama(0)))
    specs = [MethodSpec("autoregressive"), MethodSpec("recycling"), MethodSpec("mixture")]
    settings = GenerationSettings(max_new_tokens=12)
    with torch.inference_mode():  # as playground.bench.runner runs
        bench = [e for e in engine.run([1, 2, 3, 4], specs, settings)]
    later = [e for e in engine.run([5, 6, 7, 8], specs, settings)]  # the page: no inference mode
    for events in (bench, later):
        assert {e.method for e in events if e.finished} == {"autoregressive", "recycling", "mixture"}
    table = engine.make_drafter(MethodSpec("recycling")).table.table
    assert not table.is_inference()


def test_eagle_member_needs_a_head_and_keeps_one_colour():
    """Naming eagle as a member without a head loaded is a clear error; with a head its nodes carry
    the one mixture source ``eagle`` (not EAGLE's per-depth tags) and calibrated estimates."""
    from helpers import FakeLoaded, tiny_llama
    from playground.engine import Engine, MethodSpec
    from playground.engine.mixture import SOURCE_EAGLE
    from test_eagle import tiny_head

    model = tiny_llama(4)
    with pytest.raises(ValueError, match="mixture member eagle needs an EAGLE head"):
        Engine(FakeLoaded(model)).make_drafter(MethodSpec("mixture", {"members": "eagle,suffix"}))
    engine = Engine(FakeLoaded(model), eagle=tiny_head(model, 0, draft_vocab=32, layers=(0, 1, 2)))
    d = engine.make_drafter(MethodSpec("mixture", {"members": "eagle,suffix,prompt_lookup", "budget": "off"}))
    assert d.feature_layers == tuple(engine.eagle.feature_layers)
    # its draft gate's memory is the mixture setting's, not the eagle method's (nor another setting's)
    gate = lambda mix: dict(mix.members)["eagle"].inner.gate_memory  # noqa: E731
    alone = engine.make_drafter(MethodSpec("eagle"))
    auto = engine.make_drafter(MethodSpec("mixture", {"members": "eagle,suffix,prompt_lookup"}))
    assert len({id(gate(d)), id(gate(auto)), id(alone.gate_memory)}) == 3
    assert gate(d) is gate(engine.make_drafter(MethodSpec("mixture", {"members": "eagle,suffix,prompt_lookup",
                                                                       "budget": "off"})))
    from playground.engine.decoding import GenerationSettings
    events = list(engine.run_one([1, 2, 3, 4, 1, 2, 3], MethodSpec("mixture", {"members": "eagle,suffix,prompt_lookup"}),
                                 GenerationSettings(max_new_tokens=12)))
    sources = {s for e in events for s in e.sources}
    assert not [s for s in sources if s.startswith("eagle_d")] and sources <= {"target", SOURCE_EAGLE, "suffix",
                                                                             "prompt_lookup"}


def test_loading_for_a_mixture_loads_its_members_parts():
    """``methods_run`` names a mixture's members beside it, so ``Engine.load(methods=...)`` loads
    the EAGLE head a mixture with EAGLE needs (``python -m playground.bench --methods mixture
    --members eagle,suffix`` failed: "mixture member eagle needs an EAGLE head", the head unloaded)."""
    from playground.engine import METHODS, MethodSpec, methods_run

    specs = [MethodSpec("autoregressive"), MethodSpec("mixture", {"members": "eagle,suffix"}),
             MethodSpec("suffix"), MethodSpec("mixture", {"members": "medusa,prompt_lookup"})]
    assert methods_run(specs) == ["autoregressive", "mixture", "eagle", "suffix", "medusa", "prompt_lookup"]
    assert methods_run([MethodSpec("mixture")]) == ["mixture", *METHODS["mixture"].uses({})]
    assert "eagle" not in methods_run([MethodSpec("mixture")])  # the training-free default
    with pytest.raises(ValueError, match="members must be among"):
        methods_run([MethodSpec("mixture", {"members": "eagle,nonsense"})])
    with pytest.raises(ValueError, match="unknown"):
        methods_run([MethodSpec("nonsense")])


def test_greedy_with_eagle_member_equals_baseline_over_many_seeds():
    """EAGLE as a member (its features captured for the merged tree, its gate and early stop on): on
    tiny models with random heads, greedy output equals the baseline, budget off and on."""
    from playground.engine.eagle import EagleDrafter
    from playground.engine.mixture import SOURCE_EAGLE, CalibratedMember
    from playground.engine.budget import AcceptanceEstimator
    from test_eagle import tiny_head

    from helpers import tiny_llama

    def factory(vocab_size, budget_cost, model):
        head = tiny_head(model, 0, draft_vocab=min(32, vocab_size), layers=(0, 1, 2))
        eagle = CalibratedMember(EagleDrafter(head, depth=3, top_k=3), AcceptanceEstimator(), SOURCE_EAGLE)
        suffix = SuffixDrafter(max_spec_factor=MIXTURE_SUFFIX_SPEC_FACTOR)
        d = MixtureDrafter([("eagle", eagle), ("suffix", suffix), ("prompt_lookup", PromptLookupDrafter())])
        d.budget_cost = budget_cost
        return d
    checks.greedy_sweep(factory, seeds=12, models=[tiny_llama(seed, num_layers=3) for seed in range(4)])


@pytest.mark.real_model
def test_mixture_with_eagle_equals_baseline_on_real_prompts(real_target):
    """With the shipped head on the real default model (fp32): the mixture of EAGLE, suffix decoding
    and prompt lookup (budget auto) equals the baseline token for token on benchmark prompts, and
    EAGLE's tokens are accepted."""
    from playground.engine import Engine, MethodSpec, check_lossless
    from playground.engine.decoding import GenerationSettings
    from playground.engine.eagle import DEFAULT_EAGLE_DIR, load_eagle
    from test_eagle import REAL_PROMPTS

    if not (DEFAULT_EAGLE_DIR / "config.json").is_file():
        pytest.fail(f"the shipped EAGLE head is missing from {DEFAULT_EAGLE_DIR}")
    engine = Engine(real_target, eagle=load_eagle(DEFAULT_EAGLE_DIR, real_target))
    specs = [MethodSpec("autoregressive"), MethodSpec("mixture", {"members": "eagle,suffix,prompt_lookup"})]
    from_eagle = 0
    for label, prompt, chat in REAL_PROMPTS[:5]:
        out = {}
        for event in engine.run(engine.encode_prompt(prompt, chat=chat), specs, GenerationSettings(max_new_tokens=40)):
            o = out.setdefault(event.method, {"ids": [], "margins": []})
            o["ids"] += event.tokens
            o["margins"] += event.margins
            from_eagle += event.sources.count("eagle") if event.method == "mixture" else 0
        verdict = check_lossless(out["autoregressive"]["ids"], out["autoregressive"]["margins"], out["mixture"]["ids"])
        assert verdict.matched, f"{label}: {verdict.message()}"
    assert from_eagle > 0


def test_rest_member_joins_where_a_datastore_exists(monkeypatch):
    """On a target without a datastore the presets (the default included) run without REST, a list that
    names rest explicitly is a clear error, and the page's method list leaves rest out; with a datastore
    given, the default mixture has REST as a member."""
    from helpers import FakeLoaded, tiny_llama
    from playground.engine import Datastore, Engine, MethodSpec
    from playground.engine.mixture import DEFAULT_MEMBERS, EAGLE_MEMBERS
    from playground.engine.rest import DATASTORE_ENV

    monkeypatch.delenv(DATASTORE_ENV, raising=False)
    model = tiny_llama(2)
    engine = Engine(FakeLoaded(model))
    members = lambda e, m: [n for n, _ in e.make_drafter(MethodSpec("mixture", {"members": m})).members]  # noqa: E731
    assert "rest" in DEFAULT_MEMBERS and "rest" in EAGLE_MEMBERS
    assert members(engine, DEFAULT_MEMBERS) == ["suffix", "recycling", "prompt_lookup"]
    assert "rest" not in engine.available_methods() and "PLAYGROUND_DATASTORE" in engine.unavailable_reason("rest")
    with pytest.raises(ValueError, match="PLAYGROUND_DATASTORE=FOLDER"):
        engine.make_drafter(MethodSpec("mixture", {"members": "suffix,rest"}))
    with_store = Engine(FakeLoaded(model), datastore=Datastore([[1, 2, 3, 4]]))
    assert members(with_store, DEFAULT_MEMBERS) == ["suffix", "rest", "recycling", "prompt_lookup"]
    assert "rest" in with_store.available_methods()
