"""Code the target did not write, for teacher forcing: slices of this Python's own standard library.

The task generator (:mod:`playground.training.tasks`) gets few code tokens out of a 135M target
(its code requests are short and often filtered out: under 4 % of the answer tokens in
``data/selfgen/default``). An EAGLE head learns the target's next-token distribution at each
position from the target's own features, so any text the target reads teaches it (EAGLE-1 trained
on fixed ShareGPT text); only the labels must be the target's, and the teacher-forcing pass gives
them. Python's standard library is on every machine that runs the playground, so the records are
rebuilt here rather than committed (they are another project's text): each is a chat prompt asking
for the code of a module, then about ``piece_tokens`` tokens of its source, cut at line ends.

    python -m playground.training.code_text --out artifacts/code_text/stdlib.jsonl.gz --tokens 150000
    python -m playground.training.eagle --data data/selfgen/default artifacts/code_text/stdlib.jsonl.gz ...

Records are those of :mod:`playground.training.tasks` (``{"category": "code_text", "input_ids",
"prompt_len"}``); the trainer's loss covers the source tokens only. Files under ``test``/``tests``
folders and ``idlelib`` are skipped (mostly fixtures and GUI code); the order is a seeded shuffle of
the sorted file list, so the same Python gives the same records.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
import sysconfig
from pathlib import Path
from typing import Callable, Iterator

from playground.training.cli import HelpFormatter, int_at_least

SKIP_PARTS = {"test", "tests", "idlelib", "site-packages", "__pycache__"}
"""Folders of the standard library whose files are not used."""

REQUEST = "Write the Python code of `{name}`."
"""The user turn before each piece (our own words)."""


def source_files(root: str | Path, seed: int = 0) -> list[Path]:
    """The ``.py`` files under ``root`` outside :data:`SKIP_PARTS`, sorted, then shuffled with ``seed``."""
    root = Path(root)
    files = sorted(p for p in root.rglob("*.py") if not SKIP_PARTS & set(p.relative_to(root).parts[:-1]))
    random.Random(seed).shuffle(files)
    return files


def pieces(text: str, encode: Callable[[str], list[int]], piece_tokens: int) -> Iterator[list[int]]:
    """Token ids of consecutive runs of whole lines of ``text``, each about ``piece_tokens`` long
    (a run ends at the first line that reaches it; blank-only runs are dropped)."""
    lines, run, count = text.splitlines(keepends=True), [], 0
    for line in lines:
        run.append(line)
        count += max(1, len(line) // 3)  # a cheap estimate; the piece is encoded once, whole
        if count >= piece_tokens:
            ids = encode("".join(run))
            if "".join(run).strip():
                yield ids
            run, count = [], 0
    if run and "".join(run).strip():
        yield encode("".join(run))


def build_records(root: str | Path, chat: Callable[[str], str], encode: Callable[[str], list[int]], *,
                  tokens: int, piece_tokens: int = 256, seed: int = 0) -> list[dict]:
    """Records totalling at least ``tokens`` source tokens (or every file's): for each file in
    :func:`source_files` order, its first pieces (at most 4 a file, so many modules are seen).

    Args:
        root: the standard library folder (or any folder of ``.py`` files).
        chat: user text -> the chat-templated prompt string (generation prompt added).
        encode: text -> token ids, without special tokens.
    """
    root, out, total = Path(root), [], 0
    for f in source_files(root, seed):
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        name = ".".join(f.relative_to(root).with_suffix("").parts)
        prompt_ids = encode(chat(REQUEST.format(name=name)))
        for i, ids in enumerate(pieces(text, encode, piece_tokens)):
            if i >= 4:
                break
            out.append({"category": "code_text", "input_ids": prompt_ids + ids, "prompt_len": len(prompt_ids)})
            total += len(ids)
        if total >= tokens:
            break
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m playground.training.code_text", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--target", default="default", help="target whose tokenizer encodes the text")
    p.add_argument("--out", required=True, type=Path, help="records file (.jsonl.gz)")
    p.add_argument("--tokens", type=int_at_least(1), default=150_000, help="source tokens wanted")
    p.add_argument("--piece-tokens", type=int_at_least(16), default=256, help="about this many tokens a record")
    p.add_argument("--root", default=sysconfig.get_paths()["stdlib"], help="folder of .py files")
    p.add_argument("--seed", type=int, default=0)
    try:
        args = p.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    from playground.engine import ModelLoadError, load_model

    try:
        tok = load_model(args.target, device="cpu", dtype="float32").tokenizer
    except (ModelLoadError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    chat = lambda u: tok.apply_chat_template([{"role": "user", "content": u}], tokenize=False,  # noqa: E731
                                             add_generation_prompt=True)
    encode = lambda t: tok(t, add_special_tokens=False)["input_ids"]  # noqa: E731
    records = build_records(args.root, chat, encode, tokens=args.tokens, piece_tokens=args.piece_tokens,
                            seed=args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(args.out, "wt") as f:
        for r in records:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    n = sum(len(r["input_ids"]) - r["prompt_len"] for r in records)
    print(f"[code_text] {len(records)} records, {n} source tokens from {args.root} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
