"""Draft-model speculative decoding: a small draft model proposes a chain of K tokens.

Sources: Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
Decoding"; Chen et al. 2023, "Accelerating Large Language Model Decoding with
Speculative Sampling". The draft keeps its own KV cache; after each verification it is
rolled back to the longest prefix it shares with the committed sequence, and the tokens
it has not seen yet (the accepted tail and the bonus token) are fed on the next
proposal, in the same forward pass as the first drafted token.
"""

from __future__ import annotations

import torch

from .drafter import DecodeState, Drafter, StepResult
from .events import SOURCE_DRAFT
from .limits import K_KNOB
from .sampling import logits_to_probs
from .target import CausalLM
from .tree import Candidates


def _fit_vocab(q: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Pad (with zeros) or cut ``q`` ``(draft_vocab,)`` to ``(vocab_size,)``.

    Embedding tables are often padded past the tokenizer's vocabulary; the tokenizer check
    at load time guarantees that the ids both models use mean the same strings.
    """
    if q.shape[-1] == vocab_size:
        return q
    if q.shape[-1] > vocab_size:
        q = q[..., :vocab_size]
        return q / q.sum(-1, keepdim=True)
    return torch.nn.functional.pad(q, (0, vocab_size - q.shape[-1]))


class DraftModelDrafter(Drafter):
    """Chain drafter backed by a smaller causal LM that shares the target's tokenizer.

    Args:
        draft: the draft model wrapper.
        k: speculative tokens K (gamma) per step, in ``[1, MAX_SPECULATIVE_TOKENS]``.

    Raises:
        ValueError: when ``k`` is out of range.
    """

    name = "draft_model"
    source = SOURCE_DRAFT

    def __init__(self, draft: CausalLM, k: int = K_KNOB.default):
        self.draft = draft
        self.k = K_KNOB.check(k)
        self.cache = None
        self.fed: list[int] = []  # token ids held in the draft's KV cache, in order

    def begin(self, prompt_ids: list[int]) -> None:
        self.cache = self.draft.new_cache()
        self.fed = []

    def _sync_cache(self, tokens: list[int]) -> list[int]:
        """Roll the cache back to its common prefix with ``tokens``; return the unseen tail."""
        common = 0
        limit = min(len(self.fed), len(tokens))
        while common < limit and self.fed[common] == tokens[common]:
            common += 1
        if common < len(self.fed):
            CausalLM.crop(self.cache, common)
            del self.fed[common:]
        return tokens[common:]

    def propose(self, state: DecodeState) -> Candidates:
        k = min(self.k, state.budget)
        if k <= 0:
            return Candidates.empty(state.device)
        pending = self._sync_cache(state.tokens)
        drafted: list[int] = []
        q_rows: list[torch.Tensor] = []
        for i in range(k):
            # 1. Feed what the draft has not seen (the unseen tail, then each drafted token).
            feed = torch.tensor(pending if i == 0 else [drafted[-1]], dtype=torch.long)
            logits = self.draft.forward(self.cache, feed)[-1]
            self.fed.extend(feed.tolist())
            # 2. Draft the next token: argmax, or a sample from q after the shared transform.
            if state.sampling.greedy:  # only ids the target has (the draft's table may be padded)
                drafted.append(int(logits[:state.vocab_size].argmax()))
            else:
                q = _fit_vocab(logits_to_probs(logits, state.sampling), state.vocab_size).to(state.device)
                drafted.append(int(torch.multinomial(q, 1, generator=state.generator).item()))
                q_rows.append(q)
        draft_probs = torch.stack(q_rows) if q_rows else None
        return Candidates.chain(drafted, self.source, draft_probs, device=state.device)

    def update(self, result: StepResult) -> None:
        # Rejected drafted tokens are dropped lazily, by the next propose's _sync_cache.
        pass
