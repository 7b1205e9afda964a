"""Sampling settings and the logits -> probabilities transform shared by target and draft.

Speculative sampling keeps the target's distribution only if the target's ``p`` and
the draft's ``q`` are both taken *after* the same temperature / top-k / top-p
processing (Leviathan et al. 2023, "Fast Inference from Transformers via
Speculative Decoding", Sec. 2.3; Chen et al. 2023, "Accelerating Large Language
Model Decoding with Speculative Sampling", Alg. 2). This module is that one
transform.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .limits import MIN_SAMPLING_TEMPERATURE, SEED_KNOB, TEMPERATURE_KNOB, TOP_K_KNOB, TOP_P_KNOB


@dataclass(frozen=True)
class SamplingConfig:
    """Decoding settings. ``temperature == 0`` means greedy (argmax) decoding.

    Raises:
        ValueError: when a value is outside its bound in :mod:`playground.engine.limits`; a temperature
            above 0 but below ``MIN_SAMPLING_TEMPERATURE`` (dividing logits by it overflows).
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "temperature", TEMPERATURE_KNOB.check(self.temperature))
        if 0 < self.temperature < MIN_SAMPLING_TEMPERATURE:
            raise ValueError(f"temperature must be 0 (greedy) or in [{MIN_SAMPLING_TEMPERATURE}, "
                             f"{TEMPERATURE_KNOB.maximum}], got {self.temperature}")
        object.__setattr__(self, "top_p", TOP_P_KNOB.check(self.top_p))
        object.__setattr__(self, "top_k", TOP_K_KNOB.check(self.top_k))
        object.__setattr__(self, "seed", SEED_KNOB.check(self.seed))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def generator(self, device: torch.device | str) -> torch.Generator:
        """A fresh ``torch.Generator`` on ``device`` seeded with ``seed``."""
        g = torch.Generator(device=device)
        g.manual_seed(self.seed)
        return g


def logits_to_probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Turn logits into the sampling distribution.

    Args:
        logits: ``(..., vocab_size)``, any float dtype.
        cfg: the sampling settings; must not be greedy (use argmax for greedy).

    Returns:
        ``(..., vocab_size)`` float32 probabilities after temperature, then top-k, then
        top-p (the smallest set of most likely tokens whose mass reaches ``top_p``; the
        token that crosses the threshold is kept).
    """
    if cfg.greedy:
        raise ValueError("logits_to_probs needs temperature > 0; greedy decoding uses argmax")
    x = logits.float() / cfg.temperature
    vocab = x.shape[-1]
    if 0 < cfg.top_k < vocab:
        kth = torch.topk(x, cfg.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        sorted_p = torch.softmax(sorted_x, dim=-1)
        # Mass strictly before each token; drop tokens whose preceding mass already reaches top_p.
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p
        drop_sorted = before >= cfg.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return torch.softmax(x, dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from ``probs`` of shape ``(vocab_size,)``."""
    if probs.dim() != 1:
        raise ValueError(f"probs must have shape (vocab_size,), got {tuple(probs.shape)}")
    return int(torch.multinomial(probs, 1, generator=generator).item())
