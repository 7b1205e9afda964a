"""The vLLM tab's session without servers: warming up the servers once after they start, and the
commands that deploy the ticked methods on vLLM servers of your own."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from playground.ui.vllm_panel import VLLMSession, deploy_markdown


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


def test_deploy_commands_run_the_same_configs_on_a_machine_of_your_own(capsys, tmp_path):
    """The vLLM tab's deploy commands: one `vllm serve` per method on consecutive ports, each with the
    speculative config the servers started here get (the default target by its hub id, the shipped
    head's folder to copy), a share of one GPU's memory each, the metrics flags the playground reads,
    and the app command that attaches to them; a draft whose full-vocabulary export is not written yet
    comes with the command that writes it, and its own K; bad method lists are refused."""
    import json
    import shlex

    from playground.backends.vllm import methods as M
    from playground.backends.vllm import serve
    from playground.engine import DEFAULT_EAGLE_DIR, DEFAULT_HUB_ID, TOKEN_MAP_FILE

    names = ["autoregressive", "prompt_lookup", "eagle"]
    plan = M.serve_commands(names + ["eagle"], {"eagle": {"depth": 3}})  # a repeated method is served once
    assert len(plan.commands) == len(names) and plan.prepare == []
    for i, (m, line) in enumerate(zip(names, plan.commands)):
        argv = shlex.split(line)
        assert argv[:3] == ["vllm", "serve", DEFAULT_HUB_ID] and argv[argv.index("--port") + 1] == str(8000 + i)
        assert argv[argv.index("--served-model-name") + 1] == m and "--dtype" not in argv
        assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.30" and "--enable-per-request-metrics" in argv
        want = M.speculative_config(m, {"depth": 3} if m == "eagle" else None, None, str(DEFAULT_EAGLE_DIR))
        got = json.loads(argv[argv.index("--speculative-config") + 1]) if want else None
        assert got == want and (want is None) == ("--per-request-spec-decode-metrics" not in argv)
    assert shlex.split(plan.attach)[-2:] == ["--vllm-url", "eagle=http://gpu-host:8002"] and "--target" not in plan.attach
    assert plan.folders == [str(DEFAULT_EAGLE_DIR)]
    assert "--gpu-memory-utilization" not in M.serve_commands(["eagle"]).commands[0]  # one server: vLLM's default
    assert "--target /models/mine" in M.serve_commands(["autoregressive"], target="/models/mine").attach
    draft = tmp_path / "my-draft"  # a reduced-vocabulary draft never exported: export it first, K from its knobs
    draft.mkdir()
    for name, text in ((TOKEN_MAP_FILE, "[0, 1, 2]"), ("config.json", "{}"), ("draft_knobs.json", '{"k": 3}')):
        (draft / name).write_text(text)
    plan = M.serve_commands(["draft_model"], draft=str(draft))
    assert plan.prepare == [f".venv/bin/python -m playground.backends.vllm.export_draft --draft {draft}"]
    config = json.loads(shlex.split(plan.commands[0])[-1])
    assert config["num_speculative_tokens"] == 3 and plan.folders == [config["model"]]
    for bad, why in ((["lookahead"], "lookahead cannot run on vLLM"), ([], "no method to serve")):
        with pytest.raises(ValueError, match=why):
            M.serve_commands(bad)
    text = deploy_markdown(VLLMSession(), ["eagle", "lookahead"])  # the baseline added, Lookahead left out
    assert text.count("vllm serve") == 2 and str(DEFAULT_EAGLE_DIR) in text and "lookahead" not in text
    assert deploy_markdown(VLLMSession(eagle="none"), ["eagle"]).startswith("Cannot write the commands: eagle")
    attached = VLLMSession(attached={"autoregressive": "http://a:1"})
    assert "--served-model-name autoregressive" not in deploy_markdown(attached, ["eagle"])
    assert serve.main(["autoregressive,eagle", "--print"]) == 0
    out = capsys.readouterr().out
    assert out.count("vllm serve") == 2 and "app.py --vllm-url autoregressive=" in out
    assert serve.main([",", "--print"]) == 2 and serve.main(["mixture"]) == 2
    assert "mixture cannot run on vLLM" in capsys.readouterr().err
