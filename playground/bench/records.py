"""Benchmark records: one JSON object per (question, turn, method), to and from JSONL and CSV.

JSONL is what ``python -m playground.bench --out`` writes (:func:`record_line` per record) and
what the page's download holds. CSV holds the same records one row each, columns in order of
first appearance; text fields (:data:`TEXT_FIELDS`), and any other text that could not be read as
JSON (``playground-run-1``, a prompt), are written as they are; None is an empty cell; every other
value is JSON (numbers as numbers, a text that looks like JSON quoted, lists such as ``output_ids``
and dicts such as ``params`` as JSON text), so :func:`from_csv` gives back equal records (None in a
field outside the contract reads back as a missing field).

Fields
    The contract fields (:data:`CONTRACT_FIELDS`) ``question_id, category, turn, method, params,
    new_tokens, steps, wall_s, ttft_s, tokens_per_s, mean_accepted_tokens, acceptance_rate,
    output_ids, output_text`` plus ``proposed, accepted, finish_reason, prompt_tokens,
    temperature, dtype, target, margins`` (the target's top-1 minus top-2 logit at each output
    token, used to tell a numerical near-tie from a real mismatch) and, with stop strings,
    ``stop_strings``. ``turn`` is 0-based. ``acceptance_rate`` is null when the method proposed
    nothing. ``output_ids`` are the engine's new ids: when the model stopped (``finish_reason``
    "eos") the last one is the EOS id, counted in ``new_tokens``, as transformers' ``generate()``
    does; ``output_text`` holds no special tokens. ``wall_s`` is the method's own time including
    the prefill (``ttft_s``).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from pathlib import Path
from typing import Iterable, Iterator

CONTRACT_FIELDS = ("question_id", "category", "turn", "method", "params", "new_tokens", "steps", "wall_s",
                   "ttft_s", "tokens_per_s", "mean_accepted_tokens", "acceptance_rate", "output_ids",
                   "output_text")
"""The fields every record holds (the benchmark's contract with the tools that read its files)."""
TEXT_FIELDS = ("category", "method", "output_text", "finish_reason", "dtype", "target")
"""Fields written to CSV as plain text (all others are JSON-encoded)."""


def record_line(rec: dict) -> str:
    """One record as the results file holds it: a JSON object and a newline."""
    return json.dumps(rec, ensure_ascii=False) + "\n"


def missing_fields(rec: dict) -> list[str]:
    """The :data:`CONTRACT_FIELDS` that ``rec`` lacks (empty for a complete record)."""
    return [f for f in CONTRACT_FIELDS if f not in rec]


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


def read_records(path: str | Path) -> list[dict]:
    """The records of a results file (JSONL, as ``--out`` writes it; gzip-compressed when its name ends
    in ``.gz``, as the committed ``data/bench/`` records are).

    Raises:
        OSError: the file cannot be read (or is not gzip data).
        ValueError: a line that is not a JSON object (names the file and the line number).
    """
    try:
        raw = Path(path).read_bytes()
        return from_jsonl((gzip.decompress(raw) if str(path).endswith(".gz") else raw).decode("utf-8"))
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def _json_like(text: str) -> bool:
    """Whether ``text`` would read back as a JSON value (``81``, ``true``, ``null``, ``[1]``) or could be
    mistaken for malformed JSON (it starts like a list, object or JSON string)."""
    if text == "" or text[:1] in "[{\"":
        return True
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


def _csv_cell(column: str, value) -> str:
    if value is None:
        return ""  # an empty cell, not the text "null"
    if isinstance(value, str) and (column in TEXT_FIELDS or not _json_like(value)):
        return value  # plain text, as a spreadsheet shows it: "playground-run-1", a prompt, a model name
    return json.dumps(value, ensure_ascii=False)


def to_csv(records: list[dict]) -> str:
    """The records as CSV text with a header row (see the module docstring for the encoding)."""
    columns = list(dict.fromkeys(k for r in records for k in r))
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for r in records:
        w.writerow([_csv_cell(c, r.get(c)) for c in columns])
    return buf.getvalue()


def from_csv(text: str) -> list[dict]:
    """Records from :func:`to_csv`'s text. An empty cell is the empty string in a text field, null in a
    contract field (``acceptance_rate``), and elsewhere means the record lacks that field; a cell that
    is not JSON (and does not start like JSON) is text.

    Raises:
        ValueError: a cell that starts like JSON (``[``, ``{``, ``"``) but is not valid JSON (names the
            row and column).
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
                if c in CONTRACT_FIELDS:
                    rec[c] = None
                continue
            try:
                rec[c] = json.loads(cell)
            except json.JSONDecodeError:
                if _json_like(cell):
                    raise ValueError(f"row {n}, column {c!r}: not valid JSON: {cell[:40]!r}") from None
                rec[c] = cell  # plain text
        out.append(rec)
    return out


def measured_fields(stats: dict, output_ids: list[int], output_text: str, margins: list[float],
                    finish_reason: str | None) -> dict:
    """The measured part of one record (everything but the question, turn, method and params).

    Args:
        stats: a run's statistics as ``RunStats.as_dict()`` gives them (``new_tokens``, ``steps``,
            ``elapsed_s``, ``ttft_s`` (seconds), ``tokens_per_s``, ``tau``, ``alpha``, ``proposed``,
            ``accepted``).
        output_ids: the new token ids, ``(new_tokens,)``; output_text: their text.
        margins: the target's top-1 minus top-2 logit at each output token, ``(new_tokens,)``.
        finish_reason: why the run ended (``"eos"``, ``"length"``, ``"stop"``, ``"cancelled"``...).

    The benchmark's runner and the page's run export both build records with it, so both
    files read back with :func:`from_jsonl` / :func:`from_csv` and summarise alike.

    Raises:
        KeyError: ``stats`` lacks one of the fields above.
    """
    return {"new_tokens": stats["new_tokens"], "steps": stats["steps"], "wall_s": stats["elapsed_s"],
            "ttft_s": stats["ttft_s"], "tokens_per_s": stats["tokens_per_s"], "mean_accepted_tokens": stats["tau"],
            "acceptance_rate": stats["alpha"], "proposed": stats["proposed"], "accepted": stats["accepted"],
            "finish_reason": finish_reason, "output_ids": list(output_ids), "output_text": output_text,
            "margins": [round(float(x), 5) for x in margins]}
