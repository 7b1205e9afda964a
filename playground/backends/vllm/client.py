"""Talk to one vLLM OpenAI-compatible server: stream a completion, read its per-request metrics.

Only the Python standard library is used (``urllib``), so this module imports in the
playground's own ``.venv``; vLLM itself lives in ``.venv-vllm`` and is only ever a server.

What one request sends (``POST {url}/v1/completions``, see :func:`completion_body`):

* ``prompt``: the prompt as **token ids** (the playground's own chat-template encoding), so the
  built-in engine and vLLM decode exactly the same prompt;
* ``stream: true`` with ``stream_options.include_usage``: vLLM then sends one event per engine
  output (usually one verification step; several when the client fell behind) and a final
  usage event that carries ``metrics`` (below);
* ``return_token_ids: true``: each event holds the new token ids (``choices[0].token_ids``);
* ``logprobs: 2`` with ``return_tokens_as_token_ids``: the top-2 log-probabilities at each new
  token, keyed ``"token_id:N"``; their difference is the target's top-1 minus top-2 logit
  (log-softmax only shifts logits), the *margin* that tells a numerical near-tie from a real
  mismatch. Every method asks for them, the baseline included, so all pay the same cost.

What comes back in the final event's ``metrics`` (vLLM 0.32; field names read from its source,
``vllm/entrypoints/generate/base/protocol.py``):

* with ``--enable-per-request-metrics``: ``time_to_first_token_ms``, ``generation_time_ms``,
  ``queue_time_ms``, ``mean_itl_ms``, ``tokens_per_second`` (server-side clocks);
* with ``--per-request-spec-decode-metrics detailed`` (only on a server with speculative
  decoding): ``speculative_decoding`` = ``num_spec_steps`` (verification steps that had a
  draft), ``num_draft_tokens``, ``num_accepted_draft_tokens``, ``acceptance_histogram``,
  ``mean_acceptance_length`` (1 + accepted / spec steps), ``draft_acceptance_rate``, and the
  ordered ``per_step_accepted`` / ``per_step_drafted`` (one entry per step that had a draft).

Steps without a draft (prompt lookup found no match) are not in those arrays, and a step's
tokens may be merged with the next step's in one event; :func:`align_steps` puts the two
sources together to recover each step and the source of each token.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from .align import MAX_ALIGN_STATES, SpecDecodeMetrics, Step, VLLMError, align_steps  # noqa: F401

TOP_LOGPROBS = 2
"""Log-probabilities asked for at each token: top-1 and top-2 give the margin."""


# ----- the request ---------------------------------------------------------------------------
def completion_body(model: str, prompt_ids: list[int], max_tokens: int, *, temperature: float = 0.0,
                    top_p: float = 1.0, top_k: int = 0, seed: int | None = None,
                    stop_token_ids: Iterable[int] = (), logprobs: int | None = TOP_LOGPROBS) -> dict:
    """The JSON body of one streamed completion request.

    Args:
        model: the served model name (``--served-model-name``; the method's name for servers the
            playground starts).
        prompt_ids: prompt token ids ``(prompt_len,)``, chat template already applied.
        max_tokens: most new tokens.
        temperature, top_p, top_k, seed: sampling; temperature 0 is greedy; top_k 0 is off.
        stop_token_ids: ids that end the output (the target's EOS ids); the stopping id is the
            output's last token, as in the built-in engine.
        logprobs: top log-probabilities per token (None: none).

    Raises:
        ValueError: an empty prompt or ``max_tokens < 1``.
    """
    if not prompt_ids:
        raise ValueError("the prompt has no tokens")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    body = {
        "model": model, "prompt": [int(t) for t in prompt_ids], "max_tokens": int(max_tokens),
        "temperature": float(temperature), "top_p": float(top_p), "stream": True,
        "stream_options": {"include_usage": True}, "return_token_ids": True, "skip_special_tokens": True,
        "stop_token_ids": [int(t) for t in stop_token_ids],
    }
    if top_k and top_k > 0:
        body["top_k"] = int(top_k)
    if seed is not None and temperature > 0:
        body["seed"] = int(seed)
    if logprobs:
        body.update(logprobs=int(logprobs), return_tokens_as_token_ids=True)
    return body


# ----- parsing the stream --------------------------------------------------------------------
@dataclass
class Chunk:
    """One streamed event's new tokens.

    Attributes:
        token_ids: new token ids, ``(n,)``, n >= 1 (events without tokens are not chunks).
        text: the text they add (special tokens skipped).
        margins: top-1 minus top-2 log-probability at each token, ``(n,)`` (empty without logprobs).
        finish_reason: vLLM's ``"stop"``, ``"length"``, ``"abort"``, ... on the last chunk, else None.
        stop_reason: the stop token id or string when vLLM stopped on one, else None.
        t: client seconds from sending the request to reading this event.
    """

    token_ids: list[int]
    text: str
    margins: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    t: float = 0.0


@dataclass
class Completion:
    """A whole streamed completion, filled by :func:`read_stream`.

    Attributes:
        chunks: the events with tokens, in order.
        usage: ``{"prompt_tokens", "completion_tokens", "total_tokens"}`` from the final event.
        server_metrics: vLLM's per-request timings (``time_to_first_token_ms``, ...) when the
            server reports them, else {}.
        spec: the speculative-decoding figures, None from a server without speculation (or
            without ``--per-request-spec-decode-metrics``).
        fingerprint: the final event's ``system_fingerprint`` (vLLM's version and config hash).
        t_end: client seconds from sending the request to the final event.
    """

    chunks: list[Chunk] = field(default_factory=list)
    usage: dict = field(default_factory=dict)
    server_metrics: dict = field(default_factory=dict)
    spec: SpecDecodeMetrics | None = None
    fingerprint: str | None = None
    t_end: float = 0.0

    @property
    def token_ids(self) -> list[int]:
        return [t for c in self.chunks for t in c.token_ids]

    @property
    def text(self) -> str:
        return "".join(c.text for c in self.chunks)

    @property
    def margins(self) -> list[float]:
        return [m for c in self.chunks for m in c.margins]

    @property
    def finish_reason(self) -> str | None:
        return self.chunks[-1].finish_reason if self.chunks else None


def _margins(logprobs: dict | None, n: int) -> list[float]:
    """Top-1 minus top-2 log-probability at each of ``n`` tokens (``[]`` without logprobs)."""
    if not logprobs or not logprobs.get("top_logprobs"):
        return []
    out = []
    for top in logprobs["top_logprobs"][:n]:
        values = sorted((v for v in (top or {}).values() if v is not None), reverse=True)
        out.append(values[0] - values[1] if len(values) >= 2 else float("inf"))
    return out


def iter_events(lines: Iterable[bytes | str]) -> Iterator[dict]:
    """Server-sent events of a vLLM stream as JSON objects, up to ``data: [DONE]``.

    Args:
        lines: the response body line by line (bytes or str, with or without line ends).

    Raises:
        VLLMError: an event is not JSON, is an error event (vLLM streams ``{"error": {...}}``
            when a request fails after the stream began), or the body ends without ``[DONE]``
            (the connection was cut mid-answer).
    """
    for raw in lines:
        line = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        line = line.strip()
        if not line.startswith("data:"):
            continue  # blank separators, ": keep-alive" comments
        data = line[5:].strip()
        if data == "[DONE]":
            return
        try:
            event = json.loads(data)
        except json.JSONDecodeError as e:
            raise VLLMError(f"the server sent an event that is not JSON ({e.msg}): {data[:200]!r}") from None
        if "error" in event:
            raise VLLMError(f"the server reported an error during the stream: {error_message(event)}")
        yield event
    raise VLLMError("the stream ended without its closing 'data: [DONE]' (the connection was cut)")


def error_message(payload: dict | str) -> str:
    """The human-readable reason in a vLLM error body (``{"error": {"message": ...}}``)."""
    if isinstance(payload, str):
        try:
            payload = json.loads(payload)
        except json.JSONDecodeError:
            return payload.strip()[:500]
    err = payload.get("error", payload) if isinstance(payload, dict) else payload
    if isinstance(err, dict):
        return str(err.get("message") or err)
    return str(err)


def read_stream(events: Iterable[dict], clock: Callable[[], float] | None = None) -> Iterator[Chunk]:
    """Turn vLLM stream events into :class:`Chunk` objects as they arrive; the generator's
    return value (``StopIteration.value``) is the whole :class:`Completion`.

    Args:
        events: from :func:`iter_events`.
        clock: seconds since the request was sent (each chunk's ``t``); None gives 0.

    Raises:
        VLLMError: an event with more than one choice, or tokens without ids (the request did
            not ask for ``return_token_ids``).
    """
    done = Completion()
    for event in events:
        now = clock() if clock else 0.0
        choices = event.get("choices") or []
        if len(choices) > 1:
            raise VLLMError(f"expected one choice per event, got {len(choices)}")
        for c in choices:
            ids = c.get("token_ids")
            if ids is None:
                if c.get("text"):
                    raise VLLMError("the server sent text without token ids; it needs 'return_token_ids' "
                                    "(vLLM 0.10.2 or newer)")
                ids = []
            if not ids and c.get("finish_reason") is None:
                continue
            chunk = Chunk([int(t) for t in ids], c.get("text") or "", _margins(c.get("logprobs"), len(ids)),
                          c.get("finish_reason"), c.get("stop_reason"), now)
            if not ids and done.chunks:  # a finish event without tokens: mark the last chunk
                done.chunks[-1].finish_reason, done.chunks[-1].stop_reason = chunk.finish_reason, chunk.stop_reason
                continue
            done.chunks.append(chunk)
            yield chunk
        if event.get("usage"):
            done.usage = dict(event["usage"])
        if event.get("system_fingerprint"):
            done.fingerprint = event["system_fingerprint"]
        metrics = event.get("metrics") or {}
        if metrics:
            done.server_metrics = {k: v for k, v in metrics.items() if k != "speculative_decoding"}
            if metrics.get("speculative_decoding"):
                done.spec = SpecDecodeMetrics.from_json(metrics["speculative_decoding"])
        done.t_end = now
    return done


# ----- HTTP --------------------------------------------------------------------------------------
def _open(url: str, body: dict | None = None, timeout: float = 600.0):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        return urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        reason = error_message(e.read().decode("utf-8", "replace"))
        raise VLLMError(f"{url} answered HTTP {e.code}: {reason}") from None
    except (urllib.error.URLError, OSError) as e:
        raise VLLMError(f"cannot reach {url}: {getattr(e, 'reason', e)}") from None


def get_json(url: str, timeout: float = 10.0) -> dict:
    """GET ``url`` and parse its JSON body.

    Raises:
        VLLMError: unreachable, an HTTP error, or a body that is not JSON.
    """
    with _open(url, timeout=timeout) as r:
        text = r.read().decode("utf-8", "replace")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise VLLMError(f"{url} did not answer JSON: {text[:200]!r}") from None


def stream_completion(base_url: str, body: dict, timeout: float = 600.0,
                      on_open: Callable[[object], None] | None = None) -> Iterator[Chunk]:
    """Send one completion request (``body`` from :func:`completion_body`) and yield its chunks as
    they arrive; the return value is the :class:`Completion`.

    Closing the generator early (Stop on the page) closes the connection, and vLLM aborts a
    request whose client went away, so the server stops decoding it. A generator blocked in a
    read cannot be closed from another thread: ``on_open`` gets the open response (pass
    :meth:`StreamCutter.opened`, whose :meth:`~StreamCutter.cut` then cuts it from any thread).

    Raises:
        VLLMError: the server cannot be reached, refuses the request (its message is kept), or
            breaks off the stream.
    """
    url = base_url.rstrip("/") + "/v1/completions"
    t0 = time.perf_counter()
    response = _open(url, body, timeout)
    try:
        if on_open is not None:
            on_open(response)
        done = yield from read_stream(iter_events(response), lambda: time.perf_counter() - t0)
    except (OSError, urllib.error.URLError, http.client.HTTPException) as e:
        raise VLLMError(f"the stream from {url} broke off: {e}") from None
    finally:
        response.close()
    if not done.chunks:
        raise VLLMError(f"{url} ended the stream without any token")
    return done


class StreamCutter:
    """Cuts one streaming response's connection from any thread (Stop on the page).

    A generator blocked in a read cannot be closed from another thread, and closing it only
    after the next chunk leaves vLLM decoding a request nobody reads. Pass :meth:`opened` as
    :func:`stream_completion`'s ``on_open``: it keeps a duplicate of the connection's socket,
    taken in the reading thread right after the request was answered (so it is certainly this
    connection's, never a later socket that reused the descriptor number). :meth:`cut` then shuts
    the connection down from any thread: a read blocked on it returns at once (the stream reads
    as cut: :class:`VLLMError`), and vLLM sees the client gone and aborts the request. A cut
    before the response arrived cuts it as soon as it does. :meth:`release` forgets it after a
    normal end. Both are idempotent.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._done = False
        self._cut = False

    def opened(self, response) -> None:
        """``on_open``: keep a duplicate of ``response``'s socket (cut at once after :meth:`cut`)."""
        sock = socket.socket(fileno=os.dup(response.fileno()))
        with self._lock:
            if not self._done:
                self._sock, sock = sock, None
            cut_now = self._cut
        if sock is not None:
            self._close(sock, cut_now)

    def cut(self) -> None:
        """Shut the connection down (now, or as soon as it opens)."""
        self._finish(True)

    def release(self) -> None:
        """The stream ended: drop the duplicate without touching the connection."""
        self._finish(False)

    def _finish(self, cut: bool) -> None:
        with self._lock:
            self._done, self._cut = True, cut
            sock, self._sock = self._sock, None
        if sock is not None:
            self._close(sock, cut)

    @staticmethod
    def _close(sock: socket.socket, cut: bool) -> None:
        try:
            if cut:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            sock.close()


# ----- the server's /metrics -------------------------------------------------------------------
def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text (``GET /metrics``) as ``{name or name{label=value}: value}``.

    Samples of one name are summed over their labels into ``name`` (every engine and model of
    the server); samples with a ``position`` label are also kept as ``name{position=N}``.
    """
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        try:
            v = float(value)
        except ValueError:
            continue
        name, _, labels = head.partition("{")
        out[name] = out.get(name, 0.0) + v
        for label in labels.rstrip("}").split(","):
            key, _, val = label.partition("=")
            if key.strip() == "position":
                k = f"{name}{{position={val.strip().strip(chr(34))}}}"
                out[k] = out.get(k, 0.0) + v
    return out


def spec_decode_totals(metrics: dict[str, float]) -> dict:
    """vLLM's server-wide speculative-decoding counters (since it started) from :func:`parse_prometheus`.

    Returns:
        ``num_drafts`` (steps with a draft), ``num_draft_tokens``, ``num_accepted_tokens``,
        ``accepted_per_pos`` (accepted drafts at each draft position) and ``mean_acceptance_length``
        (1 + accepted / drafts, the bonus token included; None before any draft).
    """
    p = "vllm:spec_decode_"
    drafts = metrics.get(p + "num_drafts_total", 0.0)
    accepted = metrics.get(p + "num_accepted_tokens_total", 0.0)
    per_pos = []
    while (key := f"{p}num_accepted_tokens_per_pos_total{{position={len(per_pos)}}}") in metrics:
        per_pos.append(int(metrics[key]))
    return {"num_drafts": int(drafts), "num_draft_tokens": int(metrics.get(p + "num_draft_tokens_total", 0.0)),
            "num_accepted_tokens": int(accepted), "accepted_per_pos": per_pos,
            "mean_acceptance_length": 1 + accepted / drafts if drafts else None}


def read_metrics(base_url: str, timeout: float = 10.0) -> dict[str, float]:
    """``GET {base_url}/metrics``, parsed by :func:`parse_prometheus`.

    Raises:
        VLLMError: unreachable or an HTTP error.
    """
    with _open(base_url.rstrip("/") + "/metrics", timeout=timeout) as r:
        return parse_prometheus(r.read().decode("utf-8", "replace"))
