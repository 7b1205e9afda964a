"""REST (retrieval-based speculative decoding): the datastore's index and the continuation trie against
slow references, the default datastore (the committed answers), errors, then the checks every method
passes (greedy equal to the baseline over many seeds, and, in test_drafter_failure_modes, EOS inside a
block, the token limit, no EOS id, streaming, sampling exactness)."""

from __future__ import annotations

import gzip
import json
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import drafter_checks as checks
from playground.engine import MethodSpec
from playground.engine.rest import (DATASTORE_ENV, DEFAULT_DATASTORE_DIR, MAX_TOKEN_ID, Datastore, RestDrafter,
                                    continuation_tree, datastore_dir, engine_datastore, longest_match_reference,
                                    read_answers)

pytestmark = pytest.mark.usefixtures("torch_single_thread")

ANSWERS = ["Quick bw-fox", "_JUMPS", "Café crème, 北京 🎉 naïve — ok!", "ab", "cdefghab"]
"""Texts the failure-mode checks script: the byte-level datastore has seen them as earlier answers."""


def fixture_store(vocab_size: int) -> Datastore:
    """Earlier answers for a test target: random sequences, and for the byte tokenizer the checks' texts
    (with EOS between the scripted halves, as the EOS check's answer has it)."""
    rng = random.Random(vocab_size)
    seqs = [[rng.randrange(vocab_size) for _ in range(120)] for _ in range(8)]
    if vocab_size >= 256:
        tok = checks.TOK
        seqs += [tok.encode(ANSWERS[0]) + [checks.EOS] + tok.encode(ANSWERS[1])]
        seqs += [tok.encode(t) for t in ANSWERS[2:]]
        seqs += [tok.encode(ANSWERS[3]) + [checks.EOS] + tok.encode(ANSWERS[4])]
    return Datastore(seqs)


def factory(vocab_size, budget_cost, model=None):
    if model is not None:  # the model's own greedy answers to other prompts: what a real datastore holds
        target, g = checks.CausalLM(model), torch.Generator().manual_seed(77)
        seqs = [checks.baseline(target, torch.randint(0, 8, (10,), generator=g).tolist(), 40) for _ in range(12)]
        store = Datastore(seqs)
    else:
        store = fixture_store(vocab_size)
    d = RestDrafter(store, min_match=1, depth=16)
    d.budget_cost = budget_cost
    return d


def occurrences(seqs, pattern):
    """Slow reference: (sequence, start) of every occurrence of ``pattern`` inside one sequence."""
    m = len(pattern)
    return sorted((i, j) for i, s in enumerate(seqs) for j in range(len(s) - m + 1) if list(s[j:j + m]) == pattern)


def test_find_equals_a_scan_of_every_sequence():
    """On 60 random corpora (tiny and 16-bit-wide vocabularies), every pattern of 1-12 tokens taken from
    the corpus or made up is found exactly as often as a scan finds it, never across two sequences, and
    each range's positions start with the pattern."""
    rng = random.Random(3)
    for trial in range(60):
        vocab = rng.choice([3, 7, 40, MAX_TOKEN_ID + 1])
        seqs = [[rng.randrange(vocab) for _ in range(rng.randint(0, 60))] for _ in range(rng.randint(1, 6))]
        store = Datastore(seqs)
        where = [(i, j) for i, s in enumerate(seqs) if s for j in range(len(s) + 1)]  # corpus position -> (seq, j)
        for _ in range(25):
            m = rng.randint(1, 12)
            src = [s for s in seqs if len(s) >= m]
            if src and rng.random() < 0.7:
                s = rng.choice(src)
                j = rng.randrange(len(s) - m + 1)
                pattern = s[j:j + m]
            else:
                pattern = [rng.randrange(vocab) for _ in range(m)]
            lo, hi = store.find(pattern)
            found = sorted(where[p] for p in store.order[lo:hi].tolist())
            assert found == occurrences(seqs, pattern), (trial, pattern)
    with pytest.raises(ValueError, match="1..12 tokens"):
        store.find([])
    assert store.find([MAX_TOKEN_ID + 5]) == (0, 0)
    with pytest.raises(ValueError, match="token ids must be in"):
        Datastore([[1, 2, MAX_TOKEN_ID + 1]])


def test_longest_match_and_continuations():
    """The longest suffix that occurs is chosen (bounded by max_match and min_match), and its
    continuations are what followed each occurrence, cut at the sequence's end."""
    store = Datastore([[1, 2, 3, 4, 5], [9, 2, 3, 4, 6, 7], [3, 4, 8]])
    m, lo, hi = store.longest_match([0, 2, 3, 4], 12, 1)
    assert (m, hi - lo) == (3, 2)
    rows = store.continuations(lo, hi, m, 3, 16)
    assert sorted(rows.tolist()) == [[5, -1, -1], [6, 7, -1]]
    m, lo, hi = store.longest_match([0, 2, 3, 4], 2, 1)
    assert (m, hi - lo) == (2, 3)
    assert store.longest_match([0, 5, 9], 12, 2) == (0, 0, 0)
    assert store.longest_match([0, 5, 9], 12, 1)[0] == 1
    m, lo, hi = store.longest_match([3], 12, 1)
    assert len(store.continuations(lo, hi, m, 2, 2)) == 2  # at most max_retrieved rows


def test_longest_match_equals_trying_every_length():
    """The binary search on the match length finds what trying every length longest first finds, on
    40 random corpora and contexts (small vocabularies, so that long matches occur), for every
    max_match and min_match."""
    rng = random.Random(11)
    for trial in range(40):
        vocab = rng.choice([2, 3, 5])
        seqs = [[rng.randrange(vocab) for _ in range(rng.randint(0, 50))] for _ in range(rng.randint(1, 4))]
        store = Datastore(seqs)
        for _ in range(20):
            context = [rng.randrange(vocab + 1) for _ in range(rng.randint(1, 16))]  # vocab: an unseen id
            max_match = rng.randint(1, 12)
            min_match = rng.randint(1, max_match)
            got = store.longest_match(context, max_match, min_match)
            assert got == longest_match_reference(store, context, max_match, min_match), (trial, context)


def reference_tree(rows: list[list[int]], max_nodes: int, min_prob: float) -> dict[tuple[int, ...], int]:
    """Slow reference: every path prefix of the rows with its count, kept by count (ties: shallower)."""
    counts: dict[tuple[int, ...], int] = {}
    for r in rows:
        path = ()
        for t in r:
            if t < 0:
                break
            path += (t,)
            counts[path] = counts.get(path, 0) + 1
    ranked = sorted((p for p, c in counts.items() if c >= min_prob * len(rows)), key=lambda p: (-counts[p], len(p)))
    return {p: counts[p] for p in ranked[:max_nodes]}


def test_continuation_tree_equals_the_reference_trie():
    """On 300 random continuation sets: the kept paths are the most frequent prefixes (path frequency at
    least min_prob), a tree in topological order whose conditional frequencies are count over parent's."""
    rng = random.Random(5)
    for _ in range(300):
        k, depth, vocab = rng.randint(1, 30), rng.randint(1, 6), rng.randint(1, 4)
        rows = [[rng.randrange(vocab) for _ in range(depth)] for _ in range(k)]
        for r in rows:
            if rng.random() < 0.3:
                cut = rng.randrange(depth)
                r[cut:] = [-1] * (depth - cut)
        max_nodes, min_prob = rng.randint(1, 20), rng.choice([0.0, 0.1, 0.3])
        toks, pars, conds, probs = continuation_tree(np.array(rows, dtype=np.int64), max_nodes, min_prob)
        paths = []
        for t, p in zip(toks, pars):
            assert p < len(paths)
            paths.append((paths[p] if p >= 0 else ()) + (t,))
        ref = reference_tree(rows, max_nodes, min_prob)
        # Counts decide membership except among equal counts at one depth (any of those is right).
        got = {p: round(q * k) for p, q in zip(paths, probs)}
        assert len(got) == len(ref) and all(ref.get(p, c) == c for p, c in got.items())
        assert sorted(got.values()) == sorted(ref.values())
        for i, p in enumerate(pars):
            parent_count = k if p < 0 else round(probs[p] * k)
            assert conds[i] == pytest.approx(round(probs[i] * k) / parent_count)


def test_default_datastore_is_the_committed_answers():
    """The default target's datastore holds every committed answer (about a million tokens), and a
    phrase the target writes often is found in it."""
    answers = read_answers(DEFAULT_DATASTORE_DIR)
    store = Datastore(answers)
    assert len(answers) > 5000 and len(store) == sum(map(len, answers)) > 500_000
    a = next(x for x in answers if len(x) > 20)
    lo, hi = store.find(a[5:13])
    assert hi > lo


def test_datastore_errors_name_the_way_out(tmp_path, monkeypatch):
    """Another target without $PLAYGROUND_DATASTORE, or a folder without chunks: ValueError saying
    what to do; a folder in the generator's format is read."""
    engine = SimpleNamespace(target=SimpleNamespace(spec="some/hub-model", name="hub-model"), datastore=None,
                             persistent=lambda key, make: make())
    monkeypatch.delenv(DATASTORE_ENV, raising=False)
    with pytest.raises(ValueError, match="PLAYGROUND_DATASTORE=FOLDER"):
        datastore_dir(engine)
    monkeypatch.setenv(DATASTORE_ENV, str(tmp_path))
    with pytest.raises(ValueError, match="no chunk_"):
        engine_datastore(engine)
    with gzip.open(tmp_path / "chunk_00000.jsonl.gz", "wt") as f:
        f.write(json.dumps({"category": "x", "input_ids": json.dumps([1, 2, 3, 4, 5]), "prompt_len": "2"}) + "\n")
        f.write(json.dumps({"category": "x", "input_ids": [7, 8, 9], "prompt_len": 1}) + "\n")
    assert read_answers(tmp_path) == [[3, 4, 5], [8, 9]]
    assert len(engine_datastore(engine)) == 5
    with pytest.raises(ValueError, match=r"REST: the shortest match \(min_match, 3\) must not exceed the longest "
                                         r"\(max_match, 2\)"):  # the page's words and the API's names
        RestDrafter(Datastore([[1]]), max_match=2, min_match=3)
    with pytest.raises(ValueError, match="max_retrieved"):
        MethodSpec("rest", {"max_retrieved": 0}).checked_params()


def test_greedy_equals_baseline_over_many_seeds():
    """24 prompts on 4 tiny models, each with a datastore of its own greedy answers to other prompts,
    budget off and on: greedy REST equals the baseline token for token; tokens were accepted and rejected."""
    checks.greedy_sweep(factory, models=[checks.tiny_llama(seed) for seed in range(4)])
