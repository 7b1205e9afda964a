"""The drafter interface every method implements: ``begin``, ``propose``, ``update``.

The decoding loop (:mod:`playground.engine.decoding`) never branches on a method's
name: it asks the drafter for :class:`~playground.engine.tree.Candidates`, verifies
them with the one verifier, and reports the verdict back through :meth:`Drafter.update`.
Plain autoregressive decoding is the drafter that proposes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .sampling import SamplingConfig
from .tree import Candidates


@dataclass
class DecodeState:
    """What a drafter may read when it proposes.

    Attributes:
        tokens: prompt plus every emitted token so far; ``tokens[-1]`` is the root of the
            next candidate tree (emitted, not yet in the target's KV cache).
        prompt_len: number of prompt tokens at the start of ``tokens``.
        sampling: the run's sampling settings (drafters that sample must use the same
            temperature / top-k / top-p transform as the target).
        generator: the run's seeded generator, None under greedy decoding.
        budget: the most candidate tokens worth proposing along any path this step
            (tokens left before max new tokens or the context end, minus the bonus token).
        device: the target's device.
        vocab_size: the target's vocabulary size (the width of ``draft_probs`` rows).
        features: ``(n, len(feature_layers) * hidden_size)`` the target's hidden states, at the
            layers the drafter names in ``feature_layers`` (concatenated in that order), of the
            positions committed to the target's cache since the previous ``propose``: every prompt
            position at the first step, then the previous root and its accepted path. Filled only
            for drafters with ``feature_layers`` (EAGLE reads them), else None.
    """

    tokens: list[int]
    prompt_len: int
    sampling: SamplingConfig
    generator: torch.Generator | None
    budget: int
    device: torch.device
    vocab_size: int
    features: torch.Tensor | None = None


@dataclass
class StepResult:
    """The verdict of one step, as drafters see it in :meth:`Drafter.update`.

    Attributes:
        candidates: what was proposed.
        path: accepted candidate indices, root to leaf.
        bonus_token: the target's token after the path.
        tokens: ``tokens`` of the state after the step (root and accepted path committed,
            the bonus token as the new root).
        extra_logits: ``(m, vocab_size)`` float32 logits of ``candidates.extras`` (None
            when the proposal had no extra queries).
        logits: ``(num_nodes + 1, vocab_size)`` float32 logits of the verification pass over the
            root and the candidates (row 0: the root; row i + 1: candidate i), extras excluded.
            Token recycling keeps their top-k; it costs nothing (the verifier computed them).
    """

    candidates: Candidates
    path: list[int]
    bonus_token: int
    tokens: list[int] = field(default_factory=list)
    extra_logits: torch.Tensor | None = None
    logits: torch.Tensor | None = None


class Drafter:
    """Base class of all drafters.

    Class attributes:
        name: method name used by the API, the benchmark and the UI.
        source: tag of the tokens it contributes (the UI colours tokens by it).
        lossless: whether greedy output must equal the baseline's token for token.
        typical: a :class:`~playground.engine.verify.TypicalAcceptance` to verify this drafter's
            candidates with typical acceptance instead of the exact rule; None = exact.
        feature_layers: indices of the target's hidden states the drafter reads
            (``DecodeState.features``), numbered as transformers' ``output_hidden_states``: 0 = the
            embeddings, i = the output of decoder layer i; the target computes only these (forward
            hooks), and only for drafters that name some. Empty: none.
        budget_cost: this device's step cost (:class:`~playground.engine.budget.StepCost`) when the
            ``budget`` knob is ``auto`` (the loop then prunes each proposal with
            :func:`~playground.engine.budget.apply_budget`); None: every candidate is verified.
    """

    name = "drafter"
    source = "draft"
    lossless = True
    typical = None
    feature_layers: tuple[int, ...] = ()
    budget_cost = None

    def begin(self, prompt_ids: list[int]) -> None:
        """Forget any previous sequence; a new run starts with ``prompt_ids``."""

    def propose(self, state: DecodeState) -> Candidates:
        """Return candidates rooted at ``state.tokens[-1]`` (at most ``state.budget`` deep)."""
        raise NotImplementedError

    def update(self, result: StepResult) -> None:
        """Learn from the step's verdict (roll back caches, update pools)."""

    def finish(self, tokens: list[int], prompt_len: int) -> None:
        """The run ended (EOS, max new tokens, a stop string or cancellation); ``tokens`` is the
        prompt plus every emitted token. Drafters that learn across runs (suffix decoding's global
        cache) add the output here; default: nothing."""

    def info(self) -> dict[str, int | float]:
        """Figures of this drafter's own state after the latest step, shown beside the run's
        statistics (``RunStats.drafter``; e.g. Lookahead's pool size and hits). Plain data;
        empty by default."""
        return {}
