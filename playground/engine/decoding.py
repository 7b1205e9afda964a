"""The decoding loop shared by every method: draft, verify in one target pass, commit, emit.

One call of :func:`decode` is a generator that yields one :class:`StepEvent` per target
forward pass (the prefill first). Timing, stopping (EOS, max new tokens, stop strings,
cancellation), detokenisation and statistics live here, once, for all methods.
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass
from typing import Iterator

import torch

from .budget import RunRate, apply_budget
from .detok import IncrementalDetokenizer
from .drafter import DecodeState, Drafter, StepResult
from .events import SOURCE_TARGET, RunStats, StepEvent, StepTree
from .limits import MAX_NEW_TOKENS_KNOB, MAX_STOP_STRING_CHARS, MAX_STOP_STRINGS, REPETITION_PENALTY_KNOB
from .penalty import apply_repetition_penalty
from .sampling import SamplingConfig, logits_to_probs
from .target import CausalLM, feature_layer
from .tree import Candidates, pass_attention
from .verify import verify


@dataclass(frozen=True)
class GenerationSettings:
    """Settings of one run.

    Attributes:
        max_new_tokens: the output never exceeds this many tokens.
        sampling: temperature (0 = greedy), top-p, top-k, seed.
        stop_on_eos: end the output at the first EOS token (its id is the output's last; it adds no text).
        stop_strings: the output ends at the first token whose text completes one of these strings
            (the string, and whatever else that token holds, is kept, as transformers'
            ``stop_strings`` does); finish reason ``"stop"``. At most ``MAX_STOP_STRINGS`` strings of
            1 to ``MAX_STOP_STRING_CHARS`` characters. Needs a tokenizer.
        repetition_penalty: transformers' repetition penalty over prompt + output, applied to the
            target's logits along each candidate path (:mod:`.penalty`); within
            ``REPETITION_PENALTY_KNOB``'s bounds. None: the target's own ``generation_config`` value
            (resolved by :class:`~playground.engine.engine.Engine`; 1.0 = off when :func:`decode` is
            called directly).

    Raises:
        ValueError: ``max_new_tokens`` or ``repetition_penalty`` out of range, or a stop string empty
            or too long, or too many.
        TypeError: ``sampling`` is not a :class:`SamplingConfig`, ``stop_on_eos`` not a bool, or a
            stop string is not text.
    """

    max_new_tokens: int = MAX_NEW_TOKENS_KNOB.default
    sampling: SamplingConfig = SamplingConfig()
    stop_on_eos: bool = True
    stop_strings: tuple[str, ...] = ()
    repetition_penalty: float | None = None

    def __post_init__(self):
        object.__setattr__(self, "max_new_tokens", MAX_NEW_TOKENS_KNOB.check(self.max_new_tokens))
        if not isinstance(self.stop_on_eos, bool):
            raise TypeError(f"stop_on_eos must be True or False, got {self.stop_on_eos!r}")
        if not isinstance(self.sampling, SamplingConfig):
            raise TypeError(f"sampling must be a SamplingConfig, got {type(self.sampling).__name__}")
        stops = (self.stop_strings,) if isinstance(self.stop_strings, str) else tuple(self.stop_strings or ())
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"stop_strings may hold at most {MAX_STOP_STRINGS} strings, got {len(stops)}")
        for s in stops:
            if not isinstance(s, str):
                raise TypeError(f"each stop string must be text, got {type(s).__name__}")
            if not 1 <= len(s) <= MAX_STOP_STRING_CHARS:
                raise ValueError(f"each stop string must have 1 to {MAX_STOP_STRING_CHARS} characters, got {s!r}")
        object.__setattr__(self, "stop_strings", stops)
        if self.repetition_penalty is not None:
            object.__setattr__(self, "repetition_penalty", REPETITION_PENALTY_KNOB.check(self.repetition_penalty))


def _margins(logits: torch.Tensor) -> list[float]:
    """Top-1 minus top-2 logit of each row of ``logits`` ``(rows, vocab_size)``."""
    top2 = torch.topk(logits, 2, dim=-1).values
    return (top2[:, 0] - top2[:, 1]).tolist()


class _Output:
    """The run's output so far: stopping rules, detokenisation, statistics and events."""

    def __init__(self, method: str, drafter: Drafter, prompt_ids: list[int], settings: GenerationSettings,
                 eos: set[int], tokenizer):
        self.method, self.drafter, self.settings, self.eos = method, drafter, settings, eos
        self.tokens = list(prompt_ids)
        self.stats = RunStats()
        self.detok = IncrementalDetokenizer(tokenizer, prompt_ids) if tokenizer is not None else None
        self.text_tail = ""  # the output's last characters, for stop strings
        self.stop_len = max((len(s) for s in settings.stop_strings), default=0)

    def emit(self, new: list[int], sources: list[str], margins: list[float], *, step: int, proposed: int,
             accepted: int, seconds: float, draft_s: float = 0.0, depth: int = 0) -> StepEvent:
        """Append the step's tokens up to the first stop (EOS, a stop string, max new tokens) and
        return its event; EOS is kept as the output's last id (it adds no text), as transformers does."""
        room = self.settings.max_new_tokens - self.stats.new_tokens
        reason, pieces, kept = None, [], 0
        for t, s in zip(new, sources):
            kept += 1
            piece = self.detok.add(t) if self.detok else ""
            if piece:
                pieces.append((piece, s))
            if t in self.eos:
                reason = "eos"
            elif self.stop_len and piece:
                self.text_tail = (self.text_tail + piece)[-(self.stop_len + len(piece)):]
                if any(stop in self.text_tail for stop in self.settings.stop_strings):
                    reason = "stop"
            if reason is None and kept >= room:
                reason = "length"
            if reason:
                break
        new, sources, margins = new[:kept], sources[:kept], margins[:kept]
        if reason and self.detok and (tail := self.detok.flush()):
            pieces.append((tail, sources[-1] if sources else SOURCE_TARGET))
        accepted = min(accepted, sum(1 for s in sources if s != SOURCE_TARGET))
        self.stats.record_step(seconds=seconds, emitted=len(new), proposed=proposed, accepted=accepted,
                               draft_s=draft_s, verify_s=seconds - draft_s, proposed_depth=depth, prefill=step == 0)
        self.stats.drafter = self.drafter.info()
        self.tokens.extend(new)
        return StepEvent(self.method, step, new, sources, pieces, proposed, accepted, seconds, margins,
                         self.stats.snapshot(), finished=reason is not None, finish_reason=reason)


def _target_pass(target: CausalLM, cache, tokens: list[int], cand: Candidates, layers: tuple[int, ...]):
    """One verification pass over the root ``tokens[-1]``, the candidates and any extra queries.

    Returns:
        ``(logits, extra_logits, features)``: ``(num_nodes + 1, vocab_size)`` float32, the extra
        queries' ``(m, vocab_size)`` rows or None, and ``(num_nodes + 1, F)`` features or None.
    """
    inputs = torch.cat([torch.tensor(tokens[-1:], dtype=torch.long), cand.tokens.cpu()])
    with target.capture_features(layers) as features:
        if cand.extras is None:
            logits = target.forward(cache, inputs, cand.parents if len(cand) else None)
        else:  # the drafter's extra queries (Lookahead's Jacobi window) ride in the same pass
            allowed, offsets = pass_attention(cand)
            logits = target.forward_masked(cache, torch.cat([inputs, cand.extras.tokens.cpu()]), allowed, offsets)
        feats = features()[:len(cand) + 1] if layers else None
    extra = logits[len(cand) + 1:] if cand.extras is not None else None
    return logits[:len(cand) + 1], extra, feats


class SharedPrefill:
    """One prefill of a prompt for every method of a side-by-side run (:meth:`Engine.run`).

    Every method's first step is the same target pass over the same prompt (a drafter's own work on
    the prompt, such as a draft model's prefill, stays its own). Run once and given to each method as
    a copy of its KV cache, it costs one pass instead of one per method (ten methods on an 836-token
    passage: 1.6 s instead of 16 s on a 2-vCPU AMD EPYC, two threads), and every method's time to first
    token holds the same measured seconds, so the timing noise of ten separate passes (0.8 s of 3 s
    between two of them on a loaded machine, one thread) no longer ranks the methods. Outputs are unchanged: the cache,
    logits and features are those each method computed for itself.

    Args:
        layers: every feature layer some method reads (:attr:`Drafter.feature_layers`, repeats allowed;
            numbered as :meth:`CausalLM.capture_features` numbers them, -1 being ``num_layers``):
            the pass captures each once, and a method gets its own layers' columns, in its order.
        users: how many methods will take it: after the last (or its failure, :meth:`release`), the
            pass's own cache is dropped (each method holds its copy; over a long context the original
            would be one cache too many). None: kept until this object goes.
        num_layers: the target's decoder layers: layers are checked against it here, at the run's
            call, so that one method's bad layer fails that call, not every method's first step.

    Raises:
        ValueError: a layer outside ``[-num_layers - 1, num_layers]``.
    """

    def __init__(self, layers=(), users: int | None = None, num_layers: int | None = None):
        self.num_layers = num_layers
        self.layers = tuple(dict.fromkeys(self._layer(i) for i in layers))
        self.users = users
        self._made = None  # (cache, logits (1, vocab), features (prompt_len, len(layers) * hidden) or None, seconds)
        self._lock = threading.Lock()

    def _layer(self, i) -> int:
        """Layer ``i`` numbered from 0 (-1 and ``num_layers`` are one layer, captured once)."""
        return int(i) if self.num_layers is None else feature_layer(i, self.num_layers)

    def release(self) -> None:
        """One user is done (it took its copy, or failed before): after the last, drop the pass."""
        with self._lock:
            if self.users is not None:
                self.users -= 1
                if self.users <= 0:
                    self._made = None

    def take(self, target: CausalLM, prompt_ids: list[int], layers: tuple[int, ...]):
        """``(cache, logits, features, seconds)`` for one method: a copy of the prompt's KV cache,
        the ``(1, vocab_size)`` float32 logits of its last position, the ``(prompt_len, len(layers) *
        hidden_size)`` features of ``layers`` (None without layers) and the seconds the one pass took.

        Raises:
            ValueError: ``layers`` not among those given at construction, or another prompt than the
                first call's.
        """
        with self._lock:
            if self._made is None:
                cache = target.new_cache()
                t0 = target.clock()
                with target.capture_features(self.layers) as features:
                    logits = target.forward(cache, torch.tensor(prompt_ids, dtype=torch.long), last_only=True)
                    feats = features() if self.layers else None
                self._made = (cache, logits, feats, target.clock() - t0, list(prompt_ids))
            cache, logits, feats, seconds, prompt = self._made
            if list(prompt_ids) != prompt:
                raise ValueError("a shared prefill serves one prompt")
            mine, wanted = None, [self._layer(i) for i in layers]
            missing = [i for i, j in zip(layers, wanted) if j not in self.layers]
            if missing:
                raise ValueError(f"feature layers {missing} were not captured by the shared prefill {self.layers}")
            if layers:
                width = feats.shape[-1] // len(self.layers)
                mine = torch.cat([feats[:, j * width:(j + 1) * width] for j in map(self.layers.index, wanted)], dim=-1)
            taken = copy.deepcopy(cache), logits.clone(), mine, seconds
        self.release()
        return taken


def decode(target: CausalLM, drafter: Drafter, prompt_ids: list[int], settings: GenerationSettings,
           *, eos_token_ids: list[int] | tuple[int, ...] = (), tokenizer=None, context_length: int | None = None,
           cancel: threading.Event | None = None, method: str | None = None,
           prefill: SharedPrefill | None = None) -> Iterator[StepEvent]:
    """Generate with ``drafter`` proposing and ``target`` verifying; yield one event per step.

    Each step follows the design's four steps: 1. the drafter proposes candidates rooted at the
    last emitted token; 2. the target scores them in one pass (tree attention); 3. the verifier
    accepts the longest agreeing path plus one target token; 4. the KV cache keeps the accepted
    path, and the drafter learns the verdict.

    Args:
        target: the target model wrapper.
        drafter: any :class:`Drafter`; :class:`AutoregressiveDrafter` gives the baseline.
        prompt_ids: the prompt's token ids (chat template already applied), ``(prompt_len,)``.
        settings: max new tokens, sampling settings and stop strings.
        eos_token_ids: ids that end the output (may be empty: the run then stops at max new tokens only).
        tokenizer: when given, events carry text pieces (incremental detokenisation).
        context_length: the target's context in tokens; None = unchecked.
        cancel: when set, the run ends before its next step with reason ``"cancelled"``.
        method: the name put in events (default: ``drafter.name``).
        prefill: the prompt's pass shared with the other methods of a run (:class:`SharedPrefill`);
            the first step then counts its seconds, not the copy's. None: this run's own pass.

    Yields:
        :class:`StepEvent`; the last one has ``finished=True``.

    Raises:
        ValueError: empty prompt, prompt plus ``max_new_tokens`` longer than the context, or stop
            strings without a tokenizer.
        RuntimeError: a drafter proposing deeper than the step's budget.
    """
    if not prompt_ids:
        raise ValueError("the prompt is empty: give at least one token")
    if context_length is not None and len(prompt_ids) + settings.max_new_tokens > context_length:
        raise ValueError(f"the prompt is {len(prompt_ids)} tokens; with {settings.max_new_tokens} max new tokens it "
                         f"exceeds the model's context of {context_length} tokens")
    if settings.stop_strings and tokenizer is None:
        raise ValueError("stop strings need a tokenizer to read the output's text")
    sampling, layers = settings.sampling, tuple(drafter.feature_layers)
    penalty = settings.repetition_penalty or 1.0
    generator = None if sampling.greedy else sampling.generator(target.device)
    out = _Output(method or drafter.name, drafter, prompt_ids, settings,
                  set(eos_token_ids) if settings.stop_on_eos else set(), tokenizer)
    # Prefill: one pass over the prompt gives the first new token (time to first token). The
    # drafter's own work on the prompt (suffix trees, n-gram pools, caches) is timed with it.
    t0 = target.clock()
    shared_s, taken = 0.0, prefill is None  # with a shared prefill: its seconds in place of the copy's
    try:
        drafter.begin(list(prompt_ids))
        if prefill is None:
            cache = target.new_cache()
            with target.capture_features(layers) as features:
                logits = target.forward(cache, torch.tensor(prompt_ids, dtype=torch.long), last_only=True)
                feats = features() if layers else None
        else:
            t1 = target.clock()
            cache, logits, feats, seconds = prefill.take(target, list(prompt_ids), layers)
            taken, shared_s = True, seconds - (target.clock() - t1)
    except BaseException:
        if not taken:
            prefill.release()  # this method will not take its copy: the pass must not wait for it
        raise
    logits = apply_repetition_penalty(logits, prompt_ids, None, None, penalty)
    first = int(logits[0].argmax()) if sampling.greedy else \
        int(torch.multinomial(logits_to_probs(logits[0], sampling), 1, generator=generator).item())
    event = out.emit([first], [SOURCE_TARGET], _margins(logits), step=0, proposed=0, accepted=0,
                     seconds=target.clock() - t0 + shared_s)
    event.tree = StepTree([], [], [], [], [], first, 0.0, event.seconds)
    step = 0
    run_rate = RunRate()  # the budget's lambda: this run's tokens per unit of modelled step time
    while not event.finished:
        yield event
        if cancel is not None and cancel.is_set():
            event = StepEvent(out.method, step + 1, [], [], [], 0, 0, 0.0, [], out.stats.snapshot(), True, "cancelled")
            break
        step += 1
        t0 = target.clock()
        # 1. Draft: candidates rooted at the last emitted token, no deeper than the tokens left.
        budget = settings.max_new_tokens - out.stats.new_tokens - 1
        if context_length is not None:
            budget = min(budget, context_length - len(out.tokens))
        state = DecodeState(out.tokens, len(prompt_ids), sampling, generator, max(budget, 0), target.device,
                            target.vocab_size, features=feats)
        cand = drafter.propose(state)
        context = len(out.tokens)
        if drafter.budget_cost is not None:  # the per-step budget: keep what pays on this device
            cand = apply_budget(cand, drafter.budget_cost, context, run_rate.value)
        depth = max(cand.depths()) if len(cand) else 0
        if depth > state.budget:
            raise RuntimeError(f"{type(drafter).__name__} proposed a tree deeper than the budget {state.budget}")
        t_draft = target.clock() - t0
        # 2. Verify: the root plus every candidate in one target forward pass; 3. the rule that applies.
        past_len = len(out.tokens) - 1
        logits, extra_logits, feats = _target_pass(target, cache, out.tokens, cand, layers)
        logits = apply_repetition_penalty(logits, out.tokens, cand.parents.cpu() if len(cand) else None,
                                          cand.tokens.cpu() if len(cand) else None, penalty)
        verdict = verify(cand, logits, sampling, generator, drafter.typical)
        # 4. Commit: keep the root and the accepted path in the KV cache, drop the rest; the drafter learns.
        rows = [0] + [c + 1 for c in verdict.path]
        CausalLM.keep(cache, past_len, rows)
        feats = feats[rows] if feats is not None else None
        new = [int(cand.tokens[c]) for c in verdict.path] + [verdict.bonus_token]
        if drafter.budget_cost is not None:
            run_rate.observe(len(new), cand, drafter.budget_cost, context)
        sources = [cand.sources[c] for c in verdict.path] + [SOURCE_TARGET]
        drafter.update(StepResult(cand, verdict.path, verdict.bonus_token, out.tokens + new, extra_logits,
                                  logits=logits))
        margins = verdict.margins if verdict.margins is not None else _margins(logits[rows])
        event = out.emit(new, sources, margins, step=step, proposed=len(cand),
                         accepted=len(verdict.path), seconds=target.clock() - t0, draft_s=t_draft, depth=depth)
        event.tree = StepTree.of(cand, verdict.path, verdict.bonus_token, t_draft, event.seconds - t_draft)
    drafter.finish(list(out.tokens), len(prompt_ids))  # before the last event: consumers may stop there
    yield event


def generate(target: CausalLM, drafter: Drafter, prompt_ids: list[int], settings: GenerationSettings,
             **kwargs) -> tuple[list[int], RunStats]:
    """Run :func:`decode` to the end; return the new token ids and the run's statistics."""
    out: list[int] = []
    stats = RunStats()
    for event in decode(target, drafter, prompt_ids, settings, **kwargs):
        out.extend(event.tokens)
        stats = event.stats
    return out, stats
