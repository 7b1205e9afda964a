"""The benchmark's command line: ``python -m playground.bench``.

Runs every chosen method on every (question, turn) of a question file and writes one JSON
object a line per (question, turn, method), then prints a table per category and overall::

    python -m playground.bench --questions spec_bench --per-category 3 \\
        --methods autoregressive,prompt_lookup --max-new-tokens 128 --out results.jsonl

Questions (:mod:`.questions`): Spec-Bench or HumanEval rows, or a built-in set's name;
``--categories`` keeps some categories, ``--per-category N`` the first N questions of each
category in file order, ``--limit N`` the first N of what is left. Runs (:mod:`.runner`):
every method on each (question, turn), round-robin (one step of each in turn, the baseline
first; ``--sequential``: one after another), turn after turn, after ``--warmup`` untimed rounds.
Records (:mod:`.records`): the contract fields and more. Table (:mod:`.summary`).
``--stop STRING`` (repeatable) ends each answer at its first stop string (kept in the output,
finish reason "stop"), for every method alike.

Exit status: 0 on success, 2 on a usage error (unknown method, bad file, bad knob, model that
cannot load, a setting the loaded models cannot run, ``--max-new-tokens`` that leaves no question
room in the context), 130 when interrupted. Every check that needs the models runs right after they
load (:func:`playground.bench.runner.prepare`), before the first run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from . import runner
from .errors import BenchError
from .questions import load_questions
from .records import record_line
from .summary import format_table, medusa_summary, summarize

CLI_LABELS = {"max_new_tokens": "--max-new-tokens", "tree": "--tree"}
"""The flags the run checks' messages name (see ``runner.check_runnable``)."""

# Command-line flag -> knob names it may set. A flag sets whichever name the chosen method declares.
KNOB_FLAGS: dict[str, tuple[str, ...]] = {
    "k": ("k",),
    "confidence": ("confidence",),
    "proposer": ("proposer",),
    "max_ngram_size": ("max_ngram_size",),
    "num_pred_tokens": ("num_pred_tokens",),
    "window": ("window",),
    "ngram": ("ngram_size", "ngram"),
    "guess": ("guess_set_size", "guess"),
    "posterior_threshold": ("posterior_threshold",),
    "posterior_alpha": ("posterior_alpha",),
    "tree": ("tree_choices", "tree"),
    "acceptance": ("acceptance",),
    "budget": ("budget",),
    "members": ("members",),
    "depth": ("depth",),
    "eagle_top_k": ("top_k",),
    "total_tokens": ("total_tokens",),
}


def method_params(methods: list[str], knob_values: dict) -> dict[str, dict]:
    """Map the knob flags given on the command line onto each method's params.

    Args:
        methods: method names, all in the engine's ``METHODS``.
        knob_values: flag name (a key of :data:`KNOB_FLAGS`) -> value; None = not given.

    Returns:
        method -> params dict holding only the knobs that method declares.

    Raises:
        BenchError: a flag was given that none of the chosen methods has.
    """
    from playground.engine import METHODS

    params: dict[str, dict] = {m: {} for m in methods}
    for flag, value in knob_values.items():
        if value is None:
            continue
        used = False
        for m in methods:
            declared = {k.name for k in METHODS[m].knobs}
            name = next((n for n in KNOB_FLAGS[flag] if n in declared), None)
            if name is not None:
                params[m][name] = value
                used = True
        if not used:
            owners = [m for m, info in METHODS.items() if {k.name for k in info.knobs} & set(KNOB_FLAGS[flag])]
            hint = f" (it belongs to {', '.join(owners)})" if owners else ""
            raise BenchError(f"--{flag.replace('_', '-')} is not a setting of any chosen method "
                             f"({', '.join(methods)}){hint}")
    return params


def method_spec(text: str):
    """``(text, MethodSpec)`` from ``NAME[:knob=value;knob=value]`` (a list value joined by '+', e.g.
    ``mixture:members=suffix+recycling``; values parsed as JSON where they are, else text)."""
    from playground.engine import MethodSpec

    name, _, rest = text.partition(":")
    params = {}
    for item in filter(None, rest.split(";")):
        k, _, v = item.partition("=")
        v = v.replace("+", ",")  # members=suffix+recycling: commas separate methods
        try:
            params[k] = json.loads(v)
        except json.JSONDecodeError:
            params[k] = v
    return text, MethodSpec(name, params)


def parse_methods(text: str) -> list[str]:
    """Split ``a,b,c``, check every name, put the baseline first (added when missing, with a note).

    Raises:
        BenchError: empty list, duplicates, or an unknown name.
    """
    from playground.engine import BASELINE, METHODS

    names = [m.strip() for m in text.split(",") if m.strip()]
    if not names:
        raise BenchError("--methods is empty; available methods: " + ", ".join(METHODS))
    ordered = runner.order_methods(names)  # unknown names, then duplicates
    if BASELINE not in names:
        print(f"note: adding {BASELINE} (the baseline every speedup is measured against)", file=sys.stderr)
    return ordered


TREE_PRESET_NAMES = ("auto", "depth3", "chain", "cpu_small", "mc_sim_7b_63")
"""The names of the engine's ``TREE_PRESETS`` for ``--help`` (repeated here so that ``--help`` needs no
torch import; a test checks that they agree)."""


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's arguments; every help text names the option's default.

    The method knobs default to None (not given): the method then uses the engine's default, which
    the help quotes from ``playground.engine.limits`` (a draft may bring its own, see ``--k``).
    """
    from playground.engine import (DRAFT_CONFIDENCE_KNOB, K_KNOB, LOOKAHEAD_GUESS_KNOB, LOOKAHEAD_NGRAM_KNOB,
                                   LOOKAHEAD_WINDOW_KNOB, MAX_NEW_TOKENS_KNOB, POSTERIOR_ALPHA_KNOB,
                                   POSTERIOR_THRESHOLD_KNOB, PROMPT_LOOKUP_NGRAM_KNOB, PROMPT_LOOKUP_TOKENS_KNOB,
                                   TEMPERATURE_KNOB, METHODS)

    def bounds(knob) -> str:
        lo, hi = (int(knob.minimum), int(knob.maximum)) if knob.integer else (knob.minimum, knob.maximum)
        return f"{lo:g} to {hi:g}, default {knob.default:g}"

    ap = argparse.ArgumentParser(
        prog="python -m playground.bench",
        description="Benchmark decoding methods on Spec-Bench or HumanEval questions; write one JSON line per "
                    "(question, turn, method) and print a table per category.",
        epilog="Example: python -m playground.bench --questions spec_bench --per-category 3 "
               "--methods autoregressive,prompt_lookup --max-new-tokens 128 --out results.jsonl")
    g = ap.add_argument_group("what to run")
    g.add_argument("--questions", default="spec_bench", metavar="FILE_OR_SET",
                   help="JSONL file of Spec-Bench rows (question_id, category, turns) or HumanEval rows (task_id, "
                        "prompt), or a built-in set: spec_bench, humaneval (default: spec_bench)")
    g.add_argument("--methods", default="autoregressive,prompt_lookup", metavar="LIST",
                   help=f"comma-separated methods among {', '.join(METHODS)}; autoregressive (the baseline "
                        "every speedup is measured against) is added when missing and always runs first (default: "
                        "autoregressive,prompt_lookup)")
    g.add_argument("--max-new-tokens", type=int, default=128, metavar="N",
                   help=f"most new tokens per answer, 1 to {int(MAX_NEW_TOKENS_KNOB.maximum)}; the prompt and the answer must fit "
                        "the target's context (default: 128)")
    g.add_argument("--out", default="results.jsonl", metavar="FILE",
                   help="results file, one JSON object a line; overwritten (default: results.jsonl)")
    g.add_argument("--per-category", type=int, metavar="N",
                   help="sample the first N questions of every category, in file order, after --categories "
                        "(default: off, every question)")
    g.add_argument("--limit", type=int, metavar="N",
                   help="keep only the first N questions, after --categories and --per-category (default: all)")
    g.add_argument("--categories", metavar="LIST",
                   help="comma-separated categories to keep, e.g. qa,rag (default: all)")
    g.add_argument("--warmup", type=int, default=1, metavar="N",
                   help="short untimed runs of every method before timing, in rounds (default: 1)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar (default: show one)")
    g.add_argument("--sequential", action="store_true",
                   help="run each method to the end before the next (default: round-robin, one step of each in "
                        "turn, speedups read from steady_steps)")
    g = ap.add_argument_group("models and device")
    g.add_argument("--target", default="default", metavar="MODEL",
                   help="the model to speed up: 'default' (the embedded SmolLM2-135M-Instruct), a .gguf file, a "
                        "model folder or a Hugging Face hub id (default: default)")
    g.add_argument("--draft", metavar="MODEL",
                   help="small model with the target's tokenizer that proposes tokens for draft_model; 'none' for "
                        "no draft (default: with the default target, the draft shipped in assets/draft/default; "
                        "else none)")
    g.add_argument("--medusa", metavar="PATH_OR_HUB_ID",
                   help="Medusa heads trained on the target, for the medusa method; 'none' for no heads (default: "
                        "with the default target, the heads shipped in assets/medusa/default; else none)")
    g.add_argument("--draft-medusa", metavar="PATH_OR_HUB_ID",
                   help="Medusa heads trained on the draft model, needed by --proposer medusa_heads (default: none)")
    g.add_argument("--eagle", metavar="PATH_OR_HUB_ID",
                   help="EAGLE-3 head trained on the target, for the eagle method; 'none' for no head (default: "
                        "with the default target, the head shipped in assets/eagle/default; else none)")
    g.add_argument("--device", default="auto",
                   help="auto, cpu, cuda, cuda:N or mps (default: auto, a GPU when there is one, else the CPU)")
    g.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                   help="precision of the weights (default: auto, bfloat16 on CUDA, float32 on a CPU, where "
                        "bfloat16 would round multi-token verification differently from the baseline)")
    g.add_argument("--threads", type=int, metavar="N", help="CPU threads for torch (default: torch's choice)")
    g = ap.add_argument_group("sampling (temperature 0 = greedy)")
    g.add_argument("--temperature", type=float, default=0.0, metavar="T",
                   help=f"0 to {TEMPERATURE_KNOB.maximum:g}; 0 is greedy decoding, where the lossless methods must match "
                        "the baseline token for token (default: 0)")
    g.add_argument("--top-p", type=float, default=1.0, metavar="P",
                   help="sample only from the most likely tokens holding this much probability (default: 1, off)")
    g.add_argument("--top-k", type=int, default=0, metavar="K",
                   help="sample only from the k most likely tokens (default: 0, off)")
    g.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the sampling (default: 0)")
    g.add_argument("--stop", action="append", metavar="STRING",
                   help="end each answer at the first occurrence of STRING, which is kept (finish reason "
                        "'stop'); repeat for several (default: none, only EOS and --max-new-tokens end an answer)")
    g = ap.add_argument_group("method settings (each names its method)")
    g.add_argument("--k", type=int, metavar="K",
                   help=f"draft_model: tokens the draft proposes per step ({bounds(K_KNOB)}, unless the draft "
                        "folder's draft_knobs.json sets another)")
    g.add_argument("--confidence", type=float, metavar="P",
                   help="draft_model: stop drafting when the draft's top probability falls below this; 0 always "
                        f"drafts K tokens ({bounds(DRAFT_CONFIDENCE_KNOB)})")
    g.add_argument("--proposer", choices=("model", "medusa_heads"),
                   help="draft_model: 'model' drafts K tokens with the draft model, one pass each; 'medusa_heads' "
                        "drafts the draft's next token plus its Medusa heads' tokens in one pass (needs "
                        "--draft-medusa) (default: model)")
    g.add_argument("--max-ngram-size", type=int, metavar="N",
                   help=f"prompt_lookup: longest n-gram searched for in the prompt and the answer so far "
                        f"({bounds(PROMPT_LOOKUP_NGRAM_KNOB)})")
    g.add_argument("--num-pred-tokens", type=int, metavar="N",
                   help=f"prompt_lookup: tokens copied after a match ({bounds(PROMPT_LOOKUP_TOKENS_KNOB)})")
    g.add_argument("--window", type=int, metavar="W",
                   help=f"lookahead: window size W, tokens guessed in parallel ({bounds(LOOKAHEAD_WINDOW_KNOB)})")
    g.add_argument("--ngram", type=int, metavar="N", help=f"lookahead: n-gram size N ({bounds(LOOKAHEAD_NGRAM_KNOB)})")
    g.add_argument("--guess", type=int, metavar="G",
                   help=f"lookahead: n-grams verified per step, G ({bounds(LOOKAHEAD_GUESS_KNOB)})")
    g.add_argument("--tree", metavar="TREE",
                   help=f"medusa: candidate tree, a preset ({', '.join(TREE_PRESET_NAMES)}) or a JSON list of "
                        "paths such as '[[0], [0, 0], [1]]', each no deeper than the heads loaded (default: auto, "
                        "chosen for this device)")
    g.add_argument("--budget", choices=("auto", "off"),
                   help="every method but the baseline: 'auto' verifies only the candidates whose expected accepted "
                        "tokens pay for their cost on this device (measured once at load); 'off' verifies all "
                        "(default: auto)")
    g.add_argument("--members", metavar="LIST",
                   help="mixture: comma-separated drafters merged into one tree, among suffix, prompt_lookup, "
                        "recycling, rest, lookahead, medusa, eagle (default: suffix,rest,recycling,prompt_lookup)")
    g.add_argument("--acceptance", choices=("exact", "typical"),
                   help="medusa: 'exact' keeps the target's output (lossless); 'typical' accepts more tokens but "
                        "may change the output, tuned by --posterior-* (default: exact)")
    g.add_argument("--posterior-threshold", type=float, metavar="X",
                   help=f"medusa with --acceptance typical: accept a token when its probability exceeds "
                        f"min(threshold, alpha * exp(-entropy)) ({bounds(POSTERIOR_THRESHOLD_KNOB)})")
    g.add_argument("--posterior-alpha", type=float, metavar="X",
                   help=f"medusa with --acceptance typical: the alpha above ({bounds(POSTERIOR_ALPHA_KNOB)})")
    g.add_argument("--depth", type=int, metavar="D", help="eagle: draft levels per step (default: 4)")
    g.add_argument("--eagle-top-k", type=int, metavar="K",
                   help="eagle: nodes expanded per level and children per expanded node (default: 4)")
    g.add_argument("--total-tokens", metavar="N",
                   help="eagle: tree nodes verified per step, or auto (chosen per step from this device's "
                        "verify-cost curve; default: auto)")
    from playground.backends.vllm.bench import add_arguments as add_backend_arguments

    add_backend_arguments(ap)
    return ap


def load_engine(args: argparse.Namespace, methods: list[str]):
    """Load the target (and the draft when a chosen method needs one) into an ``Engine``.

    Uses ``args.target, args.draft, args.medusa, args.draft_medusa, args.device, args.dtype``
    (through ``Engine.load``); logs loading stages to stderr. What the loaded models can run is
    checked afterwards, by :func:`playground.bench.runner.prepare`.

    Raises:
        BenchError: a model cannot load, a bad device or dtype.
    """
    from playground.engine import Engine, ModelLoadError

    def log(fraction: float, message: str) -> None:
        print(f"  {message}", file=sys.stderr, flush=True)
    try:
        return Engine.load(args.target, getattr(args, "draft", None), getattr(args, "medusa", None),
                           getattr(args, "draft_medusa", None), args.device, args.dtype, log, methods=methods,
                           eagle=getattr(args, "eagle", None))
    except (ModelLoadError, ValueError) as e:
        raise BenchError(str(e)) from None


def _parse_tree(text: str | None):
    if text is None:
        return None
    try:
        return json.loads(text) if text.strip().startswith("[") else text
    except json.JSONDecodeError as e:
        raise BenchError(f"--tree: the tree is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None


def generation_settings(args: argparse.Namespace):
    """The ``GenerationSettings`` of ``--max-new-tokens``, the sampling flags and ``--stop``.

    Raises:
        BenchError: a value out of range (the engine's message).
    """
    from playground.engine import GenerationSettings, SamplingConfig

    stops = {"stop_strings": tuple(args.stop)} if getattr(args, "stop", None) else {}
    try:
        return GenerationSettings(args.max_new_tokens, SamplingConfig(args.temperature, args.top_p, args.top_k,
                                                                      args.seed), **stops)
    except TypeError:  # an engine without stop strings
        raise BenchError("--stop is not supported by this version of the engine") from None
    except ValueError as e:
        raise BenchError(str(e)) from None


def main(argv: list[str] | None = None) -> int:
    return run_cli(build_parser(), _main, argv)


def run_cli(parser: argparse.ArgumentParser, body, argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run ``body(args)``; a :class:`BenchError` prints one line and gives exit code 2."""
    args = parser.parse_args(argv)
    try:
        return body(args)
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _check_out_path(out: str) -> Path:
    out_path = Path(out)
    try:
        out_path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BenchError(f"cannot write {out!r}: {e.strerror or e}") from None
    if out_path.is_dir() or not os.access(out_path.parent, os.W_OK) or \
            (out_path.exists() and not os.access(out_path, os.W_OK)):
        raise BenchError(f"cannot write {out!r}: not a writable file path")
    return out_path


def _main(args: argparse.Namespace) -> int:
    # 1. Everything that can be checked without a model: methods, knobs, settings, questions.
    from playground.engine import METHODS, MethodSpec, default_draft_spec, methods_run

    methods = parse_methods(args.methods)
    knobs = {flag: getattr(args, flag) for flag in KNOB_FLAGS}
    knobs["tree"] = _parse_tree(args.tree)
    params = method_params(methods, knobs)
    specs = [MethodSpec(m, params[m]) for m in methods]
    runner.check_specs(specs)
    settings = generation_settings(args)
    if args.warmup < 0:
        raise BenchError(f"--warmup must be at least 0, got {args.warmup}")
    if args.threads is not None and args.threads < 1:
        raise BenchError(f"--threads must be at least 1, got {args.threads}")
    categories = [c.strip() for c in args.categories.split(",") if c.strip()] if args.categories else None
    questions = load_questions(args.questions, categories, args.limit, args.per_category)
    needs_draft = [m for m in methods if METHODS[m].needs_draft]
    if needs_draft and not default_draft_spec(args.target, args.draft):
        raise BenchError(f"{', '.join(needs_draft)} needs a draft model: add --draft MODEL (a smaller model with "
                         "the target's tokenizer: a hub id, a model folder or a .gguf file)")
    if args.draft and not needs_draft:
        print("note: --draft is loaded only for methods that need it; none is chosen", file=sys.stderr)
    if args.medusa and "medusa" not in methods_run(specs):
        print("note: --medusa is loaded only for the medusa method (or a mixture with it), which is not chosen",
              file=sys.stderr)
    has_draft_heads = bool(args.draft_medusa) and args.draft_medusa.strip().lower() != "none"
    if params.get("draft_model", {}).get("proposer") == "medusa_heads" and not has_draft_heads:
        raise BenchError("--proposer medusa_heads needs Medusa heads trained on the draft model: add "
                         "--draft-medusa PATH_OR_HUB_ID, or use --proposer model")
    if has_draft_heads and "draft_model" not in methods:
        print("note: --draft-medusa is loaded only for the draft_model method, which is not chosen", file=sys.stderr)
    out_path = _check_out_path(args.out)
    if getattr(args, "backend", "builtin") == "vllm":  # every method served by vLLM (docs/vllm.md)
        from playground.backends.vllm.bench import run as run_on_vllm

        return run_on_vllm(args, methods, params, settings, questions, out_path)
    if getattr(args, "vllm_url", None):
        raise BenchError("--vllm-url is for --backend vllm")

    # 2. Models (a failure leaves an earlier results file untouched), then every check that needs them.
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    engine = load_engine(args, methods_run(specs))  # a mixture's members' parts too (its EAGLE head)
    bench = runner.prepare(engine, questions, specs, settings, CLI_LABELS)
    bench.round_robin = not args.sequential
    target = engine.target
    dtype = bench.extra["dtype"]
    turns = sum(len(q.turns) for q in questions)
    print(f"{target.name} on {target.device}, {dtype}, {torch.get_num_threads()} threads; "
          f"{len(questions)} questions, {turns} turns, methods {', '.join(methods)}, "
          f"max_new_tokens {settings.max_new_tokens}, temperature {settings.sampling.temperature}",
          file=sys.stderr, flush=True)
    busy = runner.other_cpu_load()
    if busy is not None and busy >= 0.5 and torch.get_num_threads() > max(1, (os.cpu_count() or 1) - busy):
        print(f"warning: other processes keep about {busy:.1f} of this machine's {os.cpu_count()} cores busy; with "
              f"{torch.get_num_threads()} threads every method runs much slower and the timings are noisy. Run "
              f"on a quiet machine, or pass --threads {max(1, int((os.cpu_count() or 1) - busy))}.",
              file=sys.stderr, flush=True)

    # 3. Warm-up, then the timed runs, one flushed line per run.
    t0 = time.perf_counter()
    bench.warm_up(args.warmup)
    try:
        out_file = open(out_path, "w", encoding="utf-8")
    except OSError as e:
        raise BenchError(f"cannot write {args.out!r}: {e.strerror or e}") from None
    progress = runner.Progress(bench.total_runs, enabled=not args.no_progress)

    def write(rec: dict) -> None:
        out_file.write(record_line(rec))
        out_file.flush()
    try:
        records = bench.run(write, progress)
    finally:
        progress.close()
        out_file.close()
    print(f"wrote {len(records)} records to {out_path} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    print(f"\n{target.name}, {dtype}, {target.device}, max_new_tokens {settings.max_new_tokens}, "
          f"temperature {settings.sampling.temperature}")
    print(format_table(summarize(records)), end="")
    if "medusa" in methods:
        print(medusa_summary(engine, records, params["medusa"].get("tree_choices")), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
