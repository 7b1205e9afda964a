"""The vLLM tab's session without servers: warming up the servers once after they start."""

from __future__ import annotations

from types import SimpleNamespace

from playground.ui.vllm_panel import VLLMSession


def test_warm_up_sends_one_short_request_per_server_once():
    """Each server gets one short request after it starts (its first request pays for lazy start-up,
    which would otherwise inflate the first run's baseline and every speedup), and only once."""
    session = VLLMSession()
    session.pool = SimpleNamespace(endpoints={"autoregressive": "e0", "prompt_lookup": "e1"})
    calls = []

    def run(endpoint, method, ids, sampling, eos):
        calls.append((endpoint, method, ids, sampling.max_new_tokens, eos))
        return {}

    assert session.warm_up([1, 2, 3], [7], run=run) == ["autoregressive", "prompt_lookup"]
    assert [(e, m) for e, m, *_ in calls] == [("e0", "autoregressive"), ("e1", "prompt_lookup")]
    assert all(ids == [1, 2, 3] and eos == [7] and 0 < n <= 16 for *_, ids, n, eos in calls)
    assert session.warm_up([1, 2, 3], [7], run=run) == [] and len(calls) == 2


def test_warm_up_without_servers_does_nothing():
    assert VLLMSession().warm_up([1], run=lambda *a: 1 / 0) == []
