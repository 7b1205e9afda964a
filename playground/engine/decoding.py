"""The decoding loop shared by every method: draft, verify in one target pass, commit, emit.

One call of :func:`decode` is a generator that yields one :class:`StepEvent` per target
forward pass (the prefill first). Timing, stopping (EOS, max new tokens, cancellation),
detokenisation and statistics live here, once, for all methods.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Iterator

import torch

from .budget import apply_budget
from .detok import IncrementalDetokenizer
from .drafter import DecodeState, Drafter, StepResult
from .events import SOURCE_TARGET, RunStats, StepEvent
from .limits import MAX_NEW_TOKENS_KNOB
from .sampling import SamplingConfig, logits_to_probs
from .target import CausalLM
from .tree import Candidates, pass_attention
from .verify import Verdict, verify_greedy, verify_sampling, verify_typical


@dataclass(frozen=True)
class GenerationSettings:
    """Settings of one run.

    Attributes:
        max_new_tokens: the output never exceeds this many tokens.
        sampling: temperature (0 = greedy), top-p, top-k, seed.
        stop_on_eos: end the output at the first EOS token (its id is the output's last; it adds no text).

    Raises:
        ValueError: when ``max_new_tokens`` is out of range.
    """

    max_new_tokens: int = MAX_NEW_TOKENS_KNOB.default
    sampling: SamplingConfig = SamplingConfig()
    stop_on_eos: bool = True

    def __post_init__(self):
        object.__setattr__(self, "max_new_tokens", MAX_NEW_TOKENS_KNOB.check(self.max_new_tokens))


def _margins(logits: torch.Tensor) -> list[float]:
    """Top-1 minus top-2 logit of each row of ``logits`` ``(rows, vocab_size)``."""
    top2 = torch.topk(logits, 2, dim=-1).values
    return (top2[:, 0] - top2[:, 1]).tolist()


def decode(target: CausalLM, drafter: Drafter, prompt_ids: list[int], settings: GenerationSettings,
           *, eos_token_ids: list[int] | tuple[int, ...] = (), tokenizer=None, context_length: int | None = None,
           cancel: threading.Event | None = None, method: str | None = None) -> Iterator[StepEvent]:
    """Generate with ``drafter`` proposing and ``target`` verifying; yield one event per step.

    Args:
        target: the target model wrapper.
        drafter: any :class:`Drafter`; :class:`AutoregressiveDrafter` gives the baseline.
        prompt_ids: the prompt's token ids (chat template already applied), ``(prompt_len,)``.
        settings: max new tokens and sampling settings.
        eos_token_ids: ids that end the output (may be empty: the run then stops at
            max new tokens only).
        tokenizer: when given, events carry text pieces (incremental detokenisation).
        context_length: the target's context in tokens; None = unchecked.
        cancel: when set, the run ends before its next step with reason ``"cancelled"``.
        method: the name put in events (default: ``drafter.name``).

    Yields:
        :class:`StepEvent`; the last one has ``finished=True``.

    Raises:
        ValueError: empty prompt, or prompt plus ``max_new_tokens`` longer than the context.
    """
    method = method or drafter.name
    prompt_len = len(prompt_ids)
    if prompt_len == 0:
        raise ValueError("the prompt is empty: give at least one token")
    if context_length is not None and prompt_len + settings.max_new_tokens > context_length:
        raise ValueError(f"the prompt is {prompt_len} tokens; with max_new_tokens={settings.max_new_tokens} it "
                         f"exceeds the model's context of {context_length} tokens")
    sampling = settings.sampling
    eos = set(eos_token_ids) if settings.stop_on_eos else set()
    generator = None if sampling.greedy else sampling.generator(target.device)
    detok = IncrementalDetokenizer(tokenizer, prompt_ids) if tokenizer is not None else None
    stats = RunStats()
    tokens = list(prompt_ids)
    cache = target.new_cache()
    drafter.begin(list(prompt_ids))

    def pick(logits_row: torch.Tensor) -> int:
        if sampling.greedy:
            return int(logits_row.argmax())
        return int(torch.multinomial(logits_to_probs(logits_row, sampling), 1, generator=generator).item())

    def emit(new: list[int], sources: list[str], margins: list[float], step: int, proposed: int,
             accepted: int, seconds: float, draft_s: float, depth: int) -> StepEvent:
        # Stop at EOS (kept as the last output id, as transformers does; it adds no text) and at
        # max new tokens; nothing after either is emitted.
        reason = None
        for i, t in enumerate(new):
            if t in eos:
                new, sources, margins, reason = new[:i + 1], sources[:i + 1], margins[:i + 1], "eos"
                break
        room = settings.max_new_tokens - stats.new_tokens
        if len(new) >= room:
            new, sources, margins = new[:room], sources[:room], margins[:room]
            reason = reason or "length"
        accepted_kept = min(accepted, sum(1 for s in sources if s != SOURCE_TARGET))
        stats.record_step(seconds=seconds, emitted=len(new), proposed=proposed, accepted=accepted_kept,
                          draft_s=draft_s, verify_s=seconds - draft_s, proposed_depth=depth, prefill=step == 0)
        stats.drafter = drafter.info()
        tokens.extend(new)
        pieces = [(detok.add(t), s) for t, s in zip(new, sources)] if detok else []
        if reason and detok:
            tail = detok.flush()
            if tail:
                pieces.append((tail, sources[-1] if sources else SOURCE_TARGET))
        if reason is not None:
            drafter.finish(list(tokens), prompt_len)  # drafters that learn across runs keep the output
        return StepEvent(method, step, new, sources, pieces, proposed, accepted_kept, seconds, margins,
                         stats.snapshot(), finished=reason is not None, finish_reason=reason)

    # Prefill: one pass over the prompt gives the first new token (time to first token).
    # Drafters with needs_hidden (Medusa) also get the target's last hidden state at the root's parent.
    needs_hidden = drafter.needs_hidden
    hidden = None
    t0 = target.clock()
    if needs_hidden:
        logits, hidden_rows = target.forward(cache, torch.tensor(prompt_ids, dtype=torch.long), return_hidden=True,
                                             last_only=True)
        hidden = hidden_rows[-1]
    else:
        logits = target.forward(cache, torch.tensor(prompt_ids, dtype=torch.long), last_only=True)
    first = pick(logits[0])
    event = emit([first], [SOURCE_TARGET], _margins(logits), 0, 0, 0, target.clock() - t0, 0.0, 0)
    yield event
    step = 0
    while not event.finished:
        if cancel is not None and cancel.is_set():
            drafter.finish(list(tokens), prompt_len)
            yield StepEvent(method, step + 1, [], [], [], 0, 0, 0.0, [], stats.snapshot(), True, "cancelled")
            return
        step += 1
        t0 = target.clock()
        # 1. Draft: candidates rooted at the last emitted token, no deeper than the tokens left.
        budget = settings.max_new_tokens - stats.new_tokens - 1
        if context_length is not None:
            budget = min(budget, context_length - len(tokens))
        state = DecodeState(tokens, prompt_len, sampling, generator, max(budget, 0), target.device, target.vocab_size,
                            hidden)
        cand = drafter.propose(state)
        if drafter.budget_cost is not None:  # the per-step budget: keep what pays on this device
            cand = apply_budget(cand, drafter.budget_cost)
        if len(cand) and max(cand.depths()) > state.budget:
            raise RuntimeError(f"{type(drafter).__name__} proposed a tree deeper than the budget {state.budget}")
        t_draft = target.clock() - t0
        # 2. Verify: the root plus every candidate in one target forward pass.
        past_len = len(tokens) - 1
        inputs = torch.cat([torch.tensor(tokens[-1:], dtype=torch.long), cand.tokens.cpu()])
        extra_logits = hidden_rows = None
        hidden_kw = {"return_hidden": True} if needs_hidden else {}  # only then: wrappers need not know the flag
        if cand.extras is None:
            out = target.forward(cache, inputs, cand.parents if len(cand) else None, **hidden_kw)
        else:
            # The drafter's extra queries (e.g. Lookahead's Jacobi window) ride in the same pass.
            allowed, offsets = pass_attention(cand)
            out = target.forward_masked(cache, torch.cat([inputs, cand.extras.tokens.cpu()]), allowed, offsets,
                                        **hidden_kw)
        all_logits, hidden_rows = out if needs_hidden else (out, None)
        logits = all_logits[:len(cand) + 1]
        if cand.extras is not None:
            extra_logits = all_logits[len(cand) + 1:]
        if drafter.typical is not None:  # the drafter asked for typical acceptance (Medusa)
            probs = torch.softmax(logits, -1) if sampling.greedy else logits_to_probs(logits, sampling)
            verdict: Verdict = verify_typical(cand, probs, drafter.typical, generator)
        elif sampling.greedy:
            verdict = verify_greedy(cand, logits)
        else:
            verdict = verify_sampling(cand, logits_to_probs(logits, sampling), generator)
        # 3. Commit: keep the root and the accepted path in the KV cache, drop the rest.
        rows = [0] + [c + 1 for c in verdict.path]
        CausalLM.keep(cache, past_len, rows)
        new = [int(cand.tokens[c]) for c in verdict.path] + [verdict.bonus_token]
        sources = [cand.sources[c] for c in verdict.path] + [SOURCE_TARGET]
        hidden = hidden_rows[rows[-1]] if needs_hidden else None
        drafter.update(StepResult(cand, verdict.path, verdict.bonus_token, tokens + new, extra_logits, hidden,
                                  logits))
        seconds = target.clock() - t0
        depth = max(cand.depths()) if len(cand) else 0
        event = emit(new, sources, _margins(logits[rows]), step, len(cand), len(verdict.path), seconds,
                     t_draft, depth)
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
