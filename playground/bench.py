"""Benchmark command line: ``python -m playground.bench``.

Runs every chosen method on every (question, turn) of a question file and writes one JSON
object a line per (question, turn, method), then prints a table per category and overall::

    python -m playground.bench --questions ../shared/data/spec_bench_dev.jsonl \\
        --methods autoregressive,prompt_lookup --max-new-tokens 128 --out results.jsonl

Questions
    Spec-Bench rows ``{"question_id", "category", "turns": [user message, ...]}`` or HumanEval
    rows ``{"task_id", "prompt"}`` (category ``humaneval``). A HumanEval prompt is given to the
    chat model as the user message ``HUMANEVAL_TEMPLATE`` (the code inside a fenced block after
    "Complete the following Python function:"), because the targets are chat models and
    Spec-Bench feeds every task through the chat template too. ``--questions`` also takes the
    names of the built-in sets in ``assets/bench/`` (``spec_bench``, ``humaneval``).
    Multi-turn rows run turn after turn; each method sees its *own* earlier answers in the chat.
    ``--limit N`` keeps the first N questions in file order (after ``--categories``).

Order and timing
    For each (question, turn) every method runs once, the autoregressive baseline first, before
    the next turn. Each method's clock counts only its own steps (prefill included), as the
    engine measures it; ``--warmup`` runs short untimed generations first.

Records (``--out``)
    The contract fields ``question_id, category, turn, method, params, new_tokens, steps, wall_s,
    ttft_s, tokens_per_s, mean_accepted_tokens, acceptance_rate, output_ids, output_text`` plus
    ``proposed, accepted, finish_reason, prompt_tokens, temperature, dtype, target, margins``
    (the target's top-1 minus top-2 logit at each output token, used to tell a numerical
    near-tie from a real mismatch). ``turn`` is 0-based. ``acceptance_rate`` is null when the
    method proposed nothing. ``output_ids`` are the engine's new ids: when the model stopped
    (``finish_reason`` "eos") the last one is the EOS id, counted in ``new_tokens``, as
    transformers' ``generate()`` does; ``output_text`` holds no special tokens.
    ``wall_s`` is the method's own time including the prefill (``ttft_s``).

Summary
    :func:`summarize` (records -> rows) and :func:`format_table` (rows -> text) are pure
    functions of the records, so the UI can reuse them. Speedup and tau are computed as
    ``shared/tools/check_bench.py`` does: total tokens over total seconds against the
    autoregressive baseline, and total tokens over total steps.

Exit status: 0 on success, 2 on a usage error (unknown method, bad file, bad knob, model that
cannot load, a setting the loaded models cannot run, ``--max-new-tokens`` that leaves no question
room in the context), 130 when interrupted. Every check that needs the models runs right after they
load (:func:`check_runnable`), before the first run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

ASSETS = Path(__file__).resolve().parent.parent / "assets" / "bench"
BUILTIN_SETS = {"spec_bench": ASSETS / "spec_bench_dev.jsonl", "humaneval": ASSETS / "humaneval_dev.jsonl"}
"""Built-in question sets (see assets/bench/README.md), selectable by name with --questions."""
BASELINE = "autoregressive"
HUMANEVAL_CATEGORY = "humaneval"
HUMANEVAL_TEMPLATE = "Complete the following Python function:\n```python\n{prompt}\n```"
"""User message built from a HumanEval ``prompt`` (signature and docstring, trailing whitespace stripped)."""
WARMUP_PROMPT = "Write two sentences about the sea. The sea is"
WARMUP_TOKENS = 16

# Command-line flag -> knob names it may set. Upcoming methods (lookahead, medusa) may spell
# their knobs either way; a flag sets whichever name the chosen method declares.
KNOB_FLAGS: dict[str, tuple[str, ...]] = {
    "k": ("k",),
    "confidence": ("confidence",),
    "proposer": ("proposer",),
    "max_ngram_size": ("max_ngram_size",),
    "num_pred_tokens": ("num_pred_tokens",),
    "window": ("window",),
    "ngram": ("ngram_size", "ngram"),
    "guess": ("guess_set_size", "guess"),
    "posterior_threshold": ("posterior_threshold",),
    "posterior_alpha": ("posterior_alpha",),
    "tree": ("tree_choices", "tree"),
    "acceptance": ("acceptance",),
    "budget": ("budget",),
    "members": ("members",),
}


class BenchError(Exception):
    """A usage error reported as one line (exit status 2), never a traceback."""


# ----- questions -------------------------------------------------------------------------
@dataclass(frozen=True)
class Question:
    """One benchmark question: its id, category and user turns (one or more)."""

    question_id: int | str
    category: str
    turns: tuple[str, ...]


def parse_question(row: dict, where: str = "row") -> Question:
    """Turn a Spec-Bench or HumanEval row into a :class:`Question`.

    Raises:
        BenchError: the row is neither format, or a field has the wrong type.
    """
    if not isinstance(row, dict):
        raise BenchError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if "turns" in row:
        qid, turns = row.get("question_id"), row["turns"]
        if qid is None:
            raise BenchError(f"{where}: Spec-Bench row without 'question_id'")
        if isinstance(turns, str):
            turns = [turns]
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
            raise BenchError(f"{where}: 'turns' must be a non-empty list of non-empty strings")
        return Question(qid, str(row.get("category") or "uncategorized"), tuple(turns))
    if "task_id" in row and "prompt" in row:
        if not isinstance(row["prompt"], str) or not row["prompt"].strip():
            raise BenchError(f"{where}: 'prompt' must be a non-empty string")
        return Question(row["task_id"], HUMANEVAL_CATEGORY, (HUMANEVAL_TEMPLATE.format(prompt=row["prompt"].rstrip()),))
    raise BenchError(f"{where}: neither a Spec-Bench row (question_id, category, turns) nor a HumanEval "
                     f"row (task_id, prompt); keys are {sorted(row)}")


def load_questions(path: str | Path, categories: Iterable[str] | None = None,
                   limit: int | None = None) -> list[Question]:
    """Read a JSONL question file (or a built-in set's name), filter by category, keep the first ``limit``.

    Raises:
        BenchError: missing or unreadable file, bad JSON, a row in neither format, duplicate ids,
            or nothing left after filtering.
    """
    path = BUILTIN_SETS.get(str(path), Path(path))
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise BenchError(f"cannot read questions file {str(path)!r}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise BenchError(f"questions file {str(path)!r} is not UTF-8 text") from None
    from playground.bench_io import iter_jsonl

    try:
        rows = list(iter_jsonl(text))
    except ValueError as e:
        raise BenchError(f"{path}: {e}") from None
    questions, seen = [], set()
    for n, row in rows:
        q = parse_question(row, f"{path}:{n}")
        if str(q.question_id) in seen:
            raise BenchError(f"{path}:{n}: duplicate question id {q.question_id!r}")
        seen.add(str(q.question_id))
        questions.append(q)
    if not questions:
        raise BenchError(f"questions file {str(path)!r} has no questions")
    if categories:
        wanted = set(categories)
        present = {q.category for q in questions}
        missing = wanted - present
        if missing:
            raise BenchError(f"no questions in categories {', '.join(sorted(missing))}; the file has "
                             f"{', '.join(sorted(present))}")
        questions = [q for q in questions if q.category in wanted]
    return questions[:limit] if limit is not None else questions


# ----- methods -----------------------------------------------------------------------------
def method_params(methods: list[str], knob_values: dict) -> dict[str, dict]:
    """Map the knob flags given on the command line onto each method's params.

    Args:
        methods: method names, all in ``compare.METHODS``.
        knob_values: flag name (a key of :data:`KNOB_FLAGS`) -> value; None = not given.

    Returns:
        method -> params dict holding only the knobs that method declares.

    Raises:
        BenchError: a flag was given that none of the chosen methods has.
    """
    from playground.engine.compare import METHODS

    params: dict[str, dict] = {m: {} for m in methods}
    for flag, value in knob_values.items():
        if value is None:
            continue
        used = False
        for m in methods:
            declared = {k.name for k in METHODS[m].knobs}
            name = next((n for n in KNOB_FLAGS[flag] if n in declared), None)
            if name is not None:
                params[m][name] = value
                used = True
        if not used:
            owners = [m for m, info in METHODS.items() if {k.name for k in info.knobs} & set(KNOB_FLAGS[flag])]
            hint = f" (it belongs to {', '.join(owners)})" if owners else ""
            raise BenchError(f"--{flag.replace('_', '-')} is not a setting of any chosen method "
                             f"({', '.join(methods)}){hint}")
    return params


def parse_methods(text: str) -> list[str]:
    """Split ``a,b,c``, check every name, put the baseline first (added when missing).

    Raises:
        BenchError: empty list, duplicates, or a name not in ``compare.METHODS``.
    """
    from playground.engine.compare import METHODS

    names = [m.strip() for m in text.split(",") if m.strip()]
    if not names:
        raise BenchError("--methods is empty; available methods: " + ", ".join(METHODS))
    unknown = [m for m in names if m not in METHODS]
    if unknown:
        raise BenchError(f"unknown method{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                         f"available methods: {', '.join(METHODS)}")
    if len(set(names)) != len(names):
        raise BenchError(f"--methods lists a method twice: {text}")
    if BASELINE not in names:
        print(f"note: adding {BASELINE} (the baseline every speedup is measured against)", file=sys.stderr)
    return [BASELINE] + [m for m in names if m != BASELINE]


# ----- summary (pure functions of the records) -----------------------------------------------
def _dtype(name: str | None):
    import torch

    return getattr(torch, name, torch.float32) if isinstance(name, str) else torch.float32


def _lossless_cell(records: list[dict], base: dict) -> tuple[str, dict]:
    """Compare a lossless method's records with the baseline's, key by key.

    A differing turn whose previous turn already differed saw a different conversation, so it
    is counted apart ("after an earlier turn differed") rather than as a mismatch of its own.
    """
    from playground.engine.compare import check_lossless

    by_key = {(str(r["question_id"]), r.get("turn", 0)): r for r in records}
    differ: set = set()
    near = after = compared = 0
    for key in sorted(by_key, key=lambda k: (k[0], k[1])):
        r, b = by_key[key], base.get(key)
        if b is None:
            continue
        compared += 1
        if r["output_ids"] == b["output_ids"]:
            continue
        differ.add(key)
        if (key[0], key[1] - 1) in differ:
            after += 1
            continue
        check = check_lossless(b["output_ids"], b.get("margins") or [], r["output_ids"], _dtype(b.get("dtype")))
        near += check.near_tie
    detail = {"compared": compared, "differ": len(differ), "near_ties": near, "after_earlier_turn": after}
    if not compared:
        return "-", detail
    if not differ:
        return "yes", detail
    notes = [f"{len(differ)}/{compared} differ"]
    if near:
        notes.append(f"{near} at near-ties")
    if after:
        notes.append(f"{after} after an earlier turn differed")
    return f"no ({'; '.join(notes)})", detail


def summarize(records: list[dict], baseline: str = BASELINE, lossless: Iterable[str] | None = None) -> list[dict]:
    """Aggregate benchmark records per category and overall.

    Args:
        records: dicts as written by the benchmark (at least ``question_id, category, turn,
            method, new_tokens, steps, wall_s, output_ids``; ``proposed/accepted``,
            ``margins``, ``dtype`` and ``temperature`` are used when present).
        baseline: the method speedups and losslessness are measured against.
        lossless: methods whose greedy output must equal the baseline's (default: the
            registry's lossless methods).

    Returns:
        One dict per (category, method), categories in order of first appearance, then
        ``"overall"``: ``category, method, runs, new_tokens, wall_s, tokens_per_s`` (total tokens
        / total seconds), ``speedup`` (over the baseline in the same category; None without
        one), ``tau`` (total tokens / total steps), ``alpha`` (total accepted / total proposed;
        None when nothing was proposed), ``lossless`` (``"yes"``, ``"no (...)"``, ``"baseline"``
        or ``"-"`` when not applicable: a lossy method, or sampling) and ``lossless_detail``.
    """
    if lossless is None:
        from playground.engine.compare import METHODS

        lossless = {m for m, info in METHODS.items() if info.lossless}
    lossless = set(lossless)
    categories: list[str] = []
    methods: list[str] = []
    for r in records:
        if r["category"] not in categories:
            categories.append(r["category"])
        if r["method"] not in methods:
            methods.append(r["method"])
    if baseline in methods:
        methods.remove(baseline)
        methods.insert(0, baseline)
    rows = []
    for cat in categories + ["overall"]:
        group = [r for r in records if cat == "overall" or r["category"] == cat]
        by_method = {m: [r for r in group if r["method"] == m] for m in methods}
        base_records = by_method.get(baseline) or []
        base_tokens = sum(r["new_tokens"] for r in base_records)
        base_tps = base_tokens / max(1e-9, sum(r["wall_s"] for r in base_records)) if base_records else None
        base_by_key = {(str(r["question_id"]), r.get("turn", 0)): r for r in base_records}
        for m in methods:
            rs = by_method[m]
            if not rs:
                continue
            tokens = sum(r["new_tokens"] for r in rs)
            seconds = sum(r["wall_s"] for r in rs)
            tps = tokens / max(1e-9, seconds)
            proposed = sum(r.get("proposed") or 0 for r in rs)
            accepted = sum(r.get("accepted") or 0 for r in rs)
            if proposed:
                alpha = accepted / proposed
            else:  # records without proposed/accepted counts: mean of the per-run rates
                rates = [r["acceptance_rate"] for r in rs if r.get("acceptance_rate") is not None]
                alpha = sum(rates) / len(rates) if rates and not any("proposed" in r for r in rs) else None
            greedy = all(float(r.get("temperature") or 0.0) == 0.0 for r in rs)
            if m == baseline:
                cell, detail = "baseline", {}
            elif m in lossless and greedy and base_records and all(_lossless_params(m, r) for r in rs):
                cell, detail = _lossless_cell(rs, base_by_key)
            else:
                cell, detail = "-", {}
            rows.append({
                "category": cat, "method": m, "runs": len(rs), "new_tokens": tokens, "wall_s": seconds,
                "tokens_per_s": tps, "speedup": tps / base_tps if base_tps else None,
                "tau": tokens / max(1, sum(r["steps"] for r in rs)), "alpha": alpha,
                "lossless": cell, "lossless_detail": detail,
            })
    return rows


TABLE_HEADER = ("method", "runs", "tokens", "tokens/s", "speedup", "tau", "alpha", "lossless")
"""Columns of :func:`table_cells` (and of the printed table)."""


def table_cells(r: dict) -> tuple[str, ...]:
    """One :func:`summarize` row as the printed table's cells (see :data:`TABLE_HEADER`)."""
    return (r["method"], str(r["runs"]), str(r["new_tokens"]), f"{r['tokens_per_s']:.2f}",
            "-" if r["speedup"] is None else f"{r['speedup']:.2f}x", f"{r['tau']:.2f}",
            "-" if r["alpha"] is None else f"{r['alpha']:.3f}", r["lossless"])


def leaderboard(rows: list[dict]) -> tuple[list[str], list[list]]:
    """:func:`summarize`'s rows pivoted like Spec-Bench's leaderboard: one line per method.

    Returns:
        ``(header, lines)``: header ``method``, one speedup column per category (in order of
        appearance), then ``overall speedup``, ``tau``, ``tokens/s`` and ``lossless`` (all
        overall); each line holds floats rounded to 2 decimals (None where there is no
        baseline) and the lossless cell (``yes``, ``no (...)``, ``baseline`` or ``-``).
        No number is recomputed here: every value is a field of a summary row.
    """
    cats = [c for c in dict.fromkeys(r["category"] for r in rows) if c != "overall"]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    by = {(r["category"], r["method"]): r for r in rows}
    def rnd(x):
        return None if x is None else round(x, 2)
    header = ["method"] + [f"{c} speedup" for c in cats] + ["overall speedup", "tau", "tokens/s", "lossless"]
    lines = []
    for m in methods:
        overall = by.get(("overall", m))
        if overall is None:
            continue
        lines.append([m] + [rnd(by[(c, m)]["speedup"]) if (c, m) in by else None for c in cats]
                     + [rnd(overall["speedup"]), rnd(overall["tau"]), rnd(overall["tokens_per_s"]), overall["lossless"]])
    return header, lines


def _lossless_params(method: str, record: dict) -> bool:
    """Whether the method with this record's params must match the baseline (Medusa's typical
    acceptance does not)."""
    from playground.engine.compare import METHODS, is_lossless

    return method not in METHODS or is_lossless(method, record.get("params") or {})


def medusa_summary(engine, records: list[dict], tree) -> str:
    """Lines naming the Medusa tree used and each head's acceptance over the medusa records."""
    from playground.engine.medusa import head_acceptance
    from playground.engine.medusa_trees import TREE_KNOB

    rs = [r for r in records if r["method"] == "medusa" and r.get("accepted_at") is not None]
    if not rs:
        return ""
    depth = max(len(r["accepted_at"]) for r in rs)
    acc = [sum(r["accepted_at"][i] for r in rs if i < len(r["accepted_at"])) for i in range(depth)]
    prop = [sum(r["proposed_at"][i] for r in rs if i < len(r["proposed_at"])) for i in range(depth)]
    heads = head_acceptance({"per_position_acceptance": [a / p if p else 0.0 for a, p in zip(acc, prop)]})
    lines = [f"medusa tree: {engine.medusa_tree_description(tree if tree is not None else TREE_KNOB.default)}",
             "medusa per-head acceptance (share of steps accepting head k's token; given head k-1 accepted): " +
             ", ".join(f"head {h['head']} {h['rate']:.1%} ({h['conditional']:.1%})" for h in heads)]
    return "\n".join(lines) + "\n"


def format_table(rows: list[dict]) -> str:
    """Plain-text tables of :func:`summarize`'s rows, one block per category."""
    header, fmt = TABLE_HEADER, table_cells
    cells = [header] + [fmt(r) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    def line(c: tuple[str, ...]) -> str:
        return "  ".join(c[i].ljust(widths[i]) if i in (0, 7) else c[i].rjust(widths[i])
                         for i in range(len(c))).rstrip()
    out: list[str] = []
    for cat in dict.fromkeys(r["category"] for r in rows):
        out += [f"== {cat} ==", line(header)] + [line(fmt(r)) for r in rows if r["category"] == cat] + [""]
    return "\n".join(out).rstrip() + "\n"


def record_line(rec: dict) -> str:
    """One record as the results file holds it: a JSON object and a newline."""
    return json.dumps(rec, ensure_ascii=False) + "\n"


# ----- running -------------------------------------------------------------------------------
class _Progress:
    """A stderr progress bar (tqdm, which transformers already depends on) with a plain fallback."""

    def __init__(self, total: int, enabled: bool = True):
        self.total, self.done, self.enabled = total, 0, enabled
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="run", file=sys.stderr, dynamic_ncols=True, mininterval=0.5)
            except ImportError:
                pass

    def update(self, text: str) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=False)
            self.bar.update(1)
        elif self.enabled:
            print(f"[{self.done}/{self.total}] {text}", file=sys.stderr, flush=True)

    def write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_method(engine, prompt_ids: list[int], spec, settings) -> dict:
    """Run one method to the end; return the measured part of its record."""
    from playground.engine.compare import RunOutput

    out = RunOutput(spec.name, spec.params)
    for event in engine.run_one(prompt_ids, spec, settings):
        out.add(event)
    stats = out.last.stats
    return {
        "new_tokens": stats.new_tokens, "steps": stats.steps, "wall_s": stats.elapsed_s, "ttft_s": stats.ttft_s,
        "tokens_per_s": stats.tokens_per_s, "mean_accepted_tokens": stats.tau, "acceptance_rate": stats.alpha,
        "proposed": stats.proposed, "accepted": stats.accepted, "finish_reason": out.last.finish_reason,
        "output_ids": out.ids, "output_text": out.text, "margins": [round(x, 5) for x in out.margins],
        "accepted_at": list(stats.accepted_at), "proposed_at": list(stats.proposed_at),
    }


@dataclass(frozen=True)
class Runner:
    """One method as the benchmark loop sees it: a name, its params, and
    ``run(prompt_ids) -> measured fields`` (see :func:`run_method` for the fields)."""

    name: str
    params: dict
    run: Callable[[list[int]], dict]


def engine_runner(engine, spec, settings) -> Runner:
    """A :class:`Runner` for an engine method (``spec`` is a ``compare.MethodSpec``)."""
    return Runner(spec.name, engine.with_defaults(spec).checked_params(),
                  lambda ids: run_method(engine, ids, spec, settings))


def run_benchmark(engine, questions: list[Question], runners: list[Runner], max_new_tokens: int,
                  write: Callable[[dict], None], progress: _Progress | None = None,
                  extra: dict | None = None) -> list[dict]:
    """Run every method on every (question, turn); call ``write(record)`` after each run.

    ``engine`` only builds prompts (chat template, context check). Each method keeps its own
    conversation per question: turn t's prompt holds the earlier user turns and that method's
    own earlier answers. A (question, turn) whose prompt does not fit the context for some
    method is skipped for all methods (with a note), and so are the question's later turns.
    """
    records = []
    for kind, item, runs in iter_benchmark(engine, questions, runners, max_new_tokens, extra):
        if kind == "skip":
            if progress:
                progress.write(item)
                for _ in range(runs):
                    progress.update("skipped")
            else:
                print(item, file=sys.stderr)
            continue
        write(item)
        records.append(item)
        if progress:
            progress.update(f"q {item['question_id']} t{item['turn']} {item['method']} "
                            f"{item['tokens_per_s']:.1f} tok/s")
    return records


def iter_benchmark(engine, questions: list[Question], runners: list[Runner], max_new_tokens: int,
                   extra: dict | None = None):
    """The benchmark loop of :func:`run_benchmark` as a generator (the page's Benchmark tab uses it).

    Yields:
        ``("record", record, 1)`` after each run, and ``("skip", message, runs_skipped)`` when a
        (question, turn) and the question's later turns are skipped because a prompt does not fit
        the context. Closing the generator stops after the current run.
    """
    context = engine.target.context_length
    for q in questions:
        history: dict[str, list[dict]] = {r.name: [] for r in runners}
        for turn, user in enumerate(q.turns):
            prompts = {}
            try:
                for r in runners:
                    ids = engine.encode_prompt(history[r.name] + [{"role": "user", "content": user}])
                    if len(ids) + max_new_tokens > context:
                        raise ValueError(f"the prompt is {len(ids)} tokens; with max_new_tokens={max_new_tokens} "
                                         f"it exceeds the context of {context}")
                    prompts[r.name] = ids
            except ValueError as e:
                yield "skip", f"skipping question {q.question_id} from turn {turn}: {e}", \
                    (len(q.turns) - turn) * len(runners)
                break
            for r in runners:
                rec = {"question_id": q.question_id, "category": q.category, "turn": turn, "method": r.name,
                       "params": r.params, "prompt_tokens": len(prompts[r.name])}
                rec.update(r.run(prompts[r.name]))
                rec.update(extra or {})
                history[r.name] += [{"role": "user", "content": user},
                                    {"role": "assistant", "content": rec["output_text"]}]
                yield "record", rec, 1


def warm_up(engine, specs: list, settings, rounds: int) -> None:
    """Untimed short generations of every method (kernel selection, allocator, lazy imports)."""
    from playground.engine.decoding import GenerationSettings

    short = GenerationSettings(min(WARMUP_TOKENS, settings.max_new_tokens), settings.sampling)
    ids = engine.encode_prompt(WARMUP_PROMPT)
    for _ in range(rounds):
        for s in specs:
            for _event in engine.run_one(ids, s, short):
                pass


TREE_PRESET_NAMES = ("auto", "depth3", "chain", "cpu_small", "mc_sim_7b_63")
"""The names of ``medusa_trees.TREE_PRESETS`` for ``--help`` (repeated here so that ``--help`` needs no
torch import; a test checks that they agree)."""


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's arguments; every help text names the option's default.

    The method knobs default to None (not given): the method then uses the engine's default, which
    the help quotes from ``playground.engine.limits`` (a draft may bring its own, see ``--k``).
    """
    from playground.engine.limits import (DRAFT_CONFIDENCE_KNOB, K_KNOB, LOOKAHEAD_GUESS_KNOB,
                                          LOOKAHEAD_NGRAM_KNOB, LOOKAHEAD_WINDOW_KNOB, MAX_NEW_TOKENS,
                                          MAX_TEMPERATURE, POSTERIOR_ALPHA_KNOB, POSTERIOR_THRESHOLD_KNOB,
                                          PROMPT_LOOKUP_NGRAM_KNOB, PROMPT_LOOKUP_TOKENS_KNOB)

    def bounds(knob) -> str:
        lo, hi = (int(knob.minimum), int(knob.maximum)) if knob.integer else (knob.minimum, knob.maximum)
        return f"{lo:g} to {hi:g}, default {knob.default:g}"

    ap = argparse.ArgumentParser(
        prog="python -m playground.bench",
        description="Benchmark decoding methods on Spec-Bench or HumanEval questions; write one JSON line per "
                    "(question, turn, method) and print a table per category.",
        epilog="Example: python -m playground.bench --questions spec_bench --limit 24 "
               "--methods autoregressive,prompt_lookup --max-new-tokens 128 --out results.jsonl")
    g = ap.add_argument_group("what to run")
    g.add_argument("--questions", default="spec_bench", metavar="FILE_OR_SET",
                   help="JSONL file of Spec-Bench rows (question_id, category, turns) or HumanEval rows (task_id, "
                        "prompt), or a built-in set: spec_bench, humaneval (default: spec_bench)")
    g.add_argument("--methods", default="autoregressive,prompt_lookup", metavar="LIST",
                   help="comma-separated methods among autoregressive, prompt_lookup, draft_model, lookahead, "
                        "medusa, suffix, recycling, mixture; autoregressive (the baseline every speedup is measured against) is added when "
                        "missing and always runs first (default: autoregressive,prompt_lookup)")
    g.add_argument("--max-new-tokens", type=int, default=128, metavar="N",
                   help=f"most new tokens per answer, 1 to {MAX_NEW_TOKENS}; the prompt and the answer must fit "
                        "the target's context (default: 128)")
    g.add_argument("--out", default="results.jsonl", metavar="FILE",
                   help="results file, one JSON object a line; overwritten (default: results.jsonl)")
    g.add_argument("--limit", type=int, metavar="N",
                   help="keep only the first N questions, after --categories (default: all)")
    g.add_argument("--categories", metavar="LIST",
                   help="comma-separated categories to keep, e.g. qa,rag (default: all)")
    g.add_argument("--warmup", type=int, default=1, metavar="N",
                   help="short untimed runs of every method before timing, in rounds (default: 1)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar (default: show one)")
    g = ap.add_argument_group("models and device")
    g.add_argument("--target", default="default", metavar="MODEL",
                   help="the model to speed up: 'default' (the embedded SmolLM2-135M-Instruct), a .gguf file, a "
                        "model folder or a Hugging Face hub id (default: default)")
    g.add_argument("--draft", metavar="MODEL",
                   help="small model with the target's tokenizer that proposes tokens for draft_model; 'none' for "
                        "no draft (default: with the default target, the draft shipped in assets/draft/default; "
                        "else none)")
    g.add_argument("--medusa", metavar="PATH_OR_HUB_ID",
                   help="Medusa heads trained on the target, for the medusa method; 'none' for no heads (default: "
                        "with the default target, the heads shipped in assets/medusa/default; else none)")
    g.add_argument("--draft-medusa", metavar="PATH_OR_HUB_ID",
                   help="Medusa heads trained on the draft model, needed by --proposer medusa_heads (default: none)")
    g.add_argument("--device", default="auto",
                   help="auto, cpu, cuda, cuda:N or mps (default: auto, a GPU when there is one, else the CPU)")
    g.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                   help="precision of the weights (default: auto, bfloat16 on CUDA, float32 on a CPU, where "
                        "bfloat16 would round multi-token verification differently from the baseline)")
    g.add_argument("--threads", type=int, metavar="N", help="CPU threads for torch (default: torch's choice)")
    g = ap.add_argument_group("sampling (temperature 0 = greedy)")
    g.add_argument("--temperature", type=float, default=0.0, metavar="T",
                   help=f"0 to {MAX_TEMPERATURE:g}; 0 is greedy decoding, where the lossless methods must match "
                        "the baseline token for token (default: 0)")
    g.add_argument("--top-p", type=float, default=1.0, metavar="P",
                   help="sample only from the most likely tokens holding this much probability (default: 1, off)")
    g.add_argument("--top-k", type=int, default=0, metavar="K",
                   help="sample only from the k most likely tokens (default: 0, off)")
    g.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the sampling (default: 0)")
    g = ap.add_argument_group("method settings (each names its method)")
    g.add_argument("--k", type=int, metavar="K",
                   help=f"draft_model: tokens the draft proposes per step ({bounds(K_KNOB)}, unless the draft "
                        "folder's draft_knobs.json sets another)")
    g.add_argument("--confidence", type=float, metavar="P",
                   help="draft_model: stop drafting when the draft's top probability falls below this; 0 always "
                        f"drafts K tokens ({bounds(DRAFT_CONFIDENCE_KNOB)})")
    g.add_argument("--proposer", choices=("model", "medusa_heads"),
                   help="draft_model: 'model' drafts K tokens with the draft model, one pass each; 'medusa_heads' "
                        "drafts the draft's next token plus its Medusa heads' tokens in one pass (needs "
                        "--draft-medusa) (default: model)")
    g.add_argument("--max-ngram-size", type=int, metavar="N",
                   help=f"prompt_lookup: longest n-gram searched for in the prompt and the answer so far "
                        f"({bounds(PROMPT_LOOKUP_NGRAM_KNOB)})")
    g.add_argument("--num-pred-tokens", type=int, metavar="N",
                   help=f"prompt_lookup: tokens copied after a match ({bounds(PROMPT_LOOKUP_TOKENS_KNOB)})")
    g.add_argument("--window", type=int, metavar="W",
                   help=f"lookahead: window size W, tokens guessed in parallel ({bounds(LOOKAHEAD_WINDOW_KNOB)})")
    g.add_argument("--ngram", type=int, metavar="N", help=f"lookahead: n-gram size N ({bounds(LOOKAHEAD_NGRAM_KNOB)})")
    g.add_argument("--guess", type=int, metavar="G",
                   help=f"lookahead: n-grams verified per step, G ({bounds(LOOKAHEAD_GUESS_KNOB)})")
    g.add_argument("--tree", metavar="TREE",
                   help=f"medusa: candidate tree, a preset ({', '.join(TREE_PRESET_NAMES)}) or a JSON list of "
                        "paths such as '[[0], [0, 0], [1]]', each no deeper than the heads loaded (default: auto, "
                        "chosen for this device)")
    g.add_argument("--budget", choices=("auto", "off"),
                   help="every method but the baseline: 'auto' verifies only the candidates whose expected accepted "
                        "tokens pay for their cost on this device (measured once at load); 'off' verifies all "
                        "(default: auto)")
    g.add_argument("--members", metavar="LIST",
                   help="mixture: comma-separated drafters merged into one tree, among suffix, prompt_lookup, "
                        "recycling, lookahead, medusa (default: suffix,recycling,prompt_lookup)")
    g.add_argument("--acceptance", choices=("exact", "typical"),
                   help="medusa: 'exact' keeps the target's output (lossless); 'typical' accepts more tokens but "
                        "may change the output, tuned by --posterior-* (default: exact)")
    g.add_argument("--posterior-threshold", type=float, metavar="X",
                   help=f"medusa with --acceptance typical: accept a token when its probability exceeds "
                        f"min(threshold, alpha * exp(-entropy)) ({bounds(POSTERIOR_THRESHOLD_KNOB)})")
    g.add_argument("--posterior-alpha", type=float, metavar="X",
                   help=f"medusa with --acceptance typical: the alpha above ({bounds(POSTERIOR_ALPHA_KNOB)})")
    return ap


def load_engine(args: argparse.Namespace, methods: list[str]):
    """Load the target (and the draft when a chosen method needs one) into a ``compare.Engine``.

    Uses ``args.target, args.draft, args.medusa, args.draft_medusa, args.device, args.dtype``
    (through ``Engine.load``); logs loading stages to stderr.

    Raises:
        BenchError: a model cannot load, a bad device or dtype, or a chosen method cannot run.
    """
    from playground.engine import models
    from playground.engine.compare import Engine

    def log(fraction: float, message: str) -> None:
        print(f"  {message}", file=sys.stderr, flush=True)
    try:
        engine = Engine.load(args.target, getattr(args, "draft", None), getattr(args, "medusa", None),
                             getattr(args, "draft_medusa", None), args.device, args.dtype, log, methods=methods)
    except (models.ModelLoadError, ValueError) as e:
        raise BenchError(str(e)) from None
    for m in methods:
        reason = engine.unavailable_reason(m)
        if reason:
            raise BenchError(f"{m} cannot run: {reason}")
    return engine


def check_runnable(engine, specs: list, max_new_tokens: int, questions: list[Question]) -> None:
    """Check, once the models are loaded and before any run, everything that needs them.

    That is: ``max_new_tokens`` leaves room for a prompt in the target's context; every method builds
    its drafter with these settings and models (a Medusa tree deeper than the heads loaded,
    draft_model's ``medusa_heads`` proposer without heads for the draft, ...); and at least one
    question's first turn fits the context with ``max_new_tokens`` (questions that do not fit are
    skipped later, with a note). Building a drafter runs no model, except that Medusa's ``auto``
    tree is measured here, once, rather than in the first run.

    Args:
        engine: a loaded ``compare.Engine``.
        specs: the ``compare.MethodSpec`` of every method to run.
        max_new_tokens: new tokens per answer.
        questions: the questions to run.

    Raises:
        BenchError: naming the setting to change.
    """
    from playground.engine.tree import TreeChoicesError

    target = engine.target
    context = target.context_length
    if max_new_tokens >= context:
        raise BenchError(f"--max-new-tokens {max_new_tokens} leaves no room for the prompt: {target.name}'s context "
                         f"holds {context} tokens, prompt and answer together; use fewer new tokens")
    # The questions first: building drafters may time the device (Medusa's auto tree, the budget's
    # step cost), which a run refused for its questions should not wait for.
    _check_some_question_fits(engine, max_new_tokens, questions)
    for s in specs:
        try:
            engine.make_drafter(s)
        except TreeChoicesError as e:  # only a custom tree can fail here (presets fit any heads)
            raise BenchError(f"{s.name} cannot run: --tree: {e}") from None
        except ValueError as e:
            raise BenchError(f"{s.name} cannot run: {e}") from None


def _check_some_question_fits(engine, max_new_tokens: int, questions) -> None:
    """Raise BenchError (naming the largest --max-new-tokens that fits) when no first prompt fits."""
    target = engine.target
    context = target.context_length
    if not questions:
        return
    shortest = None
    for q in questions:
        try:
            length = len(engine.encode_prompt(q.turns[0]))
        except ValueError:  # longer than the whole context
            continue
        if length + max_new_tokens <= context:
            return
        shortest = length if shortest is None else min(shortest, length)
    longest_ok = context - (shortest if shortest is not None else context)
    hint = (f"the shortest first prompt is {shortest} tokens, so use --max-new-tokens {longest_ok} or fewer"
            if longest_ok >= 1 else "every first prompt alone fills the context; choose shorter questions")
    raise BenchError(f"no question fits {target.name}'s context of {context} tokens with --max-new-tokens "
                     f"{max_new_tokens}: {hint}")


def _parse_tree(text: str | None):
    if text is None:
        return None
    try:
        return json.loads(text) if text.strip().startswith("[") else text
    except json.JSONDecodeError as e:
        raise BenchError(f"--tree: the tree is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None


def _cpu_times() -> tuple[float, float] | None:
    """(busy, total) CPU time of the whole machine in clock ticks, from Linux's /proc/stat; None elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    if len(fields) < 5:
        return None
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def other_cpu_load(seconds: float = 0.5) -> float | None:
    """Cores kept busy by other processes, measured over ``seconds`` while this one sleeps (Linux); None
    where it cannot be measured. A benchmark's threads compete with them, and on a CPU a thread that
    loses its core stalls the others at every synchronisation, so timings become slow and noisy."""
    first = _cpu_times()
    if first is None:
        return None
    time.sleep(seconds)
    second = _cpu_times()
    if second is None or second[1] <= first[1]:
        return None
    return (second[0] - first[0]) / (second[1] - first[1]) * (os.cpu_count() or 1)


def main(argv: list[str] | None = None) -> int:
    return run_cli(build_parser(), _main, argv)


def run_cli(parser: argparse.ArgumentParser, body, argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run ``body(args)``; a :class:`BenchError` prints one line and gives exit code 2."""
    args = parser.parse_args(argv)
    try:
        return body(args)
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _main(args: argparse.Namespace) -> int:
    # 1. Everything that can be checked without a model: methods, knobs, settings, questions.
    from playground.engine.compare import METHODS, MethodSpec
    from playground.engine.decoding import GenerationSettings
    from playground.engine.sampling import SamplingConfig

    methods = parse_methods(args.methods)
    knobs = {flag: getattr(args, flag) for flag in KNOB_FLAGS}
    knobs["tree"] = _parse_tree(args.tree)
    params = method_params(methods, knobs)
    specs = [MethodSpec(m, params[m]) for m in methods]
    try:
        for s in specs:
            s.checked_params()
        settings = GenerationSettings(args.max_new_tokens, SamplingConfig(args.temperature, args.top_p,
                                                                          args.top_k, args.seed))
    except ValueError as e:
        raise BenchError(str(e)) from None
    if args.limit is not None and args.limit < 1:
        raise BenchError(f"--limit must be at least 1, got {args.limit}")
    if args.warmup < 0:
        raise BenchError(f"--warmup must be at least 0, got {args.warmup}")
    if args.threads is not None and args.threads < 1:
        raise BenchError(f"--threads must be at least 1, got {args.threads}")
    categories = [c.strip() for c in args.categories.split(",") if c.strip()] if args.categories else None
    questions = load_questions(args.questions, categories, args.limit)
    needs_draft = [m for m in methods if METHODS[m].needs_draft]
    from playground.engine.models import default_draft_spec

    if needs_draft and not default_draft_spec(args.target, args.draft):
        raise BenchError(f"{', '.join(needs_draft)} needs a draft model: add --draft MODEL (a smaller model with "
                         "the target's tokenizer: a hub id, a model folder or a .gguf file)")
    if args.draft and not needs_draft:
        print("note: --draft is loaded only for methods that need it; none is chosen", file=sys.stderr)
    if args.medusa and "medusa" not in methods:
        print("note: --medusa is loaded only for the medusa method, which is not chosen", file=sys.stderr)
    has_draft_heads = bool(args.draft_medusa) and args.draft_medusa.strip().lower() != "none"
    if params.get("draft_model", {}).get("proposer") == "medusa_heads" and not has_draft_heads:
        raise BenchError("--proposer medusa_heads needs Medusa heads trained on the draft model: add "
                         "--draft-medusa PATH_OR_HUB_ID, or use --proposer model")
    if has_draft_heads and "draft_model" not in methods:
        print("note: --draft-medusa is loaded only for the draft_model method, which is not chosen", file=sys.stderr)
    out_path = Path(args.out)
    try:
        out_path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BenchError(f"cannot write {args.out!r}: {e.strerror or e}") from None
    if out_path.is_dir() or not os.access(out_path.parent, os.W_OK) or \
            (out_path.exists() and not os.access(out_path, os.W_OK)):
        raise BenchError(f"cannot write {args.out!r}: not a writable file path")

    # 2. Models (a failure leaves an earlier results file untouched).
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    engine = load_engine(args, methods)
    check_runnable(engine, specs, settings.max_new_tokens, questions)
    target = engine.target
    dtype = str(target.dtype).removeprefix("torch.")
    turns = sum(len(q.turns) for q in questions)
    print(f"{target.name} on {target.device}, {dtype}, {torch.get_num_threads()} threads; "
          f"{len(questions)} questions, {turns} turns, methods {', '.join(methods)}, "
          f"max_new_tokens {settings.max_new_tokens}, temperature {settings.sampling.temperature}",
          file=sys.stderr, flush=True)

    busy = other_cpu_load()
    if busy is not None and busy >= 0.5 and torch.get_num_threads() > max(1, (os.cpu_count() or 1) - busy):
        print(f"warning: other processes keep about {busy:.1f} of this machine's {os.cpu_count()} cores busy; with "
              f"{torch.get_num_threads()} threads every method runs much slower and the timings are noisy. Run "
              f"on a quiet machine, or pass --threads {max(1, int((os.cpu_count() or 1) - busy))}.",
              file=sys.stderr, flush=True)

    # 3. Warm-up, then the timed runs, one flushed line per run.
    t0 = time.perf_counter()
    try:
        warm_up(engine, specs, settings, args.warmup)
        # Methods that learn across runs (suffix caches, recycling tables) forget the warm-up output:
        # the timed runs see only earlier questions' outputs of the same method.
        if hasattr(engine, "forget"):
            engine.forget("learned/")
    except ValueError as e:
        raise BenchError(f"warm-up failed: {e}") from None
    try:
        out_file = open(out_path, "w", encoding="utf-8")
    except OSError as e:
        raise BenchError(f"cannot write {args.out!r}: {e.strerror or e}") from None
    extra = {"temperature": settings.sampling.temperature, "dtype": dtype, "target": target.name}
    progress = _Progress(turns * len(specs), enabled=not args.no_progress)

    def write(rec: dict) -> None:
        out_file.write(record_line(rec))
        out_file.flush()
    try:
        with torch.inference_mode():
            runners = [engine_runner(engine, s, settings) for s in specs]
            records = run_benchmark(engine, questions, runners, settings.max_new_tokens, write, progress, extra)
    except ValueError as e:  # the engine's message about a setting or a prompt (TreeChoicesError is one)
        raise BenchError(f"run failed: {e}") from None
    finally:
        progress.close()
        out_file.close()
    if not records:
        raise BenchError(f"no question could be run: each was skipped because its prompt with --max-new-tokens "
                         f"{settings.max_new_tokens} exceeds {target.name}'s context of {target.context_length} "
                         f"tokens; use fewer new tokens or shorter questions")
    print(f"wrote {len(records)} records to {out_path} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    print(f"\n{target.name}, {dtype}, {target.device}, max_new_tokens {settings.max_new_tokens}, "
          f"temperature {settings.sampling.temperature}")
    print(format_table(summarize(records)), end="")
    if "medusa" in methods:
        print(medusa_summary(engine, records, params["medusa"].get("tree_choices")), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
