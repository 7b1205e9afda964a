"""The GPU check (issue 21, item 8): every lossless method on small random models built here (no
downloads), on one device in float32 and bfloat16, greedy output against the baseline and a short
benchmark. Called by ``scripts/gpu_check.sh``, which also runs the tiny-model pytest suites with
``PLAYGROUND_DEVICE`` / ``PLAYGROUND_DTYPE`` set.

Exit codes: 0 every output matched (or differed only at classified near-ties: the baseline's
top-2 logit margin under the dtype's threshold); 1 a mismatch beyond a near-tie; 3 the device is
not available.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from playground.engine import Datastore, Engine, GenerationSettings, MethodSpec, check_lossless  # noqa: E402

METHODS = ("draft_model", "prompt_lookup", "lookahead", "medusa", "eagle", "suffix", "recycling", "rest", "mixture")


@dataclass
class _Loaded:
    """The parts of a loaded model the Engine reads (no tokenizer: ids in, ids out)."""

    model: torch.nn.Module
    device: torch.device
    dtype: torch.dtype
    name: str = "random tiny Llama"
    spec: str = "random"
    tokenizer: object = None
    context_length: int = 512
    eos_token_ids: list = field(default_factory=list)


def random_llama(seed: int, device, dtype, vocab: int = 256) -> LlamaForCausalLM:
    """A small Llama with random weights (peaked distributions: block weights N(0, 0.2^2))."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 1.0 if ("embed" in name or "lm_head" in name) else 0.2)
    return model.to(device=device, dtype=dtype)


def build_engine(device, dtype) -> Engine:
    """Target, a noisy copy as draft, random Medusa heads and a random EAGLE head."""
    from playground.engine import MedusaHeads
    from playground.engine.eagle import EagleHead, eagle_head_config

    target = random_llama(0, device, dtype)
    draft = random_llama(0, device, dtype)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    cfg = target.config
    heads = MedusaHeads(cfg.hidden_size, cfg.vocab_size, 3, 1).attach_lm_head(target.get_output_embeddings())
    heads = heads.to(device=device, dtype=dtype).eval().requires_grad_(False)
    eagle_cfg = eagle_head_config(cfg, 128, feature_layers=(0, 1, 3), intermediate_size=128)
    eagle = EagleHead(eagle_cfg, torch.arange(0, 256, 2)).to(device=device, dtype=dtype).eval()
    eagle = eagle.attach_embedding(target.get_input_embeddings())
    loaded = _Loaded(target, torch.device(device), dtype)
    g = torch.Generator().manual_seed(3)  # REST's datastore: random "earlier answers" (ids on the CPU)
    store = Datastore(torch.randint(0, 256, (16, 64), generator=g).tolist())
    return Engine(loaded, _Loaded(draft, torch.device(device), dtype), medusa=heads, eagle=eagle, datastore=store)


def check(device: str, dtype: torch.dtype, prompts: int, new_tokens: int) -> int:
    """Greedy outputs of every method against the baseline, with tokens/s; returns the mismatches
    beyond near-ties."""
    engine = build_engine(device, dtype)
    g = torch.Generator().manual_seed(1)
    settings = GenerationSettings(max_new_tokens=new_tokens)
    bad, near, speed = 0, 0, {m: [0, 0.0] for m in ("autoregressive",) + METHODS}
    for i in range(prompts):
        prompt = torch.randint(0, 6 + i, (12 + i,), generator=g).tolist()
        t0 = time.perf_counter()
        events = list(engine.run_one(prompt, MethodSpec("autoregressive"), settings))
        base = [t for e in events for t in e.tokens]
        margins = [m for e in events for m in e.margins]
        speed["autoregressive"][0] += len(base)
        speed["autoregressive"][1] += time.perf_counter() - t0
        for method in METHODS:
            t0 = time.perf_counter()
            out = [t for e in engine.run_one(prompt, MethodSpec(method), settings) for t in e.tokens]
            speed[method][0] += len(out)
            speed[method][1] += time.perf_counter() - t0
            verdict = check_lossless(base, margins, out, dtype)
            if not verdict.matched:
                if verdict.near_tie:
                    near += 1
                else:
                    bad += 1
                    print(f"MISMATCH {device} {dtype} prompt {i} {method}: {verdict.message()}")
    label = str(dtype).removeprefix("torch.")
    for method, (tokens, seconds) in speed.items():
        if seconds:
            print(f"  {device} {label} {method:15s} {tokens / seconds:8.1f} tokens/s")
    print(f"{device} {label}: {prompts} prompts x {len(METHODS)} methods, {bad} mismatches, {near} near-ties")
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--quick", action="store_true", help="1 prompt, 12 new tokens")
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_check: CUDA is not available on this machine (torch.cuda.is_available() is False); "
              "run with --device cpu --quick for the CPU dry run", file=sys.stderr)
        return 3
    prompts, new_tokens = (1, 12) if args.quick else (6, 48)
    bad = 0
    for name in args.dtypes.split(","):
        bad += check(args.device, getattr(torch, name.strip()), prompts, new_tokens)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
