"""Training data that lasts: the target's own answers to requests spread over the playground's kinds of work.

The Magpie generator (:mod:`playground.training.data`) lets the target write chatty requests;
left to itself a 135M model asks for advice and little else. This generator steers it over the
tasks people run in the playground: chat, instructions and writing, role-play, reasoning, code,
maths word problems, science and humanities questions, and the tasks over a given passage
(summaries, extraction, question answering, translation), and answers every request with the
target itself (greedy, as the lossless methods are benchmarked).

One *round* (three batched ``generate`` calls, ``batch_size`` rows each or twice that):

1. **Passages**: the target writes short texts from ``PASSAGE_KINDS`` x ``TOPICS`` (our own
   lists, no benchmark text): "Write a short news article about a flood in a mountain village."
   Each answer is itself a record (category ``writing``) and becomes a passage for step 3.
   Since round 108 the passages are *sampled* (``--passage-temperature`` 0.8, top-p 0.95; rounds
   0-107 were greedy) and up to ``--passage-tokens`` long. A greedy passage is the target's own
   likeliest text, so a summary of it restates what the target would say anyway: the shipped
   EAGLE head agreed with the target on 0.85 of the summary tokens of greedy passages, 0.49 on
   those of passages sampled at temperature 1, and 0.28 on Spec-Bench's summaries of human-written news
   (``python -m playground.training.probe``; docs/eagle.md). Sampled passages are text the target
   did not predict, as a user's passage is.
2. **Requests** (sampled, temperature 1, top-k 100): Magpie user turns under a category's
   system prompt, started with one of that category's opening words (``CATEGORIES``); and, for
   passage questions, the user turn ``"<passage>\\n\\nQuestion:"`` continued by the target.
3. **Answers** (greedy): the requests of step 2, plus requests built over the passages of step 1
   from our own instruction templates: summarise, extract, translate into German/French/Spanish,
   and translate the German answers of the previous round back into English.

Each round is written as one gzip-compressed JSON Lines chunk,
``<out>/chunk_<round>.jsonl.gz``, records ``{"category", "input_ids", "prompt_len"}`` (plus
``"sampled": true`` on sampled passages: the EAGLE trainer learns from them against the target's
own distribution, the draft and Medusa trainers and REST's datastore leave them out) (the
chat-templated prompt followed by the answer ids, the end-of-turn id included when the target
produced it). Ids only: hidden states are recomputed by one teacher-forced pass. A killed run
loses at most the round in progress; a rerun continues with the next round number (its seed).

    python -m playground.training.tasks --out data/selfgen/default --rounds 1000
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
import time
from pathlib import Path

import torch

from playground.training.cli import HelpFormatter, float_in, int_at_least
from playground.training.data import QUESTION_TOP_K, magpie_prefix

TOPICS = (
    "a flood in a mountain village", "a new public library", "electric buses", "a local football final",
    "a bakery that opened downtown", "the discovery of a new comet", "a school science fair", "honeybees",
    "a power outage in a large city", "a jazz festival", "recycling plastic", "a marathon in the rain",
    "a startup that makes solar roofs", "an old lighthouse", "remote work", "a volcano erupting on an island",
    "a farmers' market", "a lost dog that found its way home", "the history of the bicycle", "coral reefs",
    "a chess tournament for children", "a train delayed by snow", "a museum of ancient coins",
    "a new vaccine trial", "city parks", "the price of coffee", "a robot that sorts mail", "a drought",
    "an art exhibition of paper sculptures", "a mobile phone launch", "the northern lights", "desert plants",
    "a bridge being rebuilt", "a community garden", "online privacy", "a hospital that opened a new wing",
    "wind farms at sea", "a cooking competition", "the life of a medieval blacksmith", "migrating birds",
    "a tech company's quarterly results", "a strike by airport workers", "learning a second language",
    "a hiking trail in the Alps", "the invention of the printing press", "a summer heatwave",
    "a local election", "an earthquake drill at a school", "space tourism", "a family restaurant",
    "octopuses", "a river cleanup", "video game design", "a new subway line", "the water cycle",
    "a violin maker", "a snowstorm", "a charity run", "3D printing", "an ancient castle", "sleep and health",
    "a small island's fishing industry", "a teenager who built a telescope", "the stock market",
    "a university research lab", "a forest fire", "tea ceremonies", "a new smartphone app for farmers",
)
"""Subjects of the passages (our own list)."""

PASSAGE_KINDS = (
    "Write a short news article about {topic}.", "Write a paragraph explaining {topic}.",
    "Write a short story about {topic}.", "Write a blog post about {topic}.",
    "Write a short report about {topic}.", "Write an email to a friend about {topic}.",
    "Write a product description related to {topic}.", "Describe {topic} in a few paragraphs.",
    "Write a review of {topic}.", "Write a short essay about {topic}.",
)
"""Instructions that make the passages (each answer is also a ``writing`` record)."""

CATEGORIES = {
    "chat": ("You are a helpful AI assistant.",
             ("", "", "Can you", "I", "What", "How", "Do you", "Hi, I")),
    "instruction": ("You are a helpful AI assistant.",
                    ("Write", "Compose", "Draft", "Create", "Describe", "List", "Give me", "Suggest", "Design",
                     "Plan", "Rewrite", "Outline")),
    "roleplay": ("You are a creative assistant who plays characters.",
                 ("Pretend to be", "Imagine you are", "Act as", "You are", "Roleplay as")),
    "reasoning": ("You are a careful assistant who reasons step by step.",
                  ("If", "Suppose", "Imagine", "Which", "A man", "There are", "Why")),
    "code": ("You are an expert Python programmer who writes clear, correct code.",
             ("Write a Python function", "Implement", "Write a program", "Write a function", "Fix this code:",
              "How do I", "Explain this code:", "Write a SQL query", "Create a class", "Write a C++ program",
              "Write a JavaScript function", "Develop a Python program", "def ", "Write a unit test for",
              "Complete this function:", "Write a regular expression")),
    "math": ("You are a patient maths tutor who explains step by step.",
             ("Solve", "Calculate", "Find", "What is", "Prove", "A store", "A train", "John has", "Sarah buys",
              "If a", "A farmer", "Tom")),
    "stem": ("You are a knowledgeable assistant who explains science and technology.",
             ("Explain", "What is", "How does", "Why do", "Describe")),
    "humanities": ("You are a knowledgeable assistant who answers questions about history, society and culture.",
                   ("Explain", "What", "Discuss", "Compare", "How did", "Why did")),
    "qa": ("You are a helpful AI assistant.", ("Who", "When", "Where", "What", "Which", "How many")),
}
"""Magpie categories: the system prompt that steers the request and the words it starts with."""

CATEGORY_WEIGHTS = {"code": 3, "math": 2}
"""How many times more often than the others a category's requests are drawn (code and maths
answers are the ones the first shipped head predicted worst). Rounds 0-15 were drawn uniformly."""

OVER_PASSAGE = {
    "summary": ("Summarize: {p}", "Summarize the following text in a few sentences.\n\n{p}",
                "Write a one-paragraph summary of this article:\n\n{p}", "{p}\n\nTL;DR:",
                "Give a short summary of the text below.\n\n{p}"),
    "extraction": ("Extract all the names, places and numbers mentioned in the following text.\n\n{p}",
                   "List the key facts in this text as bullet points.\n\n{p}",
                   "From the text below, extract the main events in order, as JSON.\n\n{p}",
                   "Read the text and rate its tone from 1 (negative) to 5 (positive); explain briefly.\n\n{p}",
                   "Identify the people and organisations in this passage and what each did.\n\n{p}"),
    "translation": ("Translate into German: {s}", "Translate English to French: {s}",
                    "Translate the following sentence into Spanish: {s}", "Translate English to German: {s}"),
}
"""Requests over a passage (our own templates); ``{s}`` is its first one or two sentences."""

BACK_TRANSLATION = ("Translate German to English: {s}", "Translate this German text into English: {s}")
"""Requests that turn the previous round's German answers back into English."""

PASSAGE_TOP_P = 0.95
"""Nucleus of the sampled passages."""

QA_PREFIX = "Answer the question using the passage below.\n\nPassage: {p}\n\nQuestion:"
"""Passage question answering: the target continues this user turn with a question."""


def _sentences(text: str, n: int) -> str:
    parts = [s.strip() for s in text.replace("\n", " ").split(". ") if s.strip()]
    return ". ".join(parts[:n]).rstrip(".") + "." if parts else text


def _generate(model, tokenizer, texts: list[str], max_new_tokens: int, sample: bool, stop_ids: list[int],
              seed: int, temperature: float | None = None) -> list[list[int]]:
    """Batched, left-padded ``generate``: each row's new ids, cut after its first stop id.

    ``sample``: temperature 1, top-k ``QUESTION_TOP_K`` (requests); ``temperature`` (> 0): nucleus
    sampling at that temperature, top-p ``PASSAGE_TOP_P`` (passages); neither: greedy."""
    tokenizer.padding_side = "left"
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    torch.manual_seed(seed)
    if temperature:
        kwargs = dict(do_sample=True, temperature=float(temperature), top_p=PASSAGE_TOP_P, top_k=0)
    elif sample:
        kwargs = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=QUESTION_TOP_K)
    else:
        kwargs = dict(do_sample=False)
    with torch.inference_mode():
        out = model.generate(**batch, max_new_tokens=max_new_tokens, eos_token_id=stop_ids,
                             pad_token_id=tokenizer.pad_token_id, **kwargs)
    rows = []
    for row in out[:, batch["input_ids"].shape[1]:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in stop_ids), len(row))
        rows.append(row[:cut])
    return rows


GENERATOR_LOG = "rounds.jsonl"
"""One line per round written since round 108: the settings that made it (earlier rounds had greedy
passages of at most ``answer_tokens``)."""


def chunk_path(out: Path, round_index: int) -> Path:
    return out / f"chunk_{round_index:05d}.jsonl.gz"


def read_chunks(out: str | Path) -> list[dict]:
    """Every record of every chunk under ``out`` (in round order)."""
    records = []
    for path in sorted(Path(out).glob("chunk_*.jsonl.gz")):
        with gzip.open(path, "rt") as f:
            records.extend(json.loads(line) for line in f if line.strip())
    return records


def generate_round(model, tokenizer, round_index: int, *, batch_size: int, answer_tokens: int,
                   question_tokens: int, stop_ids: list[int], seed: int, carry: list[str],
                   passage_tokens: int | None = None, passage_temperature: float = 0.0) -> list[dict]:
    """One round (see the module docstring): about ``3 * batch_size`` records. ``carry`` holds German
    texts from the previous round (consumed) and receives this round's. Passages are up to
    ``passage_tokens`` long (default ``answer_tokens``), sampled at ``passage_temperature`` (0: greedy)."""
    rng = random.Random(seed * 100_003 + round_index)
    s = seed * 100_003 + round_index
    chat = lambda msgs: tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    # 1. Passages.
    asks = [rng.choice(PASSAGE_KINDS).format(topic=rng.choice(TOPICS)) for _ in range(batch_size)]
    prompts = [chat([{"role": "user", "content": a}]) for a in asks]
    passages_ids = _generate(model, tokenizer, prompts, passage_tokens or answer_tokens, False, stop_ids, s,
                             temperature=passage_temperature)
    records = [("writing", p, ids, bool(passage_temperature)) for p, ids in zip(prompts, passages_ids)]
    passages = [tokenizer.decode(ids, skip_special_tokens=True).strip() for ids in passages_ids]
    passages = [p for p in passages if len(p) > 200]
    # 2. Requests: Magpie per category, and questions over passages.
    names = list(CATEGORIES)
    cats = rng.choices(names, weights=[CATEGORY_WEIGHTS.get(c, 1) for c in names], k=batch_size)
    starts = [rng.choice(CATEGORIES[c][1]) for c in cats]
    q_texts = [magpie_prefix(tokenizer, CATEGORIES[c][0]) + o for c, o in zip(cats, starts)]
    qa_passages = passages[: max(1, len(passages) // 4)]
    q_texts += [magpie_prefix(tokenizer, None) + QA_PREFIX.format(p=p) for p in qa_passages]
    q_ids = _generate(model, tokenizer, q_texts, question_tokens, True, stop_ids, s + 1)
    requests = []  # (category, system or None, user text)
    for i, row in enumerate(q_ids):
        if not row or row[-1] not in stop_ids:
            continue
        text = tokenizer.decode([t for t in row if t not in stop_ids], skip_special_tokens=True)
        if i < batch_size:
            q = (starts[i] + text).strip()
            if len(q) >= 12:
                requests.append((cats[i], CATEGORIES[cats[i]][0], q))
        elif len(text.strip()) >= 8:
            requests.append(("rag", None, QA_PREFIX.format(p=qa_passages[i - batch_size]) + text))
    # 3. Requests over the passages, and back-translations.
    for p in passages[len(qa_passages):]:
        kind = rng.choice(("summary", "summary", "extraction", "translation"))
        template = rng.choice(OVER_PASSAGE[kind])
        requests.append((kind, None, template.format(p=p, s=_sentences(p, rng.choice((1, 2))))))
    while carry:
        requests.append(("translation", None, rng.choice(BACK_TRANSLATION).format(s=carry.pop())))
    prompts = [chat(([{"role": "system", "content": sys_}] if sys_ else []) + [{"role": "user", "content": u}])
               for _, sys_, u in requests]
    answers = _generate(model, tokenizer, prompts, answer_tokens, False, stop_ids, s + 2) if prompts else []
    for (cat, _, u), p, ids in zip(requests, prompts, answers):
        records.append((cat, p, ids, False))
        if cat == "translation" and ("into German" in u or "to German" in u):
            german = tokenizer.decode(ids, skip_special_tokens=True).strip()
            if 20 < len(german) < 400:
                carry.append(german)
    out = []
    for cat, p, ids, sampled in records:
        p_ids = tokenizer(p, add_special_tokens=False)["input_ids"]
        if ids:
            out.append({"category": cat, "input_ids": p_ids + ids, "prompt_len": len(p_ids)})
            if sampled:  # not the target's greedy text: no hard labels, not REST's datastore
                out[-1]["sampled"] = True
    return out


def build_parser() -> argparse.ArgumentParser:
    positive = int_at_least(1)
    p = argparse.ArgumentParser(prog="python -m playground.training.tasks", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--target", default="default", help="target model: default, hub id, folder or .gguf")
    p.add_argument("--out", required=True, type=Path, help="folder of chunk_<round>.jsonl.gz files (resumed)")
    p.add_argument("--rounds", type=positive, default=1000, help="rounds wanted in the folder")
    p.add_argument("--batch-size", type=positive, default=32, help="rows per generate call (steps 1 and 2)")
    p.add_argument("--answer-tokens", type=positive, default=192, help="most tokens of an answer")
    p.add_argument("--question-tokens", type=int_at_least(13), default=56, help="most tokens of a request")
    p.add_argument("--passage-tokens", type=positive, default=288, help="most tokens of a passage")
    p.add_argument("--passage-temperature", type=float_in(0.0, 2.0), default=0.8,
                   help="sampling temperature of the passages (top-p 0.95); 0: greedy (rounds 0-107 were greedy, "
                        "with --passage-tokens equal to --answer-tokens)")
    p.add_argument("--seed", type=int, default=0, help="base seed (round r uses it with r)")
    p.add_argument("--device", default="auto", help="device for the target: auto, cpu, cuda, cuda:N or mps")
    p.add_argument("--dtype", default="bfloat16", help="target dtype (auto, float32, bfloat16, float16)")
    return p


def main(argv: list[str] | None = None) -> int:
    from playground.engine import ModelLoadError, load_model

    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    try:
        loaded = load_model(args.target, device=args.device, dtype=args.dtype)
    except (ModelLoadError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    model, tok = loaded.model.eval(), loaded.tokenizer
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    stop_ids = list(loaded.eos_token_ids) or [tok.eos_token_id]
    args.out.mkdir(parents=True, exist_ok=True)
    done = sorted(int(p.name[6:11]) for p in args.out.glob("chunk_*.jsonl.gz"))
    r = (done[-1] + 1) if done else 0
    carry: list[str] = []
    start, tokens = time.perf_counter(), 0
    while r < args.rounds:
        t0 = time.perf_counter()
        records = generate_round(model, tok, r, batch_size=args.batch_size, answer_tokens=args.answer_tokens,
                                 question_tokens=args.question_tokens, stop_ids=stop_ids, seed=args.seed, carry=carry,
                                 passage_tokens=args.passage_tokens, passage_temperature=args.passage_temperature)
        path = chunk_path(args.out, r)
        tmp = path.with_suffix(".tmp")
        with gzip.open(tmp, "wt") as f:
            for rec in records:
                f.write(json.dumps(rec, separators=(",", ":")) + "\n")
        tmp.rename(path)
        with open(args.out / GENERATOR_LOG, "a") as f:  # which settings made which round
            f.write(json.dumps({"round": r, "target": loaded.spec, "dtype": args.dtype, "batch_size": args.batch_size,
                                "answer_tokens": args.answer_tokens, "question_tokens": args.question_tokens,
                                "passage_tokens": args.passage_tokens,
                                "passage_temperature": args.passage_temperature, "passage_top_p": PASSAGE_TOP_P,
                                "seed": args.seed}) + "\n")
        new = sum(len(x["input_ids"]) - x["prompt_len"] for x in records)
        tokens += new
        print(f"[tasks] round {r}: {len(records)} records, {new} answer tokens in {time.perf_counter() - t0:.0f} s; "
              f"{tokens / (time.perf_counter() - start):.0f} answer tokens/s overall", flush=True)
        r += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
