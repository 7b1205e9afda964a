"""The server under load and faults, on loopback, through ``gradio_client`` and raw HTTP.

The app is the real page (``build_demo``) over an engine with a tiny random-weight Llama and the
default model's tokenizer (random weights: the text is gibberish, but every step is a few
milliseconds, so the whole module runs in about a minute; no EOS id, so runs go to their
length). A probe stands in for the page's run function (``worker.RUN``): it runs the real
``worker.stream_run`` and records, per run, whether it started, how many steps the engine took,
whether it finished, and whether its generator was closed (which cancels the engine's run). A
gate before the first step and a pace between steps make the ordering of events under load
deterministic instead of timed.

Checks:

* 8 clients at once with the concurrency limit at 2 and a queue of 3: 2 run, 3 wait, 3 are
  told the queue is full; every accepted one finishes;
* a cancelled run frees its slot at once: a queued run starts while the other run still runs;
* a client that disconnects mid-stream ends its run (its generator is closed before its end);
* malformed payloads (wrong types, missing fields, huge numbers, None) get a clear error and the
  next request is served;
* 100 short runs (3 new tokens, two methods) grow the process's resident memory by under 5 %
  after a warm-up of 20 runs.
"""

from __future__ import annotations

import ctypes
import gc
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from helpers import tiny_llama
from ui_fixtures import serve

gradio_client = pytest.importorskip("gradio_client")
httpx = pytest.importorskip("httpx")

from gradio_client.exceptions import AppError  # noqa: E402
from gradio_client.utils import QueueError  # noqa: E402

from playground.engine import Engine, METHODS  # noqa: E402
from playground.ui import input_names, run_arguments, worker  # noqa: E402
from playground.ui import app as ui_app  # noqa: E402

QUEUE = 3
"""The queue size the server is built with here (the page's is larger)."""
WAIT_S = 120
"""Longest wait for anything to happen (a bound against hanging, never a timing assertion)."""
LONG = 2048
"""New tokens of a run that must not finish during a test (at the probe's pace, over 100 s)."""
PACE_S = 0.05
"""Seconds the probe waits before each step while pacing (a paced LONG run takes > 100 s)."""


@dataclass
class RunRecord:
    """What the probe saw of one run."""

    started: threading.Event = field(default_factory=threading.Event)
    closed: threading.Event = field(default_factory=threading.Event)
    steps: int = 0
    finished: bool = False


class Probe:
    """Stands in for ``worker.RUN``: :func:`worker.stream_run`, recorded, behind a gate, paced."""

    def __init__(self):
        self.runs: list[RunRecord] = []
        self.gate = threading.Event()
        self.gate.set()
        self.pace = 0.0

    def __call__(self, *args):
        rec = RunRecord()
        self.runs.append(rec)
        return self._stream(rec, args)

    def _stream(self, rec: RunRecord, args):
        rec.started.set()
        inner = None
        try:
            assert self.gate.wait(WAIT_S), "the test never opened the gate"
            inner = worker.stream_run(*args)
            for item in inner:
                if item["type"] == "event":
                    if self.pace:
                        time.sleep(self.pace)
                    rec.steps += 1
                    rec.finished = rec.finished or bool(item["finished"])
                yield item
        finally:
            if inner is not None:
                inner.close()
            rec.closed.set()


def _wait(predicate, what: str, timeout: float = WAIT_S) -> None:
    """Poll ``predicate`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.fixture(scope="module")
def tiny_engine(real_target):
    """An engine over a tiny random Llama with the default model's tokenizer (and vocabulary)."""
    from playground.engine.models import LoadedModel

    vocab = real_target.model.config.vocab_size
    model = tiny_llama(0, vocab_size=vocab, max_positions=4096)
    target = LoadedModel(model, real_target.tokenizer, "tiny random Llama", "tiny", torch.device("cpu"),
                         torch.float32, 4096, [])
    return Engine(target)


@pytest.fixture(scope="module")
def server(tiny_engine):
    """``(url, probe)`` of the page served with a queue of :data:`QUEUE` and the probe as its run function."""
    probe = Probe()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ui_app, "QUEUE_SIZE", QUEUE)
        mp.setattr(worker, "RUN", probe)
        with serve(tiny_engine) as url:
            yield url, probe


@pytest.fixture()
def probe(server):
    p = server[1]
    p.gate.set()
    p.pace = 0.0
    yield p
    p.gate.set()
    p.pace = 0.0


def _client(url):
    return gradio_client.Client(url, verbose=False)


def _args(max_new_tokens: int, methods=("autoregressive",), prompt: str = "Tell me a story."):
    return run_arguments(prompt, list(methods), max_new_tokens=max_new_tokens)


def _status(final) -> str:
    return final[0]


def _done(final) -> bool:
    return "pill-done" in _status(final) and "Done in" in _status(final)


def test_eight_clients_queue_or_are_told_the_queue_is_full(server, probe):
    """Concurrency 2, queue 3, 8 clients: the 2 running hold their slots (gated before their first
    step) while 6 more arrive; 3 of them wait and 3 are refused with "Queue is full"; once the
    gate opens every accepted run finishes."""
    url, _ = server
    assert ui_app.CONCURRENT_RUNS == 2
    base = len(probe.runs)
    probe.gate.clear()
    first = [_client(url).submit(*_args(8), api_name="/run") for _ in range(2)]
    _wait(lambda: len(probe.runs) == base + 2 and all(r.started.is_set() for r in probe.runs[base:]),
          "the first two runs to take both slots")
    more = [_client(url).submit(*_args(8), api_name="/run") for _ in range(6)]
    _wait(lambda: sum(j.done() for j in more) >= 3, "three clients to be turned away")
    refused = [j for j in more if j.done()]
    assert len(refused) == 3, [j.status() for j in more]
    for job in refused:
        with pytest.raises(QueueError, match="Queue is full"):
            job.result()
    assert len(probe.runs) == base + 2, "a run started while both slots were held"
    probe.gate.set()
    accepted = first + [j for j in more if j not in refused]
    for job in accepted:
        final = job.result(timeout=WAIT_S)
        assert _done(final), _status(final)
        assert 'class="tok"' in final[1]  # the autoregressive panel has text
    assert len(probe.runs) == base + 5


def test_cancelled_run_frees_its_slot_at_once(server, probe):
    """Both slots busy with long paced runs and a third run queued: cancelling one of the long runs
    starts the queued one while the other long run is still running (so it was the cancel, not
    the end of a run, that freed the slot), and the cancelled run's generator is closed early."""
    url, _ = server
    probe.pace = PACE_S
    base = len(probe.runs)
    long_a, long_b = (_client(url).submit(*_args(LONG), api_name="/run") for _ in range(2))
    _wait(lambda: len(probe.runs) == base + 2 and all(r.steps >= 1 for r in probe.runs[base:]),
          "both long runs to stream")
    run_a, run_b = probe.runs[base:base + 2]
    queued = _client(url).submit(*_args(4), api_name="/run")
    _wait(lambda: queued.status().code.name == "IN_QUEUE", "the third run to wait in the queue")
    assert len(probe.runs) == base + 2
    assert long_a.cancel()
    _wait(lambda: len(probe.runs) == base + 3, "the queued run to start after the cancel")
    _wait(lambda: sum(r.closed.is_set() for r in (run_a, run_b)) >= 1, "the cancelled run's generator to close")
    closed = [r for r in (run_a, run_b) if r.closed.is_set()]
    running = [r for r in (run_a, run_b) if not r.closed.is_set()]
    assert len(closed) == 1 and len(running) == 1, "the cancel ended both long runs, or none"
    assert not closed[0].finished and closed[0].steps < LONG
    assert not running[0].finished, "the other long run ended before the queued run started"
    probe.pace = 0.0
    final = queued.result(timeout=WAIT_S)
    assert _done(final), _status(final)
    assert long_b.cancel()
    _wait(lambda: running[0].closed.is_set(), "the second long run to close after its cancel")
    assert not running[0].finished


def test_client_that_disconnects_mid_stream_ends_its_run(server, probe):
    """A raw HTTP client starts a long run, reads a few streamed updates and hangs up: the run's
    generator is closed (the engine's run is cancelled) long before its end, and the server
    serves the next request."""
    url, _ = server
    probe.pace = PACE_S
    base = len(probe.runs)
    with httpx.Client(base_url=url, timeout=WAIT_S) as http:
        event_id = http.post("/gradio_api/call/run", json={"data": _args(LONG)}).json()["event_id"]
        updates = 0
        with http.stream("GET", f"/gradio_api/call/run/{event_id}") as stream:
            for line in stream.iter_lines():
                updates += line.startswith("event: generating")
                if updates >= 3:
                    break  # leaving the block closes the connection mid-stream
    assert updates >= 3
    _wait(lambda: len(probe.runs) > base and probe.runs[base].closed.is_set(),
          "the disconnected client's run to close")
    rec = probe.runs[base]
    assert not rec.finished and rec.steps < LONG
    probe.pace = 0.0
    final = _client(url).predict(*_args(4), api_name="/run")
    assert _done(final), _status(final)


def _raw_call(url: str, data) -> tuple[str, object]:
    """POST ``data`` to the ``/run`` call route; return the stream's last ``(event, data)``."""
    with httpx.Client(base_url=url, timeout=WAIT_S) as http:
        r = http.post("/gradio_api/call/run", json={"data": data})
        if r.status_code != 200:
            return "http", (r.status_code, r.text)
        text = http.get(f"/gradio_api/call/run/{r.json()['event_id']}").text
    events = [ln.removeprefix("event: ") for ln in text.splitlines() if ln.startswith("event: ")]
    datas = [json.loads(ln.removeprefix("data: ")) for ln in text.splitlines() if ln.startswith("data: ")]
    return events[-1], datas[-1]


def test_malformed_payloads_get_a_clear_error_and_the_server_keeps_serving(server, probe):
    """Wrong types, huge numbers, infinities, None, missing fields and a non-list body: each is
    answered with a message saying what is wrong (a warning on the status line, or an API error
    with text), never a silent null error; a normal run afterwards succeeds."""
    url, _ = server
    client = _client(url)
    names = input_names()
    good = _args(3)

    def with_(name, value):
        args = list(good)
        args[names.index(name)] = value
        return args

    warnings = {  # payload -> text the status line must show
        "max_new_tokens huge": (with_("max_new_tokens", 10**30), "Max new tokens: allowed values are 1 to"),
        "max_new_tokens inf": (with_("max_new_tokens", "inf"), "Max new tokens: allowed values are 1 to"),
        "max_new_tokens a list": (with_("max_new_tokens", [1, 2]), "Max new tokens: allowed values are"),
        "max_new_tokens None": (with_("max_new_tokens", None), "Max new tokens: allowed values are"),
        "temperature text": (with_("temperature", "hot"), "Temperature: allowed values are"),
        "seed negative": (with_("seed", -5), "Seed: allowed values are"),
        "K of prompt lookup huge": ([*with_("use_prompt_lookup", True)[:names.index("prompt_lookup_num_pred_tokens")],
                                     10**9, *good[names.index("prompt_lookup_num_pred_tokens") + 1:]],
                                    "allowed values are"),
        "everything None": ([None] * len(names), "no method is ticked"),
        "empty prompt": (with_("prompt", ""), "prompt is empty"),
    }
    for what, (args, expected) in warnings.items():
        final = client.predict(*args, api_name="/run")
        assert "pill-warning" in _status(final) and expected in _status(final), (what, _status(final))

    # A value the widget itself cannot take (a setting chosen by name): Gradio's own error, with text.
    choice = next(f"{m}_{k.name}" for m, info in METHODS.items() for k in info.knobs if hasattr(k, "choices"))
    with pytest.raises(AppError, match="not in the list of choices"):
        client.predict(*with_(choice, "no such option"), api_name="/run")

    # Missing fields, too many, the wrong shape: raw HTTP, so no client fills anything in.
    for data in ([], ["only a prompt"], good[:-3]):
        event, payload = _raw_call(url, data)
        assert event == "error" and payload and payload.get("error"), (len(data), event, payload)
        assert "enough input values" in payload["error"]
    event, payload = _raw_call(url, "not a list")
    assert event == "http" and payload[0] == 422

    final = client.predict(*_args(3, ("autoregressive", "prompt_lookup")), api_name="/run")
    assert _done(final), _status(final)


WARMUP_RUNS = 20
"""Runs before the memory is first read (see the test)."""


def _rss_bytes() -> int:
    """This process's resident set size (Linux ``/proc``), after a garbage collection and after
    handing the allocator's free pages back (glibc ``malloc_trim``), so that it counts memory in use
    rather than what the allocator keeps cached."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the plain resident size
        pass
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_hundred_short_runs_do_not_grow_memory(server, probe):
    """100 runs of 3 new tokens on two methods through the server (after the warm-up runs) leave the
    process's resident memory (server and client share it) within 5 % of where it was."""
    if not Path("/proc/self/status").exists():
        pytest.skip("needs Linux /proc to read the resident memory")
    url, _ = server
    client = _client(url)
    args = _args(3, ("autoregressive", "prompt_lookup"))
    # Warm-up: the first runs touch new memory once (the server's thread pool, caches).
    for _ in range(WARMUP_RUNS):
        assert _done(client.predict(*args, api_name="/run"))
    before = _rss_bytes()
    for i in range(100):
        final = client.predict(*args, api_name="/run")
        assert _done(final), (i, _status(final))
    after = _rss_bytes()
    growth = (after - before) / before
    assert growth < 0.05, f"resident memory grew {growth:.1%} over 100 runs ({before >> 20} -> {after >> 20} MiB)"
