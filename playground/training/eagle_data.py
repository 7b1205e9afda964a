"""The EAGLE trainer's records and vocabulary: reading the generator's chunks, the held-out split, the
draft vocabulary, and growing a trained head's vocabulary with its new output rows
(:mod:`playground.training.eagle` uses them; kept apart so each file stays short)."""

from __future__ import annotations

import gzip
import hashlib
import json
from collections import Counter
from pathlib import Path

import torch


def read_records(sources: list[str | Path]) -> list[dict]:
    """Records ``{"input_ids", "prompt_len", "chunk"}`` from chunk folders (``chunk_*.jsonl.gz``),
    ``.jsonl.gz`` or ``.jsonl`` files, in a stable order; ``chunk`` names the file a record came from.

    Raises:
        OSError: a file that cannot be read; ValueError: a line that is not JSON or not such a record.
    """
    out = []
    for src in sources:
        p = Path(src)
        files = sorted(p.glob("chunk_*.jsonl.gz")) if p.is_dir() else [p]
        for f in files:
            opener = gzip.open if f.suffix == ".gz" else open
            with opener(f, "rt") as fh:
                for n, line in enumerate(fh, 1):
                    if line.strip():
                        r = json.loads(line)
                        if not isinstance(r, dict) or "input_ids" not in r or "prompt_len" not in r:
                            raise ValueError(f"{f}:{n}: a conversation record needs input_ids and prompt_len "
                                             "(the data generator's records, playground.training.tasks)")
                        out.append({"input_ids": r["input_ids"], "prompt_len": int(r["prompt_len"]),
                                    "category": r.get("category", ""), "chunk": str(f)})
    return out


def split_held_out(records: list[dict], share: float, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Deterministic split by a hash of each record's ids (stable as data grows)."""
    train, held = [], []
    for r in records:
        h = int(hashlib.sha1(json.dumps(r["input_ids"][:64]).encode()).hexdigest()[:8], 16)
        (held if (h % 10_000) < share * 10_000 else train).append(r)
    return train, held


def drop_seen_answers(train: list[dict], held: list[dict]) -> list[dict]:
    """The held-out records whose answer (the ids after the prompt) no training record also has.

    The generator asks alike requests and its greedy answers coincide (2,831 of the 13,370 answers in
    ``data/selfgen/default`` copy another record's), so without this the held-out figures count
    answers the head was trained on. Training is unchanged: only the evaluation set shrinks.
    """
    seen = {tuple(r["input_ids"][r["prompt_len"]:]) for r in train}
    return [r for r in held if tuple(r["input_ids"][r["prompt_len"]:]) not in seen]


def draft_vocabulary(records: list[dict], size: int, vocab_size: int, always: list[int]) -> tuple[torch.Tensor, float]:
    """The ``size`` most frequent answer tokens (plus ``always``, first), then the lowest unused ids should
    the records know too few, sorted; and their share of answer tokens (:func:`answer_share`)."""
    chosen = dict.fromkeys(int(t) for t in always if 0 <= t < vocab_size)
    counts = _answer_counts(records)
    for t in [t for t, _ in counts.most_common() if 0 <= t < vocab_size] + list(range(vocab_size)):
        if len(chosen) >= size:
            break
        chosen.setdefault(t)
    ids = torch.tensor(sorted(chosen), dtype=torch.long)
    return ids, _share(counts, ids)


def _answer_counts(records: list[dict]) -> Counter:
    counts = Counter()
    for r in records:
        counts.update(r["input_ids"][r["prompt_len"]:])
    return counts


def _share(counts: Counter, ids: torch.Tensor) -> float:
    return sum(counts[int(t)] for t in ids) / max(1, sum(counts.values()))


def answer_share(records: list[dict], ids: torch.Tensor) -> float:
    """The share of the records' answer tokens that are among ``ids`` (a draft vocabulary's coverage)."""
    return _share(_answer_counts(records), ids)


def extend_vocabulary(draft_ids: torch.Tensor, records: list[dict], size: int, vocab_size: int) -> torch.Tensor:
    """``draft_ids`` grown to ``size`` ids: the most frequent answer tokens of ``records`` not in it yet
    (then the lowest unused ids, should the records know too few), sorted (:func:`draft_vocabulary`
    with the old ids always in).

    Raises:
        ValueError: ``size`` smaller than ``len(draft_ids)`` or larger than ``vocab_size``.
    """
    if not len(draft_ids) <= size <= vocab_size:
        raise ValueError(f"cannot grow a draft vocabulary of {len(draft_ids)} ids to {size} (target vocabulary "
                         f"{vocab_size})")
    return draft_vocabulary(records, size, vocab_size, [int(t) for t in draft_ids])[0]


def extended_output_rows(old_ids: torch.Tensor, old_rows: torch.Tensor, new_ids: torch.Tensor,
                         target_rows: torch.Tensor) -> torch.Tensor:
    """Output rows for a grown draft vocabulary: the trained rows where a head has them, and for the
    ids it lacks the target's own output rows mapped by the linear map that best carries the target's
    rows of the old ids onto the head's trained rows (least squares).

    The head's rows start from the target's and drift in training (on the default target's head by
    about half their norm); the fitted map carries that drift over to the new rows, so their logits
    start on the trained rows' scale rather than the target's.

    Args:
        old_ids: ``(n,)`` target ids of the head's draft vocabulary.
        old_rows: ``(n, head_hidden)`` the head's trained output rows.
        new_ids: ``(m,)`` sorted target ids of the grown vocabulary (a superset of ``old_ids``).
        target_rows: ``(vocab_size, target_hidden)`` the target's output layer (any device and dtype).

    Returns:
        ``(m, head_hidden)`` float32 rows on the CPU, in ``new_ids`` order (the fit runs on the CPU: a
        few thousand rows, and ``lstsq`` is not on every device).

    Raises:
        ValueError: ``new_ids`` missing an id of ``old_ids``.
    """
    old_ids, new_ids = old_ids.cpu(), new_ids.cpu()
    old = {int(t): i for i, t in enumerate(old_ids)}
    if not set(old) <= set(int(t) for t in new_ids):
        raise ValueError("the grown vocabulary must keep every id of the old one")
    old_rows = old_rows.detach().float().cpu()
    fit = torch.linalg.lstsq(target_rows[old_ids.to(target_rows.device)].float().cpu(), old_rows).solution
    rows = target_rows[new_ids.to(target_rows.device)].float().cpu() @ fit  # (target_hidden, head_hidden) map
    keep = torch.tensor([old.get(int(t), -1) for t in new_ids])
    rows[keep >= 0] = old_rows[keep[keep >= 0]]
    return rows
