"""Teacher features for Medusa-head training: the target's last hidden state at every answer position
of self-generated conversations, with each head's label (the token k + 2 ahead) and, for
``--distill``, the target's stored top-k distribution aligned with each label. Computed by one
teacher-forced pass of the frozen target (Medusa-1, Cai et al. 2024)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from playground.training.cli import progress_bar as _bar
from playground.training.records import padded_batch

IGNORE = -100
"""Label of positions that no head is trained on (cross-entropy's ignore index)."""


@dataclass
class Features:
    """Cached training examples.

    Attributes:
        hidden: ``(num_examples, hidden_size)`` the target's last hidden states (storage dtype).
        labels: ``(num_examples, num_heads)`` int64; ``labels[i, k]`` is the token head k must
            predict (``IGNORE`` past the end of the conversation).
        teacher_ids: ``(num_examples, num_heads, top_k)`` int64 or None: the target's own top-k
            next-token ids at the position whose token ``labels[i, k]`` is (``IGNORE`` where the
            data stored none), for distillation (:func:`head_losses`).
        teacher_logprobs: ``(num_examples, num_heads, top_k)`` float32 or None: their
            log-probabilities under the target.
    """

    hidden: torch.Tensor
    labels: torch.Tensor
    teacher_ids: torch.Tensor | None = None
    teacher_logprobs: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.hidden.shape[0])


def _positions(ids: list[int], prompt_len: int, num_heads: int) -> tuple[list[int], list[list[int]]]:
    """Answer positions t (from the last prompt token on) with head labels ids[t + k + 2]."""
    positions, labels = [], []
    for t in range(max(prompt_len - 1, 0), len(ids) - 2):
        positions.append(t)
        labels.append([ids[t + k + 2] if t + k + 2 < len(ids) else IGNORE for k in range(num_heads)])
    return positions, labels


def _teacher(record: dict, positions: list[int], num_heads: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The stored teacher top-k (``teacher_top_ids`` / ``teacher_top_logprobs``, one row per answer
    token) for head k at position t: the row of token t + k + 2. Returns ``(ids, logprobs)``, each
    ``(len(positions), num_heads, top_k)`` (ids ``IGNORE`` where no row exists), or None when the
    record stores no teacher."""
    top_ids, top_lp = record.get("teacher_top_ids"), record.get("teacher_top_logprobs")
    if not top_ids or not top_lp:
        return None
    ids, lp = torch.tensor(top_ids, dtype=torch.long), torch.tensor(top_lp, dtype=torch.float32)  # (A, top_k)
    answer = torch.tensor(positions)[:, None] + torch.arange(num_heads)[None, :] + 2 - int(record["prompt_len"])
    valid = (answer >= 0) & (answer < ids.shape[0])
    rows = answer.clamp(0, ids.shape[0] - 1)
    return (torch.where(valid[..., None], ids[rows], IGNORE), torch.where(valid[..., None], lp[rows], 0.0))


@torch.inference_mode()
def collect_features(model, records: list[dict], num_heads: int, batch_size: int = 8, max_len: int = 1024,
                     storage_dtype: torch.dtype = torch.bfloat16, progress: bool = True,
                     saved_states: list[torch.Tensor | None] | None = None) -> Features:
    """Run the frozen ``model`` over the conversations; keep hidden states and labels at answer positions.

    Args:
        model: a transformers causal LM (frozen, eval mode).
        records: dicts with ``input_ids`` (list[int]) and ``prompt_len`` (int).
        num_heads: heads to label for.
        batch_size: conversations per forward pass (right-padded; causal attention keeps real
            tokens unaffected by the padding).
        max_len: conversations are cut to this many tokens.
        saved_states: per record, the states the data generator saved
            (:func:`playground.training.data.load_answer_states`, ``(L - P, hidden_size)``) or
            None; records that have them skip the forward pass.
    """
    device = next(model.parameters()).device
    saved_states = saved_states or [None] * len(records)
    hidden_parts, label_parts, teacher_parts = [], [], []

    def keep(record: dict, positions: list[int], labels: list[list[int]], hidden: torch.Tensor) -> None:
        hidden_parts.append(hidden)
        label_parts.append(torch.tensor(labels, dtype=torch.long))
        teacher_parts.append(_teacher(record, positions, num_heads))

    for r, states in zip(records, saved_states):
        if states is not None:
            ids, start = list(r["input_ids"][:max_len]), int(r["prompt_len"]) - 1
            positions, labels = _positions(ids, int(r["prompt_len"]), num_heads)
            if positions:
                keep(r, positions, labels, states[[t - start for t in positions]].to(storage_dtype))
    order = sorted((i for i in range(len(records)) if saved_states[i] is None),
                   key=lambda i: len(records[i]["input_ids"]))
    bar = _bar(len(order), "features", progress)
    for start in range(0, len(order), batch_size):
        batch = [records[i] for i in order[start:start + batch_size]]
        seqs = [list(r["input_ids"][:max_len]) for r in batch]
        ids, mask = padded_batch(seqs)
        out = model(input_ids=ids.to(device), attention_mask=mask.to(device), output_hidden_states=True,
                    logits_to_keep=1)
        states = out.hidden_states[-1]  # (batch, width, hidden_size), after the final norm
        for i, (s, r) in enumerate(zip(seqs, batch)):
            positions, labels = _positions(s, int(r["prompt_len"]), num_heads)
            if positions:
                keep(r, positions, labels, states[i, positions].to("cpu", storage_dtype))
        bar.update(len(batch))
    bar.close()
    if not hidden_parts:
        raise ValueError("no answer positions in the data: every conversation is shorter than its prompt + 3 tokens")
    features = Features(torch.cat(hidden_parts), torch.cat(label_parts))
    widths = {t[0].shape[-1] for t in teacher_parts if t is not None}
    if len(widths) == 1:  # every record with a teacher stores the same top-k; the others get none
        (top_k,) = widths
        filled = [t if t is not None else (torch.full((len(y), num_heads, top_k), IGNORE),
                                           torch.zeros(len(y), num_heads, top_k))
                  for t, y in zip(teacher_parts, label_parts)]
        features.teacher_ids = torch.cat([t[0] for t in filled])
        features.teacher_logprobs = torch.cat([t[1] for t in filled])
    return features
