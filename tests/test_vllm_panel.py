"""The vLLM tab without vLLM: warming up the servers once after they start, the commands that
deploy the ticked methods on vLLM servers of your own, and the tab's run (throttled streaming,
Stop) against a local stand-in server replaying a recorded vLLM stream."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

from playground.backends.vllm.server import Endpoint
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


# ----- the tab's run against a local stand-in for a vLLM server ---------------------------------
FIXTURE = Path(__file__).parent / "fixtures" / "vllm" / "base_list.sse"


class _SlowServer:
    """Serves ``base_list.sse`` (recorded from vLLM) on /v1/completions, one event every ``delay_s``;
    with ``stall_after`` set, it stops sending after that many events until ``release`` is set.
    ``closed`` is set when the client went away before the stream's end (vLLM then aborts)."""

    def __init__(self, delay_s: float = 0.0, stall_after: int | None = None):
        events = [line for line in FIXTURE.read_text().splitlines() if line.startswith("data:")]
        self.release, self.closed, self.sent = threading.Event(), threading.Event(), 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                try:
                    for i, line in enumerate(events):
                        if stall_after is not None and i == stall_after:
                            outer.release.wait(10)
                        self.wfile.write((line + "\n\n").encode())
                        self.wfile.flush()
                        outer.sent += 1
                        time.sleep(delay_s)
                        if stall_after is not None and i >= stall_after:  # give the client time to hang up
                            time.sleep(0.2)
                except (BrokenPipeError, ConnectionResetError):
                    outer.closed.set()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.endpoint = Endpoint("autoregressive", f"http://127.0.0.1:{self.httpd.server_port}", "autoregressive")
        self.events = len(events)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release.set()
        self.httpd.shutdown()


class _Tokenizer:
    def convert_ids_to_tokens(self, ids):
        return [f"<{i}>" for i in ids]

    def decode(self, ids, **kw):
        return "".join(f"<{i}>" for i in ids)


PANELS = {"autoregressive": ("text", "stats", "badge")}


def _status(update) -> str:
    return update.get("status", "")


def test_the_tab_streams_at_most_one_text_update_per_interval_then_colours_the_answer():
    """A burst of streamed chunks becomes a few text updates, not one per token (one per token can
    outrun the page, which then takes Stop late); the last panel update is the coloured answer."""
    from playground.backends.vllm.runner import Sampling
    from playground.ui.vllm_panel import stream_methods

    with _SlowServer() as server:
        updates = list(stream_methods({"autoregressive": server.endpoint}, _Tokenizer(), ["autoregressive"],
                                      [1, 2, 3], Sampling(32), [2], threading.Event(), PANELS, "status"))
    texts = [u["text"] for u in updates if "text" in u]
    assert server.events >= 20 and 2 <= len(texts) <= 6  # cleared, a few streamed updates, the answer
    assert 'class="tok' in texts[-1] and "tok/s" in updates[-2]["stats"]
    assert "done" in _status(updates[-1])


def test_stop_ends_the_run_at_once_even_while_no_chunk_arrives():
    """Stop while the server sends nothing: the run's last update says "stopped" within a poll
    interval and holds the text received so far; the connection is then closed (vLLM aborts)."""
    from playground.backends.vllm.runner import Sampling
    from playground.ui import run_control
    from playground.ui.vllm_panel import stream_methods

    flag = threading.Event()
    with _SlowServer(delay_s=0.01, stall_after=5) as server:
        run = stream_methods({"autoregressive": server.endpoint}, _Tokenizer(), ["autoregressive"],
                             [1, 2, 3], Sampling(32), [2], flag, PANELS, "status")
        updates = []
        for u in run:
            updates.append(u)
            if server.sent >= 5 and not flag.is_set():
                flag.set()
                t_stop = time.monotonic()
        waited = time.monotonic() - t_stop
        assert waited < 3 * run_control.POLL_S + 0.5
        assert "stopped during autoregressive" in _status(updates[-1])
        assert updates[-1]["text"].startswith('<div class="tokens">Apple')  # what arrived before Stop
        server.release.set()  # the stalled chunk arrives: the helper thread closes the stream
        assert server.closed.wait(5), "the connection stayed open after Stop"
        assert server.sent < server.events
