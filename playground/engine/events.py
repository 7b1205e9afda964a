"""Step events and run statistics: the one place where tau and alpha are defined.

Terms (as Spec-Bench and the speculative decoding papers use them):

* a *step* is one target forward pass (the prefill counts as the first step; it
  emits the first new token);
* *tau*, mean accepted tokens per step = new tokens / steps, the bonus (or
  correction) token included, so plain autoregressive decoding has tau = 1;
* *alpha*, acceptance rate = accepted draft tokens / proposed draft tokens.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Iterator

log = logging.getLogger(__name__)

# Sources of emitted tokens. The verifier tags each token; the UI maps them to colours.
SOURCE_TARGET = "target"
"""The bonus or correction token sampled from the target itself."""
SOURCE_DRAFT = "draft"
SOURCE_PROMPT_LOOKUP = "prompt_lookup"
SOURCE_LOOKAHEAD = "lookahead"
"""A token accepted from Lookahead decoding's n-gram pool."""


@dataclass
class RunStats:
    """Running totals of one decoding run.

    All times are seconds of wall-clock time spent in this run's own steps (on
    CUDA the clock is read after a device synchronise).
    """

    new_tokens: int = 0
    steps: int = 0
    proposed: int = 0
    accepted: int = 0
    elapsed_s: float = 0.0
    ttft_s: float = 0.0
    prefill_tokens: int = 0
    # Time split of decode steps (prefill excluded).
    draft_s: float = 0.0
    verify_s: float = 0.0
    # Per-position acceptance: accepted_at[i] counts steps whose i-th drafted token was accepted;
    # proposed_at[i] counts steps that proposed at least i+1 tokens on the accepted path's depth.
    proposed_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    # (elapsed seconds, total new tokens) after each step, for charts.
    timeline: list[tuple[float, int]] = field(default_factory=list)
    # The drafter's own figures after the latest step (``Drafter.info()``), e.g. Lookahead's pool.
    drafter: dict = field(default_factory=dict)

    def record_step(self, *, seconds: float, emitted: int, proposed: int = 0, accepted: int = 0,
                    draft_s: float = 0.0, verify_s: float = 0.0, proposed_depth: int = 0,
                    prefill: bool = False) -> None:
        """Add one step.

        Args:
            seconds: wall time of the step (drafting plus verification), seconds.
            emitted: tokens emitted by the step (accepted candidates plus the bonus token,
                after truncation at EOS or the token limit).
            proposed: candidate tokens the drafter proposed (all nodes of the tree).
            accepted: candidate tokens accepted (bonus token not included).
            draft_s, verify_s: the split of ``seconds`` between drafting and verifying.
            proposed_depth: depth of the proposal (longest root-to-leaf path), for the
                per-position acceptance counts.
            prefill: whether this is the prefill step (its time is the time to first token).
        """
        self.steps += 1
        self.new_tokens += emitted
        self.proposed += proposed
        self.accepted += accepted
        self.elapsed_s += seconds
        self.draft_s += draft_s
        self.verify_s += verify_s
        if prefill:
            self.ttft_s = seconds
        while len(self.proposed_at) < proposed_depth:
            self.proposed_at.append(0)
            self.accepted_at.append(0)
        for i in range(proposed_depth):
            self.proposed_at[i] += 1
        for i in range(min(accepted, proposed_depth)):
            self.accepted_at[i] += 1
        self.timeline.append((self.elapsed_s, self.new_tokens))

    def snapshot(self) -> "RunStats":
        """A copy that later steps leave unchanged (each event carries the totals after its step)."""
        return replace(self, proposed_at=list(self.proposed_at), accepted_at=list(self.accepted_at),
                       timeline=list(self.timeline), drafter=dict(self.drafter))

    @property
    def tokens_per_s(self) -> float:
        """New tokens per second of this run's own time (prefill included)."""
        return self.new_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """New tokens after the first per second after the prefill."""
        t = self.elapsed_s - self.ttft_s
        return (self.new_tokens - 1) / t if t > 0 and self.new_tokens > 1 else 0.0

    @property
    def tau(self) -> float:
        """Mean accepted tokens per step (bonus token included): new tokens / steps."""
        return self.new_tokens / self.steps if self.steps else 0.0

    @property
    def alpha(self) -> float | None:
        """Acceptance rate: accepted / proposed draft tokens; None when nothing was proposed."""
        return self.accepted / self.proposed if self.proposed else None

    @property
    def per_position_acceptance(self) -> list[float]:
        """Fraction of steps whose i-th drafted token was accepted, among steps that drafted one."""
        return [a / p if p else 0.0 for a, p in zip(self.accepted_at, self.proposed_at)]

    def as_dict(self) -> dict:
        """Plain-data summary (for JSON, the UI and pickling across processes)."""
        return {
            "new_tokens": self.new_tokens,
            "steps": self.steps,
            "proposed": self.proposed,
            "accepted": self.accepted,
            "elapsed_s": self.elapsed_s,
            "ttft_s": self.ttft_s,
            "tokens_per_s": self.tokens_per_s,
            "tau": self.tau,
            "alpha": self.alpha,
            "draft_s": self.draft_s,
            "verify_s": self.verify_s,
            "per_position_acceptance": self.per_position_acceptance,
            "drafter": dict(self.drafter),
        }


@dataclass
class StepTree:
    """What one step verified: the candidate tree, the accepted path, the bonus token, the timing.

    Plain lists (no tensors, no text), cheap to pickle (ZeroGPU) and to keep for the step inspector.
    Chains (draft model, prompt lookup) are trees with one path; a plain step (the prefill, the
    baseline, or a proposal the per-step budget dropped) has no nodes.

    Attributes:
        tokens: ``(num_nodes,)`` candidate token ids, as verified (after the per-step budget).
        parents: ``(num_nodes,)`` parent index of each node, ``-1`` for children of the root (the
            last emitted token); ``parents[i] < i``.
        sources: ``num_nodes`` source tags (``draft``, ``medusa_head_2``, ``eagle_d3``, ...).
        depths: ``(num_nodes,)`` depth of each node, 1 for children of the root.
        path: accepted node indices, root to leaf (may be empty).
        bonus_token: the target's own token after the path (bonus or correction).
        draft_s: seconds spent proposing (0 for the prefill); verify_s: seconds of the target pass,
            the verdict and the commit (the prefill's whole time for step 0).
        extra_queries: the drafter's own extra queries in the same pass (Lookahead's Jacobi window),
            counted in the pass's size but not verified.

    The event's ``tokens`` are the path's tokens plus the bonus token, except at the last step,
    where EOS, the token limit or a stop string may cut them short (a prefix of them).
    """

    tokens: list[int]
    parents: list[int]
    sources: list[str]
    depths: list[int]
    path: list[int]
    bonus_token: int
    draft_s: float
    verify_s: float
    extra_queries: int = 0

    @property
    def rejected(self) -> list[int]:
        """Node indices off the accepted path, in order (rejected, or under a rejected node)."""
        on = set(self.path)
        return [i for i in range(len(self.tokens)) if i not in on]

    @property
    def pass_size(self) -> int:
        """Queries in the step's target pass: the root, every node and the extra queries."""
        return 1 + len(self.tokens) + self.extra_queries

    @classmethod
    def of(cls, candidates, path: list[int], bonus_token: int, draft_s: float, verify_s: float) -> "StepTree":
        """Pack a verified :class:`~playground.engine.tree.Candidates` (its tensors turned into lists)."""
        parents = candidates.parents.tolist()
        depths: list[int] = []
        for p in parents:
            depths.append(1 if p < 0 else depths[p] + 1)
        extras = candidates.extras
        return cls(candidates.tokens.tolist(), parents, list(candidates.sources), depths, [int(c) for c in path],
                   int(bonus_token), float(draft_s), float(verify_s), len(extras) if extras is not None else 0)

    def as_dict(self) -> dict:
        """Plain data: the fields plus ``rejected``."""
        return {"tokens": list(self.tokens), "parents": list(self.parents), "sources": list(self.sources),
                "depths": list(self.depths), "path": list(self.path), "rejected": self.rejected,
                "bonus_token": self.bonus_token, "draft_s": self.draft_s, "verify_s": self.verify_s,
                "extra_queries": self.extra_queries}


@dataclass
class StepEvent:
    """What one step of one method produced.

    Attributes:
        method: the method's name (``autoregressive``, ``prompt_lookup``, ``draft_model``, ...).
        step: 0 for the prefill step, then 1, 2, ...
        tokens: token ids emitted by this step, in order, ``(num_emitted,)``.
        sources: source of each emitted token (``SOURCE_TARGET`` for the bonus/correction
            token, the drafter's source tag for accepted candidates), same length as ``tokens``.
        pieces: ``(text, source)`` pairs: the text this step adds to the output, split by
            token where the detokeniser allows (a multi-byte character split across tokens is
            attributed to the token that completes it). Concatenated over all events, the
            texts equal the final output text.
        proposed: candidates proposed this step; accepted: candidates accepted this step.
        seconds: wall time of this step.
        margins: the target's top-1 minus top-2 logit at each emitted token's position,
            same length as ``tokens`` (used to tell a numerical near-tie from a bug).
        stats: the run's totals after this step.
        finished: whether the run is over; finish_reason is ``"eos"``, ``"length"``,
            ``"stop"``, ``"cancelled"`` or ``"error"`` when it is.
        tree: what the step verified (:class:`StepTree`); None for the closing event of a
            cancelled or failed run (no step ran).
        error: with finish reason ``"error"``, what went wrong (``"TypeName: message"``; see
            :func:`round_robin`), else None.
    """

    method: str
    step: int
    tokens: list[int]
    sources: list[str]
    pieces: list[tuple[str, str]]
    proposed: int
    accepted: int
    seconds: float
    margins: list[float]
    stats: RunStats
    finished: bool = False
    finish_reason: str | None = None
    tree: StepTree | None = None
    error: str | None = None


def round_robin(streams: list[tuple[str, Iterator[StepEvent]]]) -> Iterator[StepEvent]:
    """The events of several methods' runs, one step of each in turn, until all have finished.

    Args:
        streams: ``(method, its events)`` pairs, e.g. ``Engine.run``'s per-method generators.

    One method failing does not end the others: when a stream raises an ``Exception`` (a bug met
    on some model, the device running out of memory), its method ends with one last event of no
    tokens, finish reason ``"error"`` and the exception's text in ``error`` (its traceback goes to
    this module's log), carrying the statistics of its last step, and the other methods go on.
    """
    live = [[method, stream, None] for method, stream in streams]  # method, stream, its last event
    while live:
        for entry in list(live):
            method, stream, last = entry
            try:
                event = next(stream, None)
            except Exception as e:  # noqa: BLE001 - reported in the method's last event and the log
                log.exception("%s failed after %d steps", method, 0 if last is None else last.step + 1)
                live.remove(entry)
                yield StepEvent(method, 0 if last is None else last.step + 1, [], [], [], 0, 0, 0.0, [],
                                replace(last.stats) if last is not None else RunStats(), finished=True,
                                finish_reason="error", error=f"{type(e).__name__}: {e}")
                continue
            if event is None:
                live.remove(entry)
                continue
            entry[2] = event
            yield event
            if event.finished:
                live.remove(entry)


@dataclass
class RunOutput:
    """Everything one method produced in a run (filled as its events arrive)."""

    method: str
    params: dict
    ids: list[int] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    margins: list[float] = field(default_factory=list)
    text: str = ""
    last: StepEvent | None = None

    def add(self, event: StepEvent) -> None:
        self.ids.extend(event.tokens)
        self.sources.extend(event.sources)
        self.margins.extend(event.margins)
        self.text += "".join(p for p, _ in event.pieces)
        self.last = event
