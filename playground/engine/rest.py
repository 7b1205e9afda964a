"""Retrieval-based speculative decoding (REST): a datastore of the target's own answers proposes a tree.

Source: He, Zhong, Cai, Lee, He 2024, "REST: Retrieval-Based Speculative Decoding" (NAACL 2024;
reference code FasterDecoding/REST, whose datastore is a suffix array). Facts taken from the
paper, code written here:

1. **Datastore**: a fixed corpus of token sequences and an index that finds every occurrence of a
   token string in it. Here the corpus is the target's own greedy answers to self-generated
   requests (``data/selfgen/<target>``, written by :mod:`playground.training.tasks`: no benchmark
   text), and the index is a sorted array of every position's next :data:`MAX_REST_MATCH` tokens,
   packed four 16-bit tokens to a 64-bit word (:class:`Datastore`): a suffix array cut at that
   depth, searched with ``numpy.searchsorted``.
2. **Retrieval**: each step, the longest suffix of the context (prompt plus output, at most
   ``max_match`` and at least ``min_match`` tokens) that occurs in the datastore; the
   ``depth`` tokens after each of its occurrences (at most ``max_retrieved`` of them, evenly
   spread over the sorted occurrences) are the retrieved continuations.
3. **Candidate tree**: the trie of the continuations, a node's count being the number of
   continuations that start with its path (:func:`continuation_tree`). The most frequent nodes
   (path frequency at least ``min_token_prob``, at most ``max_spec_tokens``) are proposed: REST's
   selection of the most frequent prefixes. A child is never more frequent than its parent, so
   the kept nodes form a tree.

Unlike suffix decoding's trees (the request and this engine's earlier outputs) the datastore is
fixed and large (about 1.7 million tokens for the default target), so it drafts in free text where
no earlier output repeats. The proposal is deterministic, so under sampling the verifier uses the
one-hot rule and the output keeps the target's distribution.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch

from .budget import AcceptanceEstimator, probability_bin, with_budget_knob
from .drafter import DecodeState, Drafter, StepResult
from .events import SOURCE_TARGET
from .limits import Knob
from .registry import MethodInfo, register
from .step_cost import build_with_budget
from .tree import Candidates

SOURCE_REST = "rest"
"""Tokens accepted from the REST datastore."""

WORD_TOKENS = 4
"""Tokens packed into one 64-bit index word (16 bits each)."""
MAX_REST_MATCH = 12
"""Longest context suffix matched in the datastore (tokens; three index words)."""
MAX_REST_DEPTH = 16
"""Longest retrieved continuation (tokens)."""
MAX_REST_SPEC_TOKENS = 32
"""Most candidate nodes REST proposes per step."""
MAX_REST_RETRIEVED = 1024
"""Most continuations retrieved per step."""
MAX_TOKEN_ID = (1 << 16) - 2
"""Largest token id the packed index holds (ids are stored plus one; 0 ends a sequence)."""

REST_MAX_MATCH_KNOB = Knob("max_match", "Longest match", 1, MAX_REST_MATCH, MAX_REST_MATCH,
                           info="REST: longest suffix of the context looked up in the datastore (tokens).")
REST_MIN_MATCH_KNOB = Knob("min_match", "Shortest match", 1, MAX_REST_MATCH, 1,
                           info="REST: shortest suffix worth retrieving for (tokens); shorter ones propose nothing.")
REST_DEPTH_KNOB = Knob("depth", "Continuation length", 1, MAX_REST_DEPTH, 8,
                       info="REST: tokens retrieved after each occurrence (the candidate tree's depth).")
REST_SPEC_KNOB = Knob("max_spec_tokens", "Max speculated tokens", 1, MAX_REST_SPEC_TOKENS, 16,
                      info="REST: most candidate nodes per step.")
REST_MIN_PROB_KNOB = Knob("min_token_prob", "Min path frequency", 0.0, 1.0, 0.1, step=0.01, integer=False,
                          info="REST: drop nodes that fewer than this share of the retrieved continuations start with.")
REST_RETRIEVED_KNOB = Knob("max_retrieved", "Continuations retrieved", 1, MAX_REST_RETRIEVED, 256,
                           info="REST: most occurrences read per step (evenly spread over all of them).")
REST_KNOBS = (REST_MAX_MATCH_KNOB, REST_MIN_MATCH_KNOB, REST_DEPTH_KNOB, REST_SPEC_KNOB, REST_MIN_PROB_KNOB,
              REST_RETRIEVED_KNOB)

DEFAULT_DATASTORE_DIR = Path(__file__).resolve().parents[2] / "data" / "selfgen" / "default"
"""The default target's datastore: its committed self-generated answers."""
DATASTORE_ENV = "PLAYGROUND_DATASTORE"
"""Environment variable naming a datastore folder for any target (chunks as the generator writes them)."""


class Datastore:
    """A fixed token corpus with an index of every position's next :data:`MAX_REST_MATCH` tokens.

    The corpus is the sequences one after another, each followed by an end mark, stored as
    ``id + 1`` (0 = end). Index word w of position p packs corpus tokens ``p + 4w .. p + 4w + 3``
    (16 bits each, the first in the high bits); the positions are sorted by their words
    (lexicographically, ``numpy.lexsort``), so the occurrences of any string of up to 12 tokens are
    one contiguous range, found word by word with ``numpy.searchsorted`` in O(log n).

    Args:
        sequences: token-id sequences (ids in ``[0, MAX_TOKEN_ID]``).

    Raises:
        ValueError: a token id outside ``[0, MAX_TOKEN_ID]``.

    Memory: 40 bytes a corpus token (a million tokens: 40 MB).
    """

    def __init__(self, sequences: Iterable[Sequence[int]]):
        parts = []
        for seq in sequences:
            arr = np.asarray(list(seq), dtype=np.int64)
            if not arr.size:
                continue
            if arr.min() < 0 or arr.max() > MAX_TOKEN_ID:
                raise ValueError(f"datastore token ids must be in [0, {MAX_TOKEN_ID}], got {int(arr.min())}.."
                                 f"{int(arr.max())}")
            parts += [arr + 1, np.zeros(1, np.int64)]
        corpus = np.concatenate(parts) if parts else np.zeros(1, np.int64)
        n = len(corpus)
        self.sequences = len(parts) // 2
        self.num_tokens = n - self.sequences
        # Padded with end marks, so every position has a full window and a full continuation.
        self.corpus = np.concatenate([corpus, np.zeros(MAX_REST_MATCH + MAX_REST_DEPTH, np.int64)])
        packed = self.corpus.astype(np.uint64)
        words = []
        for w in range(MAX_REST_MATCH // WORD_TOKENS):
            key = np.zeros(n, np.uint64)
            for j in range(WORD_TOKENS):
                start = w * WORD_TOKENS + j
                key = (key << np.uint64(16)) | packed[start:start + n]
            words.append(key)
        order = np.lexsort(words[::-1])  # lexsort's last key is the primary one
        self.order = order.astype(np.int64)
        self.words = [w[order] for w in words]

    def __len__(self) -> int:
        return self.num_tokens

    def find(self, pattern: Sequence[int]) -> tuple[int, int]:
        """The index range ``[lo, hi)`` of ``pattern``'s occurrences (``hi - lo`` of them; their corpus
        positions are ``order[lo:hi]``).

        Raises:
            ValueError: ``pattern`` empty or longer than :data:`MAX_REST_MATCH`.
        """
        m = len(pattern)
        if not 0 < m <= MAX_REST_MATCH:
            raise ValueError(f"a datastore pattern has 1..{MAX_REST_MATCH} tokens, got {m}")
        lo, hi = 0, len(self.order)
        for w in range(0, m, WORD_TOKENS):
            toks = pattern[w:w + WORD_TOKENS]
            value = 0
            for t in toks:
                t = int(t)
                if not 0 <= t <= MAX_TOKEN_ID:
                    return 0, 0  # an id the index cannot hold occurs nowhere
                value = (value << 16) | (t + 1)
            shift = 16 * (WORD_TOKENS - len(toks))  # a partial word matches a range of words
            col = self.words[w // WORD_TOKENS][lo:hi]
            a = int(np.searchsorted(col, np.uint64(value << shift), "left"))
            b = int(np.searchsorted(col, np.uint64(((value + 1) << shift) - 1), "right"))
            lo, hi = lo + a, lo + b
            if lo >= hi:
                return lo, lo
        return lo, hi

    def longest_match(self, context: Sequence[int], max_match: int, min_match: int = 1) -> tuple[int, int, int]:
        """``(m, lo, hi)``: the longest suffix of ``context`` (``min_match <= m <= max_match``) that
        occurs, with its range (:meth:`find`); ``(0, 0, 0)`` when none does.

        A binary search on m: where the suffix of m tokens occurs, the suffix of m - 1 occurs one
        position later, so the lengths that occur are 1 .. M. About 4 lookups instead of up to 12
        (:func:`longest_match_reference` tries them longest first)."""
        best = (0, 0, 0)
        low, high = max(min_match, 1), min(max_match, MAX_REST_MATCH, len(context))
        while low <= high:
            m = (low + high) // 2
            lo, hi = self.find(context[len(context) - m:])
            if hi > lo:
                best, low = (m, lo, hi), m + 1
            else:
                high = m - 1
        return best

    def continuations(self, lo: int, hi: int, m: int, depth: int, max_retrieved: int) -> np.ndarray:
        """``(k, depth)`` int64 target ids following occurrences ``lo .. hi - 1`` of an ``m``-token
        pattern (``k = min(hi - lo, max_retrieved)``, evenly spread), -1 after a sequence's end."""
        count = hi - lo
        idx = np.arange(lo, hi) if count <= max_retrieved else \
            lo + np.linspace(0, count - 1, max_retrieved).round().astype(np.int64)
        starts = self.order[idx] + m
        rows = self.corpus[starts[:, None] + np.arange(depth)[None, :]]
        alive = np.cumprod(rows != 0, axis=1).astype(bool)  # nothing after an end mark
        return np.where(alive, rows - 1, -1)


def longest_match_reference(store: Datastore, context: Sequence[int], max_match: int,
                            min_match: int = 1) -> tuple[int, int, int]:
    """Slow obvious reference of :meth:`Datastore.longest_match`: every length, longest first."""
    for m in range(min(max_match, MAX_REST_MATCH, len(context)), max(min_match, 1) - 1, -1):
        lo, hi = store.find(context[len(context) - m:])
        if hi > lo:
            return m, lo, hi
    return 0, 0, 0


def continuation_tree(rows: np.ndarray, max_nodes: int, min_prob: float) -> tuple[list[int], list[int], list[float],
                                                                                     list[float]]:
    """The most frequent nodes of the trie of ``rows`` (REST's candidate selection).

    Args:
        rows: ``(k, depth)`` int64 continuations (-1 after a continuation's end), k >= 1.
        max_nodes: most nodes kept; min_prob: least path frequency kept.

    Returns:
        ``(tokens, parents, conditional frequencies, path frequencies)``, parents before children:
        a node's path frequency is the share of the k rows that start with its path, its conditional
        one that share over its parent's. Ties keep the shallower node (so a kept node's parent is kept).
    """
    k, depth = rows.shape
    if k == 0 or max_nodes <= 0:
        return [], [], [], []
    codes = np.zeros(k, np.uint64)
    nodes = []  # (count, depth, code, parent code, token)
    for d in range(depth):
        col = rows[:, d]
        live = col >= 0
        if not live.any():
            break
        parent = codes.copy()
        codes = codes * np.uint64(1_000_003) + (col + 1).astype(np.uint64)  # a path's hash
        uniq, first, counts = np.unique(codes[live], return_index=True, return_counts=True)
        keep = counts >= min_prob * k
        rows_live = np.flatnonzero(live)
        for c, f, n in zip(uniq[keep].tolist(), first[keep].tolist(), counts[keep].tolist()):
            r = rows_live[f]
            nodes.append((n, d, c, int(parent[r]) if d else None, int(col[r])))
        if not keep.any():
            break
    nodes.sort(key=lambda x: (-x[0], x[1]))
    kept = sorted(nodes[:max_nodes], key=lambda x: (x[1], -x[0]))
    index: dict[tuple[int, int], int] = {}
    tokens, parents, conds, probs = [], [], [], []
    count_of: dict[int, int] = {}
    for n, d, c, pc, t in kept:
        parent = -1 if d == 0 else index[(d - 1, pc)]
        index[(d, c)] = len(tokens)
        tokens.append(t)
        parents.append(parent)
        conds.append(n / (k if d == 0 else count_of[parent]))
        probs.append(n / k)
        count_of[len(tokens) - 1] = n
    return tokens, parents, conds, probs


def read_answers(folder: Path) -> list[list[int]]:
    """The answers (``input_ids[prompt_len:]``) of every record in ``folder``'s ``chunk_*.jsonl.gz``
    files (the generator's format, :mod:`playground.training.tasks`), except those marked
    ``"sampled"`` (its sampled passages, since round 108: not the target's greedy text).

    Raises:
        FileNotFoundError: no chunk file in ``folder``.
    """
    files = sorted(Path(folder).glob("chunk_*.jsonl.gz"))
    if not files:
        raise FileNotFoundError(f"no chunk_*.jsonl.gz datastore files in {folder}")
    out = []
    for f in files:
        with gzip.open(f, "rt", encoding="utf-8") as fh:
            for line in fh:
                rec = json.loads(line)
                if rec.get("sampled"):  # a sampled passage (since round 108), not the target's greedy text
                    continue
                ids = rec["input_ids"]
                ids = json.loads(ids) if isinstance(ids, str) else ids
                out.append([int(t) for t in ids[int(rec["prompt_len"]):]])
    return out


def datastore_dir(engine) -> Path:
    """The datastore folder for ``engine``'s target: ``$PLAYGROUND_DATASTORE`` when set, else the
    committed answers of the embedded default (:data:`DEFAULT_DATASTORE_DIR`).

    Raises:
        ValueError: another target and no ``$PLAYGROUND_DATASTORE`` (the ids are its tokenizer's).
    """
    from .models import DEFAULT_HUB_ID, DEFAULT_TARGET

    if os.environ.get(DATASTORE_ENV):
        return Path(os.environ[DATASTORE_ENV])
    spec = getattr(engine.target, "spec", None)
    if spec in (DEFAULT_TARGET, DEFAULT_HUB_ID):
        return DEFAULT_DATASTORE_DIR
    raise ValueError(f"rest needs a datastore of {engine.target.name}'s own answers: write one with "
                     f"`python -m playground.training.tasks --target {spec} --out FOLDER` and set "
                     f"{DATASTORE_ENV}=FOLDER")


def datastore_available(engine) -> bool:
    """Whether ``rest`` can run on ``engine``: a datastore given, or a folder of chunks for its target."""
    if getattr(engine, "datastore", None) is not None:
        return True
    try:
        folder = datastore_dir(engine)
    except ValueError:
        return False
    # Asked for every method's availability: the folder is listed once per engine and folder.
    return engine.persistent(f"datastore_available/{folder}", lambda: any(Path(folder).glob("chunk_*.jsonl.gz")))


class RestDrafter(Drafter):
    """REST as a drafter (see the module docstring).

    Args:
        store: the :class:`Datastore`.
        max_match, min_match, depth, max_spec_tokens, min_token_prob, max_retrieved: the knobs
            (:data:`REST_KNOBS`).

    Raises:
        ValueError: a knob out of its bound, or ``min_match`` above ``max_match``.
    """

    name = "rest"
    source = SOURCE_REST

    def __init__(self, store: Datastore, max_match: int = REST_MAX_MATCH_KNOB.default,
                 min_match: int = REST_MIN_MATCH_KNOB.default, depth: int = REST_DEPTH_KNOB.default,
                 max_spec_tokens: int = REST_SPEC_KNOB.default, min_token_prob: float = REST_MIN_PROB_KNOB.default,
                 max_retrieved: int = REST_RETRIEVED_KNOB.default):
        self.store = store
        self.max_match = REST_MAX_MATCH_KNOB.check(max_match)
        self.min_match = REST_MIN_MATCH_KNOB.check(min_match)
        if self.min_match > self.max_match:
            raise ValueError(f"REST: the shortest match (min_match, {self.min_match}) must not exceed the longest "
                             f"(max_match, {self.max_match})")
        self.depth = REST_DEPTH_KNOB.check(depth)
        self.max_spec_tokens = REST_SPEC_KNOB.check(max_spec_tokens)
        self.min_token_prob = REST_MIN_PROB_KNOB.check(min_token_prob)
        self.max_retrieved = REST_RETRIEVED_KNOB.check(max_retrieved)
        self.estimator = AcceptanceEstimator()
        self.hits = 0

    def begin(self, prompt_ids: list[int]) -> None:
        self.hits = 0

    def propose(self, state: DecodeState) -> Candidates:
        """The most frequent continuations of the longest suffix found (at most ``state.budget`` deep)."""
        depth = min(self.depth, state.budget)
        if depth <= 0:
            return Candidates.empty(state.device)
        m, lo, hi = self.store.longest_match(state.tokens, self.max_match, self.min_match)
        if not m:
            return Candidates.empty(state.device)
        rows = self.store.continuations(lo, hi, m, depth, self.max_retrieved)
        toks, pars, conds, _ = continuation_tree(rows, self.max_spec_tokens, self.min_token_prob)
        if not toks:
            return Candidates.empty(state.device)
        cand = Candidates(torch.tensor(toks, dtype=torch.long, device=state.device),
                          torch.tensor(pars, dtype=torch.long, device=state.device), [self.source] * len(toks))
        # Calibrated per (frequency bin, depth, match length, few or many occurrences): a long match
        # or many agreeing continuations are worth more than one chance occurrence.
        many = rows.shape[0] >= 8
        keys = [(probability_bin(c), min(d, 4), min(m, 6), many) for c, d in zip(conds, cand.depths())]
        cand.accept_probs = self.estimator.estimate(cand, keys, [0.6 * c for c in conds])
        return cand

    def update(self, result: StepResult) -> None:
        self.estimator.observe(result)
        self.hits += bool(result.path)

    def info(self) -> dict[str, int]:
        """The datastore's size (tokens) and this run's steps that accepted a retrieved token."""
        return {"datastore_tokens": len(self.store), "datastore_hits": self.hits}


def engine_datastore(engine) -> Datastore:
    """The engine's datastore: ``engine.datastore`` when given, else read from :func:`datastore_dir`
    and indexed once (under a second for a million tokens).

    Raises:
        ValueError: no datastore for this target (:func:`datastore_dir`), or its folder has no chunks.
    """
    if getattr(engine, "datastore", None) is not None:
        return engine.datastore
    folder = datastore_dir(engine)

    def make() -> Datastore:
        try:
            return Datastore(read_answers(folder))
        except FileNotFoundError as e:
            raise ValueError(f"rest: {e}") from None
    return engine.persistent(f"datastore/{folder}", make)


def build_rest(engine, params: dict, owner: str = "rest") -> RestDrafter:
    """A :class:`RestDrafter` over the engine's datastore (:func:`engine_datastore`)."""
    store = engine_datastore(engine)
    return build_with_budget(engine, params, lambda p: RestDrafter(store, **p), owner)


METHOD = REST_METHOD = register(MethodInfo(
    name="rest", label="REST (retrieval)",
    description="Retrieves what followed the context's longest suffix in a datastore of the target's own earlier "
                "answers and proposes the most frequent continuations as a tree (He et al. 2024).",
    lossless=True, knobs=with_budget_knob(REST_KNOBS), sources=(SOURCE_TARGET, SOURCE_REST),
    source_labels={SOURCE_REST: "REST datastore"}, build=build_rest, requires=("datastore",)))
