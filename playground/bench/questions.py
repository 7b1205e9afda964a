"""Benchmark questions: Spec-Bench and HumanEval rows, the built-in sets, and sampling.

Spec-Bench rows ``{"question_id", "category", "turns": [user message, ...]}`` run turn after
turn; HumanEval rows ``{"task_id", "prompt"}`` (category ``humaneval``) become one chat turn,
:data:`HUMANEVAL_TEMPLATE` (the code inside a fenced block after "Complete the following Python
function:"), because the targets are chat models and Spec-Bench feeds every task through the
chat template too. The built-in sets in ``assets/bench/`` are selectable by name
(:data:`BUILTIN_SETS`).

Sampling (:func:`load_questions`), in this order: keep the chosen categories; then, with
``per_category=N``, the first N questions of each category in file order (the same sample on
every run and machine, every category represented: the Spec-Bench file starts with 80 MT-bench
questions, so its first rows are all of one kind); then, with ``limit=N``, the first N of what
is left. The order of the file is kept throughout.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from .errors import BenchError
from .records import iter_jsonl

ASSETS = Path(__file__).resolve().parents[2] / "assets" / "bench"
BUILTIN_SETS = {"spec_bench": ASSETS / "spec_bench_dev.jsonl", "humaneval": ASSETS / "humaneval_dev.jsonl"}
"""Built-in question sets (see assets/bench/), selectable by name with --questions."""
HUMANEVAL_CATEGORY = "humaneval"
HUMANEVAL_TEMPLATE = "Complete the following Python function:\n```python\n{prompt}\n```"
"""User message built from a HumanEval ``prompt`` (signature and docstring, trailing whitespace stripped)."""


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


def per_category(questions: list[Question], n: int) -> list[Question]:
    """The first ``n`` questions of each category, in file order (deterministic).

    Raises:
        BenchError: ``n`` is below 1.
    """
    if n < 1:
        raise BenchError(f"--per-category must be at least 1, got {n}")
    taken: dict[str, int] = {}
    out = []
    for q in questions:
        if taken.get(q.category, 0) < n:
            taken[q.category] = taken.get(q.category, 0) + 1
            out.append(q)
    return out


def read_questions(path: str | Path) -> list[Question]:
    """Every question of a JSONL file (or a built-in set's name), in file order.

    Raises:
        BenchError: missing or unreadable file, bad JSON, a row in neither format, duplicate ids,
            or no question at all.
    """
    path = BUILTIN_SETS.get(str(path), Path(path))
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise BenchError(f"cannot read questions file {str(path)!r}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise BenchError(f"questions file {str(path)!r} is not UTF-8 text") from None
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
    return questions


def load_questions(path: str | Path, categories: Iterable[str] | None = None, limit: int | None = None,
                   per_category_n: int | None = None) -> list[Question]:
    """Read a question file (or a built-in set's name) and sample it (see the module docstring):
    keep ``categories``, then the first ``per_category_n`` of each category, then the first ``limit``.

    Raises:
        BenchError: as :func:`read_questions`; a category the file does not have; ``limit`` or
            ``per_category_n`` below 1.
    """
    if limit is not None and limit < 1:
        raise BenchError(f"--limit must be at least 1, got {limit}")
    if per_category_n is not None and per_category_n < 1:
        raise BenchError(f"--per-category must be at least 1, got {per_category_n}")
    questions = read_questions(path)
    if categories:
        wanted = set(categories)
        present = {q.category for q in questions}
        missing = wanted - present
        if missing:
            raise BenchError(f"no questions in categories {', '.join(sorted(missing))}; the file has "
                             f"{', '.join(sorted(present))}")
        questions = [q for q in questions if q.category in wanted]
    if per_category_n is not None:
        questions = per_category(questions, per_category_n)
    return questions[:limit] if limit is not None else questions


def question_dict(q: Question) -> dict:
    """A question as plain data (``question_id``, ``category``, ``turns``), e.g. to cross a process boundary."""
    return {"question_id": q.question_id, "category": q.category, "turns": list(q.turns)}


def question_from_dict(d: dict) -> Question:
    """The inverse of :func:`question_dict`."""
    return Question(d["question_id"], d["category"], tuple(d["turns"]))
