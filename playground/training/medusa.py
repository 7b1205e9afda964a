"""Train Medusa heads for any target (Medusa-1: the base model frozen): ``python -m playground.training.medusa``.

Source: Cai et al. 2024, "Medusa", section 2.2.1 (Medusa-1) and 3.3 (self-distillation). The
target stays frozen; only the heads learn. Head k (0-based) on the last hidden state at position
t is trained with cross-entropy against the token at t + k + 2, the losses weighted by
``0.8 ** k`` (later heads are harder and matter less, since they are only reached when the
earlier ones were accepted). ``--distill W`` mixes in, with weight W, the cross-entropy against
the target's own top-k distribution for that token, stored by the data generator.

Steps:
1. Read conversations (JSONL records with ``input_ids`` and ``prompt_len``, as written by
   :mod:`playground.training.data`: the target's own answers to prompts it wrote itself) and
   split off a held-out part.
2. Run the frozen target once over every conversation (``torch.inference_mode``, in batches)
   and keep the last hidden state at each answer position with the next ``num_heads + 1``
   tokens as labels. The heads then train on these cached features: the target's forward is
   paid once, not once per epoch. Conversations whose states the data generator saved
   (``--keep-states``, the default there) skip this pass.
3. Train the heads (AdamW, warm-up then cosine decay), a progress bar showing the loss.
4. Report per-head top-1 and top-5 accuracy on the held-out split and save the heads in the
   reference format (plus the held-out top-1..top-10 accuracy, used to pick a tree per device).

With ``--share-lm-head`` (the default) the heads end in the target's own frozen output
projection, so a checkpoint holds only the residual blocks (a few MB for a small model) instead
of a vocabulary-sized matrix per head.

Example::

    python -m playground.training.medusa --target default --data artifacts/selfdistill/default.jsonl \\
        --heads 4 --layers 1 --epochs 2 --out assets/medusa/default
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from playground.engine import MAX_MEDUSA_HEADS, MEDUSA_TOP_K
from playground.engine import HEAD_LOSS_DECAY, MedusaHeads
from playground.training.cli import progress_bar as _bar  # noqa: F401
from playground.training.cli import read_data
from playground.training.medusa_features import IGNORE, Features, _positions, _teacher, collect_features  # noqa: F401


@dataclass
class LabelVocab:
    """The output rows training needs: the tokens that occur as labels, and their projection.

    With heads that share the frozen ``lm_head``, a softmax over every token that occurs as a
    label anywhere in the training data gives the same gradients as the full-vocabulary softmax
    except for the mass on tokens that never occur as a label (which the heads should not
    predict anyway), at a fraction of the cost: on the default model about 15 k of 49 k rows, and
    the output projection is most of a training step's arithmetic. The trainer then saves these
    tokens as the heads' proposal vocabulary (``MedusaHeads.set_proposal_vocab``), so held-out
    accuracy (:func:`evaluate`) and decoding both rank these tokens only.

    Attributes:
        ids: ``(m,)`` sorted int64 token ids.
        weight: ``(m, hidden_size)`` the ``lm_head`` rows of ``ids`` (frozen).
        bias: ``(m,)`` their bias, or None.
    """

    ids: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None

    @classmethod
    def from_labels(cls, heads: MedusaHeads, labels: torch.Tensor) -> "LabelVocab":
        """Raises: ValueError: the heads have their own projections (nothing shared to cut)."""
        if not heads.share_lm_head or not heads._lm_head or getattr(heads._lm_head[0], "weight", None) is None:
            raise ValueError("a label vocabulary needs heads that share an attached lm_head with a weight")
        lm_head = heads._lm_head[0]
        ids = torch.unique(labels[labels != IGNORE])
        dtype = next(heads.parameters()).dtype
        bias = getattr(lm_head, "bias", None)
        return cls(ids, lm_head.weight.detach()[ids].to(dtype),
                   None if bias is None else bias.detach()[ids].to(dtype))

    def index(self, labels: torch.Tensor, outside_ok: bool = False) -> torch.Tensor:
        """Token ids (any shape) -> row indices (``IGNORE`` kept; with ``outside_ok`` tokens
        outside ``ids`` become ``IGNORE`` too). Raises: ValueError: a label outside ``ids``."""
        pos = torch.searchsorted(self.ids, labels.clamp(min=0)).clamp(max=len(self.ids) - 1)
        valid = labels != IGNORE
        outside = (self.ids[pos] != labels) & valid
        if bool(outside.any()) and not outside_ok:
            raise ValueError("a label is not in the label vocabulary")
        return torch.where(valid & ~outside, pos, IGNORE)


def head_losses(heads: MedusaHeads, hidden: torch.Tensor, labels: torch.Tensor,
                vocab: LabelVocab | None = None, teacher: tuple[torch.Tensor, torch.Tensor] | None = None,
                distill: float = 0.0) -> torch.Tensor:
    """Per-head loss ``(num_heads,)`` of ``heads`` on ``hidden`` ``(n, hidden_size)``.

    The loss of head k is ``(1 - distill) * CE + distill * KD``: CE is the cross-entropy against
    ``labels[:, k]`` (``(n, num_heads)``, ``IGNORE`` entries skipped), KD the cross-entropy
    against the target's own distribution over its stored top-k tokens, renormalised
    (``teacher = (ids, logprobs)``, each ``(n, num_heads, top_k)``, ids ``IGNORE`` where absent):
    soft labels carry the target's second and third choices, which the heads' top-k candidates
    need too (Hinton et al. 2015, "Distilling the Knowledge in a Neural Network"; Medusa's
    self-distillation uses the teacher's distribution the same way, Cai et al. 2024). With
    ``vocab`` the softmax runs over its rows only, and ``labels`` and the teacher's ids must
    already be row indices (:meth:`LabelVocab.index`; teacher tokens outside it as ``IGNORE``).

    Raises:
        ValueError: shapes that do not agree, or ``distill`` outside [0, 1].
    """
    if hidden.dim() != 2 or labels.shape != (hidden.shape[0], heads.num_heads):
        raise ValueError(f"hidden (n, hidden_size) and labels (n, {heads.num_heads}) must agree, got "
                         f"{tuple(hidden.shape)} and {tuple(labels.shape)}")
    if not 0.0 <= distill <= 1.0:
        raise ValueError(f"distill must be in [0, 1], got {distill}")
    if vocab is None:
        logits = heads(hidden)  # (n, num_heads, vocab)
    else:
        logits = torch.nn.functional.linear(heads.residual(hidden), vocab.weight, vocab.bias)  # (n, heads, m)
    logp = logits.float().log_softmax(-1)
    use_teacher = teacher is not None and distill > 0.0
    if use_teacher:
        t_ids, t_lp = teacher
        present = t_ids != IGNORE
        q = t_lp.masked_fill(~present, float("-inf")).softmax(-1).nan_to_num(0.0)  # rows without a teacher: 0
        kd_rows = -(q * logp.gather(-1, t_ids.clamp(min=0))).sum(-1)  # (n, num_heads)
        has_teacher = present.any(-1)
    losses = []
    for k in range(heads.num_heads):
        valid = labels[:, k] != IGNORE
        if not bool(valid.any()):
            losses.append(logits.sum() * 0.0)
            continue
        loss = torch.nn.functional.nll_loss(logp[:, k], labels[:, k], ignore_index=IGNORE)
        if use_teacher and bool(has_teacher[:, k].any()):
            loss = (1.0 - distill) * loss + distill * kd_rows[has_teacher[:, k], k].mean()
        losses.append(loss)
    return torch.stack(losses)


def weighted_loss(losses: torch.Tensor) -> torch.Tensor:
    """Sum over heads of ``HEAD_LOSS_DECAY ** k * loss_k``."""
    weights = HEAD_LOSS_DECAY ** torch.arange(losses.shape[0], dtype=losses.dtype, device=losses.device)
    return (weights * losses).sum()


@torch.no_grad()
def evaluate(heads: MedusaHeads, features: Features, batch_size: int = 256,
             top_k: int = MEDUSA_TOP_K) -> tuple[list[list[float]], list[float]]:
    """Held-out cumulative top-1..top-k accuracy ``(num_heads, top_k)`` and mean loss per head.

    With a proposal vocabulary a label outside it counts as a miss in the accuracy and is left
    out of the loss (its logit is -inf)."""
    param = next(heads.parameters())
    hits = torch.zeros(heads.num_heads, top_k, device=param.device)
    counts = torch.zeros(heads.num_heads, device=param.device)
    loss_sum, loss_counts = torch.zeros_like(counts), torch.zeros_like(counts)
    for start in range(0, len(features), batch_size):
        h = features.hidden[start:start + batch_size].to(param.device, param.dtype)
        y = features.labels[start:start + batch_size].to(param.device)
        logits = heads(h).float()  # (n, num_heads, vocab)
        top = torch.topk(logits, top_k, dim=-1).indices  # (n, num_heads, top_k)
        valid = y != IGNORE
        rank_hit = (top == y[..., None]) & valid[..., None]
        hits += rank_hit.cumsum(-1).clamp(max=1).sum(0).float()
        counts += valid.sum(0).float()
        finite = valid & torch.isfinite(logits.gather(-1, y.clamp(min=0)[..., None]).squeeze(-1))
        for k in range(heads.num_heads):
            if bool(finite[:, k].any()):
                loss_sum[k] += torch.nn.functional.cross_entropy(logits[finite[:, k], k], y[finite[:, k], k],
                                                                 reduction="sum")
                loss_counts[k] += finite[:, k].sum()
    acc = (hits / counts.clamp(min=1)[:, None]).tolist()
    return acc, (loss_sum / loss_counts.clamp(min=1)).tolist()


def train_heads(heads: MedusaHeads, features: Features, *, epochs: float = 1.0, max_steps: int | None = None,
                batch_size: int = 64, lr: float = 1e-3, weight_decay: float = 0.0, warmup: float = 0.05,
                seed: int = 0, progress: bool = True, label_vocab: bool = True, distill: float = 0.0) -> list[float]:
    """Train ``heads`` (its parameters only) on cached features; return the loss of every step.

    Steps: shuffle (seeded), batches of ``batch_size`` positions, loss = :func:`weighted_loss`
    of :func:`head_losses` (with ``distill`` > 0 and features that carry the target's top-k,
    partly against the target's soft distribution), AdamW with a linear warm-up over ``warmup``
    of the steps and cosine decay to 0. With ``label_vocab`` (and heads sharing the base
    ``lm_head``) the softmax runs over the tokens that occur as labels (:class:`LabelVocab`;
    teacher tokens outside them are dropped); the loss values are then over those rows.
    """
    g = torch.Generator().manual_seed(seed)
    steps_per_epoch = max(1, math.ceil(len(features) / batch_size))
    total = max_steps if max_steps is not None else max(1, int(round(epochs * steps_per_epoch)))
    params = [p for p in heads.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    warm = max(1, int(warmup * total))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, total - warm))))
    device, param_dtype = params[0].device, params[0].dtype
    vocab, labels, teacher_ids = None, features.labels, features.teacher_ids
    shared = heads.share_lm_head and heads._lm_head and getattr(heads._lm_head[0], "weight", None) is not None
    if label_vocab and shared:
        vocab = LabelVocab.from_labels(heads, features.labels)
        labels = vocab.index(features.labels)
        if teacher_ids is not None:
            teacher_ids = vocab.index(teacher_ids, outside_ok=True)
    use_teacher = distill > 0.0 and teacher_ids is not None
    heads.train()
    history: list[float] = []
    bar = _bar(total, "train", progress)
    order = torch.randperm(len(features), generator=g)
    cursor = 0
    for _ in range(total):
        if cursor + batch_size > len(order) and cursor > 0:
            order, cursor = torch.randperm(len(features), generator=g), 0
        idx = order[cursor:cursor + batch_size]
        cursor += batch_size
        teacher = (teacher_ids[idx].to(device), features.teacher_logprobs[idx].to(device)) if use_teacher else None
        losses = head_losses(heads, features.hidden[idx].to(device, param_dtype), labels[idx].to(device), vocab,
                             teacher, distill)
        loss = weighted_loss(losses)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        history.append(float(loss.detach()))
        bar.set_postfix_str(f"loss {history[-1]:.3f} head1 {float(losses[0].detach()):.3f}", refresh=False)
        bar.update(1)
    bar.close()
    heads.eval()
    return history


@torch.no_grad()
def warm_start(heads: MedusaHeads, init: MedusaHeads) -> MedusaHeads:
    """Copy ``init``'s residual blocks into ``heads`` (fine-tuning trained heads, possibly deeper or more of them).

    Head k's block l takes ``init``'s for every k < ``init.num_heads`` and l < ``init.num_layers``;
    the blocks after them keep their zero initialisation, so they start as the identity and the
    warm-started heads compute exactly what ``init``'s did (extra heads start as identity heads).

    Raises:
        ValueError: different hidden sizes, one side with per-head projections, or ``init`` with
            more heads or blocks than ``heads``.
    """
    if init.hidden_size != heads.hidden_size:
        raise ValueError(f"the heads to start from have hidden size {init.hidden_size}, the target {heads.hidden_size}")
    if init.share_lm_head != heads.share_lm_head:
        raise ValueError("the heads to start from and the heads to train must agree on sharing the target's lm_head "
                         f"(--share-lm-head: {heads.share_lm_head}, theirs: {init.share_lm_head})")
    if init.num_heads > heads.num_heads or init.num_layers > heads.num_layers:
        raise ValueError(f"the heads to start from have {init.num_heads} heads of {init.num_layers} blocks; "
                         f"--heads {heads.num_heads} --layers {heads.num_layers} cannot hold them")
    for k in range(init.num_heads):
        for layer in range(init.num_layers):
            heads.heads[k][layer].load_state_dict(init.heads[k][layer].state_dict())
        if not init.share_lm_head:
            heads.heads[k][-1].load_state_dict(init.heads[k][-1].state_dict())
    return heads


def format_accuracy(acc: list[list[float]]) -> str:
    """A small table: per head, top-1 and top-5 held-out accuracy."""
    lines = ["head  predicts  top-1   top-5"]
    for k, row in enumerate(acc):
        lines.append(f"{k + 1:>4}  t+{k + 2:<7} {row[0]:6.1%}  {row[min(4, len(row) - 1)]:6.1%}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The command line; every number is checked here, so bad values stop before any model loads."""
    from playground.training.cli import HelpFormatter, float_in, int_at_least

    positive = int_at_least(1)
    ap = argparse.ArgumentParser(prog="python -m playground.training.medusa",
                                 description="Train Medusa heads (Medusa-1, target frozen) on self-distilled "
                                             "conversations; save them in the reference format.",
                                 formatter_class=HelpFormatter)
    ap.add_argument("--target", default="default", help="target model spec (as app.py's --target)")
    ap.add_argument("--data", required=True, nargs="+", help="JSONL conversations with input_ids and prompt_len "
                                                             "(python -m playground.training.data); several files "
                                                             "are read in order")
    ap.add_argument("--out", required=True, help="output folder (config.json + medusa_lm_head.safetensors); "
                                                 "files of the same names in it are replaced")
    ap.add_argument("--heads", type=int_at_least(1, maximum=MAX_MEDUSA_HEADS), default=4,
                    help=f"number of heads, 1 to {MAX_MEDUSA_HEADS} (head k predicts token t+k+2)")
    ap.add_argument("--layers", type=positive, default=1, help="residual blocks per head")
    ap.add_argument("--epochs", type=float_in(0, low_open=True), default=1.0,
                    help="passes over the training positions (fractions allowed)")
    ap.add_argument("--max-steps", type=positive,
                    help="stop after this many steps (overrides --epochs; default: from --epochs)")
    ap.add_argument("--batch-size", type=positive, default=64, help="positions per training step")
    ap.add_argument("--lr", type=float_in(0, low_open=True), default=1e-3,
                    help="peak AdamW learning rate (linear warm-up, then cosine decay to 0)")
    ap.add_argument("--distill", type=float_in(0, 1), default=0.0,
                    help="weight in [0, 1] of the loss against the target's own top-k distribution stored with "
                         "the data (python -m playground.training.data --teacher-top-k); the rest is against "
                         "the generated token")
    ap.add_argument("--share-lm-head", action=argparse.BooleanOptionalAction, default=True,
                    help="end every head in the target's frozen lm_head (small checkpoint)")
    ap.add_argument("--label-vocab", action=argparse.BooleanOptionalAction, default=True,
                    help="softmax over the tokens that occur as labels while training, and save them as the "
                         "heads' proposal vocabulary (shared lm_head only)")
    ap.add_argument("--held-out", type=float_in(0, 1, low_open=True, high_open=True), default=0.05,
                    help="fraction of conversations held out for the accuracy report, in (0, 1)")
    ap.add_argument("--max-conversations", type=positive, help="use only the first N conversations (default: all)")
    ap.add_argument("--max-len", type=positive, default=1024, help="tokens per conversation kept")
    ap.add_argument("--feature-batch", type=positive, default=8, help="conversations per target forward")
    ap.add_argument("--device", default="auto", help="device for the target and the heads: auto, cpu, cuda, "
                                                     "cuda:N or mps")
    ap.add_argument("--dtype", default="auto", help="target dtype (auto, float32, bfloat16, float16)")
    ap.add_argument("--threads", type=positive, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--format", choices=("safetensors", "pt"), default="safetensors",
                    help="file format of the saved heads")
    ap.add_argument("--save-dtype", choices=("float32", "float16", "bfloat16"), default="float32",
                    help="dtype of the saved weights (float16 halves the file; they load in the target's dtype)")
    ap.add_argument("--init", help="start from these heads (folder or hub id, as --medusa) instead of identity "
                                   "heads; --heads and --layers may exceed theirs (the extra heads and blocks "
                                   "start as the identity)")
    ap.add_argument("--seed", type=int, default=0, help="random seed (split, head initialisation, batch order)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    return ap


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring). Returns 0, or 2 after an ``error:`` on stderr: a bad
    option value (argparse's usage error), an --out that is a file, unreadable --data (all before the
    target loads), a target that does not load, or an --init that does not fit."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # a usage error, already printed by argparse (status 2), or --help (0)
        return int(e.code or 0)
    from playground.engine import ModelLoadError, load_model
    from playground.training.data import load_records, load_states_for, split_records

    if Path(args.out).exists() and not Path(args.out).is_dir():
        print(f"error: --out {args.out!r} is a file; the heads are saved in a folder (a new one, or one that "
              f"holds earlier heads)", file=sys.stderr)
        return 2

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    records = read_data(load_records, args.data)
    if records is None:
        return 2
    if args.max_conversations:
        records = records[:args.max_conversations]
    if len(records) < 2:
        print(f"error: --data {args.data!r} has {len(records)} conversations; need at least 2", file=sys.stderr)
        return 2
    train_records, held_records = split_records(records, args.held_out, args.seed)
    try:
        target = load_model(args.target, args.device, args.dtype)
    except (ModelLoadError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    model = target.model.eval().requires_grad_(False)
    config = model.config.get_text_config()
    progress = not args.no_progress
    t0 = time.perf_counter()
    saved = {id(r): s for r, s in zip(records, load_states_for(args.data, records, target.spec))}
    train, held = (collect_features(model, part, args.heads, args.feature_batch, args.max_len, progress=progress,
                                    saved_states=[saved[id(r)] for r in part])
                   for part in (train_records, held_records))
    t_feat = time.perf_counter() - t0
    n_saved = sum(s is not None for s in saved.values())
    print(f"{len(train)} training positions from {len(train_records)} conversations, {len(held)} held-out "
          f"positions from {len(held_records)}; features in {t_feat:.0f} s ({n_saved} conversations' "
          f"states saved by the data generator)", file=sys.stderr)

    heads = MedusaHeads(int(config.hidden_size), int(config.vocab_size), args.heads, args.layers,
                        share_lm_head=args.share_lm_head, base_model_name_or_path=target.spec)
    init_vocab = None
    if args.init:
        from playground.engine import MedusaLoadError, load_heads

        try:
            init = load_heads(args.init)
            warm_start(heads, init)
        except (MedusaLoadError, ValueError) as e:
            print(f"error: --init {args.init!r}: {e}", file=sys.stderr)
            return 2
        init_vocab = init.proposal_vocab
        print(f"starting from {args.init} ({init.num_heads} heads of {init.num_layers} blocks)", file=sys.stderr)
    if args.share_lm_head:
        heads.attach_lm_head(model.get_output_embeddings())
    else:  # start each projection from the target's own (the reference does the same)
        with torch.no_grad():
            for head in heads.heads:
                head[-1].weight.copy_(model.get_output_embeddings().weight.float())
    heads.to(target.device)
    before, _ = evaluate(heads, held)
    t1 = time.perf_counter()
    history = train_heads(heads, train, epochs=args.epochs, max_steps=args.max_steps, batch_size=args.batch_size,
                          lr=args.lr, seed=args.seed, progress=progress, label_vocab=args.label_vocab,
                          distill=args.distill)
    t_train = time.perf_counter() - t1
    if args.label_vocab and args.share_lm_head:
        # Propose from the tokens the heads learned to rank (a cheaper head at decoding time);
        # the accuracy below is measured the same way.
        learned = train.labels[train.labels != IGNORE]
        heads.set_proposal_vocab(learned if init_vocab is None else torch.cat([learned, init_vocab.to(learned)]))
        print(f"the heads propose from the {len(heads.proposal_vocab)} tokens that occur as labels "
              f"(of {heads.vocab_size})")
    acc, loss = evaluate(heads, held)
    heads.top_k_accuracy = acc
    heads.save(args.out, args.format, getattr(torch, args.save_dtype))
    first = sum(history[:10]) / max(1, len(history[:10]))
    last = sum(history[-10:]) / max(1, len(history[-10:]))
    print(f"\ntrained {len(history)} steps of {args.batch_size} positions in {t_train:.0f} s "
          f"({len(history) * args.batch_size / max(t_train, 1e-9):.0f} positions/s); loss {first:.3f} -> {last:.3f}")
    print(f"held-out accuracy before training ({'--init heads' if args.init else 'identity heads'}): top-1 " +
          ", ".join(f"{row[0]:.1%}" for row in before))
    print(format_accuracy(acc))
    print("held-out loss per head: " + ", ".join(f"{x:.3f}" for x in loss))
    size = sum(p.stat().st_size for p in Path(args.out).iterdir()) / 1e6
    print(f"saved to {args.out} ({size:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
