"""The benchmark: Spec-Bench and HumanEval questions run by every chosen method, one record per
(question, turn, method), summarised per category and overall.

``python -m playground.bench`` is the command line (:mod:`.cli`); ``python -m
playground.bench.hf`` compares the engine with transformers' ``generate()`` (:mod:`.hf`).
The page's Benchmark tab and the training tools use the library API below, never the command
line's internals:

* :mod:`.questions`: :class:`Question`, :func:`load_questions` (categories, ``per_category``,
  ``limit``), the built-in sets.
* :mod:`.runner`: :func:`prepare` (every run check, once) -> :class:`Benchmark` (``warm_up``,
  ``iter``, ``run``), :func:`order_methods`, :func:`check_specs`, :class:`Progress`; for other
  backends (which bring their own :class:`Runner`): :func:`run_all`, :func:`iter_runs`.
* :mod:`.summary`: :func:`summarize`, :func:`table_cells`, :func:`format_table`,
  :func:`leaderboard`, :func:`check_records`.
* :mod:`.records`: :data:`CONTRACT_FIELDS`, :func:`measured_fields` (a record's measured part),
  :func:`record_line`, JSONL and CSV to and from records.
* :class:`BenchError`: a usage error, shown as one line.

No submodule imports torch or the engine at import time (``--help`` stays fast).
"""

from __future__ import annotations

from .errors import BenchError
from .questions import (ASSETS, BUILTIN_SETS, HUMANEVAL_CATEGORY, HUMANEVAL_TEMPLATE, Question, load_questions,
                        per_category, question_dict, question_from_dict, read_questions)
from .records import (CONTRACT_FIELDS, TEXT_FIELDS, from_csv, from_jsonl, iter_jsonl, measured_fields,
                      missing_fields, read_records, record_line, to_csv, to_jsonl)
from .runner import (WARMUP_PROMPT, WARMUP_TOKENS, Benchmark, Progress, Runner, check_runnable, check_specs,
                     engine_runner, iter_runs, order_methods, prepare, run_all)
from .summary import TABLE_HEADER, check_records, format_table, leaderboard, summarize, table_cells

__all__ = ["ASSETS", "BUILTIN_SETS", "BenchError", "Benchmark", "CONTRACT_FIELDS", "HUMANEVAL_CATEGORY",
           "HUMANEVAL_TEMPLATE", "Progress", "Question", "Runner", "TABLE_HEADER", "TEXT_FIELDS", "check_records",
           "check_runnable", "check_specs", "format_table", "from_csv", "from_jsonl", "iter_jsonl", "leaderboard",
           "load_questions", "measured_fields", "missing_fields", "order_methods", "per_category", "prepare",
           "question_dict", "question_from_dict", "read_questions", "read_records", "record_line", "summarize", "table_cells",
           "to_csv", "to_jsonl", "WARMUP_PROMPT", "WARMUP_TOKENS", "engine_runner", "iter_runs", "run_all"]
