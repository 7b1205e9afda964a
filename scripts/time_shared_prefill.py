"""Wall time of one side-by-side run of every method on the RAG example (assets/examples.json), with the
prompt's pass shared (``Engine.run``) and with one pass per method (as before session 56), alternated
twice in one process after a warm-up run; prints the range of the methods' TTFT and their speedups.

    python scripts/time_shared_prefill.py [THREADS]   # default 2
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from playground.engine import METHODS, Engine, MethodSpec
from playground.engine.decoding import GenerationSettings
from playground.engine.events import round_robin

EXAMPLES = Path(__file__).resolve().parent.parent / "assets" / "examples.json"


def one_pass_per_method(engine: Engine, ids, specs, settings):
    """The same round-robin as ``Engine.run``, each method reading the prompt itself."""
    ids, drafters, settings = engine._check_run(ids, specs, settings, None, None)
    return round_robin([(s.name, engine._steps(ids, s.name, d, settings, None)) for s, d in zip(specs, drafters)])


def main() -> None:
    torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
    prompt = next(x["prompt"] for x in json.loads(EXAMPLES.read_text()) if x["label"] == "Answer from a passage (RAG)")
    engine = Engine.load("default")
    ids = engine.encode_prompt(prompt)
    specs = [MethodSpec(m) for m in METHODS if engine.unavailable_reason(m) is None]
    settings = GenerationSettings(max_new_tokens=32)
    list(engine.run(ids, specs, settings))  # warm-up (and the budget's step-cost timing)
    print(f"prompt {len(ids)} tokens, {len(specs)} methods, {torch.get_num_threads()} threads")
    for _ in range(2):
        for name, run in (("one pass per method", lambda: one_pass_per_method(engine, ids, specs, settings)),
                          ("shared", lambda: engine.run(ids, specs, settings))):
            t0, ttft, last = time.perf_counter(), {}, {}
            for event in run():
                ttft.setdefault(event.method, event.seconds)
                last[event.method] = event
            wall = time.perf_counter() - t0
            base = last["autoregressive"].stats.tokens_per_s
            speedups = {m: round(e.stats.tokens_per_s / base, 2) for m, e in last.items() if m != "autoregressive"}
            print(f"{name:20s} wall {wall:5.1f} s  TTFT {min(ttft.values()):.2f}-{max(ttft.values()):.2f} s  "
                  f"speedups {speedups}")


if __name__ == "__main__":
    main()
