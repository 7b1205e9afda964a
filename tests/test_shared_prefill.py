"""The prompt's pass shared by the methods of a side-by-side run (``decoding.SharedPrefill``, ``Engine.run``)
on tiny random Llamas: every method's output equals its output alone (``Engine.run_one``), greedy and
sampled, over several seeds; the prompt is run once; a layer given as -1 and as ``num_layers`` is one
layer; a bad layer fails the call; a method that fails before taking its copy does not keep the pass
alive. The real default model with EAGLE is tests/test_eagle.py's."""

from __future__ import annotations

import pytest
import torch

from helpers import FakeLoaded, output_ids, tiny_llama
from playground.engine import Engine, MethodSpec
from playground.engine.decoding import GenerationSettings, SharedPrefill
from playground.engine.sampling import SamplingConfig
from playground.engine.target import CausalLM
from test_medusa import random_heads

SPECS = [MethodSpec("autoregressive"), MethodSpec("prompt_lookup"), MethodSpec("lookahead"), MethodSpec("medusa")]


def _engine(seed: int) -> Engine:
    model = tiny_llama(seed)
    loaded = FakeLoaded(model)
    loaded.device, loaded.dtype, loaded.spec = torch.device("cpu"), torch.float32, "tiny"
    return Engine(loaded, medusa=random_heads(model, 3, seed=seed))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_each_method_gives_what_it_gives_alone(seed, temperature):
    """Greedy, with the per-step budget: lossless whatever the trees. Sampled, the trees decide which
    random draws are made, so the budget is off and nothing is learned between the two runs."""
    specs = SPECS if temperature == 0 else [MethodSpec(s.name, {} if s.name == "autoregressive" else {"budget": "off"})
                                            for s in SPECS]
    engine = _engine(seed)
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, engine.target_lm.vocab_size, (24,), generator=gen).tolist()
    prompt += prompt[:8]  # something for prompt lookup to copy
    settings = GenerationSettings(max_new_tokens=20, sampling=SamplingConfig(temperature=temperature, seed=seed))
    passes = []
    forward = engine.target_lm.forward
    engine.target_lm.forward = lambda cache, x, *a, **k: (passes.append(len(x)), forward(cache, x, *a, **k))[1]
    together: dict[str, list] = {}
    for event in engine.run(prompt, specs, settings):
        together.setdefault(event.method, []).append(event)
    assert passes.count(len(prompt)) == 1
    for spec in specs:
        engine.forget_learned()  # what the run learned (its calibrations, such as Medusa's auto tree, stay)
        alone = list(engine.run_one(prompt, spec, settings))
        assert output_ids(together[spec.name]) == output_ids(alone), spec.name


def test_layers_are_numbered_once_checked_at_the_call_and_released_on_failure():
    target = CausalLM(tiny_llama(0))
    n = target.num_layers
    shared = SharedPrefill([-1, n, 1], users=2, num_layers=n)
    assert shared.layers == (n, 1)
    with target.capture_features((-1, 1)) as features:
        target.forward(target.new_cache(), torch.arange(3, 13), last_only=True)
        alone = features()
    _, _, feats, _ = shared.take(target, list(range(3, 13)), (-1, 1))
    assert torch.equal(feats, alone)
    shared.release()  # the second user failed before taking its copy: the pass goes
    assert shared._made is None and shared.users == 0
    with pytest.raises(ValueError, match="outside"):
        SharedPrefill([n + 1], num_layers=n)
    from playground.engine.medusa.drafter import MedusaDrafter

    engine = _engine(0)
    with pytest.MonkeyPatch.context() as mp:  # a drafter reading a layer the target lacks: the run's call fails
        mp.setattr(MedusaDrafter, "feature_layers", (n + 5,))
        with pytest.raises(ValueError, match="outside"):
            engine.run([5, 6, 7], [MethodSpec("autoregressive"), MethodSpec("medusa")],
                       GenerationSettings(max_new_tokens=4))
