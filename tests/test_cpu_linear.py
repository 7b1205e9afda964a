"""oneDNN packed linear layers (playground/engine/cpu_linear.py): same numbers as ``F.linear``
within float32 rounding, same parameters, trainable, copyable, and lossless decoding on top."""

from __future__ import annotations

import copy
import inspect
import pickle

import pytest
import torch

from helpers import clear_greedy_baseline, noisy_copy, run_events, tiny_llama
from playground.engine import cpu_linear
from playground.engine import check_lossless
from playground.engine.cpu_linear import PackedLinear, pack_linear_layers
from playground.engine import GenerationSettings
from playground.engine.draft_model import DraftModelDrafter
from playground.engine.lookahead import LookaheadDrafter
from playground.engine.target import CausalLM

pytestmark = [pytest.mark.usefixtures("torch_single_thread"),
              pytest.mark.skipif(not cpu_linear.onednn_available(), reason="this PyTorch has no oneDNN")]


@pytest.fixture(params=["plain", "packed", "mkl"], ids=["one-row-plain", "always-packed", "mkl-packed"])
def always_packed(request, monkeypatch):
    """Run each test with one row through small layers going to F.linear, with every call packed by
    oneDNN, and with one row plain, 4 to 8 rows through MKL's weights packed for 4, 6 and 8 rows
    (5 and 7 padded) and the rest through oneDNN (the paths the timing at packing chooses between)."""
    if request.param == "packed":
        monkeypatch.setattr(cpu_linear, "PACKED_MIN", 0)
    else:
        monkeypatch.setattr(cpu_linear, "ROW_TIMING", False)
    if request.param == "mkl" and cpu_linear.mkl_packed_available():
        def every_count(layers, rounds=8, step_timer=None):
            for layer in layers:
                if layer.weight.numel() < cpu_linear.PACKED_MIN:
                    layer.set_mkl_rows(cpu_linear.MKL_ROWS)
        monkeypatch.setattr(cpu_linear, "choose_mkl_packs", every_count)
    return request.param


def test_packed_model_matches_default_layers(always_packed):
    """Every Linear is swapped, parameters are shared (same state_dict keys and tensors), and
    logits over 1 and 7 tokens stay within 1e-4 (relative to the largest logit) of the
    default layers'."""
    plain = tiny_llama(0, vocab_size=96, hidden_size=64, intermediate_size=128)
    packed = copy.deepcopy(plain)
    n = pack_linear_layers(packed)
    assert n == 2 * 7 + 1
    assert sum(isinstance(m, PackedLinear) for m in packed.modules()) == n
    assert list(packed.state_dict()) == list(plain.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(packed.state_dict().values(), plain.state_dict().values()))
    ids = torch.randint(0, 96, (1, 7), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        for x in (ids[:, :1], ids):
            want, got = plain(x).logits, packed(x).logits
            assert (got - want).abs().max() <= 1e-4 * want.abs().max()


def test_row_paths_are_chosen_per_shape(monkeypatch):
    """Packing times both paths per weight shape and thread count, at growing row counts until the
    packed weight wins: layers of a shape share the verdict, a timed count of TIMED_ROWS or 0; the
    size floor always packs; without timing small layers take F.linear for one row only. Inputs
    up to ``_plain_rows`` rows go to F.linear, larger ones packed, and both give the same outputs
    within 1e-4."""
    model = tiny_llama(0, vocab_size=96, hidden_size=64, intermediate_size=128)
    monkeypatch.setattr(cpu_linear, "_PLAIN_ROWS", {})
    pack_linear_layers(model)
    layers = [m for m in model.modules() if isinstance(m, PackedLinear)]
    verdicts: dict = {}
    for layer in layers:
        assert layer._plain_rows in (0, *cpu_linear.TIMED_ROWS)
        assert verdicts.setdefault(tuple(layer.weight.shape), layer._plain_rows) == layer._plain_rows
    assert set(cpu_linear._PLAIN_ROWS) == {(*shape, torch.get_num_threads()) for shape in verdicts}
    monkeypatch.setattr(cpu_linear, "ROW_TIMING", False)
    cpu_linear.choose_row_paths(layers)
    assert all(layer._plain_rows == 1 for layer in layers)
    layer = layers[0]
    calls = []
    monkeypatch.setattr(layer, "_packed_forward", lambda x: calls.append(x.shape[0]) or PackedLinear._packed_forward(layer, x))
    x = torch.randn(3, 64)
    with torch.inference_mode():  # (autograd always takes F.linear)
        rows = [layer(x[:n]) for n in (1, 2, 3)]
        assert calls == [2, 3]
        layer._plain_rows = 3
        assert all(torch.equal(layer(x[:n]), torch.nn.functional.linear(x[:n], layer.weight, layer.bias))
                   for n in (1, 2, 3))
        assert calls == [2, 3]
        for n, got in zip((1, 2, 3), rows):
            assert torch.allclose(layer(x[:n]), got, atol=1e-4 * got.abs().max().item())
    monkeypatch.setattr(cpu_linear, "PACKED_MIN", 0)
    cpu_linear.choose_row_paths(layers)
    assert not any(layer._plain_rows for layer in layers)


def test_mkl_packs_serve_padded_row_counts(monkeypatch):
    """A layer holding MKL weights packed for 4, 6 and 8 rows sends 4 rows to the first, 5-6 to the
    second and 7-8 to the third (zero-padded), fewer or more rows elsewhere, every output within
    1e-4 of F.linear's; copies and pickles rebuild the same counts. Choosing at packing keeps a
    prefix of MKL_ROWS for the whole model (per layer, the counts above its ``_plain_rows``), and
    nothing when the memory cap allows no copy."""
    if not cpu_linear.mkl_packed_available():  # nothing is packed by MKL, and nothing breaks
        model = tiny_llama(0)
        pack_linear_layers(model)
        assert not any(m._mkl_packs for m in model.modules() if isinstance(m, PackedLinear))
        return
    layer = PackedLinear.from_linear(torch.nn.Linear(64, 48))
    layer.set_mkl_rows((4, 6, 8))
    calls = []
    real = PackedLinear._mkl_forward
    monkeypatch.setattr(PackedLinear, "_mkl_forward", lambda self, x, r: calls.append((x.shape[-2], r)) or real(self, x, r))
    x = torch.randn(1, 10, 64)
    with torch.inference_mode():
        for n in range(1, 11):
            want = torch.nn.functional.linear(x[:, :n], layer.weight, layer.bias)
            got = layer(x[:, :n])
            assert got.shape == want.shape == (1, n, 48)
            assert (got - want).abs().max() <= 1e-4 * want.abs().max()
    assert calls == [(4, 4), (5, 6), (6, 6), (7, 8), (8, 8)]
    for clone in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        assert tuple(clone._mkl_packs) == (4, 6, 8)
        with torch.inference_mode():
            assert torch.allclose(clone(x[:, :5]), layer(x[:, :5]), atol=1e-6)
    monkeypatch.setattr(cpu_linear, "_MKL_ROWS", {})
    model = tiny_llama(0, vocab_size=96, hidden_size=64, intermediate_size=128)
    pack_linear_layers(model)
    ((kept, _),) = cpu_linear._MKL_ROWS.values()
    assert kept == cpu_linear.MKL_ROWS[:len(kept)]
    for m in model.modules():
        if isinstance(m, PackedLinear):
            want = () if m.weight.numel() >= cpu_linear.PACKED_MIN else tuple(r for r in kept if r > m._plain_rows)
            assert tuple(m._mkl_packs) == want
    monkeypatch.setattr(cpu_linear, "_MKL_ROWS", {})
    monkeypatch.setattr(cpu_linear, "MKL_PACK_BYTES", 0)
    model = tiny_llama(0, vocab_size=96, hidden_size=64, intermediate_size=128)
    pack_linear_layers(model)
    assert list(cpu_linear._MKL_ROWS.values()) == [((), False)]
    assert not any(m._mkl_packs for m in model.modules() if isinstance(m, PackedLinear))


def test_mkl_packs_chosen_by_whole_forwards(monkeypatch):
    """With a step timer, MKL's copies are kept for the counts where whole forwards with them are
    faster, up to the first count where they are not; with every count kept the layers' F.linear
    rows are capped below four (for each model of those shapes), otherwise left as the sweeps chose;
    a timer that fails hands the choice back to the sweeps, routes and rows restored. The timer steps
    a real model (logits unchanged, its cache back to the context after each pass, also after an
    error) and is None for what it cannot step."""
    from playground.engine.kernel_timing import forward_timer

    model = tiny_llama(0, vocab_size=96, hidden_size=64, intermediate_size=128)
    ids = torch.randint(0, 96, (1, 9), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        before = model(ids).logits
    timer = forward_timer(model, context=16)
    assert timer is not None
    assert all(timer(rows) > 0 for rows in (1, 4, 8, 4))
    cache = inspect.getclosurevars(timer).nonlocals["cache"]
    assert cache.get_seq_length() == 16

    def fail(*_):
        raise RuntimeError("a pass that fails after every layer wrote its keys and values")

    hook = model.model.norm.register_forward_hook(fail)
    with pytest.raises(RuntimeError):
        timer(3)
    hook.remove()
    assert cache.get_seq_length() == 16 and timer(3) > 0 and cache.get_seq_length() == 16
    with torch.inference_mode():
        assert torch.equal(model(ids).logits, before)
    assert forward_timer(torch.nn.Sequential(torch.nn.Linear(4, 4))) is None
    if not cpu_linear.mkl_packed_available():
        return

    def fresh(plain_rows):
        layers = [PackedLinear.from_linear(torch.nn.Linear(64, 48)) for _ in range(3)]
        for layer, rows in zip(layers, plain_rows):
            layer._plain_rows = rows
        return layers

    def step_time_for(layers, win_at):
        def step_time(rows):
            serving = all(len(layer._mkl_route) > rows and layer._mkl_route[rows] for layer in layers)
            seen.append((rows, serving))
            return 1.0 if serving and rows in win_at else 1.5
        return step_time

    seen = []
    monkeypatch.setattr(cpu_linear, "_MKL_ROWS", {})
    layers = fresh((0, 0, 0))
    cpu_linear.choose_mkl_packs(layers, rounds=4, step_timer=lambda: step_time_for(layers, {4}))
    assert {r for r, _ in seen} == {4, 6} and {s for _, s in seen} == {True, False}
    assert all(tuple(layer._mkl_packs) == (4,) and layer._mkl_route[4] == 4 for layer in layers)
    monkeypatch.setattr(cpu_linear, "_MKL_ROWS", {})
    layers = fresh((0, 6, 8))
    cpu_linear.choose_mkl_packs(layers, rounds=2, step_timer=lambda: step_time_for(layers, {4, 6, 8}))
    assert [layer._plain_rows for layer in layers] == [0, 3, 3]
    assert all(tuple(layer._mkl_packs) == (4, 6, 8) for layer in layers)
    again = fresh((2, 6, 8))  # the same shapes: the cached verdict, capped alike, nothing timed
    cpu_linear.choose_mkl_packs(again, step_timer=lambda: pytest.fail("timed again"))
    assert [layer._plain_rows for layer in again] == [2, 3, 3]
    assert all(tuple(layer._mkl_packs) == (4, 6, 8) for layer in again)

    def broken(rows):
        raise RuntimeError("no step")

    monkeypatch.setattr(cpu_linear, "_MKL_ROWS", {})
    layers = fresh((0, 6, 1))
    cpu_linear.choose_mkl_packs(layers, rounds=1, step_timer=lambda: broken)
    ((kept, capped),) = cpu_linear._MKL_ROWS.values()
    assert not capped and [layer._plain_rows for layer in layers] == [0, 6, 1]
    for layer in layers:
        assert tuple(layer._mkl_packs) == tuple(r for r in kept if r > layer._plain_rows)


def test_tied_output_layer_stays_tied():
    """With tied embeddings the packed output layer shares the embedding's weight tensor."""
    model = tiny_llama(0)
    model.lm_head.weight = model.model.embed_tokens.weight
    pack_linear_layers(model)
    assert isinstance(model.lm_head, PackedLinear)
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_packed_layer_trains_and_copies():
    """With autograd on, the layer falls back to F.linear so gradients reach its input and
    weight; deepcopy and pickle rebuild the packed copy (the opaque tensor cannot be copied)."""
    layer = PackedLinear.from_linear(torch.nn.Linear(8, 5))
    x = torch.randn(3, 8, requires_grad=True)
    layer(x).sum().backward()
    assert x.grad is not None and layer.weight.grad is not None
    for clone in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        with torch.inference_mode():
            assert torch.allclose(clone(x.detach()), layer(x.detach()), atol=1e-6)


def test_switch_off_and_non_float32(monkeypatch):
    """PLAYGROUND_ONEDNN=0 keeps PyTorch's layers; bfloat16 layers are never swapped."""
    monkeypatch.setenv(cpu_linear.ENV_SWITCH, "0")
    assert pack_linear_layers(tiny_llama(0)) == 0
    monkeypatch.delenv(cpu_linear.ENV_SWITCH)
    assert pack_linear_layers(tiny_llama(0).to(torch.bfloat16)) == 0


def test_greedy_decoding_on_packed_models_equals_baseline(always_packed):
    """On packed tiny targets (one-token steps and multi-token verification then take different
    kernels), greedy draft-model decoding (K 1..6, a packed noisy-copy draft) and Lookahead equal
    the packed autoregressive baseline token for token over 12 seeds, with both acceptances and
    rejections."""
    failures, accepted, proposed = [], 0, 0
    settings = GenerationSettings(max_new_tokens=24)
    g = torch.Generator().manual_seed(7)
    for seed in range(12):
        model = tiny_llama(seed % 3)
        draft_model = noisy_copy(model, 0.03, 50 + seed)
        pack_linear_layers(model)
        pack_linear_layers(draft_model)
        target = CausalLM(model)
        prompt, baseline, margins = clear_greedy_baseline(target, g, 6 + seed, 5, 24)
        for drafter in (DraftModelDrafter(CausalLM(draft_model), 1 + seed % 6),
                        LookaheadDrafter(window=2 + seed % 3, ngram_size=3, guess_set_size=3)):
            events = run_events(target, drafter, prompt, settings=settings)
            verdict = check_lossless(baseline, margins, [t for e in events for t in e.tokens])
            if not verdict.matched:
                failures.append(f"seed {seed} {type(drafter).__name__}: {verdict.message()}")
            accepted += events[-1].stats.accepted
            proposed += events[-1].stats.proposed
    assert failures == []
    assert 0 < accepted < proposed


# ----- float16 weights for drafts --------------------------------------------------------------
needs_fbgemm = pytest.mark.skipif(not cpu_linear.half_weights_available(), reason="this PyTorch has no FBGEMM")


def _half_valued(model: torch.nn.Module) -> torch.nn.Module:
    """Round every parameter to a float16 value (as a draft saved in float16 loads)."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())
    return model


@needs_fbgemm
def test_half_weight_layers_match_float32_on_half_valued_weights():
    """On a draft whose weights are float16 values, every linear layer gets a float16 copy that
    shares the parameters (tied output layer included), the logits equal the float32 layers'
    within float32 rounding, and copies, pickles and gradients work."""
    model = _half_valued(tiny_llama(1))
    model.lm_head.weight = model.model.embed_tokens.weight
    ids = torch.randint(0, 64, (2, 9))
    with torch.inference_mode():
        want = model(ids).logits
    n = cpu_linear.half_weight_linear_layers(model)
    assert n == 2 * 7 + 1 and isinstance(model.lm_head, cpu_linear.HalfWeightLinear)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    with torch.inference_mode():
        got = model(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    layer = model.model.layers[0].mlp.up_proj
    x = torch.randn(3, 32, requires_grad=True)
    layer(x).sum().backward()
    assert x.grad is not None and layer.weight.grad is not None
    for clone in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        with torch.inference_mode():
            torch.testing.assert_close(clone(x.detach()), layer(x.detach()))


@needs_fbgemm
def test_half_weights_only_where_exact(monkeypatch):
    """Weights that are not float16 values (a float32 checkpoint) are left alone, as is every
    model with PLAYGROUND_HALF_DRAFT=0."""
    assert cpu_linear.half_weight_linear_layers(tiny_llama(0)) == 0
    monkeypatch.setenv(cpu_linear.HALF_ENV_SWITCH, "0")
    assert cpu_linear.half_weight_linear_layers(_half_valued(tiny_llama(0))) == 0


@needs_fbgemm
def test_greedy_decoding_with_a_half_weight_draft_equals_baseline():
    """Greedy draft-model decoding with float16-weight noisy-copy drafts (K 1..6) equals the
    baseline token for token over 12 seeds, with both acceptances and rejections."""
    failures, accepted, proposed = [], 0, 0
    g = torch.Generator().manual_seed(11)
    for seed in range(12):
        model = tiny_llama(seed % 3)
        draft_model = _half_valued(noisy_copy(model, 0.03, 70 + seed))
        assert cpu_linear.half_weight_linear_layers(draft_model) > 0
        target = CausalLM(model)
        prompt, baseline, margins = clear_greedy_baseline(target, g, 6 + seed, 5, 24)
        events = run_events(target, DraftModelDrafter(CausalLM(draft_model), 1 + seed % 6), prompt,
                            settings=GenerationSettings(max_new_tokens=24))
        verdict = check_lossless(baseline, margins, [t for e in events for t in e.tokens])
        if not verdict.matched:
            failures.append(f"seed {seed}: {verdict.message()}")
        accepted += events[-1].stats.accepted
        proposed += events[-1].stats.proposed
    assert failures == []
    assert 0 < accepted < proposed
