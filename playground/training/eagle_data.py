"""The EAGLE trainer's records: reading the generator's chunks, the held-out split, and the draft
vocabulary (:mod:`playground.training.eagle` uses them; kept apart so each file stays short)."""

from __future__ import annotations

import gzip
import hashlib
import json
from collections import Counter
from pathlib import Path

import torch


def read_records(sources: list[str | Path]) -> list[dict]:
    """Records ``{"input_ids", "prompt_len", "chunk"}`` from chunk folders (``chunk_*.jsonl.gz``),
    ``.jsonl.gz`` or ``.jsonl`` files, in a stable order; ``chunk`` names the file a record came from."""
    out = []
    for src in sources:
        p = Path(src)
        files = sorted(p.glob("chunk_*.jsonl.gz")) if p.is_dir() else [p]
        for f in files:
            opener = gzip.open if f.suffix == ".gz" else open
            with opener(f, "rt") as fh:
                for line in fh:
                    if line.strip():
                        r = json.loads(line)
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
    """The ``size`` most frequent answer tokens (plus ``always``), sorted; and their share of answer tokens."""
    counts = Counter()
    for r in records:
        counts.update(r["input_ids"][r["prompt_len"]:])
    chosen = [t for t in always if 0 <= t < vocab_size]
    for t, _ in counts.most_common():
        if len(chosen) >= size:
            break
        if t not in chosen:
            chosen.append(t)
    rest = [t for t in range(vocab_size) if t not in set(chosen)]
    chosen += rest[:size - len(chosen)]
    total = sum(counts.values()) or 1
    share = sum(counts[t] for t in chosen) / total
    return torch.tensor(sorted(chosen), dtype=torch.long), share


def extend_vocabulary(draft_ids: torch.Tensor, records: list[dict], size: int, vocab_size: int) -> torch.Tensor:
    """``draft_ids`` grown to ``size`` ids: the most frequent answer tokens of ``records`` not in it yet
    (then the lowest unused ids, should the records know too few), sorted.

    Raises:
        ValueError: ``size`` smaller than ``len(draft_ids)`` or larger than ``vocab_size``.
    """
    if not len(draft_ids) <= size <= vocab_size:
        raise ValueError(f"cannot grow a draft vocabulary of {len(draft_ids)} ids to {size} (target vocabulary "
                         f"{vocab_size})")
    chosen = set(int(t) for t in draft_ids)
    counts = Counter()
    for r in records:
        counts.update(r["input_ids"][r["prompt_len"]:])
    ranked = [t for t, _ in counts.most_common() if 0 <= t < vocab_size] + list(range(vocab_size))
    for t in ranked:
        if len(chosen) >= size:
            break
        chosen.add(t)
    return torch.tensor(sorted(chosen), dtype=torch.long)


def extended_output_rows(old_ids: torch.Tensor, old_rows: torch.Tensor, new_ids: torch.Tensor,
                         target_rows: torch.Tensor) -> torch.Tensor:
    """Output rows for a grown draft vocabulary: the trained rows where a head has them, and for the
    ids it lacks the target's own output rows mapped by the linear map that best carries the target's
    rows of the old ids onto the head's trained rows (least squares).

    The head's rows start from the target's and drift in training (on the default target's head by
    about half their norm); the fitted map carries that drift over to the new rows, so their logits
    start on the trained rows' scale rather than the target's.

    Args:
        old_ids: ``(n,)`` target ids of the head's draft vocabulary; old_rows: ``(n, hidden)`` its rows.
        new_ids: ``(m,)`` sorted target ids of the grown vocabulary (a superset of ``old_ids``).
        target_rows: ``(vocab_size, hidden)`` the target's output layer.

    Returns:
        ``(m, hidden)`` float32 rows in ``new_ids`` order.

    Raises:
        ValueError: ``new_ids`` missing an id of ``old_ids``.
    """
    old = {int(t): i for i, t in enumerate(old_ids)}
    if not set(old) <= set(int(t) for t in new_ids):
        raise ValueError("the grown vocabulary must keep every id of the old one")
    target_rows = target_rows.float()
    fit = torch.linalg.lstsq(target_rows[old_ids], old_rows.float()).solution  # (hidden, hidden)
    mapped = target_rows[new_ids] @ fit
    keep = torch.tensor([old.get(int(t), -1) for t in new_ids])
    rows = mapped.clone()
    rows[keep >= 0] = old_rows.float()[keep[keep >= 0]]
    return rows
