"""Checking a prompt given as token ids (:meth:`~playground.engine.engine.Engine.check_prompt_ids`)."""

from __future__ import annotations

import numbers


def check_prompt_ids(prompt_ids, vocab: int) -> list[int]:
    """``prompt_ids`` as a list of ints, checked against a vocabulary of ``vocab`` tokens.

    Any 1-D sequence of integers is accepted: a list, a tuple, a 1-D tensor or array (read once,
    so a generator works too).

    Raises:
        TypeError: text, booleans, or anything but integer token ids.
        ValueError: an empty prompt, or an id outside ``[0, vocab)``.
    """
    wrong = ("prompt_ids must be a list of integer token ids (or a tuple, 1-D tensor or array): "
             "encode text with Engine.encode_prompt first")
    shape = getattr(prompt_ids, "shape", None)
    if shape is not None and not isinstance(prompt_ids, (list, tuple)):
        if len(shape) != 1:
            raise TypeError(f"prompt_ids must be 1-D (prompt_len,), got shape {tuple(shape)}")
        dtype = str(getattr(prompt_ids, "dtype", ""))
        if "int" not in dtype:
            raise TypeError(f"{wrong}; got an array of {dtype.removeprefix('torch.')}")
        prompt_ids = prompt_ids.tolist()  # tensors and arrays
    if isinstance(prompt_ids, (str, bytes, dict)) or not hasattr(prompt_ids, "__iter__"):
        raise TypeError(wrong)
    ids = []
    for t in prompt_ids:  # one pass: a generator is read once
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise TypeError(f"{wrong}; got an element {t!r} ({type(t).__name__})")
        ids.append(int(t))
    if not ids:
        raise ValueError("the prompt is empty: type something to generate from")
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise ValueError(f"token id {bad[0]} is outside the target's vocabulary of {vocab} tokens")
    return ids
