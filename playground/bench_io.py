"""Benchmark records to and from JSONL and CSV (the page's downloads; the CLI writes the same JSONL).

JSONL is exactly what ``python -m playground.bench --out`` writes (:func:`playground.bench.record_line`
per record). CSV holds the same records one row each, columns in order of first appearance; text
fields (:data:`TEXT_FIELDS`) are written as they are, every other value as JSON (numbers as
numbers, ``null`` for None, lists such as ``output_ids`` and dicts such as ``params`` as JSON text),
so :func:`from_csv` gives back equal records.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Iterable, Iterator

from playground.bench import record_line

TEXT_FIELDS = ("category", "method", "output_text", "finish_reason", "dtype", "target")
"""Fields written to CSV as plain text (all others are JSON-encoded)."""


def to_jsonl(records: Iterable[dict]) -> str:
    """The records as the CLI's results file: one JSON object a line."""
    return "".join(record_line(r) for r in records)


def iter_jsonl(text: str) -> Iterator[tuple[int, object]]:
    """``(line number, parsed value)`` for each non-blank line of JSONL text (numbered from 1).

    Raises:
        ValueError: a line that is not valid JSON (names the line number).
    """
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                yield n, json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"line {n}: not valid JSON ({e.msg})") from None


def from_jsonl(text: str) -> list[dict]:
    """Records from JSONL text (blank lines skipped).

    Raises:
        ValueError: a line that is not a JSON object (names the line number).
    """
    out = []
    for n, rec in iter_jsonl(text):
        if not isinstance(rec, dict):
            raise ValueError(f"line {n}: expected a JSON object, got {type(rec).__name__}")
        out.append(rec)
    return out


def to_csv(records: list[dict]) -> str:
    """The records as CSV text with a header row (see the module docstring for the encoding)."""
    columns = list(dict.fromkeys(k for r in records for k in r))
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for r in records:
        w.writerow(["" if c not in r else r[c] if c in TEXT_FIELDS and isinstance(r[c], str)
                    else json.dumps(r[c], ensure_ascii=False) for c in columns])
    return buf.getvalue()


def from_csv(text: str) -> list[dict]:
    """Records from :func:`to_csv`'s text (an empty non-text cell means the record lacks that field).

    Raises:
        ValueError: a non-text cell that is not valid JSON (names the row and column).
    """
    rows = list(csv.reader(io.StringIO(text)))
    if not rows:
        return []
    columns, out = rows[0], []
    for n, row in enumerate(rows[1:], 2):
        rec = {}
        for c, cell in zip(columns, row):
            if c in TEXT_FIELDS:  # an empty text cell is the empty string (bench records have every field)
                rec[c] = cell
                continue
            if cell == "":
                continue
            try:
                rec[c] = json.loads(cell)
            except json.JSONDecodeError:
                raise ValueError(f"row {n}, column {c!r}: not valid JSON: {cell[:40]!r}") from None
        out.append(rec)
    return out
