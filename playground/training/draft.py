"""Distil a small draft model from a target, on conversations the target wrote itself.

The result is an ordinary ``LlamaForCausalLM`` folder (``AutoModelForCausalLM.from_pretrained``
loads it) with the target's tokenizer and a token map (``draft_vocab.json``), so the
draft-model method can use it like any other draft.

Choices (measured on the embedded default, SmolLM2-135M-Instruct, on a 2-core CPU; see
docs/draft_model.md):

* **Reduced vocabulary.** The target's output layer alone is 576 × 49152 ≈ 28 M multiply-adds
  per token, a fifth of the target. The draft predicts only the ``--vocab`` most frequent
  tokens of the training conversations (EAGLE-3 does the same: Li et al. 2025, "EAGLE-3:
  Scaling up Inference Acceleration of Large Language Models via Training-Time Test"); one
  extra input id stands for every other target token. Verification stays exact: the target
  checks every drafted token, and tokens outside the draft's vocabulary are simply never
  proposed.
* **Narrow and shallow**: ``--hidden`` 384, ``--layers`` 3 by default, so that one draft token
  costs a few per cent of a target token; tied input and output embeddings.
* **Initialised from the target**: the embedding rows of the kept tokens, projected onto
  their top ``--hidden`` principal directions.
* **Distillation loss** (Hinton et al. 2015; for drafts: Zhou et al. 2024, "DistillSpec"):
  at every answer position, cross-entropy against the target's top-k distribution stored by
  :mod:`playground.training.data` (soft labels) plus cross-entropy against the target's
  greedy token (the token greedy verification checks); at prompt positions a small
  next-token loss keeps the draft a language model of the prompt too.

Command line (resumable: run it again with ``--resume`` after an interruption)::

    python -m playground.training.data --out artifacts/selfdistill/default.jsonl --num 1200
    python -m playground.training.draft --data artifacts/selfdistill/default.jsonl --out assets/draft/default
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from tqdm import tqdm

from playground.engine import TOKEN_MAP_FILE, TokenMap
from playground.training.cli import HelpFormatter, read_data
from playground.training.data import load_records, split_records

PROMPT_LOSS_WEIGHT = 0.1
"""Weight of the next-token loss at prompt positions (answer positions weigh 1)."""
SOFT_WEIGHT = 0.5
"""Share of the soft (top-k distribution) term in the answer positions' loss; the rest is hard."""


def build_vocab(records: list[dict], size: int, keep_ids: list[int]) -> list[int]:
    """The draft vocabulary: target ids of the draft's ids, ``(size,)``, with -1 at index 0 (the
    out-of-vocabulary input id), then ``keep_ids`` (special tokens), then the most frequent
    tokens of the conversations and of the target's top-1 predictions.

    Raises:
        ValueError: ``size`` too small to hold the special tokens.
    """
    if size < len(keep_ids) + 2:
        raise ValueError(f"vocab size must be at least {len(keep_ids) + 2}, got {size}")
    counts: Counter = Counter()
    for r in records:
        counts.update(r["input_ids"])
        counts.update(ids[0] for ids in r.get("teacher_top_ids", []))
    out = [-1] + list(dict.fromkeys(keep_ids))
    taken = set(out)
    for t, _ in counts.most_common():
        if len(out) >= size:
            break
        if t not in taken:
            out.append(t)
            taken.add(t)
    return out


def coverage(records: list[dict], token_map: TokenMap) -> float:
    """Fraction of answer tokens that the draft's vocabulary holds (an upper bound on acceptance)."""
    total = hit = 0
    for r in records:
        answer = torch.tensor(r["input_ids"][r["prompt_len"]:], dtype=torch.long)
        total += len(answer)
        hit += int((token_map.draft_ids(answer) != token_map.unknown_id).sum())
    return hit / max(total, 1)


def init_draft(target, token_map: TokenMap, hidden: int, layers: int, intermediate: int, heads: int, kv_heads: int):
    """A fresh Llama draft with the target's position and normalisation settings; embeddings
    are the target's rows of the kept tokens projected on their top principal directions.

    Args:
        target: the target's transformers model (its input embedding is read).
        token_map: the draft vocabulary.

    Raises:
        ValueError: ``hidden`` not divisible by ``heads``, or larger than the target's width.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    tcfg = target.config.get_text_config()
    if hidden % heads or heads % kv_heads:
        raise ValueError(f"hidden ({hidden}) must divide by heads ({heads}), heads by kv_heads ({kv_heads})")
    emb = target.get_input_embeddings().weight.detach().float()  # (target_vocab, target_hidden)
    if hidden > emb.shape[1]:
        raise ValueError(f"hidden ({hidden}) must not exceed the target's width ({emb.shape[1]})")
    cfg = LlamaConfig(vocab_size=len(token_map.to_target), hidden_size=hidden, intermediate_size=intermediate,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      max_position_embeddings=tcfg.max_position_embeddings, rms_norm_eps=tcfg.rms_norm_eps,
                      rope_parameters=getattr(tcfg, "rope_parameters", None), tie_word_embeddings=True,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    draft = LlamaForCausalLM(cfg)
    # Embedding rows: PCA projection of the target's rows (the out-of-vocabulary row: their mean).
    known = token_map.to_target.clamp(min=0)
    rows = emb[known]
    mean = rows.mean(0)
    _, _, v = torch.linalg.svd(rows - mean, full_matrices=False)
    proj = torch.zeros(len(rows), hidden)  # (draft_vocab, hidden); fewer directions than hidden when tiny
    proj[:, :min(hidden, len(v))] = (rows - mean) @ v[:hidden].T
    proj[token_map.unknown_id] = 0.0
    proj *= 0.02 / proj.std()
    with torch.no_grad():
        draft.get_input_embeddings().weight.copy_(proj)
    return draft


def make_examples(records: list[dict], token_map: TokenMap, max_len: int) -> list[dict]:
    """Per conversation: draft input ids ``(T,)``, next-token targets ``(T,)`` (draft ids, -100 where
    unusable), per-position weights ``(T,)``, and soft targets ``(T, k)`` ids and probabilities (zero
    probability where absent or outside the draft's vocabulary)."""
    out = []
    for r in records:
        ids = torch.tensor(r["input_ids"][:max_len], dtype=torch.long)
        T, p = len(ids) - 1, r["prompt_len"]
        if T < 1:
            continue
        x = token_map.draft_ids(ids[:-1])
        y = token_map.draft_ids(ids[1:])
        weight = torch.full((T,), PROMPT_LOSS_WEIGHT)
        weight[p - 1:] = 1.0
        top = r.get("teacher_top_ids")
        k = len(top[0]) if top else 1
        soft_ids = torch.zeros((T, k), dtype=torch.long)
        soft_p = torch.zeros((T, k))
        if top:
            # Answer token j sits at sequence position p + j; position p - 1 + j predicts it.
            n = min(len(top), T - (p - 1))
            t_ids = torch.tensor(top[:n], dtype=torch.long)
            t_lp = torch.tensor(r["teacher_top_logprobs"][:n])
            d_ids = token_map.draft_ids(t_ids)
            probs = t_lp.exp() * (d_ids != token_map.unknown_id)
            soft_ids[p - 1:p - 1 + n] = d_ids
            soft_p[p - 1:p - 1 + n] = probs / probs.sum(-1, keepdim=True).clamp(min=1e-9)
            # The hard target at answer positions is the target's greedy token.
            y[p - 1:p - 1 + n] = d_ids[:, 0]
        y[y == token_map.unknown_id] = -100
        out.append({"x": x, "y": y, "w": weight, "soft_ids": soft_ids, "soft_p": soft_p, "prompt_len": p})
    return out


def collate(batch: list[dict]) -> dict:
    """Right-pad a batch; ``mask`` is 1 on real tokens."""
    T = max(len(e["x"]) for e in batch)
    k = batch[0]["soft_ids"].shape[1]

    def pad(key, fill, shape=()):
        t = torch.full((len(batch), T) + shape, fill, dtype=batch[0][key].dtype)
        for i, e in enumerate(batch):
            t[i, :len(e[key])] = e[key]
        return t
    return {"x": pad("x", 0), "y": pad("y", -100), "w": pad("w", 0.0), "soft_ids": pad("soft_ids", 0, (k,)),
            "soft_p": pad("soft_p", 0.0, (k,)),
            "mask": pad("x", 0).new_tensor([[1] * len(e["x"]) + [0] * (T - len(e["x"])) for e in batch])}


def to_device(batch: dict, device: torch.device) -> dict:
    """A :func:`collate` batch with every tensor on ``device``."""
    return {k: v.to(device) for k, v in batch.items()}


def loss_fn(logits: torch.Tensor, b: dict) -> torch.Tensor:
    """Weighted mean of hard cross-entropy and soft (top-k) cross-entropy.

    Args:
        logits: ``(batch, T, draft_vocab)``; b: a :func:`collate` batch.
    """
    logp = logits.float().log_softmax(-1)
    hard = -logp.gather(-1, b["y"].clamp(min=0).unsqueeze(-1)).squeeze(-1) * (b["y"] >= 0)
    soft = -(logp.gather(-1, b["soft_ids"]) * b["soft_p"]).sum(-1)
    has_soft = b["soft_p"].sum(-1) > 0
    per_pos = torch.where(has_soft, SOFT_WEIGHT * soft + (1 - SOFT_WEIGHT) * hard, hard)
    return (per_pos * b["w"]).sum() / b["w"].sum().clamp(min=1e-9)


@torch.no_grad()
def evaluate(draft, examples: list[dict], batch_size: int = 16) -> dict:
    """Greedy agreement on answer positions: how often the draft's top-1 equals the target's
    greedy token (the chance that one drafted token passes greedy verification), and the loss."""
    draft.eval()
    agree = total = 0
    losses = []
    device = next(draft.parameters()).device
    for i in range(0, len(examples), batch_size):
        b = to_device(collate(examples[i:i + batch_size]), device)
        logits = draft(input_ids=b["x"], attention_mask=b["mask"]).logits
        losses.append(float(loss_fn(logits, b)))
        answer = (b["w"] == 1.0) & (b["mask"] == 1)
        pred = logits.argmax(-1)
        agree += int(((pred == b["y"]) & answer).sum())
        total += int(answer.sum())
    draft.train()
    return {"top1_agreement": agree / max(total, 1), "loss": statistics.fmean(losses) if losses else float("nan")}


def time_per_token(model, n: int = 30, context: int = 128) -> float:
    """Median seconds of one single-token forward with a ``context``-token KV cache (this device)."""
    from transformers import DynamicCache

    dev = next(model.parameters()).device
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(input_ids=torch.zeros((1, context), dtype=torch.long, device=dev), cache=cache)
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=dev), cache=cache)
            times.append(time.perf_counter() - t0)
            cache.crop(-1)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    from playground.engine import load_model, resolve_device

    p = argparse.ArgumentParser(prog="python -m playground.training.draft", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--target", default="default", help="target model spec (as app.py's --target)")
    p.add_argument("--data", required=True, type=Path, nargs="+",
                   help="conversations from playground.training.data (several files are read in order)")
    p.add_argument("--out", required=True, type=Path, help="folder to save the draft in")
    p.add_argument("--vocab", type=int, default=8192, help="draft vocabulary size (most frequent target tokens)")
    p.add_argument("--hidden", type=int, default=384,
                   help="draft hidden size (divisible by --heads; at most the target's)")
    p.add_argument("--layers", type=int, default=3, help="draft decoder layers")
    p.add_argument("--intermediate", type=int, default=1024, help="draft MLP (intermediate) size")
    p.add_argument("--heads", type=int, default=6, help="draft attention heads")
    p.add_argument("--kv-heads", type=int, default=2, help="draft key/value heads (must divide --heads)")
    p.add_argument("--epochs", type=float, default=6.0, help="passes over the training conversations")
    p.add_argument("--batch-size", type=int, default=16, help="conversations per training step")
    p.add_argument("--lr", type=float, default=3e-3,
                   help="peak AdamW learning rate (warm-up, then cosine decay to a tenth)")
    p.add_argument("--max-len", type=int, default=512, help="tokens kept per conversation")
    p.add_argument("--minutes", type=float, default=None,
                   help="stop training this many minutes after the start (the learning-rate schedule then "
                        "follows the time, so it has decayed when the budget ends the run; default: no limit)")
    p.add_argument("--held-out", type=float, default=0.05,
                   help="fraction of conversations held out to measure agreement with the target")
    p.add_argument("--resume", action="store_true", help="continue from OUT.ckpt")
    p.add_argument("--init", type=Path, help="start from this earlier draft (its weights, architecture and "
                                             "vocabulary; --vocab, --hidden, --layers ... are then ignored)")
    p.add_argument("--seed", type=int, default=0, help="random seed (split and batch order)")
    p.add_argument("--device", default="cpu",
                   help="device the draft trains on: cpu, cuda, cuda:N, mps or auto (the target stays on the CPU: "
                        "it only seeds the draft's embedding and is timed at the end)")
    args = p.parse_args(argv)

    started = time.perf_counter()
    try:
        device = resolve_device(args.device)
    except ValueError as e:
        print(f"error: --device {args.device}: {e}", file=sys.stderr)
        return 2
    records = read_data(load_records, args.data)  # before the model loads: a wrong path is said at once
    if records is None:
        return 2
    target = load_model(args.target, device="cpu", dtype="float32")
    train, held = split_records(records, args.held_out, args.seed)
    print(f"[draft] {len(records)} conversations: {len(train)} train, {len(held)} held out; "
          f"{sum(len(r['input_ids']) for r in train)} training tokens")
    ckpt = args.out.with_name(args.out.name + ".ckpt")
    state = torch.load(ckpt / "state.pt", weights_only=False) if args.resume and (ckpt / "state.pt").exists() else None
    target_vocab = int(target.model.config.get_text_config().vocab_size)
    specials = sorted({int(i) for i in target.tokenizer.all_special_ids} | set(target.eos_token_ids))
    init_map = None
    if args.init:  # continue training an earlier draft: its weights, architecture and vocabulary
        init_map = TokenMap.load(args.init, target_vocab)
        if init_map is None:
            print(f"error: --init {args.init}: no {TOKEN_MAP_FILE} (a draft made by this command)", file=sys.stderr)
            return 2
    vocab = state["vocab"] if state else init_map.to_target.tolist() if init_map else build_vocab(train, args.vocab,
                                                                                                   specials)
    token_map = TokenMap(vocab, target_vocab)
    print(f"[draft] vocabulary {len(vocab)} tokens covers {coverage(held, token_map):.1%} of held-out answer tokens")
    if args.init:
        from transformers import AutoModelForCausalLM

        draft = AutoModelForCausalLM.from_pretrained(args.init, dtype=torch.float32)
    else:
        draft = init_draft(target.model, token_map, args.hidden, args.layers, args.intermediate, args.heads,
                           args.kv_heads)
    draft.to(device)
    cfg = draft.config
    n_params = sum(p.numel() for p in draft.parameters())
    print(f"[draft] Llama draft: hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers, {n_params / 1e6:.2f} M "
          f"parameters{f' (from {args.init})' if args.init else ''}")

    g = torch.Generator().manual_seed(args.seed)
    train_ex = make_examples(train, token_map, args.max_len)
    held_ex = make_examples(held, token_map, args.max_len)
    steps_per_epoch = math.ceil(len(train_ex) / args.batch_size)
    total_steps = max(1, int(args.epochs * steps_per_epoch))
    opt = torch.optim.AdamW(draft.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = min(100, total_steps // 10)
    deadline = loop_start = None

    def progress(s: int) -> float:
        """Where the schedule stands, 0 … 1: by steps, or by time when a time budget ends first
        (so the learning rate has decayed when the budget stops the run)."""
        done = min(s, total_steps) / total_steps
        if deadline is not None:
            done = max(done, min(1.0, (time.perf_counter() - loop_start) / max(deadline - loop_start, 1e-9)))
        return done

    # Linear warm-up over `warmup` steps or the first 5 % of the run, whichever ends first; then
    # cosine decay to 10 %.
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, max((s + 1) / max(warmup, 1), progress(s) / 0.05))
                                              * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress(s)))))
    step = 0
    if state:
        draft.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        step, g = state["step"], state["generator"]
        print(f"[draft] resumed at step {step}/{total_steps}")
    before = evaluate(draft, held_ex)
    draft.train()
    bar = tqdm(total=total_steps, initial=step, desc="[draft] training", unit="step", dynamic_ncols=True)
    order: list[int] = []
    deadline = started + args.minutes * 60 if args.minutes else None
    loop_start = time.perf_counter()
    while step < total_steps:
        if not order:
            order = torch.randperm(len(train_ex), generator=g).tolist()
        batch = to_device(collate([train_ex[i] for i in order[:args.batch_size]]), device)
        del order[:args.batch_size]
        loss = loss_fn(draft(input_ids=batch["x"], attention_mask=batch["mask"]).logits, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if step % 200 == 0 or step == total_steps or (deadline and time.perf_counter() > deadline):
            ckpt.mkdir(parents=True, exist_ok=True)
            torch.save({"model": draft.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                        "step": step, "generator": g, "vocab": vocab}, ckpt / "state.pt")
        if deadline and time.perf_counter() > deadline:
            print(f"\n[draft] time budget of {args.minutes} min reached at step {step}")
            break
    bar.close()
    after = evaluate(draft, held_ex)

    # Save: an ordinary transformers folder, the target's tokenizer, the token map, a summary.
    draft.eval().to("cpu")
    args.out.mkdir(parents=True, exist_ok=True)
    draft.to(torch.float16).save_pretrained(args.out)
    draft.to(torch.float32)
    target.tokenizer.save_pretrained(args.out)
    token_map.save(args.out)
    from playground.engine import half_weight_linear_layers

    half_weight_linear_layers(draft)  # timed as decoding runs it: float16 weights (it was just saved so)
    t_draft, t_target = time_per_token(draft), time_per_token(target.model)
    summary = {
        "target": target.name, "conversations": len(records), "train_tokens": sum(len(r["input_ids"]) for r in train),
        "vocab": len(vocab), "hidden": cfg.hidden_size, "layers": cfg.num_hidden_layers,
        "intermediate": cfg.intermediate_size, "init": str(args.init) if args.init else None,
        "parameters": n_params, "steps": step, "epochs": step / steps_per_epoch,
        "minutes": (time.perf_counter() - started) / 60,
        "held_out_vocab_coverage": coverage(held, token_map),
        "held_out_top1_agreement_before": before["top1_agreement"], "held_out_top1_agreement": after["top1_agreement"],
        "held_out_loss_before": before["loss"], "held_out_loss": after["loss"],
        "draft_ms_per_token": 1000 * t_draft, "target_ms_per_token": 1000 * t_target,
        "draft_cost_ratio": t_draft / t_target,
    }
    (args.out / "training_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"[draft] saved to {args.out} ({sum(f.stat().st_size for f in args.out.iterdir()) / 1e6:.1f} MB)")
    print(f"[draft] held-out greedy agreement with the target (acceptance of one drafted token): "
          f"{before['top1_agreement']:.1%} before, {after['top1_agreement']:.1%} after training; "
          f"loss {before['loss']:.3f} -> {after['loss']:.3f}")
    print(f"[draft] cost per token on this device: draft {1000 * t_draft:.1f} ms, target {1000 * t_target:.1f} ms "
          f"(ratio c = {t_draft / t_target:.3f})")
    print(f"[draft] {summary['minutes']:.1f} min in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
