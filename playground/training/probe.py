"""How well an EAGLE head agrees with its target on benchmark questions, in about a minute.

    python -m playground.training.probe --head assets/eagle/default --questions spec_bench \\
        --per-category 2 --max-new-tokens 64

The trainer's held-out figures (:mod:`playground.training.eagle`) are measured on the generator's
own kind of text; a head runs on what users ask. This probe takes the target's greedy answers to
benchmark questions (run here with plain decoding, or read from a benchmark's records with
``--records``, the ``autoregressive`` rows of ``scripts/bench_interleaved.py`` or ``bench``
output), teacher-forces the target over each prompt and answer once, unrolls the head over every
answer position exactly as training does (:meth:`EagleHead.unrolled`, EAGLE-3's training-time
test), and prints per category the head's top-1 agreement with the target at each depth and the
chain figures (every depth up to d right), the tokens a step a depth-``steps`` chain of top-1
guesses would give (bonus token included). No decoding with the head, no timing: a quick,
deterministic A/B of two heads before a benchmark run, and the gap between held-out and real
questions in one table. It trains nothing and tunes nothing. (The draft model and Medusa heads
have :mod:`playground.training.agreement`, which also replays multi-turn prompts.)

Measured 2026-12-04 on the shipped head (4 first turns a category of the dev set, the answers of
``data/bench/2026-12-04/s34_final64`` and ``s37_amd128``): top-1 at depth 1 0.53 on the
benchmark against 0.72 held out (summarization 0.28, math_reasoning 0.69); see docs/eagle.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

from playground.engine import DTYPE_CHOICES
from playground.training.cli import HelpFormatter, int_at_least



def read_baseline_answers(paths: list[str | Path]) -> dict[int | str, tuple[int, list[int]]]:
    """``{question_id: (prompt tokens, output ids)}`` of the greedy first-turn ``autoregressive``
    rows of benchmark record files (``.jsonl`` or ``.jsonl.gz``; rows of later turns, sampled
    rows (``temperature`` above 0) and other methods are passed over); where a question appears more
    than once, its longest answer. ``prompt tokens`` is the row's ``prompt_tokens`` (-1 when absent).

    Raises:
        ValueError: a file that cannot be read, a row without ``question_id`` / ``output_ids``, or no
            such rows at all.
    """
    from playground.bench import read_records

    out: dict = {}
    for p in paths:
        try:
            rows = read_records(p)
        except (OSError, ValueError) as e:
            raise ValueError(f"could not read benchmark records {str(p)!r}: {e}") from None
        for r in rows:
            if r.get("method") != "autoregressive" or r.get("turn", 0) != 0 or float(r.get("temperature") or 0) > 0:
                continue
            if "question_id" not in r or "output_ids" not in r:
                raise ValueError(f"{str(p)!r}: an autoregressive row without question_id and output_ids")
            if len(r["output_ids"]) > len(out.get(r["question_id"], (0, []))[1]):
                out[r["question_id"]] = (int(r.get("prompt_tokens", -1)), list(r["output_ids"]))
    if not out:
        raise ValueError(f"no greedy first-turn autoregressive rows in {', '.join(map(str, paths))}")
    return out


def probe(head, target_model, records: list[dict], steps: int = 4, batch_tokens: int = 4096) -> dict:
    """Teacher-forced agreement of ``head`` with ``target_model`` per category and overall.

    Args:
        head: an :class:`~playground.engine.eagle.EagleHead` (float32, with the target's embedding
            attached), on the target's device.
        target_model: the target's transformers model (float32 for figures comparable with decoding).
        records: ``{"input_ids", "prompt_len", "category"}``: prompt then the target's greedy answer
            (at least one answer token).
        steps: unrolled depths (the shipped tree's ``depth`` is 4).
        batch_tokens: padded tokens per evaluation batch.

    The shares count the answer positions whose token is in the head's draft vocabulary (a token
    outside it is never drafted); ``in_draft_vocab`` is that share of the answer tokens.

    Returns:
        ``{category or "overall": {"records", "answer_tokens", "in_draft_vocab", "top1_per_depth",
        "chain_acceptance_per_depth", "expected_tokens_per_chain_step"}}`` (shares in [0, 1]).

    Raises:
        ValueError: a head that reads a layer the target does not have, or a record without an answer.
    """
    from playground.training.eagle import Teacher, evaluate

    depth = len(target_model.get_decoder().layers)
    if max(head.feature_layers) > depth:
        raise ValueError(f"the head reads layer {max(head.feature_layers)}, the target has {depth}")
    if any(len(r["input_ids"]) <= r["prompt_len"] for r in records):
        raise ValueError("every record needs at least one answer token after its prompt")
    teacher = Teacher(target_model, head.feature_layers)
    try:
        items = [teacher([r["input_ids"]])[0] for r in records]
    finally:
        for h in teacher.handles:
            h.remove()
    dev = next(head.parameters()).device
    rows = target_model.get_output_embeddings().weight.detach()
    target_rows = rows[head.draft_ids.to(rows.device)].float().to(dev)
    in_vocab = head.t2d.cpu()
    groups: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(records):
        groups[r.get("category", "") or "other"].append(i)
    out = {}
    for name, idx in list(groups.items()) + [("overall", list(range(len(records))))]:
        m = evaluate(head, [items[i] for i in idx], [records[i] for i in idx], steps, target_rows, batch_tokens)
        m["records"] = len(idx)
        answers = [records[i]["input_ids"][records[i]["prompt_len"]:] for i in idx]
        m["answer_tokens"] = sum(len(a) for a in answers)
        m["in_draft_vocab"] = round(sum(int(in_vocab[torch.tensor(a)].sum()) for a in answers) / m["answer_tokens"], 4)
        out[name] = m
    return out


def format_table(result: dict) -> str:
    """A Markdown table of :func:`probe`'s result, one row per category, overall last."""
    steps = len(result["overall"]["top1_per_depth"])
    head = ("| category | questions | answer tokens | in draft vocab | "
            + " | ".join(f"top-1 d{d + 1}" for d in range(steps))
            + " | " + " | ".join(f"chain d{d + 1}" for d in range(steps)) + " | tokens/chain step |")
    lines = [head, "|" + " --- |" * (5 + 2 * steps)]
    for name, m in sorted(result.items(), key=lambda kv: kv[0] == "overall"):
        lines.append(f"| {name} | {m['records']} | {m['answer_tokens']} | {m['in_draft_vocab']:.3f} | "
                     + " | ".join(f"{x:.3f}" for x in m["top1_per_depth"]) + " | "
                     + " | ".join(f"{x:.3f}" for x in m["chain_acceptance_per_depth"])
                     + f" | {m['expected_tokens_per_chain_step']:.3f} |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m playground.training.probe", formatter_class=HelpFormatter,
                                description="Teacher-forced agreement of an EAGLE head with the target on "
                                            "benchmark questions, per category.")
    p.add_argument("--head", default=None, help="EAGLE head folder or hub id (default: the shipped head of the default target)")
    p.add_argument("--target", default="default", help="target: default, hub id, folder or .gguf")
    p.add_argument("--questions", default="spec_bench",
                   help="question file or a built-in set's name (spec_bench: the Spec-Bench dev half); first turns")
    p.add_argument("--per-category", type=int_at_least(1), default=2, help="first questions of each category")
    p.add_argument("--categories", nargs="*", default=None, help="only these categories")
    p.add_argument("--records", nargs="+", default=None,
                   help="benchmark record files whose autoregressive answers to use (questions without one "
                        "are answered here)")
    p.add_argument("--max-new-tokens", type=int_at_least(1), default=64, help="answer length (when answered here)")
    p.add_argument("--steps", type=int_at_least(1), default=4, help="unrolled depths")
    p.add_argument("--device", default="cpu", help="device of the target and the head: cpu, auto, cuda, cuda:N, mps")
    p.add_argument("--dtype", default="float32", choices=DTYPE_CHOICES,
                   help="the target's dtype: float32 as the benchmark decodes on a CPU; bfloat16 as the "
                        "trainer's teacher reads features (the head itself runs in float32 either way)")
    p.add_argument("--threads", type=int_at_least(0), default=0, help="torch threads (0: torch's default)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    return p


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring); 0 on success, 2 with a message on bad input."""
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from playground.bench.questions import BenchError, load_questions
    from playground.engine import (EagleLoadError, Engine, GenerationSettings, MethodSpec, ModelLoadError,
                                   eagle_spec, load_eagle)

    if args.json is not None and not args.json.parent.is_dir():
        print(f"error: --json: no folder {str(args.json.parent)!r}", file=sys.stderr)
        return 2
    try:
        questions = load_questions(args.questions, args.categories, per_category_n=args.per_category)
        answers = read_baseline_answers(args.records) if args.records else {}
    except (BenchError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    head_spec = args.head or eagle_spec(args.target)
    if head_spec is None:
        print(f"error: no shipped EAGLE head for target {args.target!r}: give --head", file=sys.stderr)
        return 2
    try:
        engine = Engine.load(args.target, device=args.device, dtype=args.dtype, methods=["autoregressive"],
                             eagle="none")
        # The figures are the float32 head's (beside a float32 target on a CPU the engine's own copy
        # reads int8 weights, which moves its logits by a few per cent): load it plain, then check it
        # fits the target and put it on the target's device.
        head = load_eagle(head_spec).float()
        load_eagle(head_spec, target=engine.target)  # raises when it does not fit the target
        model = engine.target.model.eval()
        head = head.to(next(model.parameters()).device).attach_embedding(model.get_input_embeddings())
    except (ModelLoadError, EagleLoadError, ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    settings = GenerationSettings(max_new_tokens=args.max_new_tokens)
    records, answered, skipped = [], 0, []
    with torch.inference_mode():
        for q in questions:
            try:
                ids = engine.encode_prompt(q.turns[0])
                prompt_tokens, out = answers.get(q.question_id, (-1, None))
                if out is not None and prompt_tokens not in (-1, len(ids)):
                    skipped.append(f"{q.question_id} (its record's prompt has {prompt_tokens} tokens, here {len(ids)})")
                    continue
                if out is None:
                    out = [t for e in engine.run_one(ids, MethodSpec("autoregressive"), settings) for t in e.tokens]
                    answered += bool(out)
            except ValueError as e:  # a prompt too long for the target's context, ...
                skipped.append(f"{q.question_id} ({e})")
                continue
            if out:
                records.append({"input_ids": list(ids) + list(out), "prompt_len": len(ids), "category": q.category})
    for line in skipped:
        print(f"[probe] skipped question {line}", file=sys.stderr)
    if not records:
        print("error: no answers to probe", file=sys.stderr)
        return 2
    result = probe(head, model, records, args.steps)
    print(f"[probe] head {head_spec}: {len(records)} questions ({answered} answered here, "
          f"{len(records) - answered} from --records), {result['overall']['answer_tokens']} answer tokens")
    print(format_table(result))
    recipe = getattr(head, "recipe", {}) or {}
    if recipe.get("held_out"):
        h = recipe["held_out"]
        print(f"[probe] the head's recipe, held out: top-1 {h.get('top1_per_depth')}, "
              f"{h.get('expected_tokens_per_chain_step')} tokens a chain step")
    if args.json:
        figures = {"head": str(head_spec), "questions": args.questions, "dtype": args.dtype, "result": result}
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
