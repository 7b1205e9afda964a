"""Medusa: tree buffers, tree validation messages, tree attention, greedy losslessness, typical
acceptance, checkpoints in the reference format, Medusa as a draft, and the per-device tree choice."""

from __future__ import annotations

import json
import time

import pytest
import torch

from helpers import FakeLoaded, clear_greedy_baseline, output_ids, run_events, tiny_llama
from playground.engine.autoregressive import AutoregressiveDrafter
from playground.engine import Engine, MethodSpec, check_lossless, describe_medusa_tree
from playground.engine import GenerationSettings
from playground.engine import MedusaHeads, MedusaLoadError, head_acceptance, load_heads
from playground.engine.draft_model import MedusaDraftDrafter
from playground.engine.medusa.drafter import MedusaDrafter
from playground.engine import TREE_PRESETS, expected_tokens, greedy_tree, rank_probs_from_accuracy
from playground.engine.medusa.trees import MC_SIM_7B_63, choose_tree, preset_choices
from playground.engine import SamplingConfig
from playground.engine.target import CausalLM
from playground.engine import VerifyCost
from playground.engine import Candidates, TreeChoicesError, parse_tree_choices, tree_buffers
from playground.engine.verify import TypicalAcceptance, verify_typical, verify_typical_reference

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def random_heads(model, num_heads: int, num_layers: int = 1, share: bool = True, scale: float = 0.0,
                 seed: int = 0) -> MedusaHeads:
    """Heads for a tiny model: zero-initialised blocks (each head = the base head) plus N(0, scale^2) noise."""
    cfg = model.config
    heads = MedusaHeads(cfg.hidden_size, cfg.vocab_size, num_heads, num_layers, share_lm_head=share)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in heads.named_parameters():
            if name.endswith(f"{num_layers}.weight") and not share:  # a projection: start from the base head
                p.copy_(model.get_output_embeddings().weight)
            p.add_(torch.randn(p.shape, generator=g) * scale)
    heads.attach_lm_head(model.get_output_embeddings())
    return heads.eval().requires_grad_(False)


# ----- tree buffers ---------------------------------------------------------------------------
def test_tree_buffers_hand_worked():
    """For [[0], [0, 0], [0, 1], [0, 0, 0], [1]] the nodes sort by depth then path, parents,
    depths, ranks, positions (prefix + depth), the ancestor mask and the leaf paths are as
    worked out by hand."""
    b = tree_buffers([[0], [0, 0], [0, 1], [0, 0, 0], [1]])
    assert b.choices == [(0,), (1,), (0, 0), (0, 1), (0, 0, 0)]
    assert b.parents.tolist() == [-1, -1, 0, 0, 2]
    assert b.depths.tolist() == [1, 1, 2, 2, 3]
    assert b.ranks.tolist() == [0, 1, 0, 1, 0]
    assert b.position_offsets.tolist() == [0, 1, 1, 2, 2, 3]
    assert b.paths == [[1], [0, 3], [0, 2, 4]]
    #            root n0 n1 n2 n3 n4
    expected = [[1, 0, 0, 0, 0, 0],   # root
                [1, 1, 0, 0, 0, 0],   # n0 = [0]
                [1, 0, 1, 0, 0, 0],   # n1 = [1]
                [1, 1, 0, 1, 0, 0],   # n2 = [0, 0]
                [1, 1, 0, 0, 1, 0],   # n3 = [0, 1]
                [1, 1, 0, 1, 0, 1]]   # n4 = [0, 0, 0]
    assert b.mask.int().tolist() == expected
    assert b.nodes_within(1) == 2 and b.nodes_within(2) == 4 and b.max_depth == 3


def test_presets_are_valid_trees():
    """Every preset is a valid tree; the reference's tree has 63 nodes, depth 4, indices up to 9;
    presets lose the paths deeper than the heads loaded (a valid tree again)."""
    assert len(MC_SIM_7B_63) == 63
    b = tree_buffers(MC_SIM_7B_63)
    assert len(b) == 63 and b.max_depth == 4 and int(b.ranks.max()) == 9
    for name, paths in TREE_PRESETS.items():
        if paths is not None:
            tree_buffers(paths)
            for heads in (1, 2, 3):
                trimmed = preset_choices(name, heads)
                assert max(len(p) for p in trimmed) <= heads
                parse_tree_choices(trimmed, num_heads=heads)


@pytest.mark.parametrize("value, message", [
    ("[[0], [0, 0", r"not valid JSON: Expecting"),
    ('{"a": 1}', r"must be a list of paths .* got dict"),
    ("[]", r"the tree is empty"),
    ("[[0], 3]", r"path 1 \(3\) must be a non-empty list of integers"),
    ("[[0], [-1]]", r"path \[-1\] has a negative index"),
    ("[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]]", r"path \[0, 0, 0, 0\] has depth 4, beyond the 3 Medusa heads"),
    ("[[0], [10]]", r"path \[10\] has index 10, beyond the heads' top-10: indices must be in \[0, 9\]"),
    ("[[0], [1], [0]]", r"path \[0\] appears twice"),
    ("[[0], [1, 0]]", r"path \[1, 0\] has no parent: add \[1\]"),
    ([[0]] * 65, r"65 paths; at most 64"),
])
def test_malformed_trees_give_their_message(value, message):
    """Each malformed tree raises TreeChoicesError (a ValueError) with a message naming the problem."""
    with pytest.raises(TreeChoicesError, match=message):
        parse_tree_choices(value, num_heads=3)


# ----- tree attention ---------------------------------------------------------------------------
def test_tree_attention_equals_each_path_alone():
    """The tree pass over the 63-node reference tree (random tokens) gives, for every node, the
    logits and last hidden state of running prefix + root + that node's path as a plain chain;
    tolerance 1e-4 in fp32 (seen: ~1e-6)."""
    model = tiny_llama(3)
    lm = CausalLM(model)
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, 64, (9,), generator=g)
    b = tree_buffers(MC_SIM_7B_63)
    tokens = torch.randint(0, 64, (len(b),), generator=g)
    root = torch.tensor([5])
    cache = lm.new_cache()
    lm.forward(cache, prefix)
    logits, hidden = lm.forward(cache, torch.cat([root, tokens]), b.parents, return_hidden=True)
    for node in range(len(b)):
        chain, n = [], node
        while n >= 0:
            chain.append(int(tokens[n]))
            n = int(b.parents[n])
        alone_cache = lm.new_cache()
        lm.forward(alone_cache, prefix)
        alone, alone_h = lm.forward(alone_cache, torch.tensor([5] + chain[::-1]), return_hidden=True)
        assert torch.allclose(logits[node + 1], alone[-1], atol=1e-4), node
        assert torch.allclose(hidden[node + 1], alone_h[-1], atol=1e-4), node


# ----- greedy losslessness ------------------------------------------------------------------------
NUM_SEEDS = 24
MAX_NEW = 32
EOS = 63


@pytest.fixture(scope="module")
def sweep():
    targets = [tiny_llama(seed) for seed in range(3)]
    g = torch.Generator().manual_seed(7)
    cases = []
    for seed in range(NUM_SEEDS):
        model = targets[seed % 3]
        target = CausalLM(model)
        prompt, baseline, margins = clear_greedy_baseline(target, g, 6 + seed % 10, 3 + seed % 4, MAX_NEW, (EOS,))
        cases.append((seed, model, target, prompt, baseline, margins))
    return cases


TREES = ([[0], [0, 0], [0, 1], [0, 0, 0]], MC_SIM_7B_63, [[0], [0, 0], [0, 0, 0]], [[0], [1], [2], [3]])


def test_greedy_medusa_equals_baseline(sweep):
    """For 24 prompts on 3 tiny random models, with identity heads, noisy heads, heads with their
    own projection, heads with a proposal vocabulary, 1-2 residual layers, and four trees (the seed's, the reference's 63 nodes,
    a chain, a wide root), greedy Medusa equals the autoregressive baseline token for token; over
    the sweep candidates were both accepted and rejected, and some steps accepted depth >= 2."""
    failures, accepted, proposed, deep = [], 0, 0, 0
    for seed, model, target, prompt, baseline, margins in sweep:
        tree = TREES[seed % len(TREES)]
        num_heads = max(len(p) for p in tree) + seed % 2
        heads = random_heads(model, num_heads, num_layers=1 + seed % 2, share=seed % 3 != 2,
                             scale=(0.0, 0.05, 0.3)[seed % 3], seed=seed)
        if seed % 3 == 1:  # propose from 40 of the 64 tokens only
            heads.set_proposal_vocab(torch.randperm(64, generator=torch.Generator().manual_seed(seed))[:40])
        events = run_events(target, MedusaDrafter(heads, tree), prompt, MAX_NEW, eos_token_ids=(EOS,))
        verdict = check_lossless(baseline, margins, output_ids(events))
        if not verdict.matched:
            failures.append(f"seed={seed} tree={len(tree)} nodes: {verdict.message()}")
        accepted += events[-1].stats.accepted
        proposed += events[-1].stats.proposed
        deep += sum(1 for e in events if e.accepted >= 2)
        heads_seen = {s for e in events for s in e.sources}
        assert heads_seen <= {"target"} | {f"medusa_head_{k}" for k in range(1, num_heads + 1)}
    assert failures == []
    assert 0 < accepted < proposed, (accepted, proposed)
    assert deep > 0


def test_sampling_and_typical_run_and_stay_in_budget(sweep):
    """Sampling with exact acceptance and typical acceptance (greedy and sampled) run to the token
    limit without error on tiny models (typical acceptance is lossy, so nothing is compared)."""
    seed, model, target, prompt, _, _ = sweep[1]
    heads = random_heads(model, 3, scale=0.05)
    for temperature, acceptance in ((0.8, "exact"), (0.0, "typical"), (0.8, "typical")):
        settings = GenerationSettings(MAX_NEW, SamplingConfig(temperature, seed=3))
        drafter = MedusaDrafter(heads, MC_SIM_7B_63[:20], acceptance=acceptance)
        events = run_events(target, drafter, prompt, settings=settings)
        assert sum(len(e.tokens) for e in events) == MAX_NEW


@pytest.mark.real_model
def test_greedy_medusa_equals_baseline_real_model(real_target):
    """On the default model (fp32) with identity heads (zero-initialised) and noisy heads, greedy
    Medusa equals the baseline on two real prompts, 24 tokens each."""
    engine = Engine(real_target)
    target = engine.target_lm
    model = real_target.model
    prompts = ["Write a short poem about the sea.", "List three prime numbers and explain why they are prime."]
    for i, text in enumerate(prompts):
        ids = engine.encode_prompt(text)
        base_events = run_events(target, AutoregressiveDrafter(), ids, 24)
        baseline = output_ids(base_events)
        margins = [m for e in base_events for m in e.margins]
        heads = random_heads(model, 4, scale=(0.0, 0.01)[i], seed=i)
        events = run_events(target, MedusaDrafter(heads, TREE_PRESETS["cpu_small"]), ids, 24)
        verdict = check_lossless(baseline, margins, output_ids(events))
        assert verdict.matched, verdict.message()


# ----- typical acceptance ------------------------------------------------------------------------
def test_typical_acceptance_hand_worked():
    """Threshold = min(0.09, 0.3 exp(-H)): a peaked row (H ~ 0) has threshold 0.09, a uniform row
    over 64 tokens (H = ln 64) has 0.3/64; a candidate is accepted when p(x) > its parent's
    threshold, the longest typical path wins, and greedy takes the argmax as the bonus token."""
    rule = TypicalAcceptance(0.09, 0.3)
    peaked = torch.full((64,), 1e-6)
    peaked[7] = 1.0
    peaked /= peaked.sum()
    uniform = torch.full((64,), 1 / 64)
    th = rule.thresholds(torch.stack([peaked, uniform]))
    assert abs(float(th[0]) - 0.09) < 1e-6 and abs(float(th[1]) - 0.3 / 64) < 1e-6
    # root -> a (p=0.5 under row 0) -> b (uniform row: 1/64 > 0.3/64: typical); root -> c (p=0.05 < 0.09)
    row0 = torch.zeros(64)
    row0[1], row0[2], row0[3] = 0.5, 0.45, 0.05
    cand = Candidates(torch.tensor([1, 9, 3]), torch.tensor([-1, 0, -1]), ["medusa_head_1"] * 3)
    probs = torch.stack([row0, uniform, uniform, peaked])
    v = verify_typical(cand, probs, rule, None)
    assert v.path == [0, 1] and v.bonus_token == int(probs[2].argmax())
    # Greedy exact verification would have accepted token 1 only (the argmax), then stopped at 9.


def test_typical_acceptance_equals_reference_on_random_trees():
    """On 200 random trees with random target distributions, the fast typical walk accepts the same
    path as trying every root-to-leaf path (the slow reference)."""
    g = torch.Generator().manual_seed(1)
    rule = TypicalAcceptance(0.09, 0.3)
    for _ in range(200):
        n = int(torch.randint(1, 12, (), generator=g))
        parents = [-1] + [int(torch.randint(-1, i, (), generator=g)) for i in range(1, n)]
        tokens = torch.randint(0, 8, (n,), generator=g)
        logits = torch.randn(n + 1, 8, generator=g) * 2
        probs = torch.softmax(logits, -1)
        cand = Candidates(tokens, torch.tensor(parents), ["m"] * n)
        assert verify_typical(cand, probs, rule, None).path == verify_typical_reference(cand, probs, rule)


# ----- checkpoints -------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["safetensors", "pt"])
@pytest.mark.parametrize("share", [True, False])
def test_checkpoint_round_trip(tmp_path, fmt, share):
    """Heads saved in the reference format (keys {k}.{layer}.linear.weight/bias, {k}.{L}.weight when
    projected) load back with the same tensors and outputs, in both file formats."""
    model = tiny_llama(0)
    heads = random_heads(model, 3, num_layers=2, share=share, scale=0.1, seed=4)
    heads.save(tmp_path, fmt)
    keys = set(heads.reference_state_dict())
    assert "0.0.linear.weight" in keys and "2.1.linear.bias" in keys
    assert ("0.2.weight" in keys) == (not share)
    loaded = load_heads(tmp_path, FakeLoaded(model))
    assert (loaded.num_heads, loaded.num_layers, loaded.share_lm_head) == (3, 2, share)
    h = torch.randn(5, 32)
    assert torch.allclose(loaded(h), heads(h), atol=1e-6)


def test_proposal_vocab_projects_onto_its_rows_and_round_trips(tmp_path):
    """Heads with a proposal vocabulary give the full heads' logits on its tokens and -inf elsewhere
    (so their top-k come from it), save it in config.json and load it back; bad vocabularies fail
    with their message."""
    model = tiny_llama(0)
    heads = random_heads(model, 2, num_layers=1, share=True, scale=0.3, seed=1)
    h = torch.randn(4, 32)
    full = heads(h)
    ids = [3, 9, 10, 40, 63]
    heads.set_proposal_vocab(ids)
    sub = heads(h)
    assert sub.shape == full.shape
    torch.testing.assert_close(sub[..., ids], full[..., ids], rtol=1e-5, atol=1e-5)  # a smaller matmul
    others = [t for t in range(64) if t not in ids]
    assert bool(torch.isinf(sub[..., others]).all()) and bool((sub[..., others] < 0).all())
    assert set(sub.topk(3).indices.flatten().tolist()) <= set(ids)
    heads.save(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["proposal_vocab"] == ids
    loaded = load_heads(tmp_path, FakeLoaded(model))
    assert loaded.proposal_vocab.tolist() == ids
    torch.testing.assert_close(loaded(h), sub, rtol=1e-5, atol=1e-5)
    assert torch.equal(heads.set_proposal_vocab(None)(h), full)
    with pytest.raises(ValueError, match="non-empty list in \\[0, 64\\)"):
        heads.set_proposal_vocab([5, 64])
    with pytest.raises(ValueError, match="share the base model's lm_head"):
        random_heads(model, 2, num_layers=1, share=False, scale=0.1, seed=1).set_proposal_vocab(ids)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "proposal_vocab": "all"}))
    with pytest.raises(MedusaLoadError, match="proposal_vocab must be a list of token ids"):
        load_heads(tmp_path, FakeLoaded(model))


def test_top_tokens_equal_topk_of_the_logits():
    """``top_tokens`` (the decoding hot path: top-k over the proposal vocabulary's logits only) gives
    the top-k of the full-width logits, with and without a proposal vocabulary, below a
    ``vocab_size`` narrower than the lm_head, and falls back when the vocabulary has fewer than k ids."""
    model = tiny_llama(0)
    heads = random_heads(model, 3, num_layers=1, share=True, scale=0.3, seed=2)
    for seed in range(5):
        h = torch.randn(32, generator=torch.Generator().manual_seed(seed))
        for vocab in (None, 60, 64):
            for proposal in (None, sorted(torch.randperm(64, generator=torch.Generator().manual_seed(seed))[:30].tolist()),
                             [1, 2, 62, 63]):
                heads.set_proposal_vocab(proposal)
                logits = heads(h, 2)
                logits = logits[..., :vocab] if vocab is not None else logits
                for k in (1, 3, 5):
                    top = heads.top_tokens(h, 2, k, vocab)
                    assert top.shape == (2, k)
                    usable = [t for t in (proposal or range(64)) if vocab is None or t < vocab]
                    if len(usable) >= k:  # the same tokens in the same order (random logits: no ties)
                        assert torch.equal(top, torch.topk(logits, k, dim=-1).indices)
                        assert set(top.flatten().tolist()) <= set(usable)


def test_head_count_comes_from_tensors(tmp_path):
    """A config that names the wrong head count is overruled by the tensors; a hidden-size mismatch
    with the target and an unknown key give clear errors."""
    import json

    model = tiny_llama(0)
    heads = random_heads(model, 2)
    heads.save(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["medusa_num_heads"] = 5
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert load_heads(tmp_path, FakeLoaded(model)).num_heads == 2
    with pytest.raises(MedusaLoadError, match="hidden size 32, but the target has hidden size 16"):
        load_heads(tmp_path, FakeLoaded(tiny_llama(0, hidden_size=16)))
    torch.save({"0.0.linear.weight": torch.zeros(4, 4), "bogus": torch.zeros(1)}, tmp_path / "medusa_lm_head.pt")
    (tmp_path / "medusa_lm_head.safetensors").unlink()
    with pytest.raises(MedusaLoadError, match="unexpected tensor 'bogus'"):
        load_heads(tmp_path)


def test_missing_heads_fail_fast(tmp_path, monkeypatch):
    """A missing folder, and a hub id while offline, fail at once with a message naming the heads."""
    with pytest.raises(MedusaLoadError, match="no such folder"):
        load_heads(str(tmp_path / "nope"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True, raising=False)
    t0 = time.perf_counter()
    with pytest.raises(MedusaLoadError, match="could not load Medusa heads 'nobody/no-such-medusa-heads'"):
        load_heads("nobody/no-such-medusa-heads")
    assert time.perf_counter() - t0 < 30


# ----- the engine --------------------------------------------------------------------------------
def test_engine_medusa_method(sweep):
    """Through the engine API: unavailable without heads (the reason names --medusa); with heads a
    preset, a custom tree and the auto tree run and match the baseline; a custom tree deeper than
    the heads is refused with its message; per-head acceptance comes out of the run statistics."""
    seed, model, _, prompt, baseline, _ = sweep[0]
    assert "--medusa" in Engine(FakeLoaded(model)).unavailable_reason("medusa")
    heads = random_heads(model, 3)
    heads.top_k_accuracy = [[0.6, 0.7, 0.75] + [0.8] * 7, [0.4, 0.5] + [0.6] * 8, [0.3] * 10]
    engine = Engine(FakeLoaded(model, eos_token_ids=(EOS,)), medusa=heads)
    settings = GenerationSettings(MAX_NEW)
    for tree in ("depth3", "[[0], [1], [0, 0]]", "auto", "mc_sim_7b_63"):
        events = list(engine.run_one(prompt, MethodSpec("medusa", {"tree_choices": tree}), settings))
        assert output_ids(events) == baseline, tree
    assert "auto:" in describe_medusa_tree(engine, "auto")
    # A custom tree as the page sends it (JSON text) or as a list; presets by name.
    assert describe_medusa_tree(engine, "[[0], [1], [0, 0], [0, 1]]") == "custom: 4 nodes, depth 2"
    assert describe_medusa_tree(engine, [[0]]) == "custom: 1 node, depth 1"
    assert describe_medusa_tree(engine, "depth3") == "depth3: 4 nodes, depth 3"
    with pytest.raises(ValueError, match="beyond the 3 Medusa heads"):
        engine.make_drafter(MethodSpec("medusa", {"tree_choices": "[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]]"}))
    rates = head_acceptance(events[-1].stats.as_dict())
    assert [r["head"] for r in rates] == [1, 2, 3] and all(0 <= r["rate"] <= 1 for r in rates)


# ----- Medusa as a draft -------------------------------------------------------------------------
def test_medusa_draft_for_a_larger_target(sweep):
    """A small draft with Medusa heads (vocab shared with the target) proposes its next token plus
    its heads' tokens from one draft pass; greedy output equals the target's baseline, for K in
    1..5, with some drafted tokens accepted; through the engine it is draft_model's proposer."""
    failures, accepted = [], 0
    for seed, model, target, prompt, baseline, margins in sweep[:12]:
        draft_model = tiny_llama(100 + seed % 3, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1)
        draft = CausalLM(draft_model)
        heads = random_heads(draft_model, 3, scale=0.05, seed=seed)
        drafter = MedusaDraftDrafter(draft, heads, k=1 + seed % 5)
        events = run_events(target, drafter, prompt, MAX_NEW, eos_token_ids=(EOS,))
        accepted += events[-1].stats.accepted
        if output_ids(events) != baseline:
            failures.append(seed)
    assert failures == [] and accepted > 0
    seed, model, _, prompt, baseline, _ = sweep[0]
    draft_model = tiny_llama(100)
    engine = Engine(FakeLoaded(model, eos_token_ids=(EOS,)), draft=FakeLoaded(draft_model),
                    draft_medusa=random_heads(draft_model, 2))
    spec = MethodSpec("draft_model", {"k": 3, "proposer": "medusa_heads"})
    assert isinstance(engine.make_drafter(spec), MedusaDraftDrafter)
    assert output_ids(engine.run_one(prompt, spec, GenerationSettings(MAX_NEW))) == baseline


# ----- choosing a tree per device ----------------------------------------------------------------
def test_tree_choice_follows_cost():
    """The greedy tree adds nodes in order of path probability (always a valid tree); expected
    tokens are 1 + the sum of path probabilities; a flat cost picks the largest tree, a cost
    that doubles with every extra query picks no bigger than one node, and a CPU-like cost
    (notes.md: 8 tokens 1.3x, 64 tokens 3x) picks a tree in between."""
    acc = [[0.6, 0.7, 0.75, 0.78] + [0.8] * 6, [0.4, 0.5, 0.55] + [0.6] * 7, [0.3, 0.4] + [0.45] * 8,
           [0.2, 0.3] + [0.35] * 8]
    rp = rank_probs_from_accuracy(acc)
    assert abs(rp[0][0] - 0.6) < 1e-9 and abs(rp[0][1] - 0.1) < 1e-9
    grown = greedy_tree(rp, 64)
    probs = [p for _, p in grown]
    assert probs == sorted(probs, reverse=True)
    for n in (1, 5, 20, 64):
        paths = [path for path, _ in grown[:n]]
        parse_tree_choices(paths, num_heads=4)
        assert abs(expected_tokens(paths, rp) - (1 + sum(probs[:n]))) < 1e-9
    flat = choose_tree(rp, lambda q: 1.0)
    assert len(flat.choices) == 64
    steep = choose_tree(rp, lambda q: 2.0 ** (q - 1))
    assert len(steep.choices) <= 1
    cpu = choose_tree(rp, VerifyCost({1: 1.0, 8: 1.3, 32: 2.1, 64: 3.0, 65: 3.03}))
    assert 2 <= len(cpu.choices) < 64 and cpu.score > 1.0
    parse_tree_choices(cpu.choices, num_heads=4)
    assert "nodes" in cpu.describe()


def test_medusa_gate_skips_heads_and_stays_lossless():
    """With the budget on and the heads made to look as dear as 1000 target steps, the gate opens only
    to probe (every 4th step): greedy output still equals the baseline on 8 prompts, some steps are
    plain, and the gate learns from head 1's own first tokens only."""
    from helpers import FakeLoaded
    from playground.engine import Engine, MethodSpec
    from playground.engine.decoding import GenerationSettings, decode
    model = tiny_llama(5)
    engine = Engine(FakeLoaded(model), medusa=random_heads(model, 3, scale=0.05, seed=1))
    g = torch.Generator().manual_seed(8)
    plain = 0
    for _ in range(8):
        prompt, baseline, _ = clear_greedy_baseline(engine.target_lm, g, 10, 5, 24)
        drafter = engine.make_drafter(MethodSpec("medusa", {"budget": "auto"}))
        assert drafter.budget_cost is not None
        drafter.heads_s = 1e3 * float(drafter.budget_cost.chain.seconds[1])
        events = list(decode(engine.target_lm, drafter, prompt, GenerationSettings(max_new_tokens=24)))
        assert [t for e in events for t in e.tokens] == baseline
        assert drafter.gate.pay_at > 1  # the break-even was above any acceptance: only probes ran the heads
        plain += sum(e.proposed == 0 for e in events[1:])
    assert plain > 0
