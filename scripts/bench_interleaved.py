"""Benchmark with every method stepped round-robin, one step each in turn (as the page runs them).

``python -m playground.bench`` runs each method to the end before the next starts; on a shared
machine whose load changes by the second, that puts each method in different weather. Here every
(question, method) run advances one step at a time in turn, so load drift hits all methods alike
while they all run, and each method's clock counts only its own steps. Each record's
``steady_steps`` is that time measured in the baseline's contemporaneous decoding steps
(:mod:`playground.bench.weather`), which also cancels a change of speed after the fast methods have
finished and the weight of questions that met a slow spell. The same method may run under several
knob settings (``prompt_lookup:budget=off``). Records have the benchmark's fields
(``check_bench.py`` reads them); the table is speed over the baseline's per category (total tokens
over total ``steady_steps``; the row ``raw seconds`` from wall-clock seconds).

    python scripts/bench_interleaved.py --questions FILE.jsonl --methods autoregressive,prompt_lookup,\
        prompt_lookup:budget=off,suffix --max-new-tokens 64 --threads 1 --out results.jsonl

A/B of trained parts in one run: ``--alt eagle=DIR`` (also ``draft=``, ``medusa=``; repeatable) loads a
second engine with those parts, and a method written ``NAME@alt`` (``eagle@alt``) runs on it, stepped
round-robin with the rest against the same baseline. One setting under two labels on one engine
(``mixture`` and its members spelt out) is refused: the two would share what the method learns, so
each would read the other's tokens of the same question.

Learned state (suffix caches, recycling tables) is forgotten after the warm-up, so each method learns
only from earlier questions' outputs of its own.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import sys
import time

import torch


ALT = "@alt"
RECORD_FIELDS = ("new_tokens", "steps", "wall_s", "steady_steps", "ttft_s", "tokens_per_s", "mean_accepted_tokens",
                 "acceptance_rate", "output_ids", "output_text")
"""The measured fields each record keeps (the benchmark runner's, less margins and per-step lists)."""


def parse_method(text: str):
    """``(label, MethodSpec, on_alt)``: the label is the text as given; ``NAME@alt`` runs on the ``--alt`` engine."""
    from playground.bench.cli import method_spec

    on_alt = text.endswith(ALT)
    label, spec = method_spec(text[:-len(ALT)] if on_alt else text)
    return (text if on_alt else label), spec, on_alt


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--questions", required=True)
    ap.add_argument("--methods", required=True,
                    help="comma-separated NAME[:knob=value;knob=value] (a list value joined by '+')")
    ap.add_argument("--per-category", type=int, default=0, metavar="N",
                    help="keep the first N questions of each category (0: all); first turns only either way")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--out", default="interleaved.jsonl")
    ap.add_argument("--step-log", metavar="FILE",
                    help="also write every step (question, method, end and duration in seconds) to FILE (JSON lines)")
    for part in ("draft", "medusa", "eagle"):
        ap.add_argument(f"--{part}", help=f"{part} spec (folder or hub id; default: the shipped one)")
    ap.add_argument("--alt", action="append", default=[], metavar="PART=SPEC",
                    help="a second engine whose PART (draft, medusa or eagle) is SPEC; methods NAME@alt run on it")
    args = ap.parse_args(argv)
    alt_parts = dict(x.split("=", 1) for x in args.alt)
    if set(alt_parts) - {"draft", "medusa", "eagle"}:
        ap.error(f"--alt: parts are draft, medusa and eagle, not {sorted(set(alt_parts) - {'draft', 'medusa', 'eagle'})}")
    torch.set_num_threads(args.threads)
    from playground.bench import WARMUP_PROMPT, load_questions
    from playground.bench.runner import Runner, finish, round_robin, run_method, step_method
    from playground.engine import Engine, methods_run
    from playground.engine.decoding import GenerationSettings

    methods = [parse_method(m) for m in args.methods.split(",")]
    assert methods[0][1].name == "autoregressive" and not methods[0][2], "the baseline goes first"
    if any(on_alt for *_, on_alt in methods) and not alt_parts:
        ap.error("a method NAME@alt needs --alt PART=SPEC")
    names = methods_run([spec for _, spec, on_alt in methods if not on_alt])  # a mixture's members too
    engine = Engine.load("default", dtype=args.dtype, methods=names, draft=args.draft, medusa=args.medusa,
                         eagle=args.eagle)
    alt = None
    if alt_parts:
        parts = {"draft": args.draft, "medusa": args.medusa, "eagle": args.eagle, **alt_parts}
        alt = Engine.load("default", dtype=args.dtype, methods=methods_run([s for _, s, a in methods if a]), **parts)
    engines = [alt if on_alt else engine for *_, on_alt in methods]
    methods = [(label, spec) for label, spec, _ in methods]
    twins = same_settings([(label, spec, eng) for (label, spec), eng in zip(methods, engines)])
    if twins:
        ap.error(f"{twins[0]} and {twins[1]} are one setting: run it once (two runs of one setting on one engine "
                 "share what it learns, so each would read the other's tokens of the same question)")
    settings = GenerationSettings(max_new_tokens=args.max_new_tokens)
    questions = load_questions(args.questions)
    if args.per_category:
        seen: dict = {}
        questions = [q for q in questions if seen.setdefault(q.category, []).append(q) or
                     len(seen[q.category]) <= args.per_category]

    # The benchmark runner's round-robin, one runner a label (each on its own engine).
    runners = [Runner(label, spec.params, lambda ids, e=eng, s=spec: run_method(e, ids, s, settings),
                      lambda ids, e=eng, s=spec: step_method(e, ids, s, settings))
               for (label, spec), eng in zip(methods, engines)]

    def run_all(ids, log=None):
        return finish(round_robin(runners, {r.name: ids for r in runners}, log))

    warm = engine.encode_prompt(WARMUP_PROMPT)
    run_all(warm)
    for eng in {id(e): e for e in engines}.values():
        eng.forget("learned/")
    t0 = time.perf_counter()
    records = []
    with open(args.out, "w") as f, (open(args.step_log, "w") if args.step_log else contextlib.nullcontext()) as step_log, \
            torch.inference_mode():
        for q in questions:
            ids = engine.encode_prompt(q.turns[0])
            log = []  # every step's StepTime (the weather correction's input), for --step-log
            measured = run_all(ids, log)
            if step_log:
                for st in log:
                    step_log.write(json.dumps({"question_id": q.question_id, "method": st.label, "end_s": st.end_s,
                                               "duration_s": st.duration_s, "first": st.first}) + "\n")
            for label, spec in methods:
                m = measured[label]
                rec = {"question_id": q.question_id, "category": q.category, "turn": 0, "method": label,
                       "params": spec.params, "prompt_tokens": len(ids),
                       **{k: m[k] for k in RECORD_FIELDS}}
                f.write(json.dumps(rec) + "\n")
                records.append(rec)
            f.flush()
            if step_log:
                step_log.flush()
            print(f"q {q.question_id} ({q.category}) done, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    print(table(records, [label for label, _ in methods]))
    return 0


def same_settings(runs: list[tuple]) -> tuple[str, str] | None:
    """The labels of the first two ``(label, MethodSpec, engine)`` runs that are one method with the same
    knobs (unset knobs filled with the engine's defaults) on the same engine, else None."""
    seen: dict = {}
    for label, spec, eng in runs:
        params = eng.with_defaults(spec).checked_params()
        key = (id(eng), spec.name, json.dumps(params, sort_keys=True, default=str))
        if key in seen:
            return seen[key], label
        seen[key] = label
    return None


def table(records: list[dict], labels: list[str]) -> str:
    """Speedup over the baseline per category, tau and lossless.

    Speed is total tokens over total ``steady_steps`` (time in the baseline's contemporaneous
    decoding steps, :mod:`playground.bench.weather`), so the machine's changing speed cancels;
    the row ``raw seconds`` gives the overall speedup from plain wall-clock seconds for comparison
    (records without ``steady_steps`` fall back to seconds everywhere)."""
    from playground.bench.weather import speed_clock

    clock = speed_clock(records)
    tot = collections.defaultdict(lambda: [0, 0.0, 0, 0.0])
    base = {(r["question_id"], r["turn"]): r["output_ids"] for r in records if r["method"] == labels[0]}
    bad = collections.Counter()
    cats = list(dict.fromkeys(r["category"] for r in records)) + ["overall"]
    for r in records:
        for c in (r["category"], "overall"):
            t = tot[(c, r["method"])]
            t[0] += r["new_tokens"]
            t[1] += r[clock]
            t[2] += r["steps"]
            t[3] += r["wall_s"]
        if r["output_ids"] != base[(r["question_id"], r["turn"])]:
            bad[r["method"]] += 1

    def speedup(c, x, i=1):
        b = tot[(c, labels[0])]
        return (tot[(c, x)][0] / tot[(c, x)][i]) / (b[0] / b[i])

    width = max(12, *(len(x) for x in labels)) + 1
    lines = ["category".ljust(15) + "".join(x.rjust(width) for x in labels)]
    for c in cats:
        lines.append(c.ljust(15) + "".join(f"{speedup(c, x):.2f}x".rjust(width) for x in labels))
    lines.append("raw seconds".ljust(15) + "".join(f"{speedup('overall', x, 3):.2f}x".rjust(width) for x in labels))
    lines.append("tau".ljust(15) + "".join(f"{tot[('overall', x)][0] / tot[('overall', x)][2]:.2f}".rjust(width)
                                          for x in labels))
    lines.append("tokens/s".ljust(15) + "".join(f"{tot[('overall', x)][0] / tot[('overall', x)][3]:.1f}".rjust(width)
                                               for x in labels))
    lines.append("mismatches".ljust(15) + "".join(str(bad[x]).rjust(width) for x in labels))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
