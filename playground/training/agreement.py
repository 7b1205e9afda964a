"""How often a draft model and Medusa heads predict the target's own tokens on benchmark prompts.

A benchmark run (``python -m playground.bench --out FILE``) records the autoregressive
baseline's output ids for every (question, turn). This command rebuilds each of those prompts as
the benchmark built it (the chat template over the question's user turns so far and the
baseline's own earlier answers), then runs the models once over prompt + answer (teacher
forcing) and counts, at every answer position:

* **draft agreement**: the draft's argmax equals the target's greedy token. This is the chance
  that a drafted token passes greedy verification when the tokens before it were right, the
  per-token acceptance alpha that the expected tokens per step (1 - alpha^(K+1)) / (1 - alpha)
  of Leviathan et al. 2023 assumes;
* **head k top-1**: Medusa head k's argmax at position t equals the token at t + k + 2
  (unconditional: whether the heads before it were right is not asked);
* **tree tau**: the tokens per step that greedy Medusa decoding with a tree of n nodes would
  make on these answers. Greedy verification accepts exactly the baseline's tokens, so a step
  from answer position i accepts the base model's token plus the longest tree path whose
  head-k candidates equal the baseline's next tokens; the walk then jumps past them. The trees
  are the first n nodes that the ``auto`` tree grows from the heads' recorded accuracy
  (:func:`~playground.engine.greedy_tree`), so this is the tau a timed benchmark
  would measure for each size (up to float rounding between a tree pass and a one-token pass).

No timing is involved, so it runs on a busy machine and in seconds per question; it tells
whether a newly trained draft or set of heads predicts the benchmark's tokens better before a
timed benchmark. The numbers are the distribution the speedup depends on, on real prompts,
instead of the trainers' held-out split of self-generated conversations. An EAGLE head has its
own command, :mod:`playground.training.probe` (per-depth and chain agreement of the unrolled head).

Command line::

    python -m playground.bench --questions spec_bench --limit 24 --methods autoregressive \\
        --max-new-tokens 128 --out runs.jsonl
    python -m playground.training.agreement --results runs.jsonl --questions spec_bench \\
        --draft assets/draft/default --medusa assets/medusa/default
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from dataclasses import dataclass

import torch

from playground.bench import BenchError, load_questions, read_records
from playground.engine import BASELINE


@dataclass(frozen=True)
class TeacherSequence:
    """One baseline answer with the prompt it was generated from (token ids)."""

    category: str
    turn: int
    prompt_ids: list[int]
    answer_ids: list[int]


def bench_sequences(records: list[dict], questions: list, encode) -> list[TeacherSequence]:
    """The baseline's (question, turn) runs of a benchmark file, with their prompts rebuilt.

    Args:
        records: the benchmark's records (``python -m playground.bench --out``).
        questions: the :class:`~playground.bench.Question` list the benchmark ran.
        encode: ``encode(messages) -> prompt ids``, the engine's
            :meth:`~playground.engine.Engine.encode_prompt`.

    Raises:
        ValueError: no baseline record, none that matches a question, or a rebuilt prompt whose
        length differs from the recorded ``prompt_tokens`` (another target, template or question file).
    """
    base = {(str(r["question_id"]), int(r.get("turn", 0))): r for r in records if r.get("method") == BASELINE}
    if not base:
        raise ValueError(f"the results hold no {BASELINE} records: run the benchmark with --methods {BASELINE}")
    out = []
    for q in questions:
        history: list[dict] = []
        for turn, user in enumerate(q.turns):
            rec = base.get((str(q.question_id), turn))
            if rec is None:
                break
            prompt = encode(history + [{"role": "user", "content": user}])
            if "prompt_tokens" in rec and len(prompt) != rec["prompt_tokens"]:
                raise ValueError(f"question {q.question_id} turn {turn}: the rebuilt prompt has {len(prompt)} tokens, "
                                 f"the benchmark's had {rec['prompt_tokens']} (another target or question file?)")
            out.append(TeacherSequence(q.category, turn, prompt, list(rec["output_ids"])))
            history += [{"role": "user", "content": user}, {"role": "assistant", "content": rec["output_text"]}]
    if not out:
        raise ValueError(f"no {BASELINE} record matches a question of the file by question_id and 0-based turn "
                         "(another question file?)")
    return out


@torch.inference_mode()
def draft_hits(draft_model, token_map, seq: TeacherSequence) -> torch.Tensor:
    """``(len(answer_ids),)`` bool: where the draft's argmax is the target's token (one draft forward).

    Args:
        draft_model: a transformers causal LM; token_map: its
            :class:`~playground.engine.draft_model.TokenMap`, or None when it has the target's ids.
    """
    ids = torch.tensor(seq.prompt_ids + seq.answer_ids, dtype=torch.long)
    feed = ids[:-1] if token_map is None else token_map.draft_ids(ids[:-1])
    device = next(draft_model.parameters()).device
    pred = draft_model(input_ids=feed[None].to(device)).logits[0].argmax(-1).cpu()  # (len - 1,)
    if token_map is not None:
        pred = token_map.to_target[pred]
    p = len(seq.prompt_ids)
    return pred[p - 1:] == ids[p:]


@torch.inference_mode()
def head_candidates(target_model, heads, seq: TeacherSequence, vocab_size: int, top_k: int) -> torch.Tensor:
    """``(len(answer_ids), num_heads, top_k)``: each head's top-k tokens at every answer position
    (state i: the one after answer token i - 1, from which the base model predicts answer token i)."""
    ids = torch.tensor(seq.prompt_ids + seq.answer_ids, dtype=torch.long)
    device = next(target_model.parameters()).device
    hidden = target_model(input_ids=ids[None].to(device), output_hidden_states=True).hidden_states[-1][0]
    p, n = len(seq.prompt_ids), len(seq.answer_ids)
    return heads.top_tokens(hidden[p - 1:p - 1 + n], heads.num_heads, top_k, vocab_size).cpu()


def head_hits(candidates: torch.Tensor, answer_ids: list[int]) -> list[tuple[int, int]]:
    """Per Medusa head k (0-based): (positions where its top-1 is the token k + 2 ahead, positions
    counted), from :func:`head_candidates`; the positions counted are those whose token k + 2
    ahead is inside the answer."""
    n, ids = len(answer_ids), torch.tensor(answer_ids, dtype=torch.long)
    out = []
    for k in range(candidates.shape[1]):
        m = max(n - k - 1, 0)
        out.append((int((candidates[:m, k, 0] == ids[k + 1:]).sum()), m))
    return out


def tree_accepts(answer_ids: list[int], candidates: torch.Tensor, paths: list[list[int]]) -> list[int]:
    """Candidates accepted at each step of greedy Medusa decoding of ``answer_ids`` with the tree ``paths``.

    Args:
        answer_ids: the baseline's answer (what greedy verification accepts).
        candidates: ``(len(answer_ids), num_heads, top_k)`` from :func:`head_candidates`.
        paths: the tree's nodes as index paths (a node's prefix paths are in the tree too).

    Returns:
        One entry per base-model token (the prefill's, then each step's bonus token): how many
        head candidates the step after it accepts, the longest path whose candidate at depth d
        equals answer token i + 1 + d when the base token is answer token i. Its length is the
        number of target passes; ``len(answer_ids) / len(result)`` is tau.
    """
    n, i, out = len(answer_ids), 0, []
    by_depth = sorted(paths, key=len)
    while i < n:
        accepted: set[tuple[int, ...]] = {()}
        best = 0
        for path in by_depth:
            d = len(path) - 1
            if (tuple(path[:-1]) in accepted and i + 1 + d < n and d < candidates.shape[1]
                    and path[-1] < candidates.shape[2] and int(candidates[i, d, path[-1]]) == answer_ids[i + 1 + d]):
                accepted.add(tuple(path))
                best = max(best, d + 1)
        out.append(best)
        i += 1 + best
    return out


def agreement_table(seqs: list[TeacherSequence], draft_counts: list[int] | None,
                    head_counts: list[list[tuple[int, int]]] | None) -> str:
    """Per (category, turn) and overall: answer tokens, draft agreement, each head's top-1."""
    groups: dict = defaultdict(list)
    for i, s in enumerate(seqs):
        groups[(s.category, s.turn)].append(i)
        groups[("all", s.turn)].append(i)
        groups[("all", "all")].append(i)
    num_heads = len(head_counts[0]) if head_counts else 0
    header = ["category", "turn", "tokens"] + (["draft"] if draft_counts else []) + \
        [f"head {k + 1}" for k in range(num_heads)]
    lines = []
    for (cat, turn), idx in sorted(groups.items(), key=lambda kv: (kv[0][0] == "all", str(kv[0][0]), str(kv[0][1]))):
        tokens = sum(len(seqs[i].answer_ids) for i in idx)
        row = [cat, str(turn), str(tokens)]
        if draft_counts:
            row.append(f"{sum(draft_counts[i] for i in idx) / max(tokens, 1):.1%}")
        for k in range(num_heads):
            hit, tot = (sum(head_counts[i][k][j] for i in idx) for j in (0, 1))
            row.append(f"{hit / tot:.1%}" if tot else "-")
        lines.append(row)
    widths = [max(len(r[c]) for r in [header] + lines) for c in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in [header] + lines)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m playground.training.agreement",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", required=True, help="a benchmark --out file with autoregressive records")
    ap.add_argument("--questions", required=True, help="the question file (or built-in set) the benchmark ran")
    ap.add_argument("--target", default="default")
    ap.add_argument("--draft", help="draft model (default: the shipped draft of the default target)")
    ap.add_argument("--medusa", help="Medusa heads (default: the shipped heads of the default target)")
    ap.add_argument("--tree-sizes", default="1,2,4,7,11,15,23,31,64",
                    help="tree sizes (nodes) whose teacher-forced tau to print, Medusa only ('' for none)")
    ap.add_argument("--threads", type=int, help="torch CPU threads")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from playground.engine import Engine, ModelLoadError

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        records = read_records(args.results)
        questions = load_questions(args.questions)
    except (OSError, ValueError, BenchError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        engine = Engine.load(args.target, draft=args.draft, medusa=args.medusa, device="cpu", dtype="float32",
                             methods=["draft_model", "medusa"])
        seqs = bench_sequences(records, questions, engine.encode_prompt)
    except (ModelLoadError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    draft_counts = head_counts = None
    if engine.draft is not None:
        draft_counts = [int(draft_hits(engine.draft.model, getattr(engine.draft, "token_map", None), s).sum())
                        for s in seqs]
    cands = []
    if engine.medusa is not None:
        from playground.engine import MEDUSA_TOP_K

        cands = [head_candidates(engine.target.model, engine.medusa, s, engine.target_lm.vocab_size, MEDUSA_TOP_K)
                 for s in seqs]
        head_counts = [head_hits(c, s.answer_ids) for s, c in zip(seqs, cands)]
    print(f"teacher-forced on {len(seqs)} baseline answers ({sum(len(s.answer_ids) for s in seqs)} tokens) of "
          f"{args.results}; draft: {engine.draft.name if engine.draft else 'none'}; heads: "
          f"{'loaded' if engine.medusa is not None else 'none'}")
    print(agreement_table(seqs, draft_counts, head_counts))
    sizes = [int(x) for x in args.tree_sizes.split(",") if x.strip()]
    if engine.medusa is not None and sizes:
        print(tree_tau_table(engine.medusa, seqs, cands, sizes))
    return 0


def tree_tau_table(heads, seqs: list[TeacherSequence], cands: list[torch.Tensor], sizes: list[int]) -> str:
    """Teacher-forced tau per tree size (:func:`tree_accepts`, candidates from :func:`head_candidates`)
    for the first n nodes of the tree that ``auto`` grows from the heads' recorded accuracy."""
    from playground.engine import expected_tokens, greedy_tree, rank_probs_from_accuracy

    if heads.top_k_accuracy is None:
        return "tree tau: the heads record no accuracy to grow a tree from"
    rank_probs = rank_probs_from_accuracy(heads.top_k_accuracy)
    grown = [path for path, _ in greedy_tree(rank_probs, max(sizes))]
    tokens = sum(len(s.answer_ids) for s in seqs)
    lines = ["nodes  depth  tau (teacher-forced)  expected from recorded accuracy"]
    for n in sizes:
        paths = grown[:n]
        steps = sum(len(tree_accepts(s.answer_ids, c, paths)) for s, c in zip(seqs, cands))
        lines.append(f"{len(paths):>5}  {max(len(p) for p in paths):>5}  {tokens / steps:>20.2f}  "
                     f"{expected_tokens(paths, rank_probs):>10.2f}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
