"""Tests of app.py's command line: bad --port and --host values are refused before any model loads;
the device is timed at start; the models load and the page is built outside the main thread."""

from __future__ import annotations

import socket

import pytest

import app


@pytest.fixture(autouse=True)
def torch_threads_kept():
    """app.main sets torch's thread count (one fewer on loopback): restore it for the tests after."""
    import torch

    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture
def no_model_loading(monkeypatch):
    """Fail the test if app.main gets as far as loading the models."""
    from playground.engine import Engine

    def load(*args, **kwargs):
        raise AssertionError("the models were loaded")
    monkeypatch.setattr(Engine, "load", classmethod(load))


@pytest.mark.parametrize("port, message", [
    ("99999", "argument --port: must be from 0 to 65535, got 99999"),
    ("-5", "argument --port: must be from 0 to 65535, got -5"),
    ("http", "argument --port: must be a whole number from 0 to 65535, got 'http'"),
])
def test_port_out_of_range_is_a_usage_error(port, message, capsys):
    """argparse refuses a port outside 0-65535 with exit status 2 and a message giving the range
    (before, 99999 crashed in bind() after the models had loaded)."""
    with pytest.raises(SystemExit) as exc:
        app.parse_args(["--port", port])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert app.parse_args(["--port", "0"]).port == 0 and app.parse_args(["--port", "65535"]).port == 65535


@pytest.mark.parametrize("args, message", [
    (["--vllm-url", "nomethod=http://x:1"], "--vllm-url names nomethod, which is no method of the playground"),
    (["--vllm-url", "foo"], "--vllm-url wants NAME=URL"),
    (["--vllm-url", "suffix=gpu-host:8001"], "the URL must start with http:// or https://"),
    (["--models-dir", "/nonexistent_dir"], "--models-dir (or $PLAYGROUND_MODELS_DIR) /nonexistent_dir: no such folder"),
])
def test_bad_vllm_urls_and_models_dir_are_usage_errors_before_loading(args, message, capsys):
    """Found by a new user: a misspelt method name in --vllm-url was taken silently (the benchmark
    refuses it), a URL without NAME= was reported only after the models loaded, and a missing
    --models-dir folder was accepted."""
    with pytest.raises(SystemExit) as exc:
        app.parse_args(args)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert app.parse_args(["--vllm-url", "suffix=http://gpu-host:8001"]).vllm_url == ["suffix=http://gpu-host:8001"]


def test_port_from_the_environment_out_of_range_falls_back(monkeypatch):
    """GRADIO_SERVER_PORT outside the range is ignored like a non-number (the default 7860 is used)."""
    monkeypatch.setenv("GRADIO_SERVER_PORT", "70000")
    assert app.parse_args([]).port == 7860
    monkeypatch.setenv("GRADIO_SERVER_PORT", "7870")
    assert app.parse_args([]).port == 7870


@pytest.mark.parametrize("host, message", [
    ("999.1.1.1", "--host '999.1.1.1' is not a valid address or a host name that resolves"),
])
def test_host_that_does_not_resolve_is_named_before_loading(host, message, capsys, no_model_loading):
    """A host that does not resolve is reported as the host's problem (not as a busy port), with
    exit status 2, before anything loads."""
    assert app.main(["--host", host, "--port", "7863"]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and "Cannot find empty port" not in captured.err
    assert "Traceback" not in captured.err and "Starting" not in captured.out


def test_port_in_use_is_named_before_loading(capsys, no_model_loading):
    """A port another server listens on is reported as such, before the models load."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert app.main(["--host", "127.0.0.1", "--port", str(port)]) == 2
    assert f"--port {port} is already in use on 127.0.0.1" in capsys.readouterr().err


def test_a_usable_address_passes_the_check():
    assert app.address_problem("127.0.0.1", 0) is None
    assert app.address_problem("localhost", 0) is None


def test_the_device_is_timed_at_start_except_on_a_zerogpu_space(monkeypatch):
    """app.main starts the budget's step-cost timing after loading, on a CPU or a local GPU and on a CPU
    Space; not on a ZeroGPU Space, where the model is on the GPU only inside a ``@spaces.GPU`` call."""
    from types import SimpleNamespace

    cpu, gpu = (SimpleNamespace(target=SimpleNamespace(device=d)) for d in ("cpu", "cuda:0"))
    monkeypatch.delenv("SPACE_ID", raising=False)
    assert app._can_time_here(cpu) and app._can_time_here(gpu)
    monkeypatch.setenv("SPACE_ID", "someone/playground")
    assert app._can_time_here(cpu) and not app._can_time_here(gpu)


def test_the_models_load_and_the_page_is_built_outside_the_main_thread(monkeypatch, capsys):
    """app.main loads the models and builds the page in a thread that has ended before the page
    serves (the main thread, alive until the app ends, must not keep an OpenMP team: the page's runs
    in other threads were 30 % slower beside it); their errors still reach the caller."""
    import threading

    import playground.ui
    from playground.engine import Engine, ModelLoadError

    seen = {}

    def failing_load(*args, **kwargs):
        seen["load"] = threading.current_thread()
        raise ModelLoadError("no such model: nowhere/none")
    monkeypatch.setattr(Engine, "load", classmethod(lambda cls, *a, **k: failing_load(*a, **k)))
    assert app.main(["--port", "0"]) == 1
    assert "error: no such model: nowhere/none" in capsys.readouterr().err
    assert seen["load"] is not threading.main_thread() and not seen["load"].is_alive()

    def build_demo(engine, **kwargs):
        seen["build"] = threading.current_thread()
        raise RuntimeError("page building failed")
    monkeypatch.setattr(Engine, "load", classmethod(lambda cls, *a, **k: "an engine"))
    monkeypatch.setattr(playground.ui, "build_demo", build_demo)
    with pytest.raises(RuntimeError, match="page building failed"):
        app.main(["--port", "0"])
    assert seen["build"] is not threading.main_thread() and not seen["build"].is_alive()


def test_a_page_served_to_this_machine_only_leaves_a_core_to_its_browser():
    """On a loopback address (the default outside Spaces) the page is read in a browser on this
    machine: torch gets one thread fewer than its own choice, so that browser does not slow the
    steps (the baseline's most); on every interface, or with one core, torch's own choice stays."""
    assert app.default_threads("127.0.0.1", 2) == 1 and app.default_threads("localhost", 8) == 7
    assert app.default_threads("::1", 4) == 3
    assert app.default_threads("0.0.0.0", 8) is None and app.default_threads("127.0.0.1", 1) is None
    # a thread count the user set for OpenMP or MKL is kept
    assert app.default_threads("127.0.0.1", 2, {"OMP_NUM_THREADS": "2"}) is None
    assert app.default_threads("127.0.0.1", 2, {"MKL_NUM_THREADS": "2"}) is None
    assert app.parse_args([]).threads is None and app.parse_args(["--threads", "2"]).threads == 2
