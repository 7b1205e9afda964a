"""The vLLM tab without vLLM: warming up the servers once after they start, the commands that
deploy the ticked methods on vLLM servers of your own, and the tab's run (throttled streaming,
Stop) against a local stand-in server replaying a recorded vLLM stream."""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

from playground.backends.vllm.server import Endpoint, ServerConfig
from playground.backends.vllm.client import VLLMError
from playground.ui.vllm_panel import VLLMSession, deploy_markdown


def test_warm_up_sends_one_short_request_per_server_once():
    """Each server gets one short request after it starts (its first request pays for lazy start-up,
    which would otherwise inflate the first run's baseline and every speedup), and only once."""
    session = VLLMSession()
    session.endpoints = {"autoregressive": "e0", "prompt_lookup": "e1"}
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


class FakePool:
    """A :class:`ServerPool` stand-in: records what it was asked to start, fails on demand."""

    made: list = []

    def __init__(self, configs, attached=None, progress=None):
        self.server_configs, self.attached, self.stopped = list(configs), dict(attached or {}), False
        self.configs = [c.name for c in self.server_configs]
        self.endpoints, self.servers = {}, []
        FakePool.made.append(self)

    def start(self):
        if "broken" in self.configs:
            raise RuntimeError("could not export the draft")
        self.endpoints = {**{c: f"local-{c}" for c in self.configs}, **{m: f"at-{u}" for m, u in self.attached.items()}}
        self.servers = [SimpleNamespace(config=c, process=SimpleNamespace(poll=lambda: None))
                        for c in self.server_configs]
        return self.endpoints

    def stop(self):
        self.stopped = True


@pytest.fixture
def fake_servers(monkeypatch):
    from playground.ui import vllm_panel

    FakePool.made = []
    monkeypatch.setattr(vllm_panel, "ServerPool", FakePool)
    monkeypatch.setattr(vllm_panel.vm, "server_configs", lambda names, **kw: [ServerConfig(m, "/model") for m in names])
    monkeypatch.setattr(vllm_panel, "detect_device", lambda: "cpu")
    return FakePool.made


def test_on_a_gpu_every_server_gets_a_share_for_all_the_tab_may_start(fake_servers, monkeypatch):
    """On one GPU a server started after the first Start runs beside servers holding their memory, so
    each server's share counts every method the tab offers (0.9 split among the servers of one start
    left nothing for a later one); a server that has exited since is started again at the next call."""
    from playground.ui import vllm_panel

    monkeypatch.setattr(vllm_panel, "detect_device", lambda: "cuda")
    monkeypatch.setattr(VLLMSession, "methods", lambda self: ["autoregressive", "prompt_lookup", "eagle", "draft_model"])
    session = VLLMSession()
    session.ready(["autoregressive", "prompt_lookup"], [1], run=lambda *a: None)
    session.ready(["autoregressive", "eagle"], [1], run=lambda *a: None)
    shares = [c.extra_args for p in fake_servers for c in p.server_configs]
    assert shares == [("--gpu-memory-utilization", "0.23")] * 3
    fake_servers[0].servers[1].process = SimpleNamespace(poll=lambda: 1)  # prompt lookup's server died
    assert session.missing(["prompt_lookup"]) == []
    session.ready(["autoregressive", "prompt_lookup"], [1], run=lambda *a: None)
    assert fake_servers[-1].configs == ["prompt_lookup"]


def test_servers_for_methods_ticked_later_are_started_and_warmed_once(fake_servers):
    """The first Start starts the ticked methods' servers; a method ticked afterwards gets its own
    server at the next Start or Run (it used to be told to press Start, which did nothing); each new
    server is warmed up once, and a failed warm-up leaves it not ready, so the next call retries;
    exit stops every server started here."""
    session = VLLMSession()
    warmed = []

    def run(endpoint, method, ids, sampling, eos):
        if endpoint == "local-suffix" and not any(m == "suffix" for m, _ in warmed):
            warmed.append(("suffix", "failed"))
            raise VLLMError("warm-up refused")
        warmed.append((method, endpoint))

    assert session.ready(["autoregressive", "prompt_lookup"], [1], run=run) == {
        "autoregressive": "local-autoregressive", "prompt_lookup": "local-prompt_lookup"}
    assert session.missing(["autoregressive", "prompt_lookup", "suffix"]) == ["suffix"]
    with pytest.raises(VLLMError, match="warm-up refused"):
        session.ready(["autoregressive", "prompt_lookup", "suffix"], [1], run=run)
    assert session.missing(["suffix"]) == ["suffix"]  # started but not warmed: not ready
    assert set(session.ready(["autoregressive", "suffix"], [1], run=run)) == {"autoregressive", "prompt_lookup", "suffix"}
    assert [p.configs for p in fake_servers] == [["autoregressive", "prompt_lookup"], ["suffix"]]
    assert [m for m, e in warmed if e != "failed"] == ["autoregressive", "prompt_lookup", "suffix"]
    session.stop()
    assert all(p.stopped for p in fake_servers)


def test_with_attached_servers_only_nothing_is_started_here(fake_servers):
    """``--vllm-url`` without ``--vllm``: the tab offers the attached methods only and never starts a
    local server beside them (its speed would be divided by a remote baseline's, or the reverse)."""
    import argparse

    session = VLLMSession.from_args(argparse.Namespace(vllm=False, vllm_url=["autoregressive=http://gpu:8000",
                                                                           "eagle=http://gpu:8001"]))
    assert not session.local and session.methods() == ["autoregressive", "eagle"]
    assert session.ready(["autoregressive", "eagle"], [1], run=lambda *a: None) == {
        "autoregressive": "at-http://gpu:8000", "eagle": "at-http://gpu:8001"}
    assert fake_servers[0].configs == []
    with pytest.raises(ValueError, match="--vllm-url prompt_lookup=URL"):
        session.ready(["autoregressive", "prompt_lookup"], [1], run=lambda *a: None)
    assert VLLMSession.from_args(argparse.Namespace(vllm=True, vllm_url=None)).local


def test_the_status_says_before_any_press_that_vllm_is_missing():
    """Without vLLM installed the tab said "servers not started" in green until Start failed; now it says at
    once what is missing and the two ways out. Attached servers, or vLLM installed, read as before."""
    import argparse

    from playground.ui.vllm_panel import initial_status

    local = VLLMSession.from_args(argparse.Namespace(vllm=True, vllm_url=None))
    missing = initial_status(local, installed=False)
    assert "pill-warning" in missing and "vLLM is not installed on this machine" in missing
    assert "scripts/setup.sh --vllm" in missing and "--vllm-url" in missing
    assert "servers not started" in initial_status(local, installed=True)
    attached = VLLMSession.from_args(argparse.Namespace(vllm=False, vllm_url=["eagle=http://gpu:8001"]))
    assert "attached: eagle" in initial_status(attached, installed=False)


def test_start_failures_of_any_kind_end_in_a_readable_status(fake_servers):
    """A load or export error (not a vLLM error) while starting ends Start and Run with an error
    status, not a raw error that leaves "starting..." on the page; a long server failure keeps its
    head (which server, its log file) and its tail (the log's last lines)."""
    import gradio as gr

    from playground.ui import vllm_panel

    engine = SimpleNamespace(encode_prompt=lambda text: [1, 2], target=SimpleNamespace(tokenizer=None, eos_token_ids=[2]))
    session = VLLMSession()
    with gr.Blocks() as demo:
        vllm_panel.build(session, engine)
    fns = {getattr(f.fn, "__name__", ""): f for f in demo.fns.values()}
    assert fns["on_run"].concurrency_id == fns["on_start"].concurrency_id == "vllm"
    assert fns["on_run"].concurrency_limit == 1
    updates = list(fns["on_start"].fn(["broken"]))
    assert "starting vLLM servers for autoregressive, broken" in updates[0]
    assert "pill-error" in updates[-1] and "could not export the draft" in updates[-1]
    updates = list(fns["on_run"].fn(SimpleNamespace(session_hash="s"), ["broken"], "Hi", 8))
    assert "could not export the draft" in str(list(updates[-1].values())[-1])
    # A run stopped while it waited in the queue starts no server.
    made = len(fake_servers)
    vllm_panel.STOPS.arm("t")
    vllm_panel.STOPS.stop("t")
    updates = list(fns["on_run"].fn(SimpleNamespace(session_hash="t"), ["prompt_lookup"], "Hi", 8))
    assert "stopped" in str(list(updates[-1].values())[-1]) and len(fake_servers) == made
    text = vllm_panel.error_text(RuntimeError("server eagle at http://x exited with code 1, log /tmp/l"
                                              + "x" * 5000 + "the last log line"))
    assert len(text) <= 1503 and text.startswith("server eagle at http://x") and text.endswith("the last log line")


def test_serve_reports_a_server_that_dies_or_cannot_start(monkeypatch, capsys):
    """``python -m playground.backends.vllm.serve``: a server that exits while serving ends the
    command with status 1 naming it and its log (it used to exit 0 in silence); one that cannot
    start, or a model that cannot be loaded, is an error message with status 1, not a traceback."""
    from playground.backends.vllm import serve
    from playground.backends.vllm.server import VLLMServerError

    dead = SimpleNamespace(process=SimpleNamespace(poll=lambda: 3, returncode=3), url="http://127.0.0.1:9",
                           config=SimpleNamespace(name="prompt_lookup"), log_path="/tmp/prompt_lookup.log")

    class Pool:
        fail = None

        def __init__(self, configs, progress=None):
            self.servers, self.endpoints, self.stopped = [dead], {}, False

        def start(self):
            if Pool.fail:
                raise Pool.fail

        def stop(self):
            self.stopped = True

    monkeypatch.setattr(serve, "ServerPool", Pool)
    monkeypatch.setattr(serve, "server_configs", lambda methods: list(methods))
    assert serve.main(["prompt_lookup"]) == 1
    err = capsys.readouterr().err
    assert "prompt_lookup (http://127.0.0.1:9) exited with code 3" in err and "/tmp/prompt_lookup.log" in err
    Pool.fail = KeyboardInterrupt()  # Ctrl-C while the servers start: no traceback
    assert serve.main(["prompt_lookup"]) == 0
    Pool.fail = VLLMServerError("vLLM server for prompt_lookup exited with code 1 before it was ready")
    assert serve.main(["prompt_lookup"]) == 1
    assert "error: vLLM server for prompt_lookup exited" in capsys.readouterr().err

    def no_model(methods):
        raise RuntimeError("cannot load the target 'nowhere'")
    monkeypatch.setattr(serve, "server_configs", no_model)
    assert serve.main(["prompt_lookup"]) == 1 and "cannot load the target" in capsys.readouterr().err


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
    """Serves ``base_list.sse`` (recorded from vLLM) on /v1/completions as vLLM does (HTTP/1.1,
    chunked). With ``stall_after`` set it sends that many events, sets ``stalled`` and sends
    nothing more (for 10 s, or until the client hangs up); with ``hold`` it answers only once
    ``hold`` is set. ``posts`` counts requests; ``gone`` is set when the client hung up before the
    stream's end (vLLM then aborts the request)."""

    def __init__(self, stall_after: int | None = None, hold: threading.Event | None = None):
        events = [line for line in FIXTURE.read_text().splitlines() if line.startswith("data:")]
        self.stalled, self.gone, self.posted = threading.Event(), threading.Event(), threading.Event()
        self.posts = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def send_chunk(self, data: bytes) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                outer.posts += 1
                outer.posted.set()
                if hold is not None:
                    hold.wait(10)
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    for i, line in enumerate(events):  # the recorded stream ends with its [DONE]
                        if i == stall_after:
                            outer.stalled.set()
                            # a hung-up client shows as EOF on the request's socket
                            self.connection.settimeout(10)
                            if not self.connection.recv(1, socket.MSG_PEEK):
                                outer.gone.set()
                                return
                        self.send_chunk((line + "\n\n").encode())
                        if hold is not None:
                            time.sleep(0.05)
                    self.send_chunk(b"")
                except (BrokenPipeError, ConnectionResetError):
                    outer.gone.set()
                except TimeoutError:
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.endpoint = Endpoint("autoregressive", f"http://127.0.0.1:{self.httpd.server_port}", "autoregressive")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


class _Tokenizer:
    def convert_ids_to_tokens(self, ids):
        return [f"<{i}>" for i in ids]

    def decode(self, ids, **kw):
        return "".join(f"<{i}>" for i in ids)


PANELS = {"autoregressive": ("text", "stats", "badge")}


def _run(server, flag, names=("autoregressive",)):
    from playground.backends.vllm.runner import Sampling
    from playground.ui.vllm_panel import stream_methods

    return stream_methods({"autoregressive": server.endpoint}, _Tokenizer(), list(names), [1, 2, 3],
                          Sampling(32), [2], flag, PANELS, "status")


def test_the_tab_streams_text_at_most_every_push_interval_then_colours_the_answer(monkeypatch):
    """Streamed chunks become at most one text update per PUSH_S, not one per token (one per token can
    outrun the page, which then takes Stop late); the answer then replaces them, coloured, with stats."""
    from playground.ui import vllm_panel

    monkeypatch.setattr(vllm_panel, "PUSH_S", 60.0)
    with _SlowServer() as server:
        updates = list(_run(server, threading.Event()))
    texts = [u["text"] for u in updates if "text" in u]
    assert len(texts) == 3  # cleared, the first chunk's text, the answer: not one per token
    assert texts[1] == "Apple"
    assert '<span class="tok' in texts[2] and "tok/s" in updates[-2]["stats"]
    assert "done" in updates[-1]["status"] and "stopped" not in updates[-1]["status"]


def _consume(run, updates: list, ended: list) -> threading.Thread:
    def consume():
        updates.extend(run)
        ended.append(time.monotonic())

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    return thread


def test_stop_ends_the_run_at_once_while_no_chunk_arrives_and_cuts_the_connection():
    """Stop while the server sends nothing: the run's last update says "stopped" at once (the server
    would stay quiet for 10 s) and holds all the text received; the connection is cut, so vLLM aborts."""
    from playground.ui import run_control

    flag = threading.Event()
    with _SlowServer(stall_after=6) as server:
        updates, ended = [], []
        consumer = _consume(_run(server, flag), updates, ended)
        assert server.stalled.wait(10)
        time.sleep(2 * run_control.POLL_S)  # the run is now waiting on a quiet stream
        t_stop = time.monotonic()
        flag.set()
        consumer.join(10)
        assert ended and ended[0] - t_stop < 3.0
        assert "stopped during autoregressive" in updates[-1]["status"]
        assert updates[-1]["text"] == "Apple, Banana, Cherry"  # the 6 events sent
        assert server.gone.wait(5), "the connection stayed open after Stop"


def test_stop_before_the_server_answers_cuts_the_connection_when_it_does():
    """Stop while the request waits for the server's answer (a long prefill, a queue): the run ends
    at once, and the connection is cut the moment the answer starts, so vLLM aborts it."""
    flag, hold = threading.Event(), threading.Event()
    with _SlowServer(stall_after=0, hold=hold) as server:  # its answer: headers, then nothing
        updates, ended = [], []
        consumer = _consume(_run(server, flag), updates, ended)
        assert server.posted.wait(10)
        flag.set()
        consumer.join(10)
        assert ended and "stopped during autoregressive" in updates[-1]["status"]
        assert updates[-1]["text"] == ""
        hold.set()
        assert server.gone.wait(5), "the connection stayed open after Stop"


def test_stop_after_the_last_answer_says_done_and_a_later_method_is_not_asked():
    """Stop set once the only method's answer is complete: the run says "done". Stop set before a
    method starts: no request is sent and the run says "stopped"."""
    flag = threading.Event()
    with _SlowServer() as server:
        updates = []
        for u in _run(server, flag):
            updates.append(u)
            if '<span class="tok' in u.get("text", ""):
                flag.set()
    assert "done" in updates[-1]["status"]
    flag = threading.Event()
    with _SlowServer() as server:
        run = _run(server, flag, names=("autoregressive", "autoregressive"))
        updates = []
        for u in run:
            updates.append(u)
            if '<span class="tok' in u.get("text", ""):
                flag.set()
    assert "stopped after autoregressive" in updates[-1]["status"]
    assert sum('<span class="tok' in u.get("text", "") for u in updates) == 1 and server.posts == 1


def test_a_stream_cut_mid_answer_is_an_error_not_an_answer():
    """A body that ends without vLLM's closing ``data: [DONE]`` (the connection was cut) raises."""
    from playground.backends.vllm import client as C

    lines = [line for line in FIXTURE.read_text().splitlines() if line.startswith("data:")][:5]
    with pytest.raises(C.VLLMError, match="without its closing"):
        list(C.read_stream(C.iter_events(lines)))


def test_a_run_that_fails_unexpectedly_ends_with_an_error_status_not_an_exception():
    """Anything the tab's run raises ends the run with an error status: an exception would skip the
    step after the run that re-enables Run and releases the panels' row on the page."""
    from types import SimpleNamespace

    import gradio as gr

    from playground.ui import vllm_panel

    def encode_prompt(text):
        raise RuntimeError("the tokenizer broke")
    engine = SimpleNamespace(encode_prompt=encode_prompt, target=SimpleNamespace(tokenizer=None, eos_token_ids=[2]))
    session = vllm_panel.VLLMSession()
    with gr.Blocks() as demo:
        vllm_panel.build(session, engine)
    on_run = next(f.fn for f in demo.fns.values() if getattr(f.fn, "__name__", "") == "on_run")
    updates = list(on_run(SimpleNamespace(session_hash="s"), ["autoregressive"], "Hi", 8))
    assert "RuntimeError: the tokenizer broke" in str(list(updates[-1].values())[-1])
    assert len(vllm_panel.STOPS) == 0  # the run's stop flag is released
