"""Export a reduced-vocabulary draft as a full-vocabulary model that vLLM and transformers accept.

``python -m playground.backends.vllm.export_draft [--draft DIR] [--out DIR]`` writes the folder and
prints its path (by default under the playground cache: ``<cache>/vllm-drafts/<name>-<hash>``; it
is rebuilt only when the draft changes).

Why: the shipped draft (``assets/draft/default``) predicts only 7,168 of the target's 49,152 tokens
(``draft_vocab.json`` maps each draft id to a target id, see ``playground.engine.draft_model.TokenMap``).
vLLM's ``draft_model`` method refuses a draft whose vocabulary size differs from the target's, and
transformers' ``generate(assistant_model=...)`` wants the same ids too. The export speaks target ids
on both sides and computes the same thing as the playground's reduced draft:

* input embedding ``(49152, hidden)``: row ``t`` is the draft's row for target token ``t``, or the
  draft's out-of-vocabulary row for tokens it does not have (what ``TokenMap.draft_ids`` feeds);
* output layer ``(49152, hidden)``, untied: row ``t`` is the draft's row for ``t``; every token
  outside the draft's vocabulary gets one shared row ``w``, the mean of the rows of the
  ``NUM_FLOOR_ROWS`` draft tokens whose logits are lowest on calibration text. Since ``w`` is a
  convex combination of rows the draft has, ``w . h`` is an average of real logits and so is never
  above the largest of them: an outside token never beats the draft's best token, and greedy
  drafting (vLLM's default ``draft_sample_method``) proposes exactly what the reduced draft proposes.
  (It could only tie if all those ``NUM_FLOOR_ROWS`` logits equalled the maximum.) Under sampling
  the outside tokens keep a small probability mass; :func:`check_export` measures it and
  ``export_info.json`` records it.

The weights are float32 (about 160 MB for the shipped draft), so the folder lives in the cache,
not in git.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

NUM_FLOOR_ROWS = 32
"""Draft tokens whose mean output row scores every token outside the draft's vocabulary."""
EXPORT_INFO_FILE = "export_info.json"
EXPORT_VERSION = 1
"""Bump when the export's construction changes (a new folder is written)."""
COPIED_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json",
                "special_tokens_map.json", "draft_knobs.json")


class ExportError(RuntimeError):
    """The draft cannot be exported (no token map, unreadable weights, a map that does not fit)."""


def _source_hash(folder: Path) -> str:
    h = hashlib.sha256(f"v{EXPORT_VERSION}".encode())
    for name in ("config.json", "model.safetensors", "draft_vocab.json"):
        path = folder / name
        if path.is_file():
            h.update(name.encode())
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()[:12]


def default_export_dir(draft_dir: str | Path) -> Path:
    """Where :func:`export_full_vocab` puts the export of ``draft_dir`` by default."""
    from playground.engine import DEFAULT_DRAFT_DIR, cache_dir

    draft_dir = Path(draft_dir).resolve()
    name = "shipped-draft" if draft_dir == DEFAULT_DRAFT_DIR else draft_dir.name
    return cache_dir() / "vllm-drafts" / f"{name}-{_source_hash(draft_dir)}"


CALIBRATION_MODULES = ("textwrap.py", "argparse.py", "json/__init__.py", "csv.py", "pathlib.py", "dataclasses.py")
CHECK_MODULES = ("string.py", "shutil.py", "functools.py", "heapq.py", "logging/__init__.py", "fractions.py")


def calibration_texts(max_chars: int = 24_000, held_out: bool = False) -> list[str]:
    """Text to find the draft's lowest-scoring tokens on: eight of the examples' prompts in chat
    form and the opening of some Python standard-library modules (never the benchmark
    questions). ``held_out`` gives other examples and other modules, for :func:`check_export`."""
    import sysconfig

    repo = Path(__file__).resolve().parents[3]
    texts = []
    try:
        examples = json.loads((repo / "assets" / "examples.json").read_text())
        for ex in examples[8:16] if held_out else examples[:8]:
            texts.append(f"<|im_start|>user\n{ex['prompt'][:1500]}<|im_end|>\n<|im_start|>assistant\n")
    except (OSError, KeyError, TypeError, json.JSONDecodeError):
        pass
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for name in CHECK_MODULES if held_out else CALIBRATION_MODULES:
        try:
            texts.append((stdlib / name).read_text(encoding="utf-8")[:3000])
        except OSError:
            pass
    out, used = [], 0
    for t in texts:
        if used >= max_chars:
            break
        out.append(t[: max_chars - used])
        used += len(out[-1])
    return out


def _final_hidden(model, token_map, tokenizer, texts: list[str], max_len: int = 512):
    """Final normalised hidden states ``(positions, hidden)`` of the reduced draft on ``texts``."""
    import torch

    states = []
    with torch.inference_mode():
        for text in texts:
            ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"][0][:max_len]
            if len(ids) == 0:
                continue
            out = model(input_ids=token_map.draft_ids(ids)[None], output_hidden_states=True)
            states.append(out.hidden_states[-1][0].float())
    return torch.cat(states)


def export_full_vocab(draft_dir: str | Path, out_dir: str | Path | None = None, target_vocab: int = 49152,
                      force: bool = False, log=None) -> Path:
    """Write the full-vocabulary export of a reduced-vocabulary draft and return its folder.

    Args:
        draft_dir: a draft folder with ``draft_vocab.json`` (a ``TokenMap``).
        out_dir: where to write (default :func:`default_export_dir`); an existing complete export
            is kept unless ``force``.
        target_vocab: the target's vocabulary size.
        log: ``log(message)`` for progress (default: stderr).

    Raises:
        ExportError: no token map, or weights that do not match the config.
    """
    import torch
    from safetensors.torch import load_file, save_file

    from playground.engine import TOKEN_MAP_FILE, TokenMap

    say = log or (lambda m: print(m, file=sys.stderr, flush=True))
    src = Path(draft_dir)
    out = Path(out_dir) if out_dir else default_export_dir(src)
    if (out / EXPORT_INFO_FILE).is_file() and not force:
        return out
    if not (src / TOKEN_MAP_FILE).is_file():
        raise ExportError(f"{src} has no {TOKEN_MAP_FILE}: it already has the target's vocabulary; "
                          "give vLLM the folder itself")
    try:
        token_map = TokenMap.load(src, target_vocab)
        config = json.loads((src / "config.json").read_text())
        weights = load_file(str(src / "model.safetensors"))
    except (OSError, ValueError, KeyError) as e:
        raise ExportError(f"cannot read the draft in {src}: {e}") from None
    embed = weights["model.embed_tokens.weight"].float()  # (draft_vocab, hidden)
    head = weights.get("lm_head.weight", embed).float()  # tied when absent
    draft_vocab = embed.shape[0]
    if len(token_map.to_target) != draft_vocab:
        raise ExportError(f"{TOKEN_MAP_FILE} has {len(token_map.to_target)} ids but the embedding has "
                          f"{draft_vocab} rows")

    # 1. Lowest-scoring draft tokens on calibration text (the reduced draft itself, in float32).
    say(f"export: finding the draft's {NUM_FLOOR_ROWS} lowest-scoring tokens on calibration text")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(src))
    hidden = _final_hidden(model, token_map, tokenizer, calibration_texts())
    known = token_map.to_target >= 0  # (draft_vocab,) draft ids that map to a target token
    mean_logit = (hidden @ head.T).mean(0)  # (draft_vocab,)
    mean_logit[~known] = float("inf")
    floor_ids = torch.topk(mean_logit, NUM_FLOOR_ROWS, largest=False).indices
    floor_row = head[floor_ids].mean(0)  # (hidden,) a convex combination of real rows

    # 2. Full-vocabulary tables in target ids.
    full_embed = embed[token_map.to_draft]  # (target_vocab, hidden); unknown ids -> the OOV row
    full_head = floor_row.expand(target_vocab, -1).clone()  # (target_vocab, hidden)
    full_head[token_map.to_target[known]] = head[known]
    new = {k: v.float() for k, v in weights.items() if k not in ("model.embed_tokens.weight", "lm_head.weight")}
    new["model.embed_tokens.weight"] = full_embed.contiguous()
    new["lm_head.weight"] = full_head.contiguous()

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    config.update(vocab_size=target_vocab, tie_word_embeddings=False, dtype="float32")
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    for name in COPIED_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, tmp / name)
    save_file(new, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    say("export: checking the export against the reduced draft")
    check = check_export(src, tmp, target_vocab)
    info = {"source": str(src.resolve()), "source_hash": _source_hash(src), "export_version": EXPORT_VERSION,
            "target_vocab": target_vocab, "draft_vocab": draft_vocab, "num_floor_rows": NUM_FLOOR_ROWS,
            "floor_target_ids": [int(token_map.to_target[i]) for i in floor_ids], "check": check}
    (tmp / EXPORT_INFO_FILE).write_text(json.dumps(info, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def check_export(draft_dir: str | Path, export_dir: str | Path, target_vocab: int = 49152,
                 texts: list[str] | None = None) -> dict:
    """Compare the export with the reduced draft on text (default: held-out text, 12,000
    characters of other examples and other modules than the calibration used).

    Returns:
        ``positions``; ``greedy_equal`` (positions where the export's argmax equals the reduced
        draft's mapped argmax); ``max_logit_diff`` over the draft's own tokens (float32 rounding
        only); ``worst_outside_gap`` (largest outside-token logit minus largest inside logit; < 0
        means an outside token never led); ``max_outside_mass`` (largest total probability of the
        outside tokens at temperature 1).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from playground.engine import TokenMap

    token_map = TokenMap.load(draft_dir, target_vocab)
    small = AutoModelForCausalLM.from_pretrained(str(draft_dir), dtype=torch.float32)
    full = AutoModelForCausalLM.from_pretrained(str(export_dir), dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(draft_dir))
    known = torch.zeros(target_vocab, dtype=torch.bool)
    known[token_map.to_target[token_map.to_target >= 0]] = True
    positions = equal = 0
    max_diff, worst_gap, max_mass = 0.0, float("-inf"), 0.0
    with torch.inference_mode():
        for text in texts or calibration_texts(12_000, held_out=True):
            ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"][0][:512]
            if len(ids) == 0:
                continue
            ref = token_map.target_logits(small(input_ids=token_map.draft_ids(ids)[None]).logits[0].float())
            got = full(input_ids=ids[None]).logits[0].float()  # (n, target_vocab)
            positions += len(ids)
            equal += int((ref.argmax(-1) == got.argmax(-1)).sum())
            max_diff = max(max_diff, float((ref[:, known] - got[:, known]).abs().max()))
            inside, outside = got[:, known].max(-1).values, got[:, ~known].max(-1).values
            worst_gap = max(worst_gap, float((outside - inside).max()))
            max_mass = max(max_mass, float(torch.softmax(got, -1)[:, ~known].sum(-1).max()))
    return {"positions": positions, "greedy_equal": equal, "max_logit_diff": max_diff,
            "worst_outside_gap": worst_gap, "max_outside_mass": max_mass}


def main(argv: list[str] | None = None) -> int:
    from playground.engine import DEFAULT_DRAFT_DIR

    ap = argparse.ArgumentParser(prog="python -m playground.backends.vllm.export_draft",
                                 description="Export a reduced-vocabulary draft with the target's full vocabulary "
                                             "(for vLLM's draft_model and transformers' assistant_model).")
    ap.add_argument("--draft", default=str(DEFAULT_DRAFT_DIR),
                    help="draft folder with draft_vocab.json (default: the shipped draft)")
    ap.add_argument("--out", help="output folder (default: <playground cache>/vllm-drafts/<name>-<hash>)")
    ap.add_argument("--target-vocab", type=int, default=49152, help="the target's vocabulary size (default: 49152)")
    ap.add_argument("--force", action="store_true", help="write again even when the export exists")
    args = ap.parse_args(argv)
    try:
        out = export_full_vocab(args.draft, args.out, args.target_vocab, args.force)
    except ExportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    info = json.loads((out / EXPORT_INFO_FILE).read_text())
    print(json.dumps(info["check"]), file=sys.stderr)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
