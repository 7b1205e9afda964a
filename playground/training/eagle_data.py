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
