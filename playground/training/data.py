"""Self-distillation data: conversations the target writes itself, prompts included.

One generator, two users: the Medusa head trainer (:mod:`playground.training.medusa`) and
the draft distiller (:mod:`playground.training.draft`) both read what this module writes.

Method (no chat dataset is available offline, and the benchmark questions must not be
trained on):

1. **Prompts, the Magpie way** (Xu et al. 2024, "Magpie: Alignment Data Synthesis from
   Scratch by Prompting Aligned LLMs with Nothing"): give the instruct target only its chat
   template up to the start of a user turn, ``<|im_start|>system\\n…<|im_end|>\\n<|im_start|>user\\n``,
   and sample (temperature 1.0, top-k 100) until the end-of-turn token. The model writes a
   plausible user request. (Top-k rather than top-p: top-p sorts the whole 49k-token
   vocabulary of every row at every step, about 0.6 s per step for 64 rows on a 2-core CPU,
   longer than the model's own forward pass.) A handful of system prompts (general, code,
   maths, writing, ...) spread the requests over the kinds of tasks a playground user asks.
2. **Answers**: the target answers each request with its chat template applied. Answers are
   greedy by default, because greedy decoding is what the lossless methods are benchmarked
   with, so the draft and the heads learn the distribution they will be asked to predict
   (Medusa-2 recommends self-distillation for exactly this reason when the original data
   is unavailable: Cai et al. 2024, section 3.3).

Output: JSON Lines, one conversation a line:
``{"input_ids": [...], "prompt_len": int, "system": str, "question": str, "answer": str,
"batch": int, "row": int}`` (the batch that made it and its place there),
where ``input_ids`` is the chat-templated prompt followed by the answer's token ids (the
end-of-turn token included when the model produced it) and ``prompt_len`` counts the prompt
part; plus, by default, ``"teacher_top_ids"`` and ``"teacher_top_logprobs"``: for each answer
token, the target's top-k next-token ids and log-probabilities at that position
(``(answer_len, k)``). The file is appended to, so an interrupted run resumes where it stopped.

Command line::

    python -m playground.training.data --out artifacts/selfdistill/default.jsonl --num 2000
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

SYSTEM_PROMPTS = (
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
    "You are a helpful AI assistant.",
    "You are an expert Python programmer who writes clear, correct code.",
    "You are a patient maths tutor who explains step by step.",
    "You are a creative writer.",
    "You are a knowledgeable assistant who answers questions about science and history.",
    "You are an assistant who summarises and rewrites text.",
    "You are a friendly assistant who gives practical advice.",
)
"""System prompts used to steer the Magpie user turns towards varied tasks."""

QUESTION_TOP_K = 100
"""User turns (and answers with ``--sample-answers``) are sampled at temperature 1 from the top-k tokens."""


def magpie_prefix(tokenizer, system: str) -> str:
    """The chat template up to the start of a user turn's content.

    Built by rendering a conversation with a marker as the user's message and cutting at
    the marker, so it follows whatever chat template the tokenizer carries.

    Raises:
        ValueError: the tokenizer has no chat template.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the target's tokenizer has no chat template; Magpie prompting needs one")
    marker = "\x00MAGPIE\x00"
    text = tokenizer.apply_chat_template([{"role": "system", "content": system},
                                          {"role": "user", "content": marker}], tokenize=False)
    return text[:text.index(marker)]


def _generate(model, tokenizer, texts: list[str], max_new_tokens: int, sample: bool, stop_ids: list[int],
              seed: int, teacher_top_k: int = 0,
              keep_states: bool = False) -> tuple[list[list[int]], list[tuple[list, list]], list[torch.Tensor]]:
    """Batched ``generate`` with left padding.

    Returns:
        Each row's new ids, cut after the first stop id; and, when ``teacher_top_k`` > 0,
        for each row the target's top-k ids and log-probabilities at every new position
        (``(len(row), k)`` nested lists; the distribution each new token was chosen from),
        read from the same pass so that no second target pass is needed; and, when
        ``keep_states``, each row's last hidden states ``(len(row), hidden_size)`` (bfloat16,
        CPU) at the positions that predicted its new tokens: the last prompt token, then every
        new token but the last (see :func:`load_answer_states`).
    """
    tokenizer.padding_side = "left"
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    torch.manual_seed(seed)
    kwargs = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=QUESTION_TOP_K) if sample else dict(do_sample=False)
    with torch.inference_mode():
        out = model.generate(**batch, max_new_tokens=max_new_tokens, eos_token_id=stop_ids,
                             pad_token_id=tokenizer.pad_token_id, output_logits=teacher_top_k > 0,
                             output_hidden_states=keep_states, return_dict_in_generate=True, **kwargs)
    states = None
    if keep_states:  # step 0 holds the whole (left-padded) prompt; its last position is the last prompt token
        states = torch.stack([step[-1][:, -1] for step in out.hidden_states], 1).to("cpu", torch.bfloat16)
    topk = None
    if teacher_top_k > 0:
        logprobs = torch.stack(out.logits, 1).float().log_softmax(-1)  # (batch, new, vocab)
        values, ids = logprobs.topk(teacher_top_k, -1)
        topk = (ids.tolist(), [[[round(v, 3) for v in pos] for pos in row] for row in values.tolist()])
    rows, teacher, kept = [], [], []
    for r, row in enumerate(out.sequences[:, batch["input_ids"].shape[1]:].tolist()):
        cut = next((i + 1 for i, t in enumerate(row) if t in stop_ids), len(row))
        rows.append(row[:cut])
        if topk is not None:
            teacher.append((topk[0][r][:cut], topk[1][r][:cut]))
        if states is not None:
            kept.append(states[r, :cut].clone())
    return rows, teacher, kept


def generate_conversations(model, tokenizer, out_path: Path, num: int, *, batch_size: int = 32,
                           question_tokens: int = 64, answer_tokens: int = 192, greedy_answers: bool = True,
                           seed: int = 0, stop_ids: list[int] | None = None, teacher_top_k: int = 8,
                           keep_states: bool = False, target_name: str = "", log=print) -> int:
    """Append self-generated conversations to ``out_path`` until it holds ``num``.

    Args:
        model: a transformers causal LM (the target), in eval mode.
        tokenizer: its tokenizer, with a chat template.
        out_path: JSON Lines file (created, or resumed when it already has lines).
        num: conversations wanted in the file.
        batch_size: rows per ``generate`` call.
        question_tokens / answer_tokens: length caps, in tokens.
        greedy_answers: answer greedily (default) or by sampling at temperature 1.
        seed: base seed; batch ``b`` uses ``seed + b``, so a resumed run continues the sequence.
        stop_ids: end-of-turn ids (default: the tokenizer's eos id).
        teacher_top_k: also store the target's top-k next-token ids and log-probabilities at
            every answer position (fields ``teacher_top_ids``, ``teacher_top_logprobs``; 0: none),
            the soft labels of draft distillation, taken from the generating pass itself.
        keep_states: also save the target's last hidden states at the answer positions, one
            safetensors file per batch next to ``out_path`` (:func:`states_path`), so that the
            Medusa trainer need not run the target over the data again (:func:`load_answer_states`).
        target_name: the target's name, stored with the states (the trainer uses states only
            for the target they came from).
        log: progress printer.

    Returns:
        The number of conversations in the file at the end.

    Raises:
        ValueError: no chat template, or ``num`` < 1.
    """
    if num < 1:
        raise ValueError(f"num must be at least 1, got {num}")
    stop_ids = stop_ids or [tokenizer.eos_token_id]
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    out_path.parent.mkdir(parents=True, exist_ok=True)
    seen: set[str] = set()
    have, last_batch = 0, -1
    if out_path.exists():
        for line in out_path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                seen.add(record["question"])
                last_batch = max(last_batch, int(record.get("batch", -1)))
                have += 1
    start, made_tokens = time.perf_counter(), 0
    # Resume after the last batch written (files without batch numbers: an estimate; batches
    # already used only repeat questions, which are skipped).
    batch_index = last_batch + 1 if last_batch >= 0 else have // batch_size
    while have < num:
        rng = random.Random(seed + batch_index)
        systems = [rng.choice(SYSTEM_PROMPTS) for _ in range(batch_size)]
        # 1. The model writes user requests from the bare template prefix.
        prefixes = [magpie_prefix(tokenizer, s) for s in systems]
        q_ids, _, _ = _generate(model, tokenizer, prefixes, question_tokens, True, stop_ids, seed + batch_index)
        questions = []
        for s, ids in zip(systems, q_ids):
            q = tokenizer.decode([t for t in ids if t not in stop_ids], skip_special_tokens=True).strip()
            # Keep complete, non-trivial, new requests only.
            if ids and ids[-1] in stop_ids and len(q) >= 12 and q not in seen:
                seen.add(q)
                questions.append((s, q))
        if not questions:
            batch_index += 1
            continue
        # 2. The model answers them.
        prompts = [tokenizer.apply_chat_template([{"role": "system", "content": s}, {"role": "user", "content": q}],
                                                 tokenize=False, add_generation_prompt=True) for s, q in questions]
        a_ids, teacher, states = _generate(model, tokenizer, prompts, answer_tokens, not greedy_answers, stop_ids,
                                           seed + 10_000 + batch_index, teacher_top_k, keep_states)
        if keep_states:  # before the records: a record with a batch number always has its states
            path = states_path(out_path, batch_index)
            path.parent.mkdir(parents=True, exist_ok=True)
            save_file({str(i): st for i, st in enumerate(states)}, str(path), metadata={"target": target_name})
        with out_path.open("a") as f:
            for i, ((s, q), text, ids) in enumerate(zip(questions, prompts, a_ids)):
                p_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
                answer = tokenizer.decode(ids, skip_special_tokens=True)
                record = {"input_ids": p_ids + ids, "prompt_len": len(p_ids), "system": s, "question": q,
                          "answer": answer, "batch": batch_index, "row": i}
                if teacher:
                    record["teacher_top_ids"], record["teacher_top_logprobs"] = teacher[i]
                f.write(json.dumps(record) + "\n")
                made_tokens += len(p_ids) + len(ids)
                have += 1
        batch_index += 1
        rate = made_tokens / (time.perf_counter() - start)
        log(f"[data] {have}/{num} conversations, {rate:.0f} tokens/s written")
    return have


def states_path(out_path: Path, batch: int) -> Path:
    """The hidden-state file of one batch: ``<out>.states/batch_<b>.safetensors``."""
    return Path(str(out_path) + ".states") / f"batch_{batch:05d}.safetensors"


def load_answer_states(out_path: str | Path, records: list[dict], target_name: str) -> list[torch.Tensor | None]:
    """The target's last hidden states saved with each record (``keep_states``), else None.

    For a record with ``prompt_len`` P and ``len(input_ids)`` L the tensor is ``(L - P, hidden_size)``
    bfloat16: the states at positions P - 1 … L - 2, the positions whose next token is an answer
    token. Records without a batch file, from another target, or whose state count does not match
    get None (the caller computes those itself).
    """
    out, by_batch = [], {}
    for r in records:
        if "batch" not in r or "row" not in r:
            out.append(None)
            continue
        b = int(r["batch"])
        if b not in by_batch:
            path = states_path(Path(out_path), b)
            by_batch[b] = None
            if path.exists():
                with safe_open(str(path), "pt") as f:
                    if (f.metadata() or {}).get("target") == target_name:
                        by_batch[b] = {k: f.get_tensor(k) for k in f.keys()}
        states = (by_batch[b] or {}).get(str(r["row"]))
        ok = states is not None and states.shape[0] == len(r["input_ids"]) - int(r["prompt_len"])
        out.append(states if ok else None)
    return out


def load_records(path: str | Path) -> list[dict]:
    """Every record of a conversations file (see the module docstring for the fields).

    Raises:
        FileNotFoundError: no such file; ValueError: a line lacks ``input_ids`` or ``prompt_len``.
    """
    records = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        r = json.loads(line)
        if "input_ids" not in r or "prompt_len" not in r:
            raise ValueError(f"{path}:{n}: a conversation record needs input_ids and prompt_len")
        records.append(r)
    return records


def split_records(records: list, held_out: float = 0.05, seed: int = 0) -> tuple[list, list]:
    """A deterministic train / held-out split (at least one held-out record when there are two or more)."""
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    n_held = min(max(1, int(len(records) * held_out)), len(records) - 1) if len(records) > 1 else 0
    held = set(order[:n_held])
    return ([r for i, r in enumerate(records) if i not in held], [r for i, r in enumerate(records) if i in held])


def main(argv: list[str] | None = None) -> int:
    from playground.engine.models import load_model

    p = argparse.ArgumentParser(prog="python -m playground.training.data", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="default", help="target model: default, hub id, folder or .gguf")
    p.add_argument("--out", required=True, type=Path, help="JSON Lines file to write (resumed when it exists)")
    p.add_argument("--num", type=int, default=2000, help="conversations wanted")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--question-tokens", type=int, default=64)
    p.add_argument("--answer-tokens", type=int, default=192)
    p.add_argument("--sample-answers", action="store_true", help="sample answers at temperature 1 (default greedy)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--teacher-top-k", type=int, default=8, help="store the target's top-k at answer positions")
    p.add_argument("--keep-states", action=argparse.BooleanOptionalAction, default=True,
                   help="save the target's last hidden states at answer positions for the Medusa trainer "
                        "(about 1.2 KB a token, in OUT.states/)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    args = p.parse_args(argv)
    loaded = load_model(args.target, device=args.device, dtype=args.dtype)
    loaded.model.eval()
    have = generate_conversations(loaded.model, loaded.tokenizer, args.out, args.num, batch_size=args.batch_size,
                                  question_tokens=args.question_tokens, answer_tokens=args.answer_tokens,
                                  greedy_answers=not args.sample_answers, seed=args.seed,
                                  stop_ids=list(loaded.eos_token_ids), teacher_top_k=args.teacher_top_k,
                                  keep_states=args.keep_states, target_name=loaded.spec)
    print(f"[data] {args.out}: {have} conversations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
