"""Reference benchmark: our engine against transformers' own ``model.generate()``.

``python -m playground.bench.hf`` runs the same prompts (same questions, chat template, turns
and models as ``python -m playground.bench``) through four methods, interleaved per (question, turn)
so that all four see the same machine load:

* ``autoregressive``, ``prompt_lookup``: this project's engine (as in the benchmark);
* ``hf_generate``: ``model.generate(do_sample=False)``, transformers' greedy loop;
* ``hf_prompt_lookup``: ``model.generate(do_sample=False, prompt_lookup_num_tokens=N,
  max_matching_ngram_size=M)`` with the same N and M as our ``prompt_lookup``;
* ``hf_assistant``: ``model.generate(do_sample=False, assistant_model=draft)`` (the seed's API)
  with the shipped draft exported to the target's full vocabulary
  (``playground.backends.vllm.export_draft``, the folder vLLM's ``draft_model`` loads too),
  drafting a constant K tokens per step (``--k``, default the draft's ``draft_knobs.json``).

Every time is wall-clock around one whole generation, prefill included, on the same loaded
model. ``steps`` of the transformers runs are counted with a streamer (its ``put()`` receives
one chunk per verification step). It prints the table of :func:`.summary.summarize`
(speedups against our autoregressive baseline; "lossless" says whether each greedy method's
output equals our baseline's token for token) and can write the records with ``--out``.
This is a comparison tool, separate from the benchmark's contract.
"""

from __future__ import annotations

import argparse
import sys
import time

from . import runner
from .cli import CLI_LABELS, load_engine, run_cli
from .errors import BenchError
from .questions import load_questions
from .records import record_line
from .summary import format_table, summarize

ENGINE_METHODS = ("autoregressive", "prompt_lookup")
HF_METHODS = ("hf_generate", "hf_prompt_lookup", "hf_assistant")


class _StepCounter:
    """A ``generate()`` streamer that counts steps and times the first new token."""

    def __init__(self, clock):
        self.clock, self.puts, self.first_s = clock, 0, None

    def put(self, value) -> None:
        self.puts += 1  # the first put() is the prompt, each later one a decoding step
        if self.puts == 2:
            self.first_s = self.clock()

    def end(self) -> None:
        pass

    @property
    def steps(self) -> int:
        return max(0, self.puts - 1)


def _clock(device):
    """A wall clock that waits for the device first (CUDA runs asynchronously)."""
    import torch

    def clock() -> float:
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()
    return clock


def hf_runner(name: str, target, max_new_tokens: int, params: dict | None = None, **generate_kwargs) -> runner.Runner:
    """A :class:`~.runner.Runner` calling ``target.model.generate`` greedily with ``generate_kwargs``
    (``params``: what the records show as the run's params; default ``generate_kwargs``)."""
    import torch

    device = target.model.device
    clock = _clock(device)
    eos = set(target.eos_token_ids)
    pad = target.tokenizer.pad_token_id
    pad = pad if pad is not None else (target.eos_token_ids or [0])[0]

    def run(prompt_ids: list[int]) -> dict:
        ids = torch.tensor([prompt_ids], device=device)
        counter = _StepCounter(clock)
        t0 = clock()
        with torch.inference_mode():
            out = target.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                        temperature=None, top_p=None, top_k=None, max_new_tokens=max_new_tokens,
                                        eos_token_id=list(eos) or None, pad_token_id=pad, streamer=counter,
                                        **generate_kwargs)
        seconds = clock() - t0
        new = out[0, len(prompt_ids):].tolist()
        stop = next((i for i, t in enumerate(new) if t in eos), None)
        if stop is not None:  # EOS is the last output id, as in the engine; any padding after it goes
            new = new[:stop + 1]
        return {"new_tokens": len(new), "steps": counter.steps, "wall_s": seconds,
                "ttft_s": (counter.first_s - t0) if counter.first_s else seconds,
                "tokens_per_s": len(new) / seconds if seconds > 0 else 0.0,
                "mean_accepted_tokens": len(new) / max(1, counter.steps), "acceptance_rate": None,
                "finish_reason": "length" if stop is None else "eos",
                "output_ids": new,
                "output_text": target.tokenizer.decode(new, skip_special_tokens=True,
                                                       clean_up_tokenization_spaces=False)}

    return runner.Runner(name, dict(generate_kwargs) if params is None else params, run)


def load_assistant(target, k: int | None = None):
    """The shipped draft with the target's full vocabulary, as ``generate(assistant_model=...)`` wants
    it: exported once into the cache, loaded in the target's dtype on its device, set to draft a
    constant ``k`` tokens per step (``num_assistant_tokens`` passed to ``generate()`` is ignored).

    Returns:
        ``(model, k)``.
    """
    from transformers import AutoModelForCausalLM

    from playground.backends.vllm.export_draft import export_full_vocab
    from playground.backends.vllm.methods import knob_defaults
    from playground.engine import DEFAULT_DRAFT_DIR

    k = k or knob_defaults("draft_model", DEFAULT_DRAFT_DIR)["k"]
    folder = export_full_vocab(DEFAULT_DRAFT_DIR, target_vocab=int(target.model.config.get_text_config().vocab_size))
    draft = AutoModelForCausalLM.from_pretrained(str(folder), dtype=target.dtype).to(target.device).eval()
    draft.generation_config.num_assistant_tokens = k
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    return draft, k


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m playground.bench.hf",
                                 description="Our autoregressive and prompt lookup against transformers' "
                                             "generate() on the same prompts, interleaved.")
    ap.add_argument("--questions", default="spec_bench", help="as for playground.bench (default: spec_bench)")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--per-category", type=int, help="as for playground.bench: the first N questions of each category")
    ap.add_argument("--categories")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--methods", default=",".join(ENGINE_METHODS + HF_METHODS),
                    help=f"subset of {', '.join(ENGINE_METHODS + HF_METHODS)} (autoregressive always runs)")
    ap.add_argument("--max-ngram-size", type=int, help="prompt lookup n-gram size, ours and transformers'")
    ap.add_argument("--num-pred-tokens", type=int, help="prompt lookup tokens, ours and transformers'")
    ap.add_argument("--k", type=int, help="hf_assistant: tokens the draft proposes per step (default: the shipped "
                                          "draft's draft_knobs.json)")
    ap.add_argument("--target", default="default")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"))
    ap.add_argument("--threads", type=int)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--out", help="also write the records here (JSONL)")
    ap.add_argument("--no-progress", action="store_true")
    return ap


def main(argv: list[str] | None = None) -> int:
    return run_cli(build_parser(), _main, argv)


def _main(args: argparse.Namespace) -> int:
    import torch

    from playground.engine import (BASELINE, PROMPT_LOOKUP_NGRAM_KNOB, PROMPT_LOOKUP_TOKENS_KNOB,
                                   GenerationSettings, MethodSpec)

    names = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in names if m not in ENGINE_METHODS + HF_METHODS]
    if unknown:
        raise BenchError(f"unknown method {', '.join(unknown)}; choose from "
                         f"{', '.join(ENGINE_METHODS + HF_METHODS)}")
    names = ["autoregressive"] + [m for m in dict.fromkeys(names) if m != "autoregressive"]
    try:
        ngram = PROMPT_LOOKUP_NGRAM_KNOB.check(args.max_ngram_size or PROMPT_LOOKUP_NGRAM_KNOB.default)
        tokens = PROMPT_LOOKUP_TOKENS_KNOB.check(args.num_pred_tokens or PROMPT_LOOKUP_TOKENS_KNOB.default)
        settings = GenerationSettings(args.max_new_tokens)
    except ValueError as e:
        raise BenchError(str(e)) from None
    categories = [c.strip() for c in args.categories.split(",") if c.strip()] if args.categories else None
    questions = load_questions(args.questions, categories, args.limit, args.per_category)
    if args.threads:
        torch.set_num_threads(args.threads)
    engine_methods = [m for m in names if m in ENGINE_METHODS]
    engine = load_engine(args, engine_methods)
    runner.prepare(engine, questions, [MethodSpec(m) for m in engine_methods], settings, CLI_LABELS)  # the run checks
    target = engine.target
    pl = {"max_ngram_size": ngram, "num_pred_tokens": tokens}
    assistant = load_assistant(target, args.k) if "hf_assistant" in names else None

    def make(method: str, max_new_tokens: int) -> runner.Runner:
        gen = GenerationSettings(max_new_tokens)
        if method == "autoregressive":
            return runner.engine_runner(engine, MethodSpec(BASELINE), gen)
        if method == "prompt_lookup":
            return runner.engine_runner(engine, MethodSpec("prompt_lookup", pl), gen)
        if method == "hf_generate":
            return hf_runner(method, target, max_new_tokens)
        if method == "hf_assistant":
            return hf_runner(method, target, max_new_tokens, {"k": assistant[1], "assistant_model": "shipped draft, "
                             "full vocabulary"}, assistant_model=assistant[0])
        return hf_runner(method, target, max_new_tokens, prompt_lookup_num_tokens=tokens,
                         max_matching_ngram_size=ngram)
    runners = [make(m, settings.max_new_tokens) for m in names]
    dtype = str(target.dtype).removeprefix("torch.")
    turns = sum(len(q.turns) for q in questions)
    print(f"{target.name} on {target.device}, {dtype}, {torch.get_num_threads()} threads; {len(questions)} "
          f"questions, {turns} turns, methods {', '.join(names)}", file=sys.stderr, flush=True)
    warm = engine.encode_prompt(runner.WARMUP_PROMPT)
    warm_runners = [make(m, min(runner.WARMUP_TOKENS, settings.max_new_tokens)) for m in names]
    for _ in range(args.warmup):
        for r in warm_runners:
            r.run(warm)
    out = open(args.out, "w", encoding="utf-8") if args.out else None

    def write(rec: dict) -> None:
        if out:
            out.write(record_line(rec))
            out.flush()
    progress = runner.Progress(turns * len(runners), enabled=not args.no_progress)
    t0 = time.perf_counter()
    try:
        # One whole generation after another, whichever methods are chosen: transformers' runs cannot step.
        records = runner.run_all(engine, questions, runners, settings.max_new_tokens, write, progress,
                                 {"temperature": 0.0, "dtype": dtype, "target": target.name}, round_robin_runs=False)
    finally:
        progress.close()
        if out:
            out.close()
    print(f"{len(records)} runs in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    print(f"\n{target.name}, {dtype}, {target.device}, max_new_tokens {settings.max_new_tokens}, greedy; "
          f"prompt lookup: num_pred_tokens {tokens}, max_ngram_size {ngram}")
    rows = summarize(records, lossless=[m for m in names if m != "autoregressive"])
    print(format_table(rows), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
