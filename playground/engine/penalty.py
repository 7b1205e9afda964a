"""The target's repetition penalty, applied along every candidate path, and the target's own
generation settings (its ``generation_config``).

Repetition penalty (Keskar et al. 2019, "CTRL", eq. 2; transformers'
``RepetitionPenaltyLogitsProcessor``): for every token id x that occurs anywhere in the sequence so
far (prompt and generated tokens), its logit l becomes ``l / penalty`` when ``l > 0`` and
``l * penalty`` otherwise; other logits are unchanged. It is applied to the raw logits, before
temperature, top-k and top-p (transformers runs its logits processors before its warpers).

In a verification pass each row of logits has its own "sequence so far": the root row sees the
output so far, the row after candidate i sees the output plus the path from the root to i. The
penalty is applied to each row with its own path, so the verifier decides every token exactly as
``generate()`` would decide it one token at a time: greedy speculative output still equals the
baseline, and the baseline equals ``generate(repetition_penalty=...)``.
"""

from __future__ import annotations

import torch

from .limits import REPETITION_PENALTY_KNOB

HONOURED_FROM_MODEL = ("repetition_penalty",)
"""Settings of the target's ``generation_config`` that every run applies (unless the caller sets them)."""

SUGGESTED_FROM_MODEL = ("do_sample", "temperature", "top_p", "top_k")
"""Sampling defaults of the target's ``generation_config`` that are reported, not forced: runs are
greedy unless the caller asks for sampling, so that lossless methods can be checked against the
baseline token for token."""

NOT_HONOURED = ("no_repeat_ngram_size", "encoder_repetition_penalty", "bad_words_ids", "min_length",
                "min_new_tokens", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "sequence_bias",
                "suppress_tokens", "begin_suppress_tokens", "forced_bos_token_id", "forced_eos_token_id",
                "num_beams", "renormalize_logits", "exponential_decay_length_penalty")
"""``generation_config`` settings the engine does not implement: reported (``ignored``) when the
target sets them to a non-default value."""


def apply_repetition_penalty(logits: torch.Tensor, context_ids: list[int], parents: torch.Tensor | None,
                             node_tokens: torch.Tensor | None, penalty: float) -> torch.Tensor:
    """Repetition-penalised logits of a verification pass, each row with its own path.

    Args:
        logits: ``(num_nodes + 1, vocab_size)`` float; row 0 predicts the token after
            ``context_ids``, row i + 1 the token after candidate i.
        context_ids: the sequence so far (prompt + output, ending at the root token).
        parents: ``(num_nodes,)`` parent index of each candidate (-1: child of the root), or None
            when there are no candidates.
        node_tokens: ``(num_nodes,)`` the candidates' tokens (None with ``parents``).
        penalty: > 0; 1.0 returns ``logits`` unchanged (no work).

    Returns:
        ``(num_nodes + 1, vocab_size)``: a new tensor (``logits`` is not changed).

    Raises:
        ValueError: ``logits`` rows disagree with the number of candidates.
    """
    if penalty == 1.0:
        return logits
    n = 0 if parents is None else int(parents.shape[0])
    if logits.dim() != 2 or logits.shape[0] != n + 1:
        raise ValueError(f"logits must have shape (num_nodes + 1, vocab_size) = ({n + 1}, V), "
                         f"got {tuple(logits.shape)}")
    vocab = logits.shape[-1]
    device = logits.device
    # 1. Tokens of the sequence so far: seen by every row (ids beyond the output vocabulary dropped).
    ctx = torch.as_tensor(context_ids, dtype=torch.long, device=device).clamp(max=vocab)
    seen = torch.zeros(vocab + 1, dtype=torch.bool, device=device)
    seen[ctx] = True
    mask = seen.expand(n + 1, vocab + 1).clone()
    # 2. Each candidate's row also sees the candidate and its ancestors.
    if n:
        par, tok = parents.tolist(), node_tokens.tolist()
        rows, cols = [], []
        for i in range(n):
            node = i
            while node >= 0:
                rows.append(i + 1)
                cols.append(min(tok[node], vocab))
                node = par[node]
        mask[torch.tensor(rows, device=device), torch.tensor(cols, device=device)] = True
    mask = mask[:, :vocab]
    # 3. The penalty: divide positive logits, multiply negative ones.
    penalised = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(mask, penalised, logits)


def repetition_penalty_reference(logits: torch.Tensor, sequences: list[list[int]], penalty: float) -> torch.Tensor:
    """Slow, obvious penalty: row r is penalised for the tokens of ``sequences[r]``, one by one,
    as transformers' processor does for a batch; tests compare :func:`apply_repetition_penalty`."""
    out = logits.clone()
    for r, seq in enumerate(sequences):
        for x in set(seq):
            if x < out.shape[-1]:
                v = logits[r, x]
                out[r, x] = v * penalty if v < 0 else v / penalty  # in the logits' dtype
    return out


def model_generation_settings(model) -> dict:
    """What the target's own ``generation_config`` asks for, sorted by what the engine does with it.

    Args:
        model: a transformers model (its ``generation_config`` may be absent, as for a bare model).

    Returns:
        ``{"applied": {...}, "suggested": {...}, "ignored": {...}}``: ``applied`` holds
        :data:`HONOURED_FROM_MODEL` settings that differ from transformers' defaults (every run uses
        them unless the caller sets its own); ``suggested`` the model's sampling defaults
        (:data:`SUGGESTED_FROM_MODEL`, shown, not forced); ``ignored`` the settings of
        :data:`NOT_HONOURED` that the model sets and the engine does not implement.
    """
    config = getattr(model, "generation_config", None)
    out: dict[str, dict] = {"applied": {}, "suggested": {}, "ignored": {}}
    if config is None:
        return out
    try:
        from transformers import GenerationConfig
        defaults = GenerationConfig()
    except Exception:  # pragma: no cover - transformers always has it
        defaults = None

    def changed(name: str):
        value = getattr(config, name, None)
        default = getattr(defaults, name, None) if defaults is not None else None
        return value is not None and value != default, value

    for kind, names in (("applied", HONOURED_FROM_MODEL), ("ignored", NOT_HONOURED)):
        for name in names:
            is_set, value = changed(name)
            if is_set:
                out[kind][name] = value
    if getattr(config, "do_sample", False):  # generate() samples with these (its defaults included)
        out["suggested"] = {name: getattr(config, name, None) for name in SUGGESTED_FROM_MODEL}
    return out


def model_repetition_penalty(model) -> float:
    """The target's ``generation_config.repetition_penalty`` (1.0 when unset).

    Raises:
        ValueError: the model's value is outside ``REPETITION_PENALTY_KNOB``'s bounds (it cannot be
            honoured; give ``repetition_penalty`` explicitly).
    """
    value = model_generation_settings(model)["applied"].get("repetition_penalty", 1.0)
    try:
        return REPETITION_PENALTY_KNOB.check(value)
    except ValueError as e:
        raise ValueError(f"the target's generation_config sets repetition_penalty={value!r}, which cannot be "
                         f"honoured ({e}); set repetition_penalty in GenerationSettings") from None
