"""``python -m playground.backends.vllm.serve METHODS``: start vLLM servers for playground methods on
the default target and keep them running (Ctrl-C stops them); prints their ``--vllm-url`` options.
With ``--print``: only print the ``vllm serve`` commands that run them on a machine of your own
(:func:`.methods.serve_commands`) and the app command that attaches to them."""

from __future__ import annotations

import sys
import time

from .methods import server_configs
from .server import ServerPool


def main(argv: list[str] | None = None) -> int:
    """``python -m playground.backends.vllm.serve NAME``: start one method's server on the
    default target and keep it running (Ctrl-C stops it); prints its URL for ``--vllm-url``."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m playground.backends.vllm.serve",
                                 description="Start vLLM servers for playground methods on the default target.")
    ap.add_argument("methods", help="comma-separated methods, e.g. autoregressive,prompt_lookup")
    ap.add_argument("--print", action="store_true", dest="print_only",
                    help="print the vllm serve commands that run these methods on a machine of your own, and the "
                         "app command that attaches to them, instead of starting servers here")
    args = ap.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if args.print_only:
        from .methods import serve_commands

        try:
            commands, attach, folders = serve_commands(methods)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print("\n".join(commands + ["", "# where the playground runs:", attach]))
        for f in folders:
            print(f"# copy {f} to the serving machine (same path, or edit the command)")
        return 0
    configs = server_configs(methods)
    pool = ServerPool(configs, progress=lambda f, m: print(m, file=sys.stderr, flush=True))
    with pool:
        for name, e in pool.endpoints.items():
            print(f"--vllm-url {name}={e.url}", flush=True)
        try:
            while all(s.process and s.process.poll() is None for s in pool.servers):
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
