"""The project's measured figures: ``assets/measurements.json``, read here and rewritten by this command.

    python -m playground.measure --verify-cost              # time the target's verify cost on this machine
    python -m playground.measure --bench results.jsonl \\
        --bench-command "python -m playground.bench --questions spec_bench --limit 24 ..."

The file holds ``machines`` (id -> label, CPU model, CPU count, vector flags, ``isa``), and two
lists of records, newest first, each naming its ``machine``, ``when`` and ``command``:

* ``verify_cost``: one target forward over n tokens relative to one token
  (``theory.measure_verify_cost``): ``relative`` n -> cost, ``one_token_s``, target, device, dtype,
  threads, prefix_len, repeats. ``theory.FALLBACK`` is the newest CPU record of a
  machine with this CPU's instruction set (``theory.fallback_record``).
* ``benchmarks``: per-method figures from one benchmark results file (records as
  ``python -m playground.bench --out`` writes them): ``methods`` name -> speedup (total tokens over
  total seconds against ``autoregressive``; over total ``steady_steps`` for round-robin records,
  ``clock`` says which), tau (tokens over steps), alpha (accepted over proposed), tokens_per_s,
  lossless (every greedy output equal to the baseline's), params.

A new record replaces the one of the same kind for the same machine, target and dtype (for
benchmarks, per method: the older record keeps only the methods the new one lacks, and the method of
each variant it keeps, ``mixture`` for ``mixture:members=...``, for a comparison within one run). Run the
command on the machine that made the figures: the machine recorded is the one it runs on.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
from pathlib import Path

from playground.bench.weather import speed_clock

MEASUREMENTS_FILE = Path(__file__).resolve().parent.parent / "assets" / "measurements.json"
BASELINE = "autoregressive"
FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx_vnni", "amx_bf16", "neon", "asimd")
"""CPU flags recorded for a machine (the ones the project's CPU figures depend on)."""


def load(path: Path | str = MEASUREMENTS_FILE) -> dict:
    """The measurements file as data (``{"machines": {}, "verify_cost": [], "benchmarks": []}`` if absent)."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        data = {}
    for key, empty in (("machines", {}), ("verify_cost", []), ("benchmarks", [])):
        data.setdefault(key, empty)
    return data


def save(data: dict, path: Path | str = MEASUREMENTS_FILE) -> None:
    Path(path).write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def this_machine() -> tuple[str, dict]:
    """``(machine id, description)`` of the CPU this runs on, from /proc/cpuinfo where there is one."""
    cpu, flags = platform.processor() or platform.machine(), set()
    try:
        info = Path("/proc/cpuinfo").read_text()
        cpu = re.search(r"^model name\s*:\s*(.+)$", info, re.M).group(1).strip()
        flags = set(re.search(r"^(?:flags|Features)\s*:\s*(.+)$", info, re.M).group(1).split())
    except (OSError, AttributeError):
        pass
    cpus = os.cpu_count() or 1
    isa = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else None
    tag = "avx512bf16" if "avx512_bf16" in flags else isa or platform.machine().lower()
    ident = f"{re.sub(r'[^a-z0-9]+', '-', cpu.lower()).strip('-')}-{cpus}cpu-{tag}"
    extra = " BF16" if "avx512_bf16" in flags else ""
    label = f"a {cpus}-vCPU {cpu}" + (f" with AVX-512{extra}" if isa == "avx512" else " with AVX2 only"
                                       if isa == "avx2" else "")
    return ident, {"label": label, "cpu": cpu, "cpus": cpus, "flags": sorted(flags & set(FLAGS)), "isa": isa}


def benchmark_methods(records: list[dict]) -> tuple[float | None, dict[str, dict]]:
    """``(baseline tokens/s, method -> figures)`` from benchmark records, computed as the benchmark's
    summary (``bench.summarize``) does: totals over every (question, turn). Where every record has
    ``steady_steps`` (round-robin runs, :mod:`playground.bench.weather`) the speedup is tokens over
    those, so the machine's changing speed cancels; tokens/s are wall-clock figures either way.

    Raises:
        ValueError: no baseline records."""
    by_method: dict[str, list[dict]] = {}
    for r in records:
        by_method.setdefault(r["method"], []).append(r)
    if BASELINE not in by_method:
        raise ValueError(f"the results hold no {BASELINE} records, so there is no speedup to compute")
    clock = speed_clock(records)

    def tps(rs, key="wall_s"):
        return sum(r["new_tokens"] for r in rs) / max(1e-9, sum(r[key] for r in rs))

    base = by_method.pop(BASELINE)
    base_ids = {(str(r["question_id"]), r.get("turn", 0)): r.get("output_ids") for r in base}
    greedy = all(float(r.get("temperature") or 0.0) == 0.0 for r in records)
    out = {}
    for m, rs in sorted(by_method.items()):
        proposed, accepted = sum(r.get("proposed") or 0 for r in rs), sum(r.get("accepted") or 0 for r in rs)
        same = all(r.get("output_ids") == base_ids.get((str(r["question_id"]), r.get("turn", 0))) for r in rs)
        out[m] = {"speedup": round(tps(rs, clock) / tps(base, clock), 3), "tau": round(sum(r["new_tokens"] for r in rs)
                                                                         / max(1, sum(r["steps"] for r in rs)), 3),
                  "alpha": round(accepted / proposed, 3) if proposed else None, "tokens_per_s": round(tps(rs), 2),
                  "lossless": same if greedy else None, "params": rs[0].get("params") or {}}
    return round(tps(base), 2), out


def _same_setup(a: dict, b: dict) -> bool:
    return all(a.get(k) == b.get(k) for k in ("machine", "target", "dtype"))


def add_record(data: dict, kind: str, record: dict) -> None:
    """Put ``record`` first in ``data[kind]``, replacing what it supersedes (see the module docstring)."""
    kept = []
    for old in data[kind]:
        if _same_setup(old, record):
            if kind == "verify_cost" and old.get("device") == record.get("device"):
                continue
            if kind == "benchmarks":
                left = {m for m in old["methods"] if m not in record["methods"]}
                if not left:
                    continue
                # A variant left (``mixture:members=...``) keeps its method's figure of the same run: it
                # is compared with that one only (``advisor_figures``), never with another run's.
                left |= {m.split(":", 1)[0] for m in left if ":" in m} & set(old["methods"])
                old = {**old, "methods": {m: v for m, v in old["methods"].items() if m in left}}
        kept.append(old)
    data[kind] = [record, *kept]


def _verify_cost_record(args) -> dict:
    import torch

    from playground.engine import load_model, measure_verify_cost

    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(args.target, device=args.device, dtype=args.dtype)
    cost = measure_verify_cost(model, args.sizes, prefix_len=args.prefix_len, repeats=args.repeats)
    return {"when": time.strftime("%Y-%m-%d"), "command": "python -m playground.measure " + " ".join(sys.argv[1:]),
            "what": "one forward of the target over n new tokens after a cached prefix, median time relative "
                    "to n = 1 (theory.measure_verify_cost)", "target": args.target,
            "device": str(model.device).split(":")[0], "dtype": str(model.dtype).removeprefix("torch."),
            "threads": torch.get_num_threads(), "prefix_len": args.prefix_len, "repeats": args.repeats,
            "one_token_s": round(cost.seconds[1], 5), "relative": {str(n): round(v, 3) for n, v in cost.table.items()}}


def _benchmark_record(args) -> dict:
    records = [json.loads(line) for line in Path(args.bench).read_text().splitlines() if line.strip()]
    if not records:
        raise ValueError(f"{args.bench} holds no records")
    base_tps, methods = benchmark_methods(records)
    first = records[0]
    questions = {str(r["question_id"]) for r in records}
    turns = {(str(r["question_id"]), r.get("turn", 0)) for r in records}
    return {"when": time.strftime("%Y-%m-%d", time.localtime(Path(args.bench).stat().st_mtime)),
            "command": args.bench_command or f"python -m playground.bench ... --out {Path(args.bench).name}",
            "questions": args.questions or f"{len(questions)} questions ({len(turns)} turns), categories "
                         + ", ".join(sorted({str(r.get('category')) for r in records})),
            "target": first.get("target", "default"), "dtype": first.get("dtype") or args.dtype, "threads": args.threads,
            "temperature": float(first.get("temperature") or 0.0), "baseline_tokens_per_s": base_tps,
            "clock": speed_clock(records),
            "methods": methods}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m playground.measure", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--verify-cost", action="store_true", help="time the target's verify cost on this machine")
    p.add_argument("--bench", metavar="RESULTS_JSONL", help="store per-method figures from a benchmark results file")
    p.add_argument("--bench-command", default=None, help="the benchmark command that wrote --bench (recorded)")
    p.add_argument("--questions", default=None, help="a description of the questions (recorded)")
    p.add_argument("--target", default="default")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", help="target dtype (for --bench: recorded when its records name none)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (recorded)")
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 3, 5, 9, 13, 17, 25, 33, 64],
                   help="tokens per forward to time, comma-separated")
    p.add_argument("--prefix-len", type=int, default=200)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--file", default=str(MEASUREMENTS_FILE), help="the measurements file to update")
    p.add_argument("--dry-run", action="store_true", help="print the new record instead of writing it")
    args = p.parse_args(argv)
    if not (args.verify_cost or args.bench):
        p.error("nothing to measure: give --verify-cost and/or --bench RESULTS_JSONL")
    data = load(args.file)
    ident, machine = this_machine()
    for kind, make in (("verify_cost", _verify_cost_record if args.verify_cost else None),
                       ("benchmarks", _benchmark_record if args.bench else None)):
        if make is None:
            continue
        try:
            record = {"machine": ident, **make(args)}
        except (OSError, ValueError, KeyError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print(json.dumps(record, indent=2))
        data["machines"].setdefault(ident, machine)
        add_record(data, kind, record)
    if not args.dry_run:
        save(data, args.file)
        print(f"wrote {args.file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
