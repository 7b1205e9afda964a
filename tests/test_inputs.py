"""Every public engine entry point refuses bad input before any work, with a ValueError or TypeError
that names the setting and its allowed range (issue 21, item 1 and item 5), and the benchmark command
line turns such a refusal into one line, not a traceback."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import FakeLoaded, tiny_llama
from playground.engine import (POSTERIOR_ALPHA_KNOB, POSTERIOR_THRESHOLD_KNOB, Engine, GenerationSettings, MethodSpec,
                               SamplingConfig)
from playground.engine.verify import TypicalAcceptance

pytestmark = pytest.mark.usefixtures("torch_single_thread")

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = GenerationSettings(max_new_tokens=3)
BASELINE = [MethodSpec("autoregressive")]


class _CountingModel(torch.nn.Module):
    """Wraps a tiny Llama and counts forward passes (so a test can prove no work was done)."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.config, self.calls = inner, inner.config, 0

    def get_input_embeddings(self):
        return self.inner.get_input_embeddings()

    def forward(self, *args, **kwargs):
        self.calls += 1
        return self.inner(*args, **kwargs)


@pytest.fixture(scope="module")
def engine():
    return Engine(FakeLoaded(_CountingModel(tiny_llama(0)), context_length=64))


# ----- sampling settings --------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, error, message", [
    ({"temperature": 1e-40}, ValueError, r"temperature must be 0 \(greedy\) or in \[0.001, 2.0\], got 1e-40"),
    ({"temperature": 1e-4}, ValueError, r"temperature must be 0 \(greedy\) or in \[0.001"),
    ({"temperature": float("nan")}, ValueError, "temperature must be a number, got NaN"),
    ({"temperature": float("inf")}, ValueError, r"temperature must be in \[0.0, 2.0\], got inf"),
    ({"temperature": True}, ValueError, "temperature must be a number, got True"),
    ({"top_k": float("inf")}, ValueError, r"top_k must be in \[0, 1000\], got inf"),
    ({"top_k": True}, ValueError, "top_k must be a number, got True"),
    ({"top_k": 1.5}, ValueError, "top_k must be an integer, got 1.5"),
    ({"top_p": 0.0}, ValueError, r"top_p must be in \[0.01, 1.0\], got 0.0"),
    ({"seed": -1}, ValueError, r"seed must be in \[0, 2147483647\], got -1"),
    ({"seed": None}, ValueError, "seed must be a number, got None"),
])
def test_sampling_config_refuses_bad_values(kwargs, error, message):
    """Temperatures too small to divide logits by (1e-40 passed and crashed inside torch's sampler),
    infinities for integer knobs (they raised OverflowError), booleans (True ran as 1), NaN and
    None are refused with the setting's name and range."""
    with pytest.raises(error, match=message):
        SamplingConfig(**kwargs)


def test_sampling_config_accepts_numpy_numbers():
    cfg = SamplingConfig(temperature=np.float32(0.5), top_k=np.int64(4), seed=np.int32(3))
    assert (cfg.temperature, cfg.top_k, cfg.seed) == (0.5, 4, 3)
    assert type(cfg.top_k) is int and type(cfg.temperature) is float


@pytest.mark.parametrize("kwargs, error, message", [
    ({"sampling": None}, TypeError, "sampling must be a SamplingConfig, got NoneType"),
    ({"sampling": {"temperature": 1.0}}, TypeError, "sampling must be a SamplingConfig, got dict"),
    ({"max_new_tokens": float("inf")}, ValueError, r"max_new_tokens must be in \[1, 2048\], got inf"),
    ({"max_new_tokens": True}, ValueError, "max_new_tokens must be a number, got True"),
    ({"max_new_tokens": 0}, ValueError, r"max_new_tokens must be in \[1, 2048\], got 0"),
    ({"stop_on_eos": "no"}, TypeError, "stop_on_eos must be True or False, got 'no'"),
    ({"stop_strings": [3]}, TypeError, "each stop string must be text, got int"),
    ({"repetition_penalty": 0.0}, ValueError, r"repetition_penalty must be in \[0.5, 3.0\], got 0.0"),
    ({"repetition_penalty": float("inf")}, ValueError, r"repetition_penalty must be in \[0.5, 3.0\], got inf"),
    ({"repetition_penalty": True}, ValueError, "repetition_penalty must be a number, got True"),
])
def test_generation_settings_refuse_bad_values(kwargs, error, message):
    with pytest.raises(error, match=message):
        GenerationSettings(**kwargs)


# ----- method knobs -------------------------------------------------------------------------
@pytest.mark.parametrize("method, knob, value, message", [
    ("draft_model", "k", float("inf"), r"k must be in \[1, 16\], got inf"),
    ("draft_model", "k", float("-inf"), r"k must be in \[1, 16\], got -inf"),
    ("draft_model", "k", True, "k must be a number, got True"),
    ("draft_model", "k", 2.5, "k must be an integer, got 2.5"),
    ("prompt_lookup", "max_ngram_size", float("inf"), r"max_ngram_size must be in \[1, 8\], got inf"),
    ("lookahead", "window", False, "window must be a number, got False"),
    ("medusa", "posterior_threshold", 0.0, r"posterior_threshold must be in \[0.01, 1.0\], got 0.0"),
    ("medusa", "posterior_alpha", 0.0, r"posterior_alpha must be in \[0.01, 1.0\], got 0.0"),
])
def test_knobs_refuse_bad_values(method, knob, value, message):
    """Knob values are checked when a spec's params are checked (before any model work)."""
    with pytest.raises(ValueError, match=message):
        MethodSpec(method, {knob: value}).checked_params()


def test_typical_acceptance_bounds_are_strictly_positive():
    """posterior_threshold = 0 or posterior_alpha = 0 made every candidate typical (p(x) > 0), so the
    output was whatever the heads drafted; both now start at 0.01, in the knob, in the rule itself,
    and the knobs' help says what the values do."""
    for knob in (POSTERIOR_THRESHOLD_KNOB, POSTERIOR_ALPHA_KNOB):
        assert knob.minimum > 0
        assert "accept" in knob.info.lower() and "lower accepts more" in knob.info.lower()
    with pytest.raises(ValueError, match=r"posterior_threshold must be in \[0.01, 1.0\], got 0.0"):
        TypicalAcceptance(0.0, 0.3)
    with pytest.raises(ValueError, match=r"posterior_alpha must be in \[0.01, 1.0\], got 0.0"):
        TypicalAcceptance(0.09, 0.0)
    # At the smallest allowed values, a token the target gives almost no probability is still refused.
    rule = TypicalAcceptance(POSTERIOR_THRESHOLD_KNOB.minimum, POSTERIOR_ALPHA_KNOB.minimum)
    p = torch.tensor([[0.999, 1e-4, 9e-4]])
    assert float(rule.thresholds(p)[0]) > 1e-4


# ----- Engine.run and Engine.run_one ----------------------------------------------------------
def test_ids_as_any_one_dimensional_sequence_of_ints(engine):
    """Lists, tuples, generators (read once: a generator of valid ids was reported as an empty
    prompt), numpy arrays and numpy integers, 1-D tensors all give the same run."""
    ids = [1, 2, 3, 4]
    want = [t for e in engine.run(ids, BASELINE, SETTINGS) for t in e.tokens]
    for given in (tuple(ids), (i for i in ids), np.array(ids), np.array(ids, dtype=np.int32),
                  [np.int64(i) for i in ids], torch.tensor(ids), range(1, 5)):
        got = [t for e in engine.run(given, BASELINE, SETTINGS) for t in e.tokens]
        assert got == want, type(given)


@pytest.mark.parametrize("ids, error, message", [
    ("Hello", TypeError, "encode text with Engine.encode_prompt first"),
    ([1.0, 2.0], TypeError, r"got an element 1.0 \(float\)"),
    ([True, 2], TypeError, r"got an element True \(bool\)"),
    (np.array([1.0, 2.0]), TypeError, "got an array of float64"),
    (torch.tensor([[1, 2]]), TypeError, r"must be 1-D \(prompt_len,\), got shape \(1, 2\)"),
    (None, TypeError, "list of integer token ids"),
    ([], ValueError, "the prompt is empty"),
    ((i for i in []), ValueError, "the prompt is empty"),
    ([1, 10**6], ValueError, "token id 1000000 is outside the target's vocabulary of 64 tokens"),
])
def test_bad_ids_are_refused(engine, ids, error, message):
    with pytest.raises(error, match=message):
        engine.run(ids, BASELINE, SETTINGS)


@pytest.mark.parametrize("specs, settings, kwargs, error, message", [
    (["autoregressive"], SETTINGS, {}, TypeError, r"methods are given as MethodSpec\(name, params\), got str"),
    ([MethodSpec("autoregressive"), "draft_model"], SETTINGS, {}, TypeError, "got str"),
    (None, SETTINGS, {}, TypeError, "specs must be a list of MethodSpec"),
    ("autoregressive", SETTINGS, {}, TypeError, "specs must be a list of MethodSpec"),
    ([], SETTINGS, {}, ValueError, "choose at least one method"),
    ([MethodSpec("nope")], SETTINGS, {}, ValueError, "unknown method"),
    (BASELINE, None, {}, TypeError, "settings must be GenerationSettings, got NoneType"),
    (BASELINE, {"max_new_tokens": 3}, {}, TypeError, "settings must be GenerationSettings, got dict"),
    (BASELINE, SETTINGS, {"cancel": 5}, TypeError, r"cancel must be a threading.Event \(or None\), got int"),
    (BASELINE, GenerationSettings(max_new_tokens=200), {}, ValueError, "exceeds the model's context of 64"),
])
def test_run_checks_everything_at_call_time(engine, specs, settings, kwargs, error, message):
    """Engine.run and Engine.run_one raise at the call itself, not at the first next(), and no
    forward pass has run."""
    before = engine.target.model.calls
    with pytest.raises(error, match=message):
        engine.run([1, 2, 3], specs, settings, **kwargs)
    if isinstance(specs, list) and len(specs) == 1 and not isinstance(specs[0], str):
        with pytest.raises(error, match=message):
            engine.run_one([1, 2, 3], specs[0], settings, **kwargs)
    assert engine.target.model.calls == before


def test_run_accepts_an_event_for_cancel(engine):
    cancel = threading.Event()
    cancel.set()
    events = list(engine.run([1, 2, 3], BASELINE, GenerationSettings(max_new_tokens=8), cancel=cancel))
    assert events[-1].finish_reason == "cancelled"


# ----- the benchmark command line -------------------------------------------------------------
def _bench_args(tmp_path, flags) -> list[str]:
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question_id": 1, "category": "x", "turns": ["hi"]}) + "\n")
    return ["--questions", str(questions), "--methods", "autoregressive,medusa", "--max-new-tokens", "2",
            "--out", str(tmp_path / "o.jsonl"), "--target", str(tmp_path / "no-such-model"), *flags]


@pytest.mark.parametrize("flags, message", [
    (["--temperature", "1e-40"], r"temperature must be 0 \(greedy\) or in \[0.001, 2.0\], got 1e-40"),
    (["--temperature", "nan"], "temperature must be a number, got NaN"),
    (["--top-k", "-3"], r"top_k must be in \[0, 1000\], got -3"),
    (["--posterior-threshold", "0"], r"posterior_threshold must be in \[0.01, 1.0\], got 0.0"),
])
def test_bench_cli_refuses_bad_settings_in_one_line(tmp_path, capsys, flags, message):
    """``python -m playground.bench`` with a bad setting returns exit code 2 with one ``error:`` line
    naming the setting and its range, before any model loads (the target given does not exist)."""
    from playground.bench.cli import main

    assert main(_bench_args(tmp_path, flags)) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and re.search(message, errors[0]), err


def test_bench_cli_tiny_temperature_is_not_a_traceback(tmp_path):
    """The process itself: ``--temperature 1e-40`` gave a 41-line traceback and exit code 1."""
    proc = subprocess.run([sys.executable, "-m", "playground.bench", *_bench_args(tmp_path, ["--temperature", "1e-40"])],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.startswith("error:")] == [
        "error: temperature must be 0 (greedy) or in [0.001, 2.0], got 1e-40"]


def test_run_arguments_refuses_unknown_methods_and_knobs():
    """The page's API helper names what it does not know instead of dropping it (a misspelt method
    reached the server as "no method is ticked"; found by a user)."""
    from playground.ui import run_arguments

    with pytest.raises(ValueError, match="unknown method 'eagel'"):
        run_arguments("hi", ["autoregressive", "eagel"])
    with pytest.raises(ValueError, match="unknown method 'eagel'"):
        run_arguments("hi", ["autoregressive"], {"eagel": {}})
    with pytest.raises(ValueError, match="prompt_lookup has no knob 'nope'"):
        run_arguments("hi", ["prompt_lookup"], {"prompt_lookup": {"nope": 1}})
    with pytest.raises(ValueError, match="a list of method names"):
        run_arguments("hi", "prompt_lookup")
    assert len(run_arguments("hi", ["prompt_lookup"], {"prompt_lookup": {"num_pred_tokens": 4}})) > 10
