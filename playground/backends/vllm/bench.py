"""``python -m playground.bench --backend vllm``: the benchmark with every method served by vLLM.

The benchmark's loop, records and summary are the built-in ones (``playground.bench``); only the
runners differ: each method's answer comes from its own vLLM server (:mod:`.server`), started here
on loopback ports (and stopped at the end) or attached with ``--vllm-url NAME=URL``. Prompts are
built by the playground's tokenizer and chat template and sent as token ids, so a built-in run and
a vLLM run of the same questions get the same prompts and compare line by line.

Every record carries, beside the benchmark's fields: ``backend`` ("vllm"), ``vllm_version``,
``vllm_device`` ("cpu", "cuda", or "unknown (attached)"), ``vllm_url``, ``vllm_model``,
``speculative_config`` (as the server runs it; "attached" when unknown), ``timing`` (what
``wall_s`` includes), ``alignment``, ``server_ttft_s``, ``server_generation_s``,
``server_queue_s`` and ``vllm_fingerprint`` (see :mod:`.runner`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

TIMING = ("client wall time of one streamed HTTP request on loopback: vLLM's request handling, scheduling, "
          "prefill, decoding and detokenisation, and the HTTP round trip")
"""What a vLLM record's ``wall_s`` includes (written into each record as ``timing``)."""


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The benchmark's backend options."""
    g = ap.add_argument_group("backend")
    g.add_argument("--backend", choices=("builtin", "vllm"), default="builtin",
                   help="builtin: the playground's own engine; vllm: each method served by a vLLM server (started "
                        "here from .venv-vllm, see scripts/setup.sh --vllm, or attached with --vllm-url) "
                        "(default: builtin)")
    g.add_argument("--vllm-url", action="append", metavar="NAME=URL",
                   help="with --backend vllm: use the vLLM server already running at URL for method NAME, e.g. "
                        "prompt_lookup=http://10.0.0.5:8000 (repeat per method; methods without one get a server "
                        "started here) (default: none)")
    g.add_argument("--vllm-max-model-len", type=int, default=2048, metavar="N",
                   help="with --backend vllm: context length of the servers started here (default: 2048)")


class PromptBuilder:
    """The part of the engine the benchmark loop needs to build prompts, without the model's weights.

    ``encode_prompt`` does what ``Engine.encode_prompt`` does (the target's chat template with
    the generation prompt; a ValueError for an empty prompt or one that fills the context), and
    ``target`` has ``name``, ``context_length``, ``eos_token_ids``, ``dtype`` and ``device``.

    Args:
        folder: the target's model folder (its tokenizer and config are read).
        name: display name.
        context_length: the servers' ``max_model_len``.
    """

    def __init__(self, folder: str, name: str, context_length: int):
        from transformers import AutoTokenizer, GenerationConfig

        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        eos = [self.tokenizer.eos_token_id]
        try:
            gen = GenerationConfig.from_pretrained(folder).eos_token_id
            eos += gen if isinstance(gen, (list, tuple)) else [gen]
        except OSError:
            pass
        eos = list(dict.fromkeys(int(i) for i in eos if i is not None))
        self.target = SimpleNamespace(name=name, context_length=int(context_length), eos_token_ids=eos,
                                      dtype="float32", device="vllm", tokenizer=self.tokenizer)

    def encode_prompt(self, prompt: str | list[dict], chat: bool = True) -> list[int]:
        """Token ids of a prompt (a user message or a conversation), chat template applied.

        Raises:
            ValueError: empty prompt, or a prompt as long as the context.
        """
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        if not messages or not str(messages[-1].get("content", "")).strip():
            raise ValueError("the prompt is empty: type something to generate from")
        tok = self.tokenizer
        if chat and getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
        else:
            ids = tok("\n".join(m["content"] for m in messages), add_special_tokens=True)["input_ids"]
        ids = [int(i) for i in ids]
        ctx = self.target.context_length
        if len(ids) >= ctx:
            raise ValueError(f"the prompt is {len(ids)} tokens, longer than the model's context of {ctx} tokens")
        return ids


def run(args: argparse.Namespace, methods: list[str], params: dict[str, dict], settings, questions: list,
        out_path: Path) -> int:
    """The benchmark on vLLM: start or attach the servers, warm up, run, write, print the tables.

    Args:
        args: the parsed benchmark arguments (``target``, ``draft``, ``dtype``, ``warmup``,
            ``vllm_url``, ``vllm_max_model_len``, ``no_progress``).
        methods: methods to run, the baseline first.
        params: method -> knobs given on the command line.
        settings: the engine's ``GenerationSettings``.
        questions: the benchmark's questions.
        out_path: the results file.

    Raises:
        playground.bench.BenchError: a method vLLM cannot serve, a server that does not start, a
            request vLLM refuses.
    """
    from playground import bench as B

    from . import methods as M
    from .client import VLLMError
    from .runner import Sampling, run_to_end
    from .server import ServerPool, VLLMServerError, parse_vllm_urls

    try:
        attached = parse_vllm_urls(args.vllm_url)
    except ValueError as e:
        raise B.BenchError(str(e)) from None
    unknown = sorted(set(attached) - set(methods))
    if unknown:
        raise B.BenchError(f"--vllm-url names {', '.join(unknown)}, which --methods does not run")
    for m in methods:
        reason = M.unsupported_reason(m)
        if reason and m not in attached:
            raise B.BenchError(f"{m} cannot run on vLLM: {reason}")
    if args.dtype not in ("auto", "float32"):
        print(f"note: vLLM servers started here run in {args.dtype}", file=sys.stderr)
    dtype = "float32" if args.dtype == "auto" else args.dtype
    local = [m for m in methods if m not in attached]
    try:
        configs = M.server_configs(local, params, args.target, getattr(args, "draft", None), dtype,
                                   args.vllm_max_model_len, eagle=getattr(args, "eagle", None)) if local else []
        folder = M.default_target_folder(args.target)
    except (ValueError, RuntimeError) as e:  # RuntimeError: a model not found, a draft not exported
        raise B.BenchError(str(e)) from None
    spec_of = {c.name: c.speculative_config for c in configs}
    prompts = PromptBuilder(folder, "SmolLM2-135M-Instruct" if args.target == "default" else args.target,
                            args.vllm_max_model_len)
    sampling = Sampling(settings.max_new_tokens, settings.sampling.temperature, settings.sampling.top_p,
                        settings.sampling.top_k, settings.sampling.seed)
    eos = prompts.target.eos_token_ids

    def say(fraction: float, message: str) -> None:
        print(f"  {message}", file=sys.stderr, flush=True)
    pool = ServerPool(configs, attached, progress=say)
    try:
        endpoints = pool.start()
    except (VLLMServerError, VLLMError) as e:
        raise B.BenchError(str(e)) from None
    try:
        for m, e in endpoints.items():
            if e.max_model_len and e.max_model_len < prompts.target.context_length:
                prompts.target.context_length = e.max_model_len
        print(f"vLLM {', '.join(sorted({str(e.version) for e in endpoints.values()}))}: "
              + ", ".join(f"{m} at {e.url}" for m, e in endpoints.items()), file=sys.stderr, flush=True)
        warm = Sampling(min(B.WARMUP_TOKENS, settings.max_new_tokens), sampling.temperature, sampling.top_p,
                        sampling.top_k, sampling.seed)
        for _ in range(args.warmup):
            for m in methods:
                run_to_end(endpoints[m], m, prompts.encode_prompt(B.WARMUP_PROMPT), warm, eos)

        def runner(m: str) -> "B.Runner":
            e = endpoints[m]
            about = {**e.describe(), "speculative_config": spec_of.get(m, "attached"), "timing": TIMING}

            def go(ids: list[int]) -> dict:
                try:
                    return {**run_to_end(e, m, ids, sampling, eos), **about}
                except VLLMError as err:
                    raise B.BenchError(f"{m}: {err}") from None
            return B.Runner(m, M.params_for(m, params.get(m), args.target, getattr(args, "draft", None)) if m in M.SUPPORTED else dict(params.get(m) or {}), go)

        runners = [runner(m) for m in methods]
        extra = {"temperature": settings.sampling.temperature, "dtype": dtype, "target": prompts.target.name}
        progress = B.Progress(sum(len(q.turns) for q in questions) * len(methods), enabled=not args.no_progress)
        with open(out_path, "w", encoding="utf-8") as out:
            def write(rec: dict) -> None:
                out.write(B.record_line(rec))
                out.flush()
            try:
                records = B.run_all(prompts, questions, runners, settings.max_new_tokens, write, progress, extra)
            finally:
                progress.close()
    finally:
        pool.stop()
    if not records:
        raise B.BenchError("no question could be run: every prompt with --max-new-tokens exceeds the context")
    print(f"wrote {len(records)} records to {out_path}", file=sys.stderr)
    print(f"\n{prompts.target.name} on vLLM ({', '.join(sorted({e.describe()['vllm_device'] for e in endpoints.values()}))}), "
          f"{dtype}, max_new_tokens {settings.max_new_tokens}, temperature {settings.sampling.temperature}")
    print(B.format_table(B.summarize(records)), end="")
    return 0
