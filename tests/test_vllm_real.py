"""The vLLM backend against real vLLM servers on the embedded default (float32, greedy, loopback).

Needs ``.venv-vllm`` (``scripts/setup.sh --vllm``); without it every test here skips, unless
``PLAYGROUND_REQUIRE_VLLM=1`` is set (CI sets it after installing vLLM), which turns the skip
into a failure. Four servers start once for the module (baseline, ``ngram`` for prompt lookup,
``draft_model`` with the full-vocabulary export of the shipped draft, ``eagle3`` with the shipped
EAGLE head as it is: vLLM builds that draft from the head's ``config.json`` and loads its
``model.safetensors`` through its own EAGLE-3 loader, so a wrong tensor name, shape or config field
fails here): about 2 to 3 minutes on a 2-core CPU, then a few seconds per test. Outputs are compared token for token with vLLM's own
baseline; a difference at a position where the baseline's top-2 logits are within the float32
near-tie margin is classified as a near-tie, as the built-in engine's lossless check does.
"""

from __future__ import annotations

import time

import pytest

from playground.backends.vllm import client as C
from playground.backends.vllm import methods as M
from playground.backends.vllm import runner as R
from playground.backends.vllm import server as S

pytestmark = pytest.mark.vllm

PROMPTS = ("Write a short story about a robot learning to paint.",
           "Repeat this list twice: apple, banana, cherry, date, elderberry, fig, grape.")
NEW_TOKENS = 48
METHODS = ("autoregressive", "prompt_lookup", "draft_model", "eagle")


from helpers import require_vllm as _require_vllm  # noqa: E402


@pytest.fixture(scope="module")
def servers():
    """The three servers, started together and stopped after the module."""
    _require_vllm()
    configs = M.server_configs(list(METHODS), max_model_len=1024)
    pool = S.ServerPool(configs, timeout=480)
    pool.start()
    yield pool
    pool.stop()


@pytest.fixture(scope="module")
def prompts(servers):
    from playground.backends.vllm.bench import PromptBuilder

    builder = PromptBuilder(M.default_target_folder(), "default", 1024)
    return builder, [builder.encode_prompt(p) for p in PROMPTS]


def test_greedy_outputs_equal_vllms_baseline_and_report_acceptance(servers, prompts):
    """Property: with greedy decoding, prompt lookup (ngram), the exported draft (draft_model) and
    the shipped EAGLE head (eagle3) give vLLM's baseline output token for token (or differ first at a
    float32 near-tie); the acceptance figures are read back per request and agree with the server's
    /metrics counters; EAGLE's accepted tokens carry their draft depth."""
    try:
        from playground.engine import check_lossless
    except ImportError:  # before the engine's public API (playground.engine) has it
        from playground.engine import check_lossless

    builder, ids_list = prompts
    eos = builder.target.eos_token_ids
    before = {m: C.spec_decode_totals(C.read_metrics(servers.endpoints[m].url)) for m in METHODS[1:]}
    totals = {m: {"proposed": 0, "accepted": 0, "steps_with_draft": 0} for m in METHODS[1:]}
    last = {}  # method -> its record of the last prompt
    for ids in ids_list:
        base = R.run_to_end(servers.endpoints["autoregressive"], "autoregressive", ids, R.Sampling(NEW_TOKENS), eos)
        assert base["steps"] == base["new_tokens"] and base["proposed"] == 0
        for m in METHODS[1:]:
            r = R.run_to_end(servers.endpoints[m], m, ids, R.Sampling(NEW_TOKENS), eos)
            check = check_lossless(base["output_ids"], base["margins"], r["output_ids"])
            assert check.matched or check.near_tie, f"{m}: {check}"
            assert r["alignment"] == "exact"
            assert r["steps"] <= r["new_tokens"] and r["proposed"] > 0
            assert r["mean_accepted_tokens"] == pytest.approx(r["new_tokens"] / r["steps"])
            last[m] = r
            totals[m]["proposed"] += r["proposed"]
            totals[m]["accepted"] += r["accepted"]
            totals[m]["steps_with_draft"] += r["proposed_at"][0] if r["proposed_at"] else 0
    for m in METHODS[1:]:
        after = C.spec_decode_totals(C.read_metrics(servers.endpoints[m].url))
        assert after["num_draft_tokens"] - before[m]["num_draft_tokens"] == totals[m]["proposed"]
        assert after["num_accepted_tokens"] - before[m]["num_accepted_tokens"] == totals[m]["accepted"]
        assert after["num_drafts"] - before[m]["num_drafts"] == totals[m]["steps_with_draft"]
    assert totals["draft_model"]["accepted"] > 0  # the exported draft's proposals get accepted
    assert totals["eagle"]["accepted"] > 0  # and the EAGLE head's
    # The panel's view: accepted drafts tagged by depth, as the built-in engine's EAGLE panel colours them.
    end = list(R.run_completion(servers.endpoints["eagle"], "eagle", ids_list[-1], R.Sampling(NEW_TOKENS), eos))[-1]
    assert end.done and end.stats["output_ids"] == last["eagle"]["output_ids"]
    assert len(end.sources) == len(end.stats["output_ids"])
    assert set(end.sources) <= {"target", *(f"eagle_d{d}" for d in range(1, 5))}
    assert end.sources.count("eagle_d1") == end.stats["accepted_at"][0] > 0


def test_closing_the_stream_cancels_the_request(servers, prompts):
    """Stop on the page closes the generator: vLLM aborts the request (no request left running)
    and the server answers the next one at once."""
    _, ids_list = prompts
    e = servers.endpoints["autoregressive"]
    gen = R.run_completion(e, "autoregressive", ids_list[0], R.Sampling(900))
    for _ in range(3):
        next(gen)
    gen.close()
    deadline = time.monotonic() + 20
    while C.read_metrics(e.url).get("vllm:num_requests_running", 0) > 0:
        assert time.monotonic() < deadline, "the request kept running after the client went away"
        time.sleep(0.2)
    assert R.run_to_end(e, "autoregressive", ids_list[0], R.Sampling(4))["new_tokens"] == 4


def test_a_server_vllm_refuses_is_reported_with_the_reason(tmp_path):
    """vLLM refuses the shipped draft itself (7,168-token vocabulary): the start-up error names the
    server and quotes vLLM's reason from its log."""
    _require_vllm()
    from playground.engine.models import DEFAULT_DRAFT_DIR

    config = S.ServerConfig("draft_model", M.default_target_folder(),
                            {"method": "draft_model", "model": str(DEFAULT_DRAFT_DIR), "num_speculative_tokens": 2},
                            max_model_len=512)
    server = S.VLLMServer(config)
    server.start()
    try:
        with pytest.raises(S.VLLMServerError, match=r"(?s)draft_model .*exited with code.*same vocabulary size"):
            server.wait_ready(timeout=300)
    finally:
        server.stop()
