"""Train an EAGLE-3 head for a Llama-architecture target on the target's own answers.

    python -m playground.training.eagle --target default --data data/selfgen/default \\
        --out assets/eagle/default

Recipe (Li et al. 2025, EAGLE-3; the reference implementation's ``traineagle3``):

1. **Data**: conversations the target wrote itself (:mod:`playground.training.tasks` chunks, or
   :mod:`playground.training.data` JSON Lines), committed as token ids. A deterministic share of
   the records is held out.
2. **Draft vocabulary**: the ``draft_vocab_size`` most frequent answer tokens (end-of-turn ids
   always in), with vLLM's ``d2t`` / ``t2d`` maps.
3. **Teacher forcing**: one pass of the target over every record gives its features at the
   three layers the head reads and its final hidden state (forward hooks; cached per data chunk
   in ``--cache``, an ignored folder; never committed).
4. **Training-time test**: the head is unrolled ``--ttt-steps`` times over every position at once
   (:meth:`EagleHead.unrolled`); step j reads its own previous outputs and predicts the token
   j + 2 ahead. The loss of step j is the cross-entropy against the target's next-token
   distribution restricted to the draft vocabulary (softmax over those ids), on answer positions
   whose target argmax is in the draft vocabulary, weighted ``0.8 ** j``. AdamW, warm-up then
   cosine decay, gradients clipped. The output layer starts from the target's own output rows of
   the draft ids and the final norm from the target's, so little data goes far.
5. **Held-out acceptance per depth**: the share of held-out answer positions where the unrolled
   draft's top-1 equals the target's top-1 at every depth up to d (a chain's acceptance), saved
   in ``recipe.json`` with the command, data, timings and machine. Held-out records whose answer
   a training record also has are left out of it (:func:`drop_seen_answers`). These figures are
   on the generator's own kind of text; :mod:`playground.training.probe` measures the same on
   benchmark questions' baseline answers, where a head runs.

Resume: the trainer state is saved every ``--save-every`` steps in ``--state`` and resumed from there.
Fine-tune: ``--init HEAD`` starts from a saved head (its weights, draft vocabulary, feature layers and
MLP width) instead of the warm start above, e.g. the shipped head on newly generated rounds; the new
``recipe.json`` keeps the fine-tuned head's own recipe under ``init_recipe``. With ``--extend-vocab N``
the fine-tuned head's draft vocabulary grows to N ids (the most frequent answer tokens of
``--vocab-data`` it lacks), the new output rows starting from the target's own rows mapped onto the
trained ones (:func:`extended_output_rows`).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import platform
import random
import sys
import time
from pathlib import Path

import torch

from playground.training.cli import HelpFormatter, int_at_least, progress_bar, read_data
from playground.training.eagle_data import (answer_share, draft_vocabulary, drop_seen_answers, extend_vocabulary,
                                           extended_output_rows, read_records, split_held_out)
from playground.training.eagle_teacher import Teacher, cache_features, load_cached

__all__ = ["read_records", "split_held_out", "drop_seen_answers", "draft_vocabulary", "Teacher", "cache_features",
           "load_cached", "make_batch", "ttt_loss", "batches", "evaluate", "main"]

LOSS_DECAY = 0.8
"""Weight of unrolled step j is ``LOSS_DECAY ** j`` (EAGLE-3's reference)."""


def make_batch(items, records, steps: int, head, target_rows: torch.Tensor):
    """Padded tensors for the unrolled loss.

    Returns:
        features ``(B, T, 3H)``, next_ids ``(B, T + steps - 1)``, final hidden ``(B, T + steps, H)``,
        answer mask ``(B, T + steps + 1)`` (True where a token is an answer token in the draft vocabulary).
    """
    T = max(len(r["input_ids"]) for r in records) - 1
    B = len(records)
    H3, H = items[0][0].shape[-1], items[0][1].shape[-1]
    feats = torch.zeros(B, T, H3)
    final = torch.zeros(B, T + steps, H)
    next_ids = torch.zeros(B, T + steps - 1, dtype=torch.long)
    answer = torch.zeros(B, T + steps + 1, dtype=torch.bool)
    for b, ((f, h), r) in enumerate(zip(items, records)):
        L = len(r["input_ids"])
        ids = torch.tensor(r["input_ids"])
        feats[b, :L - 1] = f[:L - 1].float()
        final[b, :L] = h.float()
        next_ids[b, :L - 1] = ids[1:]
        # an answer token counts when it is in the draft vocabulary (for the target's greedy answers this is
        # EAGLE-3's "target argmax in the draft vocabulary" without a full-vocab pass; on sampled passages it
        # is the sampled token's; the loss is against the target's distribution either way)
        answer[b, r["prompt_len"]:L] = head.t2d[ids[r["prompt_len"]:]].cpu()
    return feats, next_ids, final, answer


def ttt_loss(head, feats, next_ids, final, answer, steps: int, target_rows: torch.Tensor, autocast: bool = False):
    """EAGLE-3's training-time-test loss (see the module docstring) and per-step top-1 agreement.

    Step j's row t predicts token t + j + 2, which the target predicts from its final hidden state
    at position t + j + 1. Only scored positions go through the output layers (the draft's and the
    target's rows of the draft vocabulary).

    Returns:
        ``(loss, per-step losses, per-step (top-1 hits, chain hits, positions))``; a chain hit at
        step j means the draft's top-1 equalled the target's at steps 0..j of that position.
    """
    T = feats.shape[1]
    ctx = torch.autocast(feats.device.type, dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    # Steps after the first skip positions whose tokens ahead are all prompt tokens.
    start = max(0, int(answer[:, :T + 2].float().argmax(1).min()) - 2 - steps)
    with ctx:
        outs = head.unrolled(feats, next_ids, steps, outputs=True, start=start)
    losses, agree = [], []
    chain = torch.ones(answer[:, :T].shape, dtype=torch.bool, device=feats.device)
    for j, h in enumerate(outs):
        mask = answer[:, j + 2:j + 2 + T].clone()  # token t + j + 2 is an answer token in the draft vocabulary
        if j > 0 and start:
            mask[:, :start] = False
            h = torch.cat([h.new_zeros(h.shape[0], start, h.shape[2]), h], 1)
        if not bool(mask.any()):
            losses.append(h.sum() * 0.0)
            agree.append((0.0, 0.0, 0.0))
            chain &= mask
            continue
        with torch.no_grad():
            tlog = final[:, j + 1:j + 1 + T][mask] @ target_rows.T  # (m, Dv): the target on the draft vocab
            tp = torch.softmax(tlog, -1)
        with ctx:
            lg = head.logits(h[mask])
        lp = torch.log_softmax(lg.float(), -1)
        losses.append(-(tp * lp).sum(-1).mean())
        with torch.no_grad():
            hit = torch.zeros_like(mask)
            hit[mask] = lg.argmax(-1) == tp.argmax(-1)
            chain = chain & hit
            agree.append((float(hit.sum()), float(chain.sum()), float(mask.sum())))
    total = sum((LOSS_DECAY ** j) * l for j, l in enumerate(losses))
    return total, [float(l.detach()) for l in losses], agree


def batches(records: list[dict], batch_tokens: int, rng: random.Random) -> list[list[int]]:
    """Index batches of similar length, at most ``batch_tokens`` padded tokens each, shuffled."""
    idx = sorted(range(len(records)), key=lambda i: len(records[i]["input_ids"]))
    out, cur = [], []
    for i in idx:
        if cur and (len(cur) + 1) * len(records[i]["input_ids"]) > batch_tokens:
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    rng.shuffle(out)
    return out


def evaluate(head, items, records, steps, target_rows, batch_tokens) -> dict:
    """Held-out top-1 agreement per depth (each depth alone, and as a chain: every depth up to d)."""
    sums = [[0.0, 0.0, 0.0] for _ in range(steps)]
    head.eval()
    with torch.no_grad():
        for group in batches(records, batch_tokens, random.Random(0)):
            f, n, h, a = make_batch([items[i] for i in group], [records[i] for i in group], steps, head, target_rows)
            f, n, h, a = (x.to(target_rows.device) for x in (f, n, h, a))
            _, _, agree = ttt_loss(head, f, n, h, a, steps, target_rows)
            for j, (hit, ch, m) in enumerate(agree):
                sums[j][0] += hit
                sums[j][1] += ch
                sums[j][2] += m
    head.train()
    per = [round(s[0] / max(s[2], 1), 4) for s in sums]
    chain = [round(s[1] / max(sums[0][2], 1), 4) for s in sums]
    return {"top1_per_depth": per, "chain_acceptance_per_depth": chain,
            "expected_tokens_per_chain_step": round(1 + sum(chain), 3)}


def build_parser() -> argparse.ArgumentParser:
    pos = int_at_least(1)
    p = argparse.ArgumentParser(prog="python -m playground.training.eagle", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--target", default="default", help="target: default, hub id, folder or .gguf (Llama architecture)")
    p.add_argument("--data", nargs="+", default=["data/selfgen/default"],
                   help="chunk folders (chunk_*.jsonl.gz) or conversation files (.jsonl, .jsonl.gz)")
    p.add_argument("--out", type=Path, default=Path("artifacts/eagle/head"), help="folder for the trained head")
    p.add_argument("--cache", type=Path, default=Path("artifacts/eagle_cache"),
                   help="teacher features cache (ignored folder; recomputed when missing)")
    p.add_argument("--state", type=Path, default=None,
                   help="trainer state for resuming (default: OUT/../<name>.state.pt)")
    p.add_argument("--init", default=None,
                   help="fine-tune this head (folder or hub id): its weights, draft vocabulary and shape")
    p.add_argument("--draft-vocab-size", type=pos, default=8192, help="draft vocabulary size")
    p.add_argument("--extend-vocab", type=pos, default=None,
                   help="with --init: grow its draft vocabulary to this many ids")
    p.add_argument("--vocab-data", nargs="+", default=None,
                   help="records that rank the tokens --extend-vocab adds (default: the training records)")
    p.add_argument("--intermediate-size", type=pos, default=None, help="MLP width of the head (default: the target's)")
    p.add_argument("--feature-layers", type=int, nargs=3, default=None,
                   help="the target layers read (0 = embeddings; default vLLM's (2, n/2, n-3))")
    p.add_argument("--ttt-steps", type=pos, default=5, help="unrolled draft steps (training-time test)")
    p.add_argument("--epochs", type=float, default=4.0, help="passes over the training records")
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many optimiser steps (0: epochs decide)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (AdamW)")
    p.add_argument("--warmup", type=int, default=50, help="warm-up steps")
    p.add_argument("--batch-tokens", type=pos, default=4096, help="padded tokens per training batch")
    p.add_argument("--max-len", type=pos, default=640, help="records are cut to this many tokens")
    p.add_argument("--held-out", type=float, default=0.03, help="share of records held out")
    p.add_argument("--teacher-dtype", default="bfloat16", help="dtype of the teacher-forcing pass")
    p.add_argument("--teacher-batch-tokens", type=pos, default=4096, help="tokens per teacher-forcing batch")
    p.add_argument("--autocast", action="store_true", help="bfloat16 autocast for the head's matrix products")
    p.add_argument("--time-budget", type=float, default=0.0,
                   help="seconds for the whole run: every 10 steps the step count is fitted to the time left (0: none)")
    p.add_argument("--save-every", type=pos, default=200, help="save the trainer state every N steps")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N, mps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    return p


def main(argv: list[str] | None = None) -> int:
    from playground.engine import EagleHead, ModelLoadError, load_model, resolve_device, save_eagle
    from playground.engine import eagle_head_config as head_config

    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t_start = time.perf_counter()
    records = read_data(read_records, args.data)
    if records is None:
        return 2
    records = [dict(r, input_ids=r["input_ids"][:args.max_len]) for r in records]
    records = [r for r in records if len(r["input_ids"]) > r["prompt_len"] + 1]
    if not records:
        print("error: no training records in --data", file=sys.stderr)
        return 2
    train, held = split_held_out(records, args.held_out, args.seed)
    n_held = len(held)
    held = drop_seen_answers(train, held)
    if (args.extend_vocab or args.vocab_data) and not args.init:
        print("error: --extend-vocab (and --vocab-data) grow the vocabulary of an --init head", file=sys.stderr)
        return 2
    vocab_records = train
    if args.vocab_data:
        try:
            vocab_records = read_records(args.vocab_data)
        except (OSError, ValueError, KeyError) as e:
            print(f"error: --vocab-data: {e}", file=sys.stderr)
            return 2
        if not vocab_records:
            print("error: no records in --vocab-data", file=sys.stderr)
            return 2
    init = None
    if args.init:  # checked before the target loads: a wrong path costs no waiting
        from playground.engine import EagleLoadError, load_eagle
        try:
            init = load_eagle(args.init, target=None)
        except EagleLoadError as e:
            print(f"error: --init: {e}", file=sys.stderr)
            return 2
    device = resolve_device(args.device)
    try:
        loaded = load_model(args.target, device=device, dtype=args.teacher_dtype)
    except (ModelLoadError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    model = loaded.model.eval()
    cfg = model.config.get_text_config()
    if getattr(cfg, "model_type", "") not in ("llama", "mistral", "qwen2", "qwen3"):
        print(f"warning: target model_type {cfg.model_type!r}; vLLM's eagle3 loader expects a Llama target",
              file=sys.stderr)
    state_path = args.state or args.out.parent / f"{args.out.name}.state.pt"
    saved = torch.load(state_path, weights_only=False) if state_path.exists() else None
    if init is not None:
        if init.target_hidden_size != int(cfg.hidden_size) or int(init.config["vocab_size"]) != int(cfg.vocab_size):
            print(f"error: --init {args.init!r} was trained for hidden size {init.target_hidden_size} and vocabulary "
                  f"{init.config['vocab_size']}, the target has {cfg.hidden_size} and {cfg.vocab_size}", file=sys.stderr)
            return 2
        if max(init.feature_layers) > int(cfg.num_hidden_layers):
            print(f"error: --init {args.init!r} reads layer {max(init.feature_layers)}, the target has "
                  f"{cfg.num_hidden_layers}", file=sys.stderr)
            return 2
        print(f"[eagle] fine-tuning {args.init}: its shape, draft vocabulary ({init.draft_vocab_size} ids"
              f"{f', grown to {args.extend_vocab}' if args.extend_vocab else ''}) and feature layers "
              f"{list(init.feature_layers)} are kept (--draft-vocab-size, --feature-layers and "
              f"--intermediate-size do not apply)")
    if init is not None:
        draft_ids = init.draft_ids.clone()
        if args.extend_vocab and saved is not None and saved.get("init") == args.init \
                and len(saved["draft_ids"]) == args.extend_vocab:
            draft_ids = saved["draft_ids"]  # resuming: the vocabulary this run grew first, whatever the data now
        elif args.extend_vocab:
            try:
                draft_ids = extend_vocabulary(draft_ids, vocab_records, args.extend_vocab, int(cfg.vocab_size))
            except ValueError as e:
                print(f"error: --extend-vocab: {e}", file=sys.stderr)
                return 2
    elif saved is not None and len(saved["draft_ids"]) == args.draft_vocab_size:
        draft_ids = saved["draft_ids"]  # resuming (possibly on more data): the vocabulary it was trained with
    else:
        draft_ids, _ = draft_vocabulary(train, args.draft_vocab_size, int(cfg.vocab_size), list(loaded.eos_token_ids))
    share = answer_share(train, draft_ids)
    if init is not None:
        config = dict(init.config, draft_vocab_size=len(draft_ids))
    else:
        config = head_config(cfg, len(draft_ids), args.feature_layers, args.intermediate_size)
    print(f"[eagle] {len(train)} training and {len(held)} held-out records ({n_held - len(held)} held out "
          f"with an answer a training record also has left out) "
          f"({sum(len(r['input_ids']) - r['prompt_len'] for r in train)} answer tokens); draft vocabulary "
          f"{len(draft_ids)} ids covers {share:.1%} of answer tokens; "
          f"layers {config['eagle_aux_hidden_state_layer_ids']}")
    layers_key = "-".join(map(str, config["eagle_aux_hidden_state_layer_ids"]))
    key = "".join(c if c.isalnum() else "_" for c in f"{loaded.spec}_{args.teacher_dtype}_{layers_key}_{args.max_len}")
    cache_dir = args.cache / key
    teacher = Teacher(model, config["eagle_aux_hidden_state_layer_ids"])
    t_tf = time.perf_counter()
    cache_features(teacher, records, cache_dir, args.teacher_batch_tokens)
    tf_s = time.perf_counter() - t_tf
    # The head, warm-started from the target's output rows and final norm.
    head = EagleHead(config, draft_ids).to(device)
    out_emb = model.get_output_embeddings().weight.detach().float()
    target_rows = out_emb[draft_ids.to(out_emb.device)].to(device)
    with torch.no_grad():
        if init is not None:  # fine-tuning: the given head's weights (output rows grown with the vocabulary)
            weights = {k: v.float() for k, v in init.state_dict().items()}
            if len(draft_ids) > init.draft_vocab_size:
                weights["lm_head.weight"] = extended_output_rows(init.draft_ids, weights["lm_head.weight"], draft_ids,
                                                                 out_emb)
            head.load_state_dict(weights)
        else:
            head.lm_head.weight.copy_(target_rows)
            head.norm.weight.copy_(model.get_decoder().norm.weight.detach().float())
            for name, p in head.named_parameters():
                if p.dim() == 2 and not name.startswith("lm_head"):
                    torch.nn.init.normal_(p, std=0.02)
    emb = torch.nn.Embedding.from_pretrained(model.get_input_embeddings().weight.detach().float().to(device),
                                             freeze=True)
    head.attach_embedding(emb)
    del teacher
    train_items = load_cached(train, cache_dir)
    held_items = load_cached(held, cache_dir)
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=args.lr, weight_decay=0.0,
                            betas=(0.9, 0.95))
    rng = random.Random(args.seed)
    per_epoch = len(batches(train, args.batch_tokens, random.Random(0)))
    total_steps = args.max_steps or max(1, int(per_epoch * args.epochs))
    step = 0
    if saved is not None:
        st = saved
        if st.get("config") == config and torch.equal(st["draft_ids"], draft_ids) and st.get("init") == args.init:
            head.load_state_dict(st["head"])
            opt.load_state_dict(st["opt"])
            step = int(st["step"])
            rng.setstate(st["rng"])
            print(f"[eagle] resumed at step {step} from {state_path}")
        else:
            print(f"[eagle] {state_path} is for another config, vocabulary or --init: starting afresh")

    def lr_at(s):
        if s < args.warmup:
            return args.lr * (s + 1) / args.warmup
        return args.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, (s - args.warmup) / max(1, total_steps - args.warmup))))

    bar = progress_bar(total_steps, "train", True)
    bar.update(step)
    head.train()
    t_train, tokens_seen, ema, first_step = time.perf_counter(), 0, None, step
    last_fit = (t_train, step)
    queue: list[list[int]] = []
    while step < total_steps:
        if not queue:
            queue = batches(train, args.batch_tokens, rng)
        group = queue.pop()
        f, n, h, a = make_batch([train_items[i] for i in group], [train[i] for i in group], args.ttt_steps, head,
                                target_rows)
        f, n, h, a = f.to(device), n.to(device), h.to(device), a.to(device)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        loss, parts, agree = ttt_loss(head, f, n, h, a, args.ttt_steps, target_rows, args.autocast)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 0.5)
        opt.step()
        step += 1
        tokens_seen += int(a.sum())
        acc0 = agree[0][0] / max(agree[0][2], 1)
        ema = acc0 if ema is None else 0.95 * ema + 0.05 * acc0
        bar.update(1)
        bar.set_postfix_str(f"loss {float(loss.detach()):.3f} top1@1 {ema:.3f}")
        if args.time_budget and (step - first_step) % 10 == 0:
            # Fit the schedule to the time left, every 10 steps from the pace of the last ones (a shared
            # machine's pace changes), so the cosine decay ends when the budget does.
            now = time.perf_counter()
            per_step = (now - last_fit[0]) / max(1, step - last_fit[1])
            last_fit = (now, step)
            left = args.time_budget - (now - t_start)
            fitted = max(step + 1, step + int(left / per_step))
            if args.max_steps:
                fitted = min(fitted, args.max_steps)
            if fitted != total_steps:
                total_steps = fitted
                bar.total = total_steps
                print(f"\n[eagle] {per_step:.1f} s a step: {total_steps} steps fit the time budget", file=sys.stderr)
        if step % args.save_every == 0 or step == total_steps:
            state_path.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "step": step, "rng": rng.getstate(),
                        "config": config, "draft_ids": draft_ids, "init": args.init}, state_path)
    bar.close()
    train_s = time.perf_counter() - t_train
    metrics = evaluate(head, held_items, held, args.ttt_steps, target_rows, args.batch_tokens)
    print(f"[eagle] held-out top-1 per depth {metrics['top1_per_depth']}; chain acceptance "
          f"{metrics['chain_acceptance_per_depth']}")
    recipe = {
        "command": "python -m playground.training.eagle " + " ".join(argv if argv is not None else sys.argv[1:]),
        "target": loaded.spec, "data": sorted({r["chunk"] for r in records}), "records": len(train),
        "held_out_records": len(held), "init": args.init,
        "answer_tokens": sum(len(r["input_ids"]) - r["prompt_len"] for r in train),
        "draft_vocab_coverage": round(share, 4), "ttt_steps": args.ttt_steps, "loss_decay": LOSS_DECAY,
        "epochs": args.epochs, "steps": total_steps, "time_budget_s": args.time_budget, "lr": args.lr,
        "batch_tokens": args.batch_tokens,
        "max_len": args.max_len, "teacher_dtype": args.teacher_dtype, "held_out": metrics,
        "teacher_forcing_s": round(tf_s, 1), "train_s": round(train_s, 1),
        "total_s": round(time.perf_counter() - t_start, 1),
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, {device}",
        "torch": torch.__version__,
    }
    if init is not None:  # the chain of recipes that made the head: the one fine-tuned, and how it was made
        recipe["init_recipe"] = getattr(init, "recipe", None) or None  # load_eagle read it (folder or hub)
    save_eagle(head.cpu(), args.out, recipe=recipe)
    print(f"[eagle] saved {args.out} ({(args.out / 'model.safetensors').stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
