"""Replay greedy runs of the model-free drafters against recorded baseline outputs: modelled speed.

Under greedy decoding the target's output is fixed, so a lossless drafter's whole run can be
replayed without the target: at each step the drafter proposes from the tokens so far, the budget
prunes with a given step-cost curve, the accepted path is the longest path of the candidate tree
that follows the recorded baseline output, and the step's time is the curve's cost of its query
count at its context length. The result, tokens per unit of plain-step time, carries none of a
CPU's timing noise (a benchmark's category figures move by up to 0.1 between runs on 2 questions
a category), so a change to an acceptance estimate or a budget rule can be compared across every
category in seconds; the benchmark then confirms it with real time.

Only drafters that read nothing but tokens can be replayed: prompt lookup, suffix decoding and a
mixture of those two (Lookahead, recycling and the trained drafters need the target's logits or
features). A drafter's own drafting time is not modelled.

    python -m playground.bench.replay --records RESULTS.jsonl[.gz] --questions FILE.jsonl \\
        --methods prompt_lookup,prompt_lookup:budget=off,suffix --max-new-tokens 64

``RESULTS`` is a benchmark records file with ``autoregressive`` rows (``output_ids``), such as
``scripts/bench_interleaved.py --out`` writes.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import sys
from pathlib import Path

import torch

REPLAYABLE = ("prompt_lookup", "suffix", "rest")
"""Methods whose drafters read only tokens (a mixture may combine them)."""


def replay(drafter, prompt_ids: list[int], truth: list[int], max_new_tokens: int, cost) -> dict:
    """One greedy run of ``drafter`` replayed against the baseline's output ``truth``.

    Args:
        drafter: a token-only drafter; its ``budget_cost`` (None: budget off) prunes each proposal,
            as the decoding loop does.
        prompt_ids: ``(prompt_len,)`` the prompt's token ids.
        truth: the baseline's new token ids (greedy; ends early where the baseline stopped).
        max_new_tokens: the run's cap.
        cost: the step cost used to time each step (``cost(queries, is_chain, context)``, a
            :class:`~playground.engine.budget.StepCost`), relative to a plain step.

    Returns:
        ``{"new_tokens", "steps", "proposed", "time", "trace"}``: time in plain steps (the
        prefill's token counts one), steps without the prefill, and per step ``(queries, accepted
        candidates, is_chain, context)``.

    Raises:
        ValueError: an empty ``truth``.
    """
    from playground.engine import DecodeState, RunRate, SamplingConfig, StepResult, apply_budget

    if not truth:
        raise ValueError("replay needs the baseline's output (no new tokens recorded)")
    end = min(max_new_tokens, len(truth))
    drafter.begin(list(prompt_ids))
    tokens = list(prompt_ids) + [truth[0]]
    emitted, steps, proposed, time, trace = 1, 0, 0, 1.0, []
    run_rate = RunRate()
    while emitted < end:
        state = DecodeState(tokens, len(prompt_ids), SamplingConfig(), None, max(0, end - emitted - 1),
                            torch.device("cpu"), 1 << 30)
        cand = drafter.propose(state)
        if drafter.budget_cost is not None:
            cand = apply_budget(cand, drafter.budget_cost, len(tokens), run_rate.value)
        toks, parents = cand.tokens.tolist(), cand.parents.tolist()
        path, node = [], -1
        while emitted + len(path) < end - 1:  # the greedy verdict: follow the recorded output
            want = truth[emitted + len(path)]
            node = next((i for i, (t, p) in enumerate(zip(toks, parents)) if p == node and t == want), None)
            if node is None:
                break
            path.append(node)
        bonus = truth[emitted + len(path)]
        extras = len(cand.extras) if cand.extras is not None else 0
        chain = parents == list(range(-1, len(parents) - 1))
        time += cost(1 + len(toks) + extras, chain, len(tokens))
        trace.append((1 + len(toks) + extras, len(path), chain, len(tokens)))
        new = [toks[i] for i in path] + [bonus]
        if drafter.budget_cost is not None:
            run_rate.observe(len(new), cand, drafter.budget_cost, len(tokens))
        drafter.update(StepResult(cand, path, bonus, tokens + new))
        tokens += new
        emitted += len(new)
        steps += 1
        proposed += len(toks)
    drafter.finish(list(tokens), len(prompt_ids))
    return {"new_tokens": emitted, "steps": steps, "proposed": proposed, "time": time, "trace": trace}


def first_turn_rows(records: list[dict]) -> list[dict]:
    """The ``autoregressive`` rows of each question's first turn (the replay rebuilds only first
    turns' prompts: a later turn's holds that method's own earlier answers).

    The first turn is the lowest ``turn`` among a question's rows: ``playground.bench`` has always
    numbered turns from 0, ``scripts/bench_interleaved.py`` from 1 until 2026-12-02 (its records
    under ``data/bench/`` up to ``2026-12-02/``, which also lack ``prompt_tokens``) and from 0 since.
    """
    rows = [r for r in records if r.get("method") == "autoregressive"]
    first: dict[str, int] = {}
    for r in rows:
        q = str(r["question_id"])
        first[q] = min(first.get(q, 1 << 30), int(r.get("turn", 0)))
    return [r for r in rows if int(r.get("turn", 0)) == first[str(r["question_id"])]]


def replay_cost(engine, path: str | None):
    """The step-cost curve a replay prices and prunes with, made the engine's own (the per-step budget
    of every drafter built after this reads it): read from ``path`` when that file exists, else timed
    here once (and written to ``path`` when given). An engine that already holds a step-cost curve
    keeps it: the file is then not read (the command line's engine holds none).

    Until 2026-12-05 a curve read from a file only priced the steps, while each drafter's budget
    timed a curve of its own on the spot, so a replay's proposals moved with the machine's load
    (REST's tau 1.33-1.46 over three replays of one record file)."""
    from playground.engine import StepCost, engine_step_cost

    if path and os.path.exists(path):
        with open(path) as f:
            saved = StepCost.from_dict(json.load(f))
        return engine.persistent("step_cost", lambda: saved)
    cost = engine_step_cost(engine)  # timed once on this machine: every method is replayed with it
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)  # e.g. artifacts/, which a clone lacks
        with open(path, "w") as f:
            json.dump(cost.as_dict(), f)
    return cost


def check_replayable(spec) -> None:
    """Raise ValueError unless ``spec`` (a MethodSpec) is a token-only method (:data:`REPLAYABLE`)."""
    names = [spec.name]
    if spec.name == "mixture":
        from playground.engine import METHODS
        default = next(k.default for k in METHODS["mixture"].knobs if k.name == "members")
        names = str(spec.params.get("members", default)).split(",")
    bad = [n for n in names if n.strip() not in REPLAYABLE]
    if bad:
        raise ValueError(f"{spec.name}: cannot replay {', '.join(bad)} without the target (only "
                         f"{', '.join(REPLAYABLE)} and mixtures of them)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m playground.bench.replay", description=__doc__.split("\n")[0])
    ap.add_argument("--records", required=True, help="benchmark records with autoregressive rows (.jsonl or .jsonl.gz)")
    ap.add_argument("--questions", required=True, help="the question file the records were made from")
    ap.add_argument("--methods", required=True, help="comma-separated NAME[:knob=value;...] ('+' joins a list)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0, help="torch threads for the step-cost timing (0: as is)")
    ap.add_argument("--cost", default=None, metavar="FILE.json",
                    help="the step-cost curve to replay with: read from FILE when it exists, else timed here and "
                         "written there (a timed curve moves by several per cent from one timing to the next)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from playground.bench import load_questions
    from playground.engine import Engine
    from playground.bench.cli import method_spec

    methods = [method_spec(m) for m in args.methods.split(",")]
    try:
        for _, spec in methods:
            check_replayable(spec)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    opener = gzip.open if args.records.endswith(".gz") else open
    with opener(args.records, "rt") as f:
        base = first_turn_rows([json.loads(line) for line in f if line.strip()])
    if not base:
        print(f"error: {args.records} has no autoregressive rows to replay", file=sys.stderr)
        return 2
    questions = {q.question_id: q for q in load_questions(args.questions)}
    engine = Engine.load("default", methods=sorted({s.name for _, s in methods}))
    cost = replay_cost(engine, args.cost)
    tot = collections.defaultdict(lambda: [0, 0.0, 0])
    skipped = 0
    for r in base:
        q = questions.get(r["question_id"])
        ids = engine.encode_prompt(q.turns[0]) if q is not None else []
        if q is None or r.get("prompt_tokens", len(ids)) != len(ids):  # another template or question file
            skipped += 1
            continue
        for label, spec in methods:
            out = replay(engine.make_drafter(spec), ids, r["output_ids"], args.max_new_tokens, cost)
            for c in (r["category"], "overall"):
                t = tot[(c, label)]
                t[0] += out["new_tokens"]
                t[1] += out["time"]
                t[2] += out["steps"] + 1
    if skipped:
        print(f"skipped {skipped} of {len(base)} first turns: question not in {args.questions}, or the recorded "
              f"prompt length differs from this tokenizer's prompt of the question", file=sys.stderr)
    if skipped == len(base):
        print("error: no first turn left to replay", file=sys.stderr)
        return 2
    labels = [label for label, _ in methods]
    width = max(12, *(len(x) for x in labels)) + 1
    print("modelled speedup over plain decoding (tokens per plain-step time), tau in brackets")
    print("category".ljust(15) + "".join(x.rjust(width) for x in labels))
    for c in [c for c in dict.fromkeys(r["category"] for r in base) if (c, labels[0]) in tot] + ["overall"]:
        print(c.ljust(15) + "".join(f"{tot[(c, x)][0] / tot[(c, x)][1]:.3f} ({tot[(c, x)][0] / tot[(c, x)][2]:.2f})"
                                    .rjust(width) for x in labels))
    return 0


if __name__ == "__main__":
    sys.exit(main())
