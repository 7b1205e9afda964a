"""``python -m playground.backends.vllm.serve METHODS``: start vLLM servers for playground methods on
the default target and keep them running (Ctrl-C stops them); prints their ``--vllm-url`` options.
With ``--print``: only print the ``vllm serve`` commands that run them on a machine of your own
(:func:`.methods.serve_commands`) and the app command that attaches to them."""

from __future__ import annotations

import sys
import time

from .client import VLLMError
from .methods import server_configs
from .server import ServerPool, VLLMServerError


def main(argv: list[str] | None = None) -> int:
    """``python -m playground.backends.vllm.serve METHODS [--print]``: start the methods' servers on the
    default target and keep them running (Ctrl-C stops them), printing their ``--vllm-url`` options; or,
    with ``--print``, print how to run them on a machine of your own. Exit status 2 on a bad method list,
    1 when a server cannot start or one exits (its log named), 0 after Ctrl-C."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m playground.backends.vllm.serve",
                                 description="Start vLLM servers for playground methods on the default target.")
    ap.add_argument("methods", help="comma-separated methods, e.g. autoregressive,prompt_lookup")
    ap.add_argument("--print", action="store_true", dest="print_only",
                    help="print the vllm serve commands that run these methods on a machine of your own, and the "
                         "app command that attaches to them, instead of starting servers here")
    args = ap.parse_args(argv)
    methods = list(dict.fromkeys(m.strip() for m in args.methods.split(",") if m.strip()))
    try:
        if args.print_only:
            from .methods import serve_commands

            plan = serve_commands(methods)
        else:
            configs = server_configs(methods)
            if not configs:
                raise ValueError("no method to serve: name at least one, e.g. autoregressive,prompt_lookup")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # the model cannot be loaded, or the draft not exported
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.print_only:
        lines = [f"# here, first:\n{c}" for c in plan.prepare]
        lines += [f"# copy {f} to the serving machine (same path, or edit the commands)" for f in plan.folders]
        lines += ["# on the serving machine, each in its own terminal:", *plan.commands,
                  "# where the playground runs:", plan.attach]
        print("\n".join(lines))
        return 0
    pool = ServerPool(configs, progress=lambda f, m: print(m, file=sys.stderr, flush=True))
    try:
        pool.start()  # on any failure, Ctrl-C too, it stops the servers it started
    except (VLLMServerError, VLLMError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    try:
        for name, e in pool.endpoints.items():
            print(f"--vllm-url {name}={e.url}", flush=True)
        while True:
            dead = [s for s in pool.servers if s.process is None or s.process.poll() is not None]
            if dead:
                for s in dead:
                    print(f"error: the vLLM server for {s.config.name} ({s.url}) exited with code "
                          f"{s.process.returncode if s.process else '?'}; its log: {s.log_path}", file=sys.stderr)
                return 1
            time.sleep(1)
    except KeyboardInterrupt:
        return 0
    finally:
        pool.stop()


if __name__ == "__main__":
    sys.exit(main())
