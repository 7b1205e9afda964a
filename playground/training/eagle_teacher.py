"""The EAGLE trainer's teacher forcing: the target's features at the head's layers and its final
hidden state per record, cached per data chunk (an ignored folder; hidden states are never committed,
one pass recomputes them). :mod:`playground.training.eagle` trains on them."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from playground.training.cli import progress_bar
from playground.training.records import padded_batch


class Teacher:
    """The target's features (the head's layers) and final hidden state for batches of records."""

    def __init__(self, model, feature_layers):
        self.model = model
        decoder = model.get_decoder()
        self.layers = tuple(feature_layers)
        self.out: dict = {}
        self.handles = []
        n = len(decoder.layers)
        for i in self.layers:  # numbered as the engine's capture_features: n = after the final norm
            mod = decoder.embed_tokens if i == 0 else decoder.norm if i == n else decoder.layers[i - 1]
            self.handles.append(mod.register_forward_hook(self._keep(i)))
        self.handles.append(decoder.norm.register_forward_hook(self._keep("final")))

    def _keep(self, key):
        def hook(module, args, output):
            self.out[key] = output[0] if isinstance(output, tuple) else output
        return hook

    @torch.inference_mode()
    def __call__(self, batch: list[list[int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """For each id list: ``(features (L, 3H), final hidden (L, H))`` bfloat16 on the CPU."""
        dev = next(self.model.parameters()).device
        ids, mask = padded_batch(batch)
        self.model.model(input_ids=ids.to(dev), attention_mask=mask.to(dev), use_cache=False)
        feats = torch.cat([self.out[i] for i in self.layers], -1).to("cpu", torch.bfloat16)
        final = self.out["final"].to("cpu", torch.bfloat16)
        return [(feats[i, :len(x)].clone(), final[i, :len(x)].clone()) for i, x in enumerate(batch)]


def cache_features(teacher: Teacher, records: list[dict], cache_dir: Path, batch_tokens: int, log=print) -> None:
    """Teacher-force every record whose features are not cached yet; one safetensors file per chunk."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    by_chunk: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        by_chunk.setdefault(r["chunk"], []).append(i)
    todo = [c for c in by_chunk if not _cache_file(cache_dir, c).exists()]
    total = sum(len(records[i]["input_ids"]) for c in todo for i in by_chunk[c])
    done, t0 = 0, time.perf_counter()
    bar = progress_bar(total, "teacher forcing", True)
    for c in todo:
        idx = sorted(by_chunk[c], key=lambda i: len(records[i]["input_ids"]))
        tensors, start = {}, 0
        while start < len(idx):
            end = start + 1
            while end < len(idx) and (end - start + 1) * len(records[idx[end]]["input_ids"]) <= batch_tokens:
                end += 1
            group = idx[start:end]
            for i, (f, h) in zip(group, teacher([records[i]["input_ids"] for i in group])):
                key = _record_key(records[i])
                tensors[f"{key}.f"], tensors[f"{key}.h"] = f, h
            n = sum(len(records[i]["input_ids"]) for i in group)
            done += n
            bar.update(n)
            start = end
        tmp = _cache_file(cache_dir, c).with_suffix(".tmp")
        save_file(tensors, str(tmp))
        tmp.rename(_cache_file(cache_dir, c))
    bar.close()
    if todo:
        log(f"[eagle] teacher forcing: {done} tokens in {time.perf_counter() - t0:.0f} s "
            f"({done / max(time.perf_counter() - t0, 1e-9):.0f} tokens/s)")


def _cache_file(cache_dir: Path, chunk: str) -> Path:
    return cache_dir / (hashlib.sha1(chunk.encode()).hexdigest()[:16] + ".safetensors")


def _record_key(r: dict) -> str:
    return hashlib.sha1(json.dumps(r["input_ids"]).encode()).hexdigest()[:20]


def load_cached(records: list[dict], cache_dir: Path) -> list[tuple[torch.Tensor, torch.Tensor]]:
    files: dict[str, dict] = {}
    out = []
    for r in records:
        if r["chunk"] not in files:
            files[r["chunk"]] = load_file(str(_cache_file(cache_dir, r["chunk"])))
        key = _record_key(r)
        out.append((files[r["chunk"]][f"{key}.f"], files[r["chunk"]][f"{key}.h"]))
    return out
