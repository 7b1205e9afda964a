"""Benchmark summaries: pure functions of the records (the command line and the page share them).

:func:`summarize` (records -> rows per category and overall), :func:`table_cells` /
:func:`format_table` (the printed table), :func:`leaderboard` (one line per method, as
Spec-Bench lays it out), :func:`medusa_summary` and :func:`check_records` (the checks a
review runs on a results file). Speedup is total tokens over total seconds against the
autoregressive baseline; tau is total tokens over total steps; a lossless method under greedy
decoding is compared with the baseline by ``output_ids``.
"""

from __future__ import annotations

from typing import Iterable

from .weather import speed_clock

TABLE_HEADER = ("method", "runs", "tokens", "tokens/s", "speedup", "tau", "alpha", "lossless")
"""Columns of :func:`table_cells` (and of the printed table)."""


def _dtype(name: str | None):
    import torch

    return getattr(torch, name, torch.float32) if isinstance(name, str) else torch.float32


def _key(r: dict) -> tuple[str, int]:
    return str(r["question_id"]), r.get("turn", 0)


def lossless_cell(records: list[dict], base: dict) -> tuple[str, dict]:
    """Compare a lossless method's records with the baseline's, key by key.

    Args:
        records: the method's records.
        base: ``(str(question_id), turn)`` -> the baseline's record.

    Returns:
        ``(cell, detail)``: cell ``"yes"``, ``"no (...)"`` or ``"-"`` (nothing to compare);
        detail counts ``compared``, ``differ``, ``near_ties`` and ``after_earlier_turn``.
        A differing turn whose previous turn already differed saw a different conversation, so it
        is counted apart ("after an earlier turn differed") rather than as a mismatch of its own.
    """
    from playground.engine import check_lossless

    by_key = {_key(r): r for r in records}
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


def _checked(method: str, records: list[dict], lossless: set[str] | None) -> bool:
    """Whether ``method``'s records are compared with the baseline: the registry's rule
    (``lossless_check_applies``: greedy, and lossless with these params) for every record, and,
    when ``lossless`` is given, the method is in it (else it must be a registered method)."""
    from playground.engine import METHODS, lossless_check_applies

    if (method not in lossless) if lossless is not None else (method not in METHODS):
        return False
    return all(lossless_check_applies(method, r.get("params") or {}, float(r.get("temperature") or 0.0))
               for r in records)


def _alpha(rs: list[dict]) -> float | None:
    proposed = sum(r.get("proposed") or 0 for r in rs)
    if proposed:
        return sum(r.get("accepted") or 0 for r in rs) / proposed
    # records without proposed/accepted counts: mean of the per-run rates
    rates = [r["acceptance_rate"] for r in rs if r.get("acceptance_rate") is not None]
    return sum(rates) / len(rates) if rates and not any("proposed" in r for r in rs) else None


def summarize(records: list[dict], baseline: str | None = None, lossless: Iterable[str] | None = None) -> list[dict]:
    """Aggregate benchmark records per category and overall.

    Args:
        records: dicts as written by the benchmark (at least ``question_id, category, turn,
            method, new_tokens, steps, wall_s, output_ids``; ``proposed/accepted``,
            ``margins``, ``dtype``, ``params`` and ``temperature`` are used when present).
        baseline: the method speedups and losslessness are measured against (default: the
            engine's ``BASELINE``, autoregressive).
        lossless: methods whose greedy output must equal the baseline's (default: the registry's
            rule, ``lossless_check_applies``, for registered methods).

    Returns:
        One dict per (category, method), categories in order of first appearance, then
        ``"overall"``: ``category, method, runs, new_tokens, wall_s, tokens_per_s`` (total tokens
        / total seconds), ``speedup`` (over the baseline in the same category; None without
        one; from ``steady_steps`` instead of seconds where every record has them: round-robin
        runs, :mod:`playground.bench.weather`), ``tau`` (total tokens / total steps), ``alpha``
        (total accepted / total proposed; None when nothing was proposed), ``lossless`` (``"yes"``, ``"no (...)"``, ``"baseline"``
        or ``"-"`` when not applicable: a lossy method, or sampling) and ``lossless_detail``.
    """
    if baseline is None:
        from playground.engine import BASELINE as baseline
    lossless = set(lossless) if lossless is not None else None
    categories = list(dict.fromkeys(r["category"] for r in records))
    methods = list(dict.fromkeys(r["method"] for r in records))
    if baseline in methods:
        methods.remove(baseline)
        methods.insert(0, baseline)
    clock = speed_clock(records)

    def rate(rs):  # tokens per unit of the clock the speedup is read from
        return sum(r["new_tokens"] for r in rs) / max(1e-9, sum(r[clock] for r in rs))

    rows = []
    for cat in categories + ["overall"]:
        group = [r for r in records if cat == "overall" or r["category"] == cat]
        by_method = {m: [r for r in group if r["method"] == m] for m in methods}
        base_records = by_method.get(baseline) or []
        base_rate = rate(base_records) if base_records else None
        base_by_key = {_key(r): r for r in base_records}
        for m in methods:
            rs = by_method[m]
            if not rs:
                continue
            tokens = sum(r["new_tokens"] for r in rs)
            tps = tokens / max(1e-9, sum(r["wall_s"] for r in rs))
            if m == baseline:
                cell, detail = "baseline", {}
            elif base_records and _checked(m, rs, lossless):
                cell, detail = lossless_cell(rs, base_by_key)
            else:
                cell, detail = "-", {}
            rows.append({
                "category": cat, "method": m, "runs": len(rs), "new_tokens": tokens,
                "wall_s": sum(r["wall_s"] for r in rs), "tokens_per_s": tps,
                "speedup": rate(rs) / base_rate if base_rate else None,
                "tau": tokens / max(1, sum(r["steps"] for r in rs)), "alpha": _alpha(rs),
                "lossless": cell, "lossless_detail": detail,
            })
    return rows


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


def medusa_summary(engine, records: list[dict], tree) -> str:
    """Lines naming the Medusa tree used and each head's acceptance over the medusa records."""
    from playground.engine import TREE_KNOB, describe_medusa_tree, head_acceptance

    rs = [r for r in records if r["method"] == "medusa" and r.get("accepted_at") is not None]
    if not rs:
        return ""
    depth = max(len(r["accepted_at"]) for r in rs)
    acc = [sum(r["accepted_at"][i] for r in rs if i < len(r["accepted_at"])) for i in range(depth)]
    prop = [sum(r["proposed_at"][i] for r in rs if i < len(r["proposed_at"])) for i in range(depth)]
    heads = head_acceptance({"per_position_acceptance": [a / p if p else 0.0 for a, p in zip(acc, prop)]})
    lines = [f"medusa tree: {describe_medusa_tree(engine, tree if tree is not None else TREE_KNOB.default)}",
             "medusa per-head acceptance (share of steps accepting head k's token; given head k-1 accepted): " +
             ", ".join(f"head {h['head']} {h['rate']:.1%} ({h['conditional']:.1%})" for h in heads)]
    return "\n".join(lines) + "\n"


def check_records(records: list[dict], lossless: Iterable[str] = (), min_speedup: dict[str, float] | None = None,
                  min_tau: dict[str, float] | None = None, baseline: str | None = None) -> list[str]:
    """The checks a review runs on a results file, with this project's own code.

    Losslessness: every ``lossless`` method's ``output_ids`` equal the baseline's for each
    (question, turn) both ran. Speedup: a method's total tokens over total seconds against the
    baseline's; tau: total tokens over total steps. Every record must hold the contract fields.

    Returns:
        The problems found, one line each (empty when every check passes).
    """
    from .records import missing_fields

    if baseline is None:
        from playground.engine import BASELINE as baseline
    problems = [f"record {i + 1} lacks {', '.join(missing_fields(r))}" for i, r in enumerate(records)
                if missing_fields(r)]
    by: dict[str, dict] = {}
    for r in records:
        by.setdefault(r.get("method"), {})[_key(r)] = r
    base = by.get(baseline)
    if not base:
        return problems + [f"no {baseline} records"]

    def tps(m: str) -> float:
        rs = by[m].values()
        return sum(r["new_tokens"] for r in rs) / max(1e-9, sum(r["wall_s"] for r in rs))
    for m in lossless:
        if m not in by:
            problems.append(f"{m}: no records")
            continue
        bad = [k for k, r in by[m].items() if k in base and r["output_ids"] != base[k]["output_ids"]]
        if bad:
            problems.append(f"{m}: {len(bad)}/{len(by[m])} outputs differ from {baseline} (e.g. {bad[0]})")
    for m, bar in (min_speedup or {}).items():
        if m not in by:
            problems.append(f"{m}: no records")
        elif tps(m) / tps(baseline) < bar:
            problems.append(f"{m}: speedup {tps(m) / tps(baseline):.2f} below {bar}")
    for m, bar in (min_tau or {}).items():
        if m not in by:
            problems.append(f"{m}: no records")
            continue
        tau = sum(r["new_tokens"] for r in by[m].values()) / max(1, sum(r["steps"] for r in by[m].values()))
        if tau < bar:
            problems.append(f"{m}: tau {tau:.2f} below {bar}")
    return problems
