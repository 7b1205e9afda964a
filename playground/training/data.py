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

3. **More turns, steered requests** (``--turns 2 --openers``, how the shipped draft and heads
   were trained): a follow-up user turn is written the same way, from the template up to a new
   user turn after the conversation so far, and answered; its record's prompt is the whole
   conversation, as the playground renders a multi-turn chat, so later turns teach contexts of
   300-400 tokens. With ``--openers`` each user turn starts with a generic instruction word
   ("Write", "Solve", "Extract", ...; "Now", "Rewrite", ... for follow-ups) that the target
   continues, and answers see the template's default system prompt, as in the playground.

Output: JSON Lines, one answered turn a line:
``{"input_ids": [...], "prompt_len": int, "system": str, "question": str, "answer": str,
"batch": int, "row": int}`` (the batch that made it and its place there; with ``--turns`` > 1
also ``"turn"``, 0-based, and ``"system"`` is ``""`` with ``--openers``),
where ``input_ids`` is the chat-templated prompt followed by the answer's token ids (the
end-of-turn token included when the model produced it) and ``prompt_len`` counts the prompt
part; plus, by default, ``"teacher_top_ids"`` and ``"teacher_top_logprobs"``: for each answer
token, the target's top-k next-token ids and log-probabilities at that position
(``(answer_len, k)``). The file is appended to, so an interrupted run resumes where it stopped.

Command line::

    python -m playground.training.data --out artifacts/selfdistill/default.jsonl --num 2000
    python -m playground.training.data --out artifacts/selfdistill/default_mt.jsonl --num 4000 \
        --turns 2 --openers --batch-size 64 --question-tokens 56 --answer-tokens 128
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from playground.training.cli import HelpFormatter, int_at_least

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

USER_OPENERS = (
    "Write", "Compose", "Draft", "Describe", "Explain", "Imagine you are", "Pretend to be", "Act as",
    "Solve", "Calculate", "Prove", "Find", "Given", "Suppose", "Write a Python function", "Implement",
    "Write a program", "Summarize", "Extract", "Translate", "Compare", "List", "What", "How", "Why",
    "Can you", "Please", "Read the following", "Create", "Design", "Help me",
)
"""With ``openers``: first user turns start with one of these words and the target writes the
rest. A 135M model's bare Magpie requests are mostly chatty "can you help me" turns; seeding the
first words spreads them over instructions (writing, role-play, reasoning, maths, code,
extraction, explanation), the kinds of task an assistant is given. Generic verbs only: no
benchmark question is used."""

FOLLOW_UP_OPENERS = (
    "Now", "Rewrite", "Can you", "What about", "Make it", "Please", "Explain", "Why", "How", "Then",
    "Change", "Add", "Summarize", "Shorten", "Continue", "Give me", "Translate", "Use", "Is", "What if",
)
"""With ``openers``: the same for follow-up user turns (``turns`` > 1), which react to the
assistant's previous answer."""

QUESTION_TOP_K = 100
"""User turns (and answers with ``--sample-answers``) are sampled at temperature 1 from the top-k tokens."""

MIN_REQUEST_CHARS = 12
"""A user turn is kept only when its text has at least this many characters (shorter ones are
greetings and fragments) and the model ended it with an end-of-turn token within the budget."""

MIN_QUESTION_TOKENS = MIN_REQUEST_CHARS + 1
"""Smallest ``question_tokens`` accepted: room for a request of :data:`MIN_REQUEST_CHARS`
characters when every token is one character, plus its end-of-turn token. A smaller budget can
only succeed through tokens of several characters and, in practice, makes no request at all."""

QUESTION_TOKENS_RULE = (f"a user request counts only when it has at least {MIN_REQUEST_CHARS} characters and ends with "
                        f"the end-of-turn token within the budget, which needs room for {MIN_REQUEST_CHARS} "
                        f"one-character tokens plus that token")
"""Why :data:`MIN_QUESTION_TOKENS` is the minimum, for error messages."""

MAX_EMPTY_BATCHES = 10
"""Consecutive batches without a single record after which :func:`generate_conversations` gives up."""


class NoRecordsError(RuntimeError):
    """Many batches in a row produced no record: no user turn finished within the budget (or every
    one repeated an earlier request). The message says which settings to change."""


def read_conversations_file(path: Path) -> tuple[set[str], int, int]:
    """Scan an existing output file of :func:`generate_conversations` (for resuming).

    Returns:
        ``(questions, records, last_batch)``: the requests already answered, the number of
        records, and the highest batch number (-1 when none is stored). A missing file gives
        ``(set(), 0, -1)``.

    Raises:
        ValueError: a line is not a JSON record with ``question``, ``input_ids`` and
            ``prompt_len`` (the file was not written by this generator).
        OSError: the file cannot be read (e.g. it is a folder).
    """
    seen: set[str] = set()
    have, last_batch = 0, -1
    if not path.exists():
        return seen, have, last_batch
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict) or not {"question", "input_ids", "prompt_len"} <= record.keys():
            raise ValueError(f"{path} is not a conversations file written by playground.training.data: line {n} "
                             f"is not a record with question, input_ids and prompt_len")
        seen.add(record["question"])
        try:
            last_batch = max(last_batch, int(record.get("batch", -1)))
        except (TypeError, ValueError):
            raise ValueError(f"{path}:{n}: batch must be an integer, got {record['batch']!r}") from None
        have += 1
    return seen, have, last_batch


def magpie_prefix(tokenizer, system: str | None, history: list[dict] | None = None) -> str:
    """The chat template up to the start of a user turn's content.

    Built by rendering a conversation with a marker as the user's message and cutting at
    the marker, so it follows whatever chat template the tokenizer carries.

    Args:
        system: the system prompt, or None for none (the template's own default, if it has one).
        history: earlier turns (``[{"role", "content"}, ...]``) that come before the new user turn.

    Raises:
        ValueError: the tokenizer has no chat template.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the target's tokenizer has no chat template; Magpie prompting needs one")
    marker = "\x00MAGPIE\x00"
    text = tokenizer.apply_chat_template(_messages(system, history or []) + [{"role": "user", "content": marker}],
                                         tokenize=False)
    return text[:text.index(marker)]


def _messages(system: str | None, turns: list[dict]) -> list[dict]:
    """``turns`` behind a system message, or alone when ``system`` is None."""
    return ([{"role": "system", "content": system}] if system is not None else []) + list(turns)


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
                           keep_states: bool = False, target_name: str = "", turns: int = 1,
                           openers: bool = False, max_empty_batches: int = MAX_EMPTY_BATCHES, log=print) -> int:
    """Append self-generated conversations to ``out_path`` until it holds ``num`` records.

    Args:
        model: a transformers causal LM (the target), in eval mode.
        tokenizer: its tokenizer, with a chat template.
        out_path: JSON Lines file (created, or resumed when it already has lines).
        num: records wanted in the file (a conversation of ``turns`` turns writes up to ``turns``).
        batch_size: rows per ``generate`` call.
        question_tokens / answer_tokens: length caps, in tokens, per turn. A user turn counts only
            when the model ends it within ``question_tokens`` and it has at least
            :data:`MIN_REQUEST_CHARS` characters; so ``question_tokens`` must be at least
            :data:`MIN_QUESTION_TOKENS`.
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
        turns: user turns per conversation. Turn ``t`` > 0 is a Magpie follow-up: the template up
            to a new user turn after the whole conversation so far, and the target writes the
            user's next message, then answers it. Each turn is its own record (``"turn": t``), whose
            prompt is the whole conversation before its answer, rendered by the chat template as
            the playground renders a multi-turn chat; so later turns teach long contexts.
        openers: start user turns with :data:`USER_OPENERS` / :data:`FOLLOW_UP_OPENERS`, and answer
            without a system message (the template's default system prompt, as the playground
            chats), the Magpie system prompt only steering the requests. Default off: the
            request is all the model's, and the answer sees the same system prompt.
        max_empty_batches: give up after this many consecutive batches that write no record.
        log: progress printer, called after every batch (also one that wrote nothing).

    Returns:
        The number of records in the file at the end.

    Raises:
        ValueError: no chat template, ``num``, ``turns``, ``batch_size``, ``answer_tokens`` or
            ``max_empty_batches`` below 1, ``question_tokens`` below :data:`MIN_QUESTION_TOKENS`,
            or ``out_path`` holds lines that are not this generator's records
            (:func:`read_conversations_file`).
        NoRecordsError: ``max_empty_batches`` batches in a row wrote no record.
    """
    for name, value in (("num", num), ("turns", turns), ("batch_size", batch_size), ("answer_tokens", answer_tokens),
                        ("max_empty_batches", max_empty_batches)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    if question_tokens < MIN_QUESTION_TOKENS:
        raise ValueError(f"question_tokens must be at least {MIN_QUESTION_TOKENS}, got {question_tokens}: "
                         f"{QUESTION_TOKENS_RULE}")
    seen, have, last_batch = read_conversations_file(out_path)
    stop_ids = stop_ids or [tokenizer.eos_token_id]
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    out_path.parent.mkdir(parents=True, exist_ok=True)
    start, made_tokens, empty = time.perf_counter(), 0, 0

    def user_turn(prefixes: list[str], starts: list[str], seed_: int) -> list[str | None]:
        """The target's continuation of each user turn; None where it did not finish the turn."""
        ids, _, _ = _generate(model, tokenizer, [p + o for p, o in zip(prefixes, starts)], question_tokens, True,
                              stop_ids, seed_)
        texts = []
        for o, row in zip(starts, ids):
            # No space after the opener: the model's own next token carries it.
            q = (o + tokenizer.decode([t for t in row if t not in stop_ids], skip_special_tokens=True)).strip()
            texts.append(q if row and row[-1] in stop_ids and len(q) >= MIN_REQUEST_CHARS else None)
        return texts

    # Resume after the last batch written (files without batch numbers: an estimate; batches
    # already used only repeat questions, which are skipped).
    batch_index = last_batch + 1 if last_batch >= 0 else have // batch_size
    while have < num:
        rng = random.Random(seed + batch_index)
        systems = [rng.choice(SYSTEM_PROMPTS) for _ in range(batch_size)]
        starts = [rng.choice(USER_OPENERS) if openers else "" for _ in range(batch_size)]
        # 1. The model writes user requests from the bare template prefix (and an opener).
        texts = user_turn([magpie_prefix(tokenizer, s) for s in systems], starts, seed + batch_index)
        convs = []  # (row, steering system prompt, answering system prompt or None, turns so far)
        for s, q in zip(systems, texts):
            if q is not None and q not in seen:  # complete, non-trivial, new requests only
                seen.add(q)
                convs.append((len(convs), s, None if openers else s, [{"role": "user", "content": q}]))
        if not convs:
            batch_index += 1
            empty += 1
            log(f"[data] {have}/{num} records; batch {batch_index - 1}: no new request of {MIN_REQUEST_CHARS}+ "
                f"characters ended within {question_tokens} tokens ({empty} such batches in a row)")
            if empty >= max_empty_batches:
                raise NoRecordsError(
                    f"{empty} batches in a row ({empty * batch_size} user requests) produced no record: no request "
                    f"ended with the end-of-turn token within {question_tokens} tokens with at least "
                    f"{MIN_REQUEST_CHARS} characters, or each repeated an earlier one; raise --question-tokens "
                    f"(or check that the target ends its turns with its end-of-turn token)")
            continue
        empty = 0
        records, states_out = [], {}
        for turn in range(turns):
            if turn > 0:  # the model writes each conversation's next user message
                follow = [rng.choice(FOLLOW_UP_OPENERS) if openers else "" for _ in convs]
                texts = user_turn([magpie_prefix(tokenizer, a, c) for _, _, a, c in convs], follow,
                                  seed + 20_000 * turn + batch_index)
                convs = [(i, s, a, c + [{"role": "user", "content": q}]) for (i, s, a, c), q in zip(convs, texts)
                         if q is not None]
                if not convs:
                    break
            # 2. The model answers them.
            prompts = [tokenizer.apply_chat_template(_messages(a, c), tokenize=False, add_generation_prompt=True)
                       for _, _, a, c in convs]
            a_ids, teacher, states = _generate(model, tokenizer, prompts, answer_tokens, not greedy_answers,
                                               stop_ids, seed + 10_000 * (turn + 1) + batch_index, teacher_top_k,
                                               keep_states)
            for j, ((i, s, a, c), text, ids) in enumerate(zip(convs, prompts, a_ids)):
                p_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
                answer = tokenizer.decode(ids, skip_special_tokens=True)
                record = {"input_ids": p_ids + ids, "prompt_len": len(p_ids), "system": s if a is not None else "",
                          "question": c[-1]["content"], "answer": answer, "batch": batch_index, "row": i}
                if turns > 1:
                    record["turn"] = turn
                if teacher:
                    record["teacher_top_ids"], record["teacher_top_logprobs"] = teacher[j]
                if keep_states:
                    states_out[_state_key(record)] = states[j]
                records.append(record)
                made_tokens += len(ids)
            convs = [(i, s, a, c + [{"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=True)}])
                     for (i, s, a, c), ids in zip(convs, a_ids)]
        if keep_states:  # before the records: a record with a batch number always has its states
            path = states_path(out_path, batch_index)
            path.parent.mkdir(parents=True, exist_ok=True)
            save_file(states_out, str(path), metadata={"target": target_name})
        with out_path.open("a") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")
        have += len(records)
        batch_index += 1
        rate = made_tokens / (time.perf_counter() - start)
        log(f"[data] {have}/{num} records, {rate:.0f} answer tokens/s")
    return have


from playground.training.records import (_state_key, load_answer_states, load_records, load_states_for,  # noqa: E402,F401,E501
                                          split_records, states_path)


def build_parser() -> argparse.ArgumentParser:
    """The command line; every number is checked here, so bad values stop before the model loads."""
    positive = int_at_least(1)
    p = argparse.ArgumentParser(prog="python -m playground.training.data", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--target", default="default", help="target model: default, hub id, folder or .gguf")
    p.add_argument("--out", required=True, type=Path,
                   help="JSON Lines file to write (an existing one written by this command is resumed)")
    p.add_argument("--num", type=positive, default=2000, help="records wanted in the file (one per answered turn)")
    p.add_argument("--batch-size", type=positive, default=32, help="conversations generated together per batch")
    p.add_argument("--question-tokens", type=int_at_least(MIN_QUESTION_TOKENS, QUESTION_TOKENS_RULE), default=64,
                   help=f"most tokens of a user request (at least {MIN_QUESTION_TOKENS}); requests the target does "
                        "not end within it are dropped")
    p.add_argument("--answer-tokens", type=positive, default=192,
                   help="most tokens of an answer (longer answers are cut)")
    p.add_argument("--sample-answers", action="store_true", help="sample answers at temperature 1 (default greedy)")
    p.add_argument("--seed", type=int, default=0, help="base random seed (batch b uses seed + b)")
    p.add_argument("--teacher-top-k", type=int_at_least(0), default=8,
                   help="store the target's top-k at answer positions (0: none)")
    p.add_argument("--keep-states", action=argparse.BooleanOptionalAction, default=True,
                   help="save the target's last hidden states at answer positions for the Medusa trainer "
                        "(about 1.2 KB a token, in OUT.states/)")
    p.add_argument("--turns", type=positive, default=1, help="user turns per conversation (each is a record)")
    p.add_argument("--openers", action="store_true",
                   help="start user turns with generic instruction words (Write, Solve, Explain, ...; Now, Rewrite, "
                        "... for follow-ups) that the target continues, and answer with the template's default "
                        "system prompt")
    p.add_argument("--device", default="auto", help="device for the target: auto, cpu, cuda, cuda:N or mps")
    p.add_argument("--dtype", default="auto", help="target dtype (auto, float32, bfloat16, float16)")
    return p


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring). Returns 0, or 2 after an ``error:`` on stderr: a
    bad option value (argparse's usage error), an --out file that is not a conversations file, a
    target that does not load, or a run in which no user request qualifies (:class:`NoRecordsError`)."""
    from playground.engine import ModelLoadError, load_model

    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # a usage error, already printed by argparse (status 2), or --help (0)
        return int(e.code or 0)
    try:  # before the model loads: resuming needs a file this command wrote
        if args.out.is_dir():
            raise ValueError(f"{args.out} is a folder, not a JSON Lines file")
        read_conversations_file(args.out)
    except (OSError, ValueError) as e:
        print(f"error: --out: {e}; name a new file, or one this command wrote, to resume", file=sys.stderr)
        return 2
    try:
        loaded = load_model(args.target, device=args.device, dtype=args.dtype)
    except (ModelLoadError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    loaded.model.eval()
    try:
        have = generate_conversations(loaded.model, loaded.tokenizer, args.out, args.num, batch_size=args.batch_size,
                                      question_tokens=args.question_tokens, answer_tokens=args.answer_tokens,
                                      greedy_answers=not args.sample_answers, seed=args.seed,
                                      stop_ids=list(loaded.eos_token_ids), teacher_top_k=args.teacher_top_k,
                                      keep_states=args.keep_states, target_name=loaded.spec, turns=args.turns,
                                      openers=args.openers)
    except (ValueError, NoRecordsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"[data] {args.out}: {have} records")
    return 0


if __name__ == "__main__":
    sys.exit(main())
