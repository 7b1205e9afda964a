"""Incremental detokenisation: the text each new token adds, safe for multi-byte characters.

Decoding token by token breaks characters split across byte-level tokens. This keeps a
small window of ids before the newest ones, decodes the window with and without them,
and emits the difference, holding back text that ends in U+FFFD (an incomplete
character) until a later token completes it.
"""

from __future__ import annotations


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text pieces.

    Args:
        tokenizer: a transformers tokenizer (``decode`` is all that is used).
        context_ids: ids already shown (e.g. the prompt), used only as left context so
            that the first piece gets its leading space right.
    """

    def __init__(self, tokenizer, context_ids: list[int] | None = None):
        self.tokenizer = tokenizer
        self.ids: list[int] = list(context_ids or [])[-4:]
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def add(self, token_id: int) -> str:
        """Append one token id; return the text it completes ("" while a character is pending)."""
        self.ids.append(token_id)
        before = self._decode(self.ids[self.prefix_offset:self.read_offset])
        after = self._decode(self.ids[self.prefix_offset:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return after[len(before):]
        return ""

    def flush(self) -> str:
        """Text still held back at the end (an incomplete character decodes as U+FFFD)."""
        before = self._decode(self.ids[self.prefix_offset:self.read_offset])
        after = self._decode(self.ids[self.prefix_offset:])
        self.prefix_offset = self.read_offset = len(self.ids)
        return after[len(before):]
