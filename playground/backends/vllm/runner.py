"""Run a method on a vLLM server and measure it as the built-in engine's runs are measured.

:func:`run_completion` streams one request and turns it into :class:`VLLMStep` updates (what
a page panel shows) and, at the end, the benchmark's measured fields (:func:`record_fields`),
the same keys as ``playground.bench``'s engine runs, so a built-in run and a vLLM run of the
same questions compare line by line.

Timing (what ``wall_s`` and ``ttft_s`` include): client wall-clock time from sending the HTTP
request to reading the final event, and to reading the first token. So it includes the HTTP
round trip on loopback, vLLM's request processing and scheduling and its detokenisation, on top
of the model's own steps; every method, the baseline included, is served and timed that way.
vLLM's own server-side figures are kept beside them (``server_ttft_s``, ``server_generation_s``,
``server_queue_s``: from ``--enable-per-request-metrics``).

Steps and acceptance come from vLLM's per-request speculative-decoding metrics lined up with
the stream (:func:`.client.align_steps`): ``steps`` counts target forward passes, the prefill
included, as the engine does; ``proposed``/``accepted`` are vLLM's draft tokens (the bonus token
not counted); ``accepted_at[i]``/``proposed_at[i]`` count steps that accepted / proposed an i-th
draft token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

from .client import Chunk, Completion, Step, align_steps, completion_body, stream_completion
from .server import Endpoint

FINISH_REASONS = {"stop": "eos", "length": "length", "abort": "cancelled"}
"""vLLM's finish reasons as the engine's (vLLM's "stop" is a stop token here: the target's EOS)."""


@dataclass
class Sampling:
    """What to generate: most new tokens and the sampling settings (temperature 0: greedy)."""

    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0


@dataclass
class VLLMStep:
    """One streamed update of a vLLM run (a page panel's view of it).

    Attributes:
        tokens: new token ids in this update, ``(n,)``.
        text: the text they add.
        t: client seconds since the request was sent.
        done: whether the run is over; then ``sources`` and ``stats`` are filled.
        sources: (when done) the source of every output token, in order.
        stats: (when done) :func:`record_fields` of the run.
    """

    tokens: list[int]
    text: str
    t: float
    done: bool = False
    sources: list[str] = field(default_factory=list)
    stats: dict = field(default_factory=dict)


def per_position(steps: list[Step]) -> tuple[list[int], list[int]]:
    """``(accepted_at, proposed_at)``: steps that accepted / proposed an i-th draft token."""
    depth = max((s.proposed for s in steps), default=0)
    proposed_at = [sum(1 for s in steps if s.proposed > i) for i in range(depth)]
    accepted_at = [sum(1 for s in steps if min(s.accepted, s.proposed) > i) for i in range(depth)]
    return accepted_at, proposed_at


def record_fields(done: Completion, method: str, eos_token_ids: list[int] = ()) -> dict:
    """The benchmark's measured fields of one finished completion.

    Keys: ``new_tokens, steps, wall_s, ttft_s, tokens_per_s, mean_accepted_tokens, acceptance_rate,
    proposed, accepted, finish_reason, output_ids, output_text, margins, accepted_at, proposed_at``
    (as the engine's runs), plus ``alignment`` ("exact", or "per_event" when the steps had to be
    guessed from the stream alone), ``server_ttft_s, server_generation_s, server_queue_s`` (vLLM's
    own clocks, None when the server does not report them) and ``vllm_fingerprint``.

    With ``alignment`` "per_event", ``proposed``/``accepted`` are vLLM's per-request totals and
    ``steps`` is estimated from them and the events (a lower bound; the per-position counts stay
    empty); a speculative server that
    sent no metrics at all leaves ``proposed``, ``accepted`` and ``acceptance_rate`` None (unknown),
    and ``steps`` counts one per streamed event (the first split into the prefill's token and the
    rest), an estimate. ``alignment_reason`` says why: ``no_metrics``, ``summary`` (totals only) or
    ``no_fit`` (per-step metrics that did not fit the events); None when exact.
    """
    from .methods import SOURCES

    ids = done.token_ids
    steps, exact = align_steps([len(c.token_ids) for c in done.chunks], done.spec, method != "autoregressive")
    spec = done.spec
    if exact:
        proposed = sum(s.proposed for s in steps)
        accepted = sum(min(s.accepted, s.proposed) for s in steps)
        accepted_at, proposed_at = per_position(steps)
        n_steps = len(steps)
    else:  # the stream alone cannot tell drafts from merged steps: vLLM's totals where it sent them
        accepted_at, proposed_at = [], []
        if spec is None:
            proposed = accepted = None
            n_steps = len(steps)
        else:
            proposed, accepted = spec.num_draft_tokens, spec.num_accepted_draft_tokens
            # Two lower bounds, the larger kept: every event holds at least one step; and the
            # prefill, each drafted step (accepted + 1 tokens) and one token per other step, which
            # counts short when the last step was cut at a stop or the token limit.
            n_steps = max(len(done.chunks),
                          1 + spec.num_spec_steps + max(0, len(ids) - 1 - spec.num_spec_steps - accepted))
    wall = done.t_end or (done.chunks[-1].t if done.chunks else 0.0)
    reason = FINISH_REASONS.get(done.finish_reason or "", done.finish_reason)
    if reason == "eos" and isinstance(done.chunks[-1].stop_reason, str):
        reason = "stop"  # a stop string, not a stop token
    ms = done.server_metrics

    def sec(key: str):
        return None if ms.get(key) is None else ms[key] / 1000.0
    return {
        "new_tokens": len(ids), "steps": n_steps, "wall_s": wall, "ttft_s": done.chunks[0].t if done.chunks else 0.0,
        "tokens_per_s": len(ids) / wall if wall > 0 else 0.0,
        "mean_accepted_tokens": len(ids) / n_steps if n_steps else 0.0,
        "acceptance_rate": accepted / proposed if proposed else None,
        "proposed": proposed, "accepted": accepted, "finish_reason": reason,
        "output_ids": ids, "output_text": done.text, "margins": [round(m, 5) for m in done.margins],
        "accepted_at": accepted_at, "proposed_at": proposed_at,
        "alignment": "exact" if exact else "per_event",
        # why the steps were estimated: no metrics at all, totals only, or per-step metrics that did
        # not fit the stream's events
        "alignment_reason": None if exact else ("no_metrics" if spec is None else
                                                "summary" if not spec.detailed else "no_fit"),
        "server_ttft_s": sec("time_to_first_token_ms"), "server_generation_s": sec("generation_time_ms"),
        "server_queue_s": sec("queue_time_ms"), "vllm_fingerprint": done.fingerprint,
        "sources": [src for s in steps for src in s.sources(SOURCES.get(method, "draft"))],
    }


def run_completion(endpoint: Endpoint, method: str, prompt_ids: list[int], sampling: Sampling,
                   eos_token_ids: list[int] = (), timeout: float = 600.0, on_open=None) -> Iterator[VLLMStep]:
    """Stream one method's answer from its server.

    Yields a :class:`VLLMStep` per streamed event, then a last one with ``done=True`` and the
    run's :func:`record_fields` in ``stats``. Closing the generator (Stop) closes the
    connection; vLLM then aborts the request. ``on_open`` is passed to
    :func:`.client.stream_completion` (it gets the open response: :meth:`.client.StreamCutter.opened`).

    Raises:
        .client.VLLMError: the server refused or broke off the request.
    """
    body = completion_body(endpoint.model, prompt_ids, sampling.max_new_tokens, temperature=sampling.temperature,
                           top_p=sampling.top_p, top_k=sampling.top_k, seed=sampling.seed,
                           stop_token_ids=eos_token_ids)
    stream = stream_completion(endpoint.url, body, timeout, on_open)
    try:
        while True:
            try:
                chunk: Chunk = next(stream)
            except StopIteration as stop:
                done: Completion = stop.value
                break
            yield VLLMStep(chunk.token_ids, chunk.text, chunk.t)
    finally:
        stream.close()
    stats = record_fields(done, method, list(eos_token_ids))
    yield VLLMStep([], "", done.t_end, True, stats.pop("sources"), stats)


def run_to_end(endpoint: Endpoint, method: str, prompt_ids: list[int], sampling: Sampling,
               eos_token_ids: list[int] = ()) -> dict:
    """:func:`run_completion` to its end; returns the record fields."""
    last = None
    for last in run_completion(endpoint, method, prompt_ids, sampling, eos_token_ids):
        pass
    return last.stats
