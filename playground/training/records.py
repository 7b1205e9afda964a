"""Self-distilled conversation records on disk: reading them back, the answer states saved beside
them (the target's hidden states, per batch), and the held-out split (by conversation)."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import torch
from safetensors import safe_open


def _state_key(record: dict) -> str:
    """A record's key in its batch's state file: ``"<row>"``, or ``"<turn>.<row>"`` after the first turn."""
    turn = int(record.get("turn", 0))
    return f"{turn}.{record['row']}" if turn else str(record["row"])


def states_path(out_path: Path, batch: int) -> Path:
    """The hidden-state file of one batch: ``<out>.states/batch_<b>.safetensors``."""
    return Path(str(out_path) + ".states") / f"batch_{batch:05d}.safetensors"


def load_answer_states(out_path: str | Path, records: list[dict], target_name: str) -> list[torch.Tensor | None]:
    """The target's last hidden states saved with each record (``keep_states``), else None.

    For a record with ``prompt_len`` P and ``len(input_ids)`` L the tensor is ``(L - P, hidden_size)``
    bfloat16: the states at positions P - 1 … L - 2, the positions whose next token is an answer
    token. Records without a batch file, from another target, or whose state count does not match
    get None (the caller computes those itself).
    """
    out, by_batch = [], {}
    for r in records:
        if "batch" not in r or "row" not in r:
            out.append(None)
            continue
        b = int(r["batch"])
        if b not in by_batch:
            path = states_path(Path(out_path), b)
            by_batch[b] = None
            if path.exists():
                with safe_open(str(path), "pt") as f:
                    if (f.metadata() or {}).get("target") == target_name:
                        by_batch[b] = {k: f.get_tensor(k) for k in f.keys()}
        states = (by_batch[b] or {}).get(_state_key(r))
        ok = states is not None and states.shape[0] == len(r["input_ids"]) - int(r["prompt_len"])
        out.append(states if ok else None)
    return out


def _expand(paths: str | Path | list) -> list:
    """Files and folders -> files, a folder standing for its ``chunk_*.jsonl.gz`` in name order.

    Raises:
        FileNotFoundError: a folder without chunks.
    """
    out = []
    for one in (paths if isinstance(paths, (list, tuple)) else [paths]):
        if Path(one).is_dir():
            chunks = sorted(Path(one).glob("chunk_*.jsonl.gz"))
            if not chunks:
                raise FileNotFoundError(f"no chunk_*.jsonl.gz files in the folder {one}")
            out.extend(chunks)
        else:
            out.append(one)
    return out


def load_records(path: str | Path | list) -> list[dict]:
    """Every record of one conversations file, or of several in order (see the module docstring
    for the fields). With several files each record gets ``"source"``: its file's path.

    A file may be gzip-compressed (``.gz``); a folder stands for its ``chunk_*.jsonl.gz`` files in
    name order, as :mod:`playground.training.tasks` writes them (the committed ``data/selfgen/``).
    Records marked ``"sampled"`` (that generator's sampled passages) are left out: the draft and
    Medusa trainers take a record's answer tokens as the target's greedy choices.

    Raises:
        FileNotFoundError: no such file, or a folder without chunks; ValueError: a line lacks
            ``input_ids`` or ``prompt_len``.
    """
    if isinstance(path, (list, tuple)) or Path(path).is_dir():
        files = _expand(path)
        if len(files) == 1:
            return load_records(files[0])
        return [dict(r, source=str(one)) for one in files for r in load_records(one)]
    raw = Path(path).read_bytes()
    text = (gzip.decompress(raw) if str(path).endswith(".gz") else raw).decode()
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        r = json.loads(line)
        if "input_ids" not in r or "prompt_len" not in r:
            raise ValueError(f"{path}:{n}: a conversation record needs input_ids and prompt_len")
        if r.get("sampled"):  # a sampled passage of playground.training.tasks: not the target's greedy tokens
            continue
        records.append(r)
    return records


def load_states_for(paths: str | Path | list, records: list[dict], target_name: str) -> list[torch.Tensor | None]:
    """:func:`load_answer_states` for records read by :func:`load_records` from one file or several."""
    paths = _expand(paths)
    if len(paths) == 1:
        return load_answer_states(paths[0], records, target_name)
    by_source = {}
    for one in paths:
        part = [r for r in records if r.get("source") == str(one)]
        by_source.update(zip(map(id, part), load_answer_states(one, part, target_name)))
    return [by_source.get(id(r)) for r in records]


def split_records(records: list, held_out: float = 0.05, seed: int = 0) -> tuple[list, list]:
    """A deterministic train / held-out split (at least one held-out record when there are two or more).

    The turns of one multi-turn conversation (records with ``"turn"``, same file, batch and row)
    stay on one side, since a later turn's prompt holds the earlier answers.
    """
    groups: dict = {}
    for i, r in enumerate(records):
        key = (r.get("source"), r.get("batch"), r.get("row")) if "turn" in r else i
        groups.setdefault(key, []).append(i)
    keys = list(groups)
    random.Random(seed).shuffle(keys)
    target = min(max(1, int(len(records) * held_out)), len(records) - 1) if len(records) > 1 else 0
    held: set[int] = set()
    for key in keys:
        if len(held) >= target:
            break
        if len(held) + len(groups[key]) < len(records):
            held.update(groups[key])
    return ([r for i, r in enumerate(records) if i not in held], [r for i, r in enumerate(records) if i in held])


def padded_batch(seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token id lists right-padded into one batch: ``(ids, attention_mask)``, both ``(len(seqs),
    longest)`` int64 on the CPU (pad id 0, mask 1 on real tokens)."""
    width = max(len(x) for x in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, x in enumerate(seqs):
        ids[i, :len(x)] = torch.tensor(x)
        mask[i, :len(x)] = 1
    return ids, mask
