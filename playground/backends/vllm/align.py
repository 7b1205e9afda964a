"""The client's error type; vLLM's per-request speculative-decoding metrics, and aligning them with the streamed chunks:
which chunk was which verification step, and how many of its tokens were accepted drafts."""

from __future__ import annotations

from dataclasses import dataclass


class VLLMError(RuntimeError):
    """A vLLM server refused a request, answered something this client cannot read, or could
    not be reached. The message names the server's URL and, where it gave one, its reason."""


MAX_ALIGN_STATES = 200_000
"""Search states :func:`align_steps` may visit before it gives up on an exact alignment."""


@dataclass(frozen=True)
class SpecDecodeMetrics:
    """vLLM's per-request speculative-decoding figures (``metrics.speculative_decoding``).

    Attributes:
        num_spec_steps: verification steps that had a draft.
        num_draft_tokens: draft tokens proposed in all.
        num_accepted_draft_tokens: draft tokens accepted (bonus tokens not counted).
        num_spec_tokens: the server's ``num_speculative_tokens``.
        acceptance_histogram: ``(num_spec_tokens + 1,)``, steps that accepted exactly j drafts.
        per_step_accepted, per_step_drafted: per step with a draft, in order (empty unless the
            server runs ``--per-request-spec-decode-metrics detailed``).
    """

    num_spec_steps: int
    num_draft_tokens: int
    num_accepted_draft_tokens: int
    num_spec_tokens: int
    acceptance_histogram: tuple[int, ...] = ()
    per_step_accepted: tuple[int, ...] = ()
    per_step_drafted: tuple[int, ...] = ()

    @classmethod
    def from_json(cls, d: dict) -> "SpecDecodeMetrics":
        """Read the response's ``speculative_decoding`` object.

        Raises:
            VLLMError: a required field is missing or the per-step arrays disagree.
        """
        try:
            m = cls(int(d["num_spec_steps"]), int(d["num_draft_tokens"]), int(d["num_accepted_draft_tokens"]),
                    int(d["num_spec_tokens"]), tuple(int(x) for x in d.get("acceptance_histogram") or ()),
                    tuple(int(x) for x in d.get("per_step_accepted") or ()),
                    tuple(int(x) for x in d.get("per_step_drafted") or ()))
        except (KeyError, TypeError, ValueError) as e:
            raise VLLMError(f"unreadable speculative_decoding metrics ({e!r}): {d!r}") from None
        if m.per_step_accepted and (len(m.per_step_accepted) != m.num_spec_steps
                                    or len(m.per_step_drafted) != m.num_spec_steps):
            raise VLLMError(f"speculative_decoding metrics: {len(m.per_step_accepted)} per-step entries for "
                            f"{m.num_spec_steps} steps")
        return m

    @property
    def detailed(self) -> bool:
        """Whether the per-step arrays are there (or there were no steps with a draft)."""
        return bool(self.per_step_accepted) or self.num_spec_steps == 0


# ----- steps and sources ---------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    """One target forward pass as recovered from a stream.

    Attributes:
        emitted: tokens it added to the output (after truncation at a stop or the token limit).
        proposed: draft tokens verified in it (0: the prefill, or a step without a draft).
        accepted: draft tokens accepted (the bonus or correction token not counted); may exceed
            ``emitted - 1`` in the last step, which vLLM counts before cutting the output at a
            stop token or at ``max_tokens``.
    """

    emitted: int
    proposed: int = 0
    accepted: int = 0

    def sources(self, draft_source: str, target_source: str = "target") -> list[str]:
        """The source of each emitted token: accepted drafts first, then the target's token.
        ``draft_source`` may hold ``{d}``, replaced by each draft's depth in the step (1, 2, ...):
        ``eagle_d{d}`` gives EAGLE's per-depth tags."""
        drafted = min(self.accepted, self.emitted)
        return [draft_source.format(d=i + 1) for i in range(drafted)] + [target_source] * (self.emitted - drafted)


def align_steps(chunk_sizes: list[int], spec: SpecDecodeMetrics | None,
                speculative: bool = True) -> tuple[list[Step], bool]:
    """Recover the verification steps of one request from its stream and vLLM's metrics.

    The stream gives ``chunk_sizes`` (tokens per event, in order); every event boundary is a step
    boundary, but one event may hold several steps. The metrics give, in order, each step that
    had a draft: ``accepted`` drafts, so ``accepted + 1`` tokens (fewer in the last step, cut at a
    stop or at the token limit). Every other step emits one token: the prefill (the first step)
    and steps without a draft. The steps are found by a search over (tokens so far, drafted steps
    used) that keeps every event boundary; where several splits fit (a one-token step with a
    rejected draft reads the same as one without a draft), the sources agree anyway.

    Args:
        chunk_sizes: tokens per streamed event, each >= 1.
        spec: the request's metrics; None or without per-step arrays when the server did not
            record them (no speculation, or not ``detailed``).
        speculative: whether the server speculates; False: with ``spec`` None every token is
            its own step (plain decoding), exactly. A speculative server without metrics (started
            without ``--per-request-spec-decode-metrics``) gives the per-event estimate.

    Returns:
        ``(steps, exact)``: ``exact`` is False when the metrics were missing or did not fit the
        stream, and each event is then taken as one step whose tokens but the last are accepted
        drafts (right whenever vLLM sent one event per step).
    """
    total = sum(chunk_sizes)
    if total == 0:
        return [], True

    def per_chunk() -> list[Step]:
        steps = []
        for i, n in enumerate(chunk_sizes):
            if i == 0:  # the prefill's token, then whatever shared its event
                steps.append(Step(1))
                n -= 1
            if n:
                steps.append(Step(n, n - 1, n - 1))
        return steps

    if spec is None:
        if speculative:
            return per_chunk(), False
        return [Step(1)] * total, True  # no speculation: one token per step
    if not spec.detailed:
        return per_chunk(), False
    acc, drafted = spec.per_step_accepted, spec.per_step_drafted
    k = len(acc)
    bounds = set()
    pos = 0
    for n in chunk_sizes:
        pos += n
        bounds.add(pos)

    def crosses(a: int, b: int) -> bool:  # an event boundary strictly inside (a, b)
        return any(x in bounds for x in range(a + 1, b))

    # Depth-first search from (1 token: the prefill, 0 drafted steps) to (total, k), drafted
    # steps tried first. (The prefill may share its event with later steps.)
    start = (1, 0)
    parent: dict[tuple[int, int], tuple[tuple[int, int], Step]] = {}
    stack, seen = [start], {start}
    while stack and len(seen) < MAX_ALIGN_STATES:
        t, j = stack.pop()
        if (t, j) == (total, k):
            break
        moves = []
        if t < total:
            moves.append(((t + 1, j), Step(1)))
        if j < k:
            end = t + acc[j] + 1
            if end <= total:
                moves.append(((end, j + 1), Step(acc[j] + 1, drafted[j], acc[j])))
            elif j == k - 1 and t < total:  # the last step, cut at a stop or the token limit
                moves.append(((total, k), Step(total - t, drafted[j], acc[j])))
        for state, step in moves:
            if state in seen or crosses(t, state[0]) or total - state[0] < k - state[1]:
                continue  # visited, splits an event, or too few tokens left for the drafted steps
            seen.add(state)
            parent[state] = ((t, j), step)
            stack.append(state)
    if (total, k) not in parent and (total, k) != start:
        return per_chunk(), False
    steps = []
    state = (total, k)
    while state != start:
        state, step = parent[state]
        steps.append(step)
    return [Step(1)] + steps[::-1], True


# ----- HTTP ----------------------------------------------------------------------------------
