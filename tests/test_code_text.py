"""The code-text records for teacher forcing: whole lines, about the asked size, the prompt before
each piece, skipped folders left out, the same records for the same seed."""

from __future__ import annotations

from playground.training.code_text import build_records, pieces, source_files


def _encode(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_pieces_are_whole_lines_of_about_the_asked_size():
    text = "".join(f"x_{i} = {i} * 2\n" for i in range(200))
    got = list(pieces(text, _encode, 60))
    assert "".join("".join(map(chr, p)) for p in got) == text
    assert all("".join(map(chr, p)).endswith("\n") for p in got)
    assert len(got) > 5 and all(len(p) <= 3 * 60 + 2 * 16 for p in got)  # about 3 characters a token, lines up to 16


def test_records_skip_test_folders_and_are_seeded(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "test").mkdir()
    for i in range(6):
        (tmp_path / "pkg" / f"m{i}.py").write_text("".join(f"def f{j}():\n    return {j}\n" for j in range(40)))
    (tmp_path / "test" / "test_x.py").write_text("assert True\n" * 50)
    files = source_files(tmp_path, seed=1)
    assert len(files) == 6 and all("test" not in f.parts for f in files)
    chat = lambda u: f"<user>{u}<assistant>"  # noqa: E731
    a = build_records(tmp_path, chat, _encode, tokens=500, piece_tokens=80, seed=1)
    b = build_records(tmp_path, chat, _encode, tokens=500, piece_tokens=80, seed=1)
    assert a == b and sum(len(r["input_ids"]) - r["prompt_len"] for r in a) >= 500
    first = a[0]
    prompt = "".join(map(chr, first["input_ids"][:first["prompt_len"]]))
    assert prompt.startswith("<user>Write the Python code of `pkg.m") and prompt.endswith("<assistant>")
    assert all(r["category"] == "code_text" for r in a)
