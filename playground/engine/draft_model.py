"""Draft-model speculative decoding: a small draft model proposes a chain of K tokens.

Sources: Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
Decoding"; Chen et al. 2023, "Accelerating Large Language Model Decoding with
Speculative Sampling". The draft keeps its own KV cache; after each verification it is
rolled back to the longest prefix it shares with the committed sequence, and the tokens
it has not seen yet (the accepted tail and the bonus token) are fed on the next
proposal, in the same forward pass as the first drafted token.

A draft may have a *reduced vocabulary* (the most frequent target tokens only, as EAGLE-3
does to shrink the draft's output layer): a :class:`TokenMap` then translates target ids
into draft ids on the way in and draft logits back onto the target's vocabulary on the way
out. Tokens outside the draft's vocabulary are never proposed (probability 0), and
verification stays exact because the target checks every drafted token.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from torch import nn

from .budget import AcceptanceEstimator, DraftGate, GateMemory, StepCost, probability_bin, with_budget_knob
from .drafter import DecodeState, Drafter, StepResult
from .events import SOURCE_DRAFT, SOURCE_TARGET
from .limits import DRAFT_CONFIDENCE_KNOB, DRAFT_PROPOSER_KNOB, K_KNOB
from .registry import MethodInfo, register
from .step_cost import build_with_budget
from .sampling import logits_to_probs
from .target import CausalLM
from .tree import Candidates


def fit_vocab(q: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Pad (with zeros) or cut ``q`` ``(draft_vocab,)`` to ``(vocab_size,)``.

    Embedding tables are often padded past the tokenizer's vocabulary; the tokenizer check
    at load time guarantees that the ids both models use mean the same strings.
    """
    if q.shape[-1] == vocab_size:
        return q
    if q.shape[-1] > vocab_size:
        q = q[..., :vocab_size]
        return q / q.sum(-1, keepdim=True)
    return torch.nn.functional.pad(q, (0, vocab_size - q.shape[-1]))


TOKEN_MAP_FILE = "draft_vocab.json"
"""File in a reduced-vocabulary draft's folder: ``{"target_ids": [...]}``, the target id of each
draft id, with -1 for the draft's out-of-vocabulary input id."""


DRAFT_KNOBS_FILE = "draft_knobs.json"
"""Optional file in a draft's folder: the draft_model knob values that suit this draft, e.g.
``{"k": 2, "confidence": 0.2}``; they replace the global defaults while it is loaded (values the
user sets still win)."""


def load_knob_defaults(folder: str | Path) -> dict:
    """The knob values saved in ``folder/draft_knobs.json`` ({} when there is none).

    Raises:
        ValueError: a knob draft_model does not have, or a value out of its range.
    """
    path = Path(folder) / DRAFT_KNOBS_FILE
    if not path.is_file():
        return {}
    values = json.loads(path.read_text())
    knobs = {knob.name: knob for knob in (K_KNOB, DRAFT_CONFIDENCE_KNOB)}
    unknown = sorted(set(values) - set(knobs))
    if unknown:
        raise ValueError(f"{DRAFT_KNOBS_FILE} names {', '.join(unknown)}; a draft may set only {', '.join(knobs)}")
    return {name: knobs[name].check(value) for name, value in values.items()}


class TokenMap:
    """Translation between a reduced draft vocabulary and the target's.

    Args:
        target_ids: ``(draft_vocab,)`` the target id of each draft id; exactly one entry is -1,
            the draft's input id for every target token it does not have (never proposed).
        target_vocab: the target's vocabulary size.

    Raises:
        ValueError: no -1 entry, a repeated id, or an id outside ``[0, target_vocab)``.
    """

    def __init__(self, target_ids: list[int], target_vocab: int):
        ids = torch.tensor(target_ids, dtype=torch.long)
        unknown = (ids == -1).nonzero().flatten()
        if len(unknown) != 1:
            raise ValueError(f"a token map needs exactly one -1 (out-of-vocabulary) entry, got {len(unknown)}")
        known = ids[ids >= 0]
        if len(known.unique()) != len(known) or (known >= target_vocab).any():
            raise ValueError(f"token map ids must be distinct and in [0, {target_vocab})")
        self.unknown_id = int(unknown[0])
        self.to_target = ids  # (draft_vocab,)
        self.to_draft = torch.full((target_vocab,), self.unknown_id, dtype=torch.long)  # (target_vocab,)
        self.to_draft[known] = (ids >= 0).nonzero().flatten()
        self.target_vocab = target_vocab
        self._index: tuple[torch.Tensor, torch.Tensor] | None = None  # (draft cols, target cols) on a device

    @classmethod
    def load(cls, folder: str | Path, target_vocab: int) -> "TokenMap | None":
        """The map saved in ``folder`` (None when the draft has the full vocabulary)."""
        path = Path(folder) / TOKEN_MAP_FILE
        if not path.is_file():
            return None
        return cls(json.loads(path.read_text())["target_ids"], target_vocab)

    def save(self, folder: str | Path) -> None:
        """Write the map to ``folder/draft_vocab.json`` (read back by :meth:`load`)."""
        (Path(folder) / TOKEN_MAP_FILE).write_text(json.dumps({"target_ids": self.to_target.tolist()}))

    def draft_ids(self, target_ids: torch.Tensor) -> torch.Tensor:
        """Target ids ``(n,)`` to draft input ids ``(n,)``."""
        return self.to_draft[target_ids]

    def target_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """Draft logits ``(..., draft_vocab)`` spread onto the target's vocabulary
        ``(..., target_vocab)``; target tokens the draft lacks (and the out-of-vocabulary slot)
        get -inf."""
        device = draft_logits.device
        if self._index is None or self._index[0].device != device:
            keep = self.to_target >= 0
            self._index = (keep.nonzero().flatten().to(device), self.to_target[keep].to(device))
        draft_cols, target_cols = self._index
        out = torch.full((*draft_logits.shape[:-1], self.target_vocab), float("-inf"),
                         dtype=draft_logits.dtype, device=device)
        out[..., target_cols] = draft_logits[..., draft_cols]
        return out


def _price(cost, queries: int, context: int | None) -> float:
    """A chain of ``queries`` queries' step cost (a :class:`StepCost` at ``context``; a plain curve as is)."""
    return float(cost(queries, True, context) if isinstance(cost, StepCost) else cost(queries))


class DraftModelDrafter(Drafter):
    """Chain drafter backed by a smaller causal LM that shares the target's tokenizer.

    Args:
        draft: the draft model wrapper.
        k: speculative tokens K (gamma) per step, in ``[1, MAX_SPECULATIVE_TOKENS]``.
        token_map: for a reduced-vocabulary draft, its :class:`TokenMap` (None: same ids).
        confidence: dynamic draft length: before drafting each position, stop when the draft's
            largest next-token probability (after the sampling transform) is below this; 0 =
            always K tokens. The decision depends only on the draft's distribution, never on
            the token then drawn, so drafted tokens stay exact samples of q and speculative
            sampling stays exact. (Transformers' ``assistant_confidence_threshold`` and
            Mamou et al. 2024, "Dynamic Speculation Lookahead", use the same idea.)

    Raises:
        ValueError: when ``k`` or ``confidence`` is out of range.
    """

    name = "draft_model"
    source = SOURCE_DRAFT

    def __init__(self, draft: CausalLM, k: int = K_KNOB.default, token_map: TokenMap | None = None,
                 confidence: float = DRAFT_CONFIDENCE_KNOB.default):
        self.draft = draft
        self.k = K_KNOB.check(k)
        self.confidence = DRAFT_CONFIDENCE_KNOB.check(confidence)
        self.token_map = token_map
        self.cache = None
        self.fed: list[int] = []  # token ids held in the draft's KV cache, in order
        self.estimator = AcceptanceEstimator()
        self.gate_memory = GateMemory()
        self.gate = DraftGate()
        self.draft_s = 0.0  # running mean seconds of one draft forward over one token

    def begin(self, prompt_ids: list[int]) -> None:
        self.cache = self.draft.new_cache()
        self.fed = []
        self.gate = DraftGate(prior=self.gate_memory.prior())

    def finish(self, tokens: list[int], prompt_len: int) -> None:
        self.gate_memory.remember(self.gate)

    def _gate_open(self, context: int | None = None) -> bool:
        """With the budget on: whether drafting can pay this step (:class:`DraftGate`, its break-even
        the draft pass's share of a plain target step plus one more verified query's, priced at this
        ``context`` length)."""
        if self.budget_cost is None:
            return True
        plain_s = float(getattr(self.budget_cost.chain, "seconds", {}).get(1, 0.0))
        if plain_s > 0 and self.draft_s > 0:
            self.gate.pay_at = self.draft_s / plain_s + max(0.0, _price(self.budget_cost, 2, context) - 1.0)
        return self.gate.draft_now()

    def _sync_cache(self, tokens: list[int]) -> list[int]:
        """Roll the cache back to its common prefix with ``tokens``; return the unseen tail."""
        common = 0
        limit = min(len(self.fed), len(tokens))
        while common < limit and self.fed[common] == tokens[common]:
            common += 1
        if common < len(self.fed):
            CausalLM.crop(self.cache, common)
            del self.fed[common:]
        return tokens[common:]

    def _greedy_pick(self, logits: torch.Tensor, vocab_size: int) -> tuple[int, float]:
        """The draft's most likely token as a target id, and its probability (1.0 without a
        confidence threshold, where it is not needed).

        Args:
            logits: ``(draft_vocab,)`` the draft's logits for one position, in its own ids.
            vocab_size: the target's vocabulary size; only ids below it may be proposed (a full-
                vocabulary draft's table may be padded; a token map's out-of-vocabulary slot never is).

        Works in the draft's ids: the same token and probability as the argmax and softmax of
        ``TokenMap.target_logits(logits)``, without spreading a row onto the target's vocabulary.
        """
        if self.token_map is None:
            logits = logits[:vocab_size]
        else:
            logits = logits.clone()
            logits[self.token_map.unknown_id] = float("-inf")
        best = int(logits.argmax())
        q_max = float(torch.softmax(logits.float(), -1)[best]) if self.confidence > 0 else 1.0
        return (best if self.token_map is None else int(self.token_map.to_target[best])), q_max

    def propose(self, state: DecodeState) -> Candidates:
        k = min(self.k, state.budget)
        if k <= 0 or not self._gate_open(len(state.tokens)):
            return Candidates.empty(state.device)
        pending = self._sync_cache(state.tokens)
        drafted: list[int] = []
        q_rows: list[torch.Tensor] = []
        q_drafted: list[float] = []  # the draft's probability of each drafted token (acceptance estimate)
        path_p = 1.0
        for i in range(k):
            # With the budget on, stop drafting once the path is too unlikely to pay for its
            # verification (its expected gain under the marginal cost of one more query).
            if self.budget_cost is not None and i and path_p < self.min_path_prob:
                break
            # 1. Feed what the draft has not seen (the unseen tail, then each drafted token).
            feed = torch.tensor(pending if i == 0 else [drafted[-1]], dtype=torch.long)
            t0 = time.perf_counter()
            logits = self.draft.forward(self.cache, feed if self.token_map is None else self.token_map.draft_ids(feed),
                                        last_only=True)[-1]
            spent = time.perf_counter() - t0
            if len(feed) <= 2:  # a drafting pass (a drafted token, or the last one with the bonus), not a catch-up
                self.draft_s = spent if not self.draft_s else 0.9 * self.draft_s + 0.1 * spent
            self.fed.extend(feed.tolist())
            if state.sampling.greedy:
                # 2-3. Greedy: the argmax, unless the draft is unsure of this position.
                token, q_max = self._greedy_pick(logits, state.vocab_size)
                if q_max < self.confidence:
                    break
                drafted.append(token)
                q_drafted.append(q_max)
                path_p *= self._calibrated(q_max, i + 1)
                continue
            if self.token_map is not None:
                logits = self.token_map.target_logits(logits)
            probs = logits_to_probs(logits, state.sampling)  # q, the target's sampling transform
            # 2. Stop early when the draft is unsure of this position (its distribution only).
            if self.confidence > 0 and probs.max() < self.confidence:
                break
            # 3. Draft the next token: a sample from q.
            q = fit_vocab(probs, state.vocab_size).to(state.device)
            drafted.append(int(torch.multinomial(q, 1, generator=state.generator).item()))
            q_rows.append(q)
            q_drafted.append(float(q.max()))
            path_p *= self._calibrated(q_drafted[-1], i + 1)
        if not drafted:
            return Candidates.empty(state.device)
        draft_probs = torch.stack(q_rows) if q_rows else None
        cand = Candidates.chain(drafted, self.source, draft_probs, device=state.device)
        keys = [(probability_bin(q), min(d, 4)) for d, q in enumerate(q_drafted, start=1)]
        cand.accept_probs = self.estimator.estimate(cand, keys, q_drafted)
        return cand

    def _calibrated(self, q: float, depth: int) -> float:
        """The estimator's current acceptance estimate for a drafted token of probability ``q``."""
        return self.estimator.value((probability_bin(q), min(depth, 4)), q)

    min_path_prob = 0.25
    """With the budget on, drafting stops when the drafted path's estimated probability falls below
    this: a drafted token costs a draft pass (about a fifth of a target step for the shipped draft on
    a CPU) plus a verified query, so a less likely one does not pay."""

    def update(self, result: StepResult) -> None:
        self.estimator.observe(result)
        if len(result.candidates):  # a chain: its first token is always tested
            self.gate.observe(bool(result.path))
        # Rejected drafted tokens are dropped lazily, by the next propose's _sync_cache.


class MedusaDraftDrafter(DraftModelDrafter):
    """Medusa as a draft (the seed's idea): a small draft model with Medusa heads proposes its own
    next token plus its heads' tokens, a chain of ``min(k, 1 + num_heads)`` from **one** draft
    forward pass, for a larger target with the same tokenizer.

    Args:
        draft: the draft model wrapper; heads: Medusa heads trained on (and attached to) it
            (:class:`~playground.engine.medusa.MedusaHeads`: ``num_heads``, ``heads(hidden, n)``
            ``(n, vocab)`` logits).
        k: most tokens per step, in ``[1, MAX_SPECULATIVE_TOKENS]``.
        token_map: the draft's :class:`~playground.engine.draft_model.TokenMap` when it has a
            reduced vocabulary (its heads then predict draft ids too); None: same ids.

    The draft's own token is its argmax (greedy) or a sample from its distribution q; the heads'
    tokens are their argmax (deterministic: q one-hot), so speculative sampling stays exact.
    """

    name = "draft_model"

    def __init__(self, draft: CausalLM, heads, k: int = K_KNOB.default, token_map=None):
        super().__init__(draft, k, token_map=token_map)
        self.heads = heads

    @torch.inference_mode()
    def propose(self, state: DecodeState) -> Candidates:
        k = min(self.k, 1 + self.heads.num_heads, state.budget)
        if k <= 0:
            return Candidates.empty(state.device)
        # 1. One draft forward over the tokens it has not seen yet.
        pending = self._sync_cache(state.tokens)
        feed = torch.tensor(pending, dtype=torch.long)
        logits, hidden = self.draft.forward(self.cache, feed if self.token_map is None else self.token_map.draft_ids(feed),
                                            return_hidden=True, last_only=True)
        self.fed.extend(pending)
        logits, hidden = logits[-1], hidden[-1]
        head_logits = self.heads(hidden, k - 1) if k > 1 else None  # (k - 1, draft vocab)
        if self.token_map is not None:
            logits = self.token_map.target_logits(logits)
            head_logits = self.token_map.target_logits(head_logits) if head_logits is not None else None
        # 2. The draft's next token: argmax, or a sample from q.
        q = None
        if state.sampling.greedy:
            first = int(logits[:state.vocab_size].argmax())
        else:
            q = fit_vocab(logits_to_probs(logits, state.sampling), state.vocab_size).to(state.device)
            first = int(torch.multinomial(q, 1, generator=state.generator).item())
        # 3. The heads' argmax tokens for the positions after it (q one-hot: deterministic).
        rest = head_logits[:, :state.vocab_size].argmax(-1).tolist() if head_logits is not None else []
        draft_probs = None
        if q is not None:  # (1 + len(rest), vocab_size): q, then one-hot rows for the heads' tokens
            one_hot = nn.functional.one_hot(torch.tensor(rest, dtype=torch.long, device=state.device), state.vocab_size)
            draft_probs = torch.cat([q[None], one_hot.to(q.dtype)])
        return Candidates.chain([first] + rest, self.source, draft_probs, device=state.device)


def _build(engine, params: dict) -> Drafter:
    """The draft model's drafter: the draft drafts K tokens (proposer ``model``), or its next token plus
    its Medusa heads' tokens from one draft pass (proposer ``medusa_heads``).

    Raises:
        ValueError: proposer ``medusa_heads`` without heads trained on the draft.
    """
    params = dict(params)
    token_map = getattr(engine.draft, "token_map", None)
    if params.pop("proposer", DRAFT_PROPOSER_KNOB.default) == "medusa_heads":
        if engine.draft_medusa is None:
            raise ValueError("the draft model's proposer 'Medusa heads on the draft' needs Medusa "
                             "heads trained on the draft model, and none are loaded: choose the proposer 'draft "
                             "model'")
        params.pop("confidence", None)  # the heads propose in one pass: no per-token stop
        return MedusaDraftDrafter(engine.draft_lm, engine.draft_medusa, token_map=token_map, **params)
    return DraftModelDrafter(engine.draft_lm, token_map=token_map, **params)


def _build_with_budget(engine, params: dict) -> Drafter:
    return build_with_budget(engine, params, lambda p: _build(engine, p), "draft_model")


METHOD = register(MethodInfo(
    "draft_model", "Draft model",
    "A small draft model proposes K tokens; the target verifies them in one pass (Leviathan et al. 2023; "
    "Chen et al. 2023).",
    lossless=True, knobs=with_budget_knob((K_KNOB, DRAFT_CONFIDENCE_KNOB, DRAFT_PROPOSER_KNOB)),
    sources=(SOURCE_TARGET, SOURCE_DRAFT), source_labels={SOURCE_DRAFT: "draft model"}, build=_build_with_budget,
    requires=("draft",)))
