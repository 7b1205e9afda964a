"""EAGLE: greedy output equals the autoregressive baseline; sampling keeps the target's distribution;
the dynamic tree equals a slow obvious reference; the training-time unroll equals decoding-time
drafting; checkpoints round-trip in vLLM's EAGLE-3 layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from helpers import (chi_square_gof, clear_greedy_baseline, exact_first_three, output_ids, run_events,
                     sample_first_three, tiny_llama)
from playground.engine import check_lossless
from playground.engine.decoding import GenerationSettings
from playground.engine.eagle import EagleDrafter, EagleHead, read_eagle, save_eagle
from playground.engine.eagle.checkpoint import head_config
from playground.engine.eagle.tree import best_rate, choose_size, expand, next_level_pays, reference_tree, rerank
from playground.engine.sampling import SamplingConfig
from playground.engine.target import CausalLM

pytestmark = pytest.mark.usefixtures("torch_single_thread")

EOS = 63


def tiny_head(target, seed: int, draft_vocab: int = 48, layers=(0, 1, 2), std: float = 0.3) -> EagleHead:
    """A random EAGLE head for a tiny target (draft vocabulary: every other id, then the first ones)."""
    config = head_config(target.config, draft_vocab, feature_layers=layers, intermediate_size=48)
    ids = torch.randperm(target.config.vocab_size, generator=torch.Generator().manual_seed(seed))[:draft_vocab]
    head = EagleHead(config, ids.sort().values)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if "norm" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    return head.eval().attach_embedding(target.get_input_embeddings())


@pytest.fixture(scope="module")
def cases():
    targets = [tiny_llama(seed, num_layers=3) for seed in range(3)]
    heads = [tiny_head(t, 50 + i) for i, t in enumerate(targets)]
    g = torch.Generator().manual_seed(7)
    out = []
    for seed in range(24):
        target = CausalLM(targets[seed % 3])
        prompt, baseline, margins = clear_greedy_baseline(target, g, 5 + seed % 11, 4 + seed % 5, 32, (EOS,))
        out.append((seed, target, heads[seed % 3], prompt, baseline, margins))
    return out


def test_captured_features_equal_output_hidden_states():
    """The target's feature hooks give exactly transformers' hidden_states at the chosen indices
    (0 = embeddings, the last = after the final norm), the numbering the head's config uses."""
    model = tiny_llama(3, num_layers=3)
    ids = torch.randint(0, 64, (1, 9), generator=torch.Generator().manual_seed(0))
    lm = CausalLM(model)
    with torch.no_grad(), lm.capture_features((0, 2, 3)) as features:
        out = model(ids, output_hidden_states=True)
        got = features()
    want = torch.cat([out.hidden_states[i][0] for i in (0, 2, 3)], -1)
    assert torch.equal(got, want)


def test_eagle_greedy_equals_baseline(cases):
    """Over 24 prompts on 3 tiny models with random heads and varied depth, top_k and total_tokens
    (fixed, and auto on a made-up cost curve), greedy EAGLE output equals the autoregressive baseline
    token for token; across the sweep some drafted tokens were accepted and some rejected."""
    failures, accepted, proposed = [], 0, 0
    settings = GenerationSettings(max_new_tokens=32)
    for seed, target, head, prompt, baseline, margins in cases:
        knobs = dict(depth=1 + seed % 6, top_k=1 + seed % 5,
                     total_tokens="auto" if seed % 4 == 0 else 1 + seed % 12)
        drafter = EagleDrafter(head, verify_cost=lambda q: 1 + 0.05 * (q - 1), **knobs)
        events = run_events(target, drafter, prompt, settings=settings, eos_token_ids=(EOS,))
        out = [t for e in events for t in e.tokens]
        verdict = check_lossless(baseline, margins, out)
        if not verdict.matched:
            failures.append(f"seed={seed} {knobs}: {verdict.message()}")
        accepted += sum(e.accepted for e in events)
        proposed += sum(e.proposed for e in events)
    assert not failures, "\n".join(failures)
    assert 0 < accepted < proposed


def test_eagle_skipping_steps_stays_lossless(cases):
    """With the draft gate closed most of the time (a draft level made to look as dear as a target
    step), EAGLE skips drafting for three steps in four, catches the skipped steps' features up at
    the next step that drafts, and its greedy output still equals the baseline on every prompt."""
    from playground.engine.theory import VerifyCost
    settings = GenerationSettings(max_new_tokens=32)
    cost = VerifyCost({1: 1.0, 2: 1.05, 65: 4.2}, {1: 1e-3})
    skipped = 0
    for seed, target, head, prompt, baseline, margins in cases[:12]:
        drafter = EagleDrafter(head, depth=3, top_k=3, verify_cost=cost)
        drafter.level_s = 1.0  # as dear as 1000 target steps: the gate opens only to probe
        drafter.target_step_s = 1e-3
        events = run_events(target, drafter, prompt, settings=settings, eos_token_ids=(EOS,))
        drafter.level_s = 1.0
        out = [t for e in events for t in e.tokens]
        assert check_lossless(baseline, margins, out).matched, seed
        skipped += sum(e.proposed == 0 for e in events)
    assert skipped > 0


def test_int8_head_stays_lossless(cases):
    """A head whose layer and output layer run on int8 weight copies (as the shipped head on a CPU,
    ``fc`` kept) gives logits close to the float head's and, over 12 prompts on 3 tiny models, greedy
    output equal to the baseline."""
    import copy

    from playground.engine import cpu_linear
    if not cpu_linear.int8_weights_available():
        pytest.skip("this PyTorch has no FBGEMM int8 ops (not an x86 build)")
    settings = GenerationSettings(max_new_tokens=32)
    heads = {}
    for seed, target, head, prompt, baseline, margins in cases[:12]:
        if id(head) not in heads:
            q = copy.deepcopy(head).attach_embedding(head._embed[0])
            assert cpu_linear.int8_weight_linear_layers(q, skip=("fc",)) == 8
            assert isinstance(q.lm_head, cpu_linear.Int8WeightLinear) and type(q.fc) is torch.nn.Linear
            h = torch.randn(5, head.hidden_size, generator=torch.Generator().manual_seed(seed))
            ids, pos, attend = torch.arange(5), torch.arange(5), torch.ones(5, 5, dtype=torch.bool).tril()
            want, _ = head.step(head.new_cache(), h, ids, pos, attend)
            got, _ = q.step(q.new_cache(), h, ids, pos, attend)
            assert (got - want).abs().max() < 0.1 * want.abs().max()
            heads[id(head)] = q
        drafter = EagleDrafter(heads[id(head)], depth=1 + seed % 5, top_k=1 + seed % 4, total_tokens=1 + seed % 9)
        events = run_events(target, drafter, prompt, settings=settings, eos_token_ids=(EOS,))
        assert check_lossless(baseline, margins, [t for e in events for t in e.tokens]).matched, seed


@pytest.mark.real_model
def test_shipped_head_reads_int8_weights_on_a_cpu(real_target, monkeypatch):
    """Loaded beside the float32 default target on a CPU, the shipped head's layer and output layer
    read int8 copies and ``fc`` float16 ones; ``PLAYGROUND_INT8_DRAFT=0`` keeps float16 throughout."""
    from playground.engine import cpu_linear
    from playground.engine.eagle import DEFAULT_EAGLE_DIR, load_eagle
    if not (cpu_linear.int8_weights_available() and cpu_linear.half_weights_available()):
        pytest.skip("this PyTorch has no FBGEMM ops (not an x86 build)")
    head = load_eagle(DEFAULT_EAGLE_DIR, real_target)
    assert isinstance(head.lm_head, cpu_linear.Int8WeightLinear)
    assert isinstance(head.midlayer.mlp.down_proj, cpu_linear.Int8WeightLinear)
    assert isinstance(head.fc, cpu_linear.HalfWeightLinear)
    monkeypatch.setenv(cpu_linear.INT8_ENV_SWITCH, "0")
    head = load_eagle(DEFAULT_EAGLE_DIR, real_target)
    assert isinstance(head.lm_head, cpu_linear.HalfWeightLinear)


def test_eagle_sampling_matches_target():
    """Sampling (temperature 0.9, top-k 8) with EAGLE: the first three tokens of 1,500 seeded runs
    follow the target's exact joint (chi-square; a false alarm has odds below 1e-4)."""
    vocab = 10
    model = tiny_llama(11, vocab_size=vocab, num_layers=2, std=0.3)
    head = tiny_head(model, 12, draft_vocab=8, layers=(0, 1, 2), std=0.5)
    cfg = SamplingConfig(temperature=0.9, top_k=8)
    prompt = [1, 5, 3, 7]
    exact = exact_first_three(model, prompt, cfg, vocab)
    counts, accepted, proposed = sample_first_three(
        model, lambda s: EagleDrafter(head, depth=3, top_k=3, total_tokens=6), prompt, cfg, 1500, vocab)
    assert accepted > 0
    test = chi_square_gof(counts, exact)
    assert test.p_value > 1e-4, str(test)


def _reference_logp(head: EagleHead, feats: torch.Tensor, tokens: list[int]):
    """The draft run from scratch, without any cache, on the committed entries and a path."""
    n = len(tokens) - 1

    def logp_of_path(path: list[int]) -> torch.Tensor:
        cache = head.new_cache()
        m = feats.shape[0]
        attend = torch.ones(m, m, dtype=torch.bool).tril()
        logits, out = head.step(cache, head.project(feats), torch.tensor(tokens[1:n + 1]), torch.arange(m), attend)
        last_logits, h = logits[-1], out[-1]
        for d, tok in enumerate(path):
            attend = torch.ones(1, len(cache) + 1, dtype=torch.bool)
            last_logits, hh = head.step(cache, h[None], torch.tensor([tok]), torch.tensor([m + d]), attend)
            last_logits, h = last_logits[0], hh[0]
        return torch.log_softmax(last_logits, -1)
    return logp_of_path


@pytest.mark.parametrize("depth,top_k,total", [(1, 4, 3), (3, 3, 10), (4, 2, 7), (5, 4, 30)])
def test_dynamic_tree_equals_reference(depth, top_k, total):
    """The batched, cached EAGLE-2 expansion and rerank keep the same nodes (as token paths) as the
    slow obvious reference that reruns the draft from scratch for every path."""
    model = tiny_llama(21, num_layers=3)
    head = tiny_head(model, 22)
    tokens = [3, 9, 14, 2, 40, 7]
    with torch.no_grad(), CausalLM(model).capture_features(head.feature_layers) as features:
        model(torch.tensor([tokens[:-1]]))
        feats = features()
    ref = reference_tree(_reference_logp(head, feats, tokens), depth, top_k, total, head.draft_ids)
    drafter = EagleDrafter(head, depth=depth, top_k=top_k, total_tokens=total)
    from playground.engine.drafter import DecodeState
    state = DecodeState(tokens, 3, SamplingConfig(), None, 10, torch.device("cpu"), 64, features=feats)
    cand = drafter.propose(state)
    paths, parents = [], cand.parents.tolist()
    for i, t in enumerate(cand.tokens.tolist()):
        paths.append((paths[parents[i]] if parents[i] >= 0 else ()) + (t,))
    assert set(paths) == {p for p, _ in ref}
    assert len(paths) == len(ref)


def test_rerank_keeps_ancestors():
    """Rerank keeps a tree: every kept node's parent is kept, and parents come first."""
    g = torch.Generator().manual_seed(0)

    def step(states, tokens, anc, level):
        return torch.log_softmax(torch.randn(tokens.shape[0], 20, generator=g), -1), states
    pool = expand(step, torch.log_softmax(torch.randn(20, generator=g), -1), torch.zeros(4), 5, 4, torch.arange(20))
    for n in range(1, len(pool) + 1, 7):
        kept, parents = rerank(pool, n)
        assert len(kept) == n
        assert all(p < i for i, p in enumerate(parents))


def test_expansion_stops_when_no_level_can_pay():
    """``stop_below``: a level is expanded only while the newest level's likeliest node is worth at
    least that much; 0 expands every level. The drafter's one-token seconds come from a verify-cost
    curve with measured seconds (0 without: no early stop under ``total_tokens=auto``)."""
    calls = []

    def step(states, tokens, anc, level):  # every child's probability is 0.5: level d is worth 0.5 ** d
        calls.append(level)
        return torch.log(torch.full((tokens.shape[0], 8), 1 / 16).index_fill(1, torch.tensor([0]), 0.5)), states
    root = torch.log(torch.full((8,), 1 / 16).index_fill(0, torch.tensor([0]), 0.5))
    full = expand(step, root, torch.zeros(4), 5, 2, torch.arange(8))
    assert calls == [2, 3, 4, 5] and int(full.depths.max()) == 5
    calls.clear()
    cut = expand(step, root, torch.zeros(4), 5, 2, torch.arange(8), stop_below=0.2)
    assert calls == [2, 3] and int(cut.depths.max()) == 3  # 0.5 ** 3 = 0.125 < 0.2: no level 4
    model = tiny_llama(21, num_layers=3)
    head = tiny_head(model, 22)
    from playground.engine.theory import VerifyCost
    timed = VerifyCost({1: 1.0, 2: 1.1, 65: 3.0}, {1: 0.03, 2: 0.033})
    assert EagleDrafter(head, verify_cost=timed).target_step_s == 0.03
    assert EagleDrafter(head, verify_cost=VerifyCost({1: 1.0, 2: 1.1})).target_step_s == 0.0


def test_best_rate_and_the_next_level_rule():
    """``best_rate``: the size maximising expected tokens per cost (ties to the smaller size, 0 = a plain
    step), brute force over every size. ``next_level_pays``: a level runs when the children it is
    expected to add raise that rate by more than the level costs, and not when the frontier is too
    unlikely, the level too dear, or the cost curve too steep for any child to pay."""
    cost = {1: 1.0, 2: 1.02, 3: 1.1, 4: 1.34, 5: 1.36, 6: 1.38, 7: 1.4, 8: 1.42, 9: 1.6}.__getitem__
    g = torch.Generator().manual_seed(3)
    for _ in range(50):
        v = torch.rand(int(torch.randint(0, 8, (1,), generator=g)), generator=g) ** 2
        brute = max(((1 + float(v.sort(descending=True).values[:n].sum())) / cost(n + 1), -n) for n in range(len(v) + 1))
        n, rate = best_rate(v, cost, 8)
        assert (n, rate) == pytest.approx((-brute[1], brute[0]))
        assert choose_size(v, cost, 8) == n
    assert best_rate(torch.tensor([0.01]), cost, 8) == (0, 1.0)
    pool = torch.tensor([0.7, 0.1, 0.05, 0.02])  # the root's children, one likely
    confident = torch.tensor([0.8, 0.1, 0.05, 0.02])  # the draft's mean sorted child probabilities
    frontier = pool[:2]
    assert next_level_pays(pool, frontier, confident, cost, 8, 0.03)  # its likely child (0.56) pays
    assert not next_level_pays(pool, frontier, confident, cost, 8, 0.5)  # a level as dear as half a step
    assert not next_level_pays(pool, frontier, torch.tensor([0.05, 0.04, 0.03, 0.02]), cost, 8, 0.03)
    assert not next_level_pays(pool, frontier, confident, lambda q: {1: 1.0, 2: 1.02}.get(q, 9.0), 8, 0.0)
    calls = []

    def step(states, tokens, anc, level):
        calls.append(level)
        return torch.log(torch.full((tokens.shape[0], 8), 1 / 16).index_fill(1, torch.tensor([0]), 0.5)), states
    root = torch.log(torch.full((8,), 1 / 16).index_fill(0, torch.tensor([0]), 0.5))
    seen = []
    pool = expand(step, root, torch.zeros(4), 5, 2, torch.arange(8),
                  keep_expanding=lambda values, f: seen.append((values.clone(), f.clone())) or len(seen) < 2)
    assert calls == [2] and int(pool.depths.max()) == 2
    assert seen[0][0].shape == (2,) and seen[0][1].tolist() == pytest.approx([0.5, 1 / 16])  # level 1: the root's 2 children
    assert seen[1][0].shape == (2 + 2 * 2,) and seen[1][1].tolist() == pytest.approx([0.25, 1 / 32])


def test_auto_drafter_expands_only_levels_that_pay(cases):
    """With ``total_tokens=auto`` and a timed cost curve (verifying four or more tokens dear) the
    drafter stops expanding once the next level is not expected to pay (:func:`next_level_pays`), so
    it runs fewer draft levels than with a fixed ``total_tokens`` (EAGLE-2's rule: every level), and
    its greedy output equals the baseline's on every prompt."""
    from playground.engine.theory import VerifyCost
    steep = VerifyCost({1: 1.0, 2: 1.05, 3: 1.1, 4: 3.0, 65: 6.0}, {1: 0.03, 2: 0.0315})
    settings = GenerationSettings(max_new_tokens=32)
    calls = {"auto": 0, 8: 0}
    for seed, target, head, prompt, baseline, margins in cases[:12]:
        for total in calls:
            drafter = EagleDrafter(head, depth=4, top_k=4, total_tokens=total, verify_cost=steep)
            inner = head.step

            def counted(*a, _total=total, **k):
                calls[_total] += 1
                return inner(*a, **k)
            head.step = counted
            try:
                events = run_events(target, drafter, prompt, settings=settings, eos_token_ids=(EOS,))
            finally:
                del head.step
            assert check_lossless(baseline, margins, [t for e in events for t in e.tokens]).matched, (seed, total)
    assert 0 < calls["auto"] < calls[8]


def test_unrolled_training_equals_drafting():
    """The training-time test's unrolled step j at position t gives the same logits as decoding-time
    drafting at depth j + 1 below root t + 1 along the ground-truth tokens (cache, masks, positions);
    running later steps from a start position on gives the same rows there."""
    model = tiny_llama(31, num_layers=3)
    head = tiny_head(model, 32)
    ids = torch.randint(0, 64, (12,), generator=torch.Generator().manual_seed(1)).tolist()
    steps, T = 3, 8
    with torch.no_grad(), CausalLM(model).capture_features(head.feature_layers) as features:
        model(torch.tensor([ids]))
        feats = features()
    with torch.no_grad():
        unrolled = head.unrolled(feats[None, :T], torch.tensor([ids[1:T + steps]]), steps)
    with torch.no_grad():  # skipping early positions in later steps changes nothing at the others
        skipped = head.unrolled(feats[None, :T], torch.tensor([ids[1:T + steps]]), steps, start=3)
    assert torch.allclose(skipped[0], unrolled[0])
    for j in range(1, steps):
        assert torch.allclose(skipped[j][0], unrolled[j][0, 3:], atol=1e-5)
    for t in (0, 3, T - 1):
        logp = _reference_logp(head, feats[:t + 1], ids[:t + 2])
        for j in range(steps):
            want = logp(ids[t + 2:t + 2 + j])
            got = torch.log_softmax(unrolled[j][0, t], -1)
            assert torch.allclose(got, want, atol=1e-4), (t, j, float((got - want).abs().max()))


@pytest.mark.parametrize("seed", range(4))
def test_step_last_only_equals_the_full_step(seed):
    """``step(last_only=True)`` (the catch-up over committed positions) gives the full step's last
    logits and output, and leaves the same keys and values in the cache, after a prefix and alone."""
    model = tiny_llama(40 + seed, num_layers=3)
    head = tiny_head(model, 60 + seed)
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(9, head.hidden_size, generator=g)
    ids = torch.randint(0, 64, (9,), generator=g)
    caches = [head.new_cache(), head.new_cache()]
    with torch.no_grad():
        for start, stop in ((0, 5), (5, 9)):  # a prefill, then a catch-up after it
            n, past = stop - start, start
            attend = torch.ones(n, past + n, dtype=torch.bool)
            attend[:, past:] = torch.ones(n, n, dtype=torch.bool).tril()
            args = (hidden[start:stop], ids[start:stop], torch.arange(start, stop), attend)
            full_logits, full_out = head.step(caches[0], *args)
            last_logits, last_out = head.step(caches[1], *args, last_only=True)
            assert last_logits.shape == (1, head.draft_vocab_size) and last_out.shape == (1, head.hidden_size)
            assert torch.allclose(last_logits, full_logits[-1:], atol=1e-5)
            assert torch.allclose(last_out, full_out[-1:], atol=1e-5)
            assert torch.equal(caches[0].keys, caches[1].keys) and torch.equal(caches[0].values, caches[1].values)


def test_checkpoint_round_trip_in_vllm_layout(tmp_path):
    """save_eagle writes vLLM's EAGLE-3 names and config fields; read_eagle gives the same head."""
    model = tiny_llama(41, num_layers=3)
    head = tiny_head(model, 42)
    save_eagle(head, tmp_path, recipe={"data": "test"}, dtype=torch.float32)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["draft_vocab_size"] == 48 and config["vocab_size"] == 64
    assert config["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    assert config["target_hidden_size"] == 32
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        d2t = f.get_tensor("d2t")
    assert {"fc.weight", "midlayer.self_attn.q_proj.weight", "midlayer.hidden_norm.weight",
            "midlayer.input_layernorm.weight", "midlayer.mlp.gate_proj.weight", "norm.weight", "lm_head.weight",
            "d2t", "t2d"} <= names
    assert not any("embed_tokens" in n for n in names)
    assert torch.equal(torch.arange(48) + d2t, head.draft_ids)
    back = read_eagle(tmp_path).attach_embedding(model.get_input_embeddings())
    for (k, a), (_, b) in zip(sorted(head.state_dict().items()), sorted(back.state_dict().items())):
        assert torch.equal(a, b), k
    assert torch.equal(back.draft_ids, head.draft_ids)


REAL_PROMPTS = __import__("helpers").bench_prompts()[::3]


@pytest.fixture(scope="module")
def real_eagle(real_target):
    """The shipped head for the default target (assets/eagle/default), else a random one of its shape."""
    from playground.engine.eagle import DEFAULT_EAGLE_DIR, load_eagle
    if (DEFAULT_EAGLE_DIR / "config.json").is_file():
        return load_eagle(DEFAULT_EAGLE_DIR, real_target)
    head = EagleHead(head_config(real_target.model.config, 4096)).eval()
    return head.attach_embedding(real_target.model.get_input_embeddings())


@pytest.mark.real_model
@pytest.mark.skipif(not REAL_PROMPTS, reason="no benchmark prompts (shared/data/ or assets/bench/) found")
@pytest.mark.parametrize("index", range(len(REAL_PROMPTS)), ids=[p[0] for p in REAL_PROMPTS])
def test_eagle_greedy_equals_baseline_on_real_prompts(real_target, real_eagle, index):
    """On benchmark prompts (every third of the shared set: Spec-Bench questions with the chat template,
    HumanEval as plain completion) with the real default model in fp32, 48 new tokens: greedy EAGLE
    with the shipped head equals the autoregressive baseline token for token (fp32 near-ties excepted
    by check_lossless)."""
    from playground.engine.autoregressive import AutoregressiveDrafter
    label, prompt, chat = REAL_PROMPTS[index]
    tok = real_target.tokenizer
    ids = (tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                   return_tensors="pt")["input_ids"][0].tolist() if chat
           else tok(prompt)["input_ids"])
    target = CausalLM(real_target.model)
    eos = tuple(real_target.eos_token_ids)
    base = run_events(target, AutoregressiveDrafter(), ids, 48, eos_token_ids=eos)
    events = run_events(target, EagleDrafter(real_eagle, depth=5, top_k=6, total_tokens=16), ids, 48,
                        eos_token_ids=eos)
    verdict = check_lossless([t for e in base for t in e.tokens], [m for e in base for m in e.margins],
                             [t for e in events for t in e.tokens])
    assert verdict.matched, f"{label}: {verdict.message()}"


@pytest.mark.real_model
def test_a_shared_prefill_gives_each_method_what_its_own_would(real_target, real_eagle, monkeypatch):
    """One prompt pass serves the baseline, EAGLE (its three feature layers) and a reader of the last layer
    (Medusa's): each gets the tokens, first-step features and outputs of its own prefill, the prompt is
    run once, and each first step counts the shared pass's seconds."""
    from playground.engine.autoregressive import AutoregressiveDrafter
    from playground.engine.decoding import SharedPrefill

    tok = real_target.tokenizer
    ids = tok.apply_chat_template([{"role": "user", "content": "Name three rivers of Europe and their seas."}],
                                  add_generation_prompt=True, return_tensors="pt")["input_ids"][0].tolist()
    target = CausalLM(real_target.model)
    eos = tuple(real_target.eos_token_ids)
    make = (AutoregressiveDrafter, lambda: EagleDrafter(real_eagle, depth=4, top_k=4, total_tokens=8))
    own = [run_events(target, m(), ids, 24, eos_token_ids=eos) for m in make]
    last = (target.num_layers,)
    shared = SharedPrefill([*real_eagle.feature_layers, *last], users=3)  # the two runs, then one take below
    passes = []
    forward = target.forward
    monkeypatch.setattr(target, "forward",
                        lambda cache, x, *a, **k: (passes.append(len(x)), forward(cache, x, *a, **k))[1])
    got = [run_events(target, m(), ids, 24, eos_token_ids=eos, prefill=shared) for m in make]
    assert passes.count(len(ids)) == 1
    for mine, theirs in zip(got, own):
        assert output_ids(mine) == output_ids(theirs)
        assert mine[0].seconds >= shared._made[3] > 0
    with target.capture_features(last) as features:
        target.forward(target.new_cache(), torch.tensor(ids), last_only=True)
        alone = features()
    cache, logits, feats, _ = shared.take(target, ids, last)
    assert torch.equal(feats, alone) and cache.get_seq_length() == len(ids) and logits.shape == (1, target.vocab_size)
    assert shared._made is None  # the third and last user took its copy: the pass's own cache is dropped
    shared.users = None
    with pytest.raises(ValueError, match="not captured"):
        shared.take(target, ids, (next(i for i in range(target.num_layers) if i not in shared.layers),))
    with pytest.raises(ValueError, match="one prompt"):
        shared.take(target, ids[:-1], last)


def test_trainer_loss_falls_and_agreement_rises():
    """The training-time-test loss on a tiny target's own greedy text falls over 40 AdamW steps, and the
    head's top-1 agreement with the target at depth 1 rises above its random start."""
    from playground.training.eagle import Teacher, draft_vocabulary, make_batch, ttt_loss
    model = tiny_llama(51, num_layers=3)
    g = torch.Generator().manual_seed(0)
    records = []
    with torch.no_grad():
        for i in range(6):
            prompt = torch.randint(0, 64, (6,), generator=g).tolist()
            out = model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)[0].tolist()
            records.append({"input_ids": out, "prompt_len": 6})
    draft_ids, share = draft_vocabulary(records, 48, 64, [])
    head = tiny_head(model, 52, draft_vocab=48, std=0.05)
    head = EagleHead(head.config, draft_ids).attach_embedding(model.get_input_embeddings())
    teacher = Teacher(model, head.feature_layers)
    items = teacher([r["input_ids"] for r in records])
    items = [(f.float(), h.float()) for f, h in items]
    rows = model.get_output_embeddings().weight.detach()[draft_ids]
    batch = make_batch(items, records, 3, head, rows)
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
    first = None
    for _ in range(40):
        loss, parts, agree = ttt_loss(head, *batch, 3, rows)
        first = first if first is not None else (float(loss), agree[0][0] / agree[0][2])
        opt.zero_grad()
        loss.backward()
        opt.step()
    loss, parts, agree = ttt_loss(head, *batch, 3, rows)
    assert float(loss) < 0.5 * first[0]
    assert agree[0][0] / agree[0][2] > max(0.5, first[1])


def test_gate_counts_only_the_heads_own_first_token():
    """In a mixture the verified tree also holds other drafters' nodes: an accepted first token the
    head did not propose is a miss for its gate; one it did propose is a hit; a step it skipped
    teaches the gate nothing."""
    from playground.engine.drafter import StepResult
    from playground.engine.tree import Candidates
    model = tiny_llama(8, num_layers=3)
    d = EagleDrafter(tiny_head(model, 0), depth=2, top_k=2, total_tokens=4)
    merged = Candidates(torch.tensor([5, 7, 9]), torch.tensor([-1, -1, 0]), ["eagle", "suffix", "eagle"])
    d.last_tree = {"tokens": [5, 9], "parents": [-1, 0], "depths": [1, 2]}
    rate = d.gate.first_rate
    d.update(StepResult(merged, [1], bonus_token=3))  # the suffix node 7 was the target's token
    assert d.gate.first_rate < rate
    rate = d.gate.first_rate
    d.last_tree = {"tokens": [5, 9], "parents": [-1, 0], "depths": [1, 2]}
    d.update(StepResult(merged, [0, 2], bonus_token=3))
    assert d.gate.first_rate > rate
    rate, d.last_tree = d.gate.first_rate, None
    d.update(StepResult(merged, [1], bonus_token=3))
    assert d.gate.first_rate == rate


def test_held_out_leaves_out_answers_the_training_records_have():
    """A held-out record whose answer a training record also has (after another prompt) is left out of
    the held-out figures; the others stay, and the training records are untouched."""
    from playground.training.eagle import drop_seen_answers
    train = [{"input_ids": [1, 2, 7, 8, 9], "prompt_len": 2}, {"input_ids": [3, 4, 5], "prompt_len": 1}]
    held = [{"input_ids": [6, 7, 8, 9], "prompt_len": 1}, {"input_ids": [6, 7, 8], "prompt_len": 1},
            {"input_ids": [4, 5], "prompt_len": 1}]
    assert drop_seen_answers(train, held) == [held[1], held[2]]  # [5] is not the answer [4, 5]


def test_trainer_command_fine_tunes_a_given_head(tmp_path, monkeypatch, capsys):
    """``python -m playground.training.eagle --init HEAD``: a second run starts from the saved head (its
    draft vocabulary, feature layers and weights: at a learning rate of 1e-12 the weights it saves are
    the ones it started from), records ``init`` and that head's own recipe in the recipe, and refuses a head
    that does not exist."""
    from dataclasses import dataclass

    from helpers import FakeLoaded
    from playground.training import eagle as train_eagle
    from playground.training.eagle_data import extended_output_rows

    model = tiny_llama(61, num_layers=3)

    @dataclass
    class _Loaded(FakeLoaded):
        spec: str = "tiny"

    monkeypatch.setattr("playground.engine.load_model", lambda *a, **k: _Loaded(model, eos_token_ids=[EOS]))
    g = torch.Generator().manual_seed(3)
    data = tmp_path / "data.jsonl"
    with open(data, "w") as f, torch.no_grad():
        for _ in range(12):
            prompt = torch.randint(0, 60, (5,), generator=g).tolist()
            out = model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)[0].tolist()
            f.write(json.dumps({"input_ids": out, "prompt_len": 5}) + "\n")
    common = ["--data", str(data), "--cache", str(tmp_path / "cache"), "--teacher-dtype", "float32",
              "--ttt-steps", "2", "--batch-tokens", "256", "--held-out", "0.2"]
    first = tmp_path / "first"
    assert train_eagle.main(common + ["--out", str(first), "--draft-vocab-size", "40", "--feature-layers", "0", "1", "2",
                                      "--intermediate-size", "48", "--max-steps", "3"]) == 0
    again = tmp_path / "again"
    assert train_eagle.main(common + ["--out", str(again), "--init", str(first), "--draft-vocab-size", "20",
                                      "--max-steps", "2", "--lr", "1e-12", "--warmup", "1"]) == 0
    a, b = read_eagle(first), read_eagle(again)
    assert torch.equal(a.draft_ids, b.draft_ids) and a.feature_layers == b.feature_layers == (0, 1, 2)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    recipe = json.loads((again / "recipe.json").read_text())
    assert recipe["init"] == str(first) and recipe["init_recipe"] == json.loads((first / "recipe.json").read_text())
    # --extend-vocab grows the vocabulary: the old rows and every other weight carried over unchanged.
    grown = tmp_path / "grown"
    assert train_eagle.main(common + ["--out", str(grown), "--init", str(first), "--extend-vocab", "45",
                                      "--max-steps", "2", "--lr", "1e-12", "--warmup", "1"]) == 0
    c = read_eagle(grown)
    assert c.draft_vocab_size == 45 and set(a.draft_ids.tolist()) <= set(c.draft_ids.tolist())
    keep = torch.tensor([c.draft_ids.tolist().index(t) for t in a.draft_ids.tolist()])
    assert torch.equal(c.lm_head.weight[keep], a.lm_head.weight)
    sc = c.state_dict()
    assert all(torch.equal(sa[k], sc[k]) for k in sa if k != "lm_head.weight")
    added = [i for i, t in enumerate(c.draft_ids.tolist()) if t not in set(a.draft_ids.tolist())]
    want = extended_output_rows(a.draft_ids, a.lm_head.weight, c.draft_ids, model.get_output_embeddings().weight)
    assert torch.allclose(c.lm_head.weight[added], want[added].half().float(), atol=1e-3)  # saved in float16
    assert json.loads((grown / "config.json").read_text())["draft_vocab_size"] == 45
    # A rerun on more data resumes the grown head (its saved vocabulary), not a vocabulary ranked anew.
    more = tmp_path / "more.jsonl"
    more.write_text(data.read_text() + json.dumps({"input_ids": [1, 2, 3] + [59] * 30, "prompt_len": 3}) + "\n")
    out = capsys.readouterr()
    assert train_eagle.main([*common[:1], str(more), *common[2:], "--out", str(grown), "--init", str(first),
                             "--extend-vocab", "45", "--max-steps", "3", "--lr", "1e-12", "--warmup", "1"]) == 0
    assert "resumed at step 2" in capsys.readouterr().out and torch.equal(read_eagle(grown).draft_ids, c.draft_ids)
    assert train_eagle.main(common + ["--out", str(tmp_path / "z"), "--extend-vocab", "45"]) == 2  # needs --init
    assert train_eagle.main(common + ["--out", str(tmp_path / "z"), "--init", str(first), "--extend-vocab", "45",
                                      "--vocab-data", str(tmp_path / "missing.jsonl")]) == 2
    assert train_eagle.main(common + ["--out", str(tmp_path / "x"), "--init", str(tmp_path / "missing")]) == 2
    # A head trained for another target (another hidden size) is refused with a message, not a traceback.
    other = tiny_llama(62, num_layers=3, hidden_size=48)
    monkeypatch.setattr("playground.engine.load_model", lambda *a, **k: _Loaded(other, eos_token_ids=[EOS]))
    assert train_eagle.main(common + ["--out", str(tmp_path / "y"), "--init", str(first)]) == 2


def test_extend_vocabulary_adds_the_most_frequent_missing_answer_tokens():
    """The grown vocabulary keeps every old id and adds the commonest answer tokens it lacked (never a
    prompt token), sorted; a size below the old one is refused."""
    from playground.training.eagle_data import extend_vocabulary
    records = [{"input_ids": [50, 51, 7, 7, 7, 9, 9, 3], "prompt_len": 2}, {"input_ids": [52, 9, 4], "prompt_len": 1}]
    grown = extend_vocabulary(torch.tensor([3, 4]), records, 4, 60)
    assert grown.tolist() == [3, 4, 7, 9]
    assert extend_vocabulary(torch.tensor([3, 4]), records, 5, 60).tolist() == [0, 3, 4, 7, 9]  # then unused ids
    for size in (1, 61):  # below the old vocabulary, above the target's
        with pytest.raises(ValueError):
            extend_vocabulary(torch.tensor([3, 4]), records, size, 60)


def test_extended_output_rows_keep_trained_rows_and_map_the_targets():
    """Old ids keep their trained rows exactly; a new id gets the target's row through the linear map
    the old rows fit (exact here, where the trained rows are a linear map of the target's)."""
    from playground.training.eagle_data import extended_output_rows
    g = torch.Generator().manual_seed(0)
    target = torch.randn(40, 6, generator=g)
    drift = torch.randn(6, 6, generator=g)
    old_ids = torch.arange(0, 40, 3)  # 14 ids, more than the hidden size: the map is determined
    old_rows = target[old_ids] @ drift
    new_ids = torch.tensor(sorted(set(old_ids.tolist()) | {1, 5, 20}))
    rows = extended_output_rows(old_ids, old_rows, new_ids, target)
    for i, t in enumerate(new_ids.tolist()):
        want = old_rows[old_ids.tolist().index(t)] if t in old_ids.tolist() else target[t] @ drift
        assert torch.allclose(rows[i], want, atol=1e-4)
    with pytest.raises(ValueError):
        extended_output_rows(old_ids, old_rows, torch.tensor([1, 5]), target)


def test_shipped_head_fits_the_size_limit_and_names_its_vocabulary():
    """The shipped head stays within the issue's 30 MB, and its config's draft vocabulary is the one its
    weights and vLLM's ``d2t`` map hold (16,384 ids since the vocabulary was grown)."""
    folder = Path(__file__).resolve().parent.parent / "assets" / "eagle" / "default"
    assert (folder / "model.safetensors").stat().st_size < 30e6
    config = json.loads((folder / "config.json").read_text())
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        assert f.get_slice("lm_head.weight").get_shape() == [config["draft_vocab_size"], config["hidden_size"]]
        assert f.get_slice("d2t").get_shape() == [config["draft_vocab_size"]]
