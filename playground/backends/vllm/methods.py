"""The playground's methods as vLLM speculative configs.

Each method is one server (see :mod:`.server`); this module says what that server runs. The
``speculative_config`` keys are vLLM 0.32's (``vllm/config/speculative.py``):

==================  ==============================================================================
method              vLLM ``speculative_config``
==================  ==============================================================================
``autoregressive``  none (plain decoding: the baseline, served the same way as the others)
``prompt_lookup``   ``{"method": "ngram", "num_speculative_tokens": N, "prompt_lookup_max": M,
                    "prompt_lookup_min": 1}`` with N = ``num_pred_tokens`` and M = ``max_ngram_size``
``draft_model``     ``{"method": "draft_model", "model": EXPORT, "num_speculative_tokens": K}``:
                    EXPORT is the draft with the target's full vocabulary (:mod:`.export_draft`),
                    K = ``k`` (the shipped draft's ``draft_knobs.json`` sets 2)
``eagle``           ``{"method": "eagle3", "model": HEAD, "num_speculative_tokens": D}``: HEAD is the
                    EAGLE-3 head the playground trains and ships (already in vLLM's ``eagle3``
                    layout), D = ``depth``. vLLM 0.32 drafts a chain (one token a level), not the
                    engine's EAGLE-2 dynamic tree, so ``top_k`` and ``total_tokens`` cannot be set
==================  ==============================================================================

Not served, with the reason shown wherever a user could pick them (:data:`UNSUPPORTED`).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import NamedTuple

from .server import ServerConfig, gpu_share_args

SUPPORTED = ("autoregressive", "prompt_lookup", "draft_model", "eagle")
"""Methods the vLLM backend can serve."""

UNSUPPORTED = {
    "lookahead": "vLLM has no Lookahead (Jacobi) decoding",
    "medusa": "vLLM's medusa method loads heads in a checkpoint format of its own, not the reference "
              "implementation's format that the playground trains",
    "suffix": "vLLM's suffix method needs the arctic-inference package, which this backend does not install "
              "(pip finds no wheel of its current release for this machine, only sources whose build failed "
              "here); on a GPU host with it installed, vLLM serves it as its suffix method",
    "mixture": "vLLM runs one speculative method per server, not a tree merged from several drafters",
    "rest": "vLLM has no retrieval (REST) drafter",
    "recycling": "vLLM has no token recycling drafter",
}
"""Method -> why the vLLM backend does not serve it."""

SOURCES = {"autoregressive": "target", "prompt_lookup": "prompt_lookup", "draft_model": "draft",
           "eagle": "eagle_d{d}"}
"""Source tag of an accepted draft token per method (the built-in engine's tags; ``{d}``: the token's
draft depth in its step, 1 for the first drafted token)."""


def unsupported_reason(method: str) -> str | None:
    """Why ``method`` cannot be served by vLLM (None when it can)."""
    if method in SUPPORTED:
        return None
    return UNSUPPORTED.get(method, f"the vLLM backend does not know the method {method!r}")


def knob_defaults(method: str, draft_dir: str | Path | None = None) -> dict:
    """The knob values a method runs with when none are given (the built-in engine's defaults;
    for draft_model, the ``draft_knobs.json`` of the draft folder ``draft_dir`` first: pass the
    draft actually served, as the engine does; a hub-id draft, ``None``, takes the engine's K)."""
    from playground.engine import K_KNOB, PROMPT_LOOKUP_NGRAM_KNOB, PROMPT_LOOKUP_TOKENS_KNOB

    if method == "prompt_lookup":
        return {"max_ngram_size": int(PROMPT_LOOKUP_NGRAM_KNOB.default),
                "num_pred_tokens": int(PROMPT_LOOKUP_TOKENS_KNOB.default)}
    if method == "draft_model":
        from playground.engine import load_knob_defaults

        values = {"k": int(K_KNOB.default)}
        if draft_dir is not None:
            values.update({k: v for k, v in load_knob_defaults(draft_dir).items() if k == "k"})
        return values
    if method == "eagle":
        from playground.engine import EAGLE_KNOBS

        return {"depth": int(next(k for k in EAGLE_KNOBS if k.name == "depth").default)}
    return {}


def speculative_config(method: str, params: dict | None = None, draft_model: str | None = None,
                       eagle_head: str | None = None) -> dict | None:
    """vLLM's ``speculative_config`` for a method (None for the baseline).

    Args:
        method: one of :data:`SUPPORTED`.
        params: the method's knobs (missing ones take :func:`knob_defaults`); knobs vLLM has no
            equivalent of (draft_model's ``confidence``) must be absent or 0.
        draft_model: for draft_model, the full-vocabulary draft folder (or hub id) vLLM loads.
        eagle_head: for eagle, the EAGLE-3 head folder (or hub id) vLLM loads as its ``eagle3`` draft.

    Raises:
        ValueError: an unsupported method, a knob out of range, a knob vLLM cannot honour, or
            draft_model / eagle without its draft or head.
    """
    reason = unsupported_reason(method)
    if reason:
        raise ValueError(f"{method} cannot run on vLLM: {reason}")
    from playground.engine import METHODS

    known = {k.name for k in METHODS[method].knobs}
    unknown = sorted(set(params or {}) - known)
    if unknown:
        raise ValueError(f"{method} has no setting {', '.join(map(repr, unknown))} "
                         f"(its settings: {', '.join(sorted(known)) or 'none'})")
    p = {**knob_defaults(method), **(params or {})}
    if method == "autoregressive":
        return None
    from playground.engine import K_KNOB, PROMPT_LOOKUP_NGRAM_KNOB, PROMPT_LOOKUP_TOKENS_KNOB

    if method == "prompt_lookup":
        return {"method": "ngram", "num_speculative_tokens": int(PROMPT_LOOKUP_TOKENS_KNOB.check(p["num_pred_tokens"])),
                "prompt_lookup_max": int(PROMPT_LOOKUP_NGRAM_KNOB.check(p["max_ngram_size"])),
                "prompt_lookup_min": 1}
    if method == "eagle":
        from playground.engine import EAGLE_KNOBS

        tree = sorted(k for k in ("top_k", "total_tokens") if k in (params or {}))
        if tree:
            raise ValueError(f"eagle on vLLM drafts a chain of depth tokens (vLLM has no EAGLE tree): "
                             f"{' and '.join(tree)} cannot be set, only depth")
        if not eagle_head:
            raise ValueError("eagle on vLLM needs an EAGLE-3 head for the target (eagle_head=...; --eagle PATH_OR_HUB_ID)")
        depth = next(k for k in EAGLE_KNOBS if k.name == "depth")
        return {"method": "eagle3", "model": str(eagle_head), "num_speculative_tokens": int(depth.check(p["depth"]))}
    if p.get("confidence"):
        raise ValueError(f"draft_model on vLLM drafts a fixed K tokens: confidence must be 0, got {p['confidence']}")
    if p.get("proposer", "model") != "model":
        raise ValueError("draft_model on vLLM drafts with the draft model itself: proposer must be 'model'")
    if not draft_model:
        raise ValueError("draft_model on vLLM needs a draft with the target's vocabulary (draft_model=...)")
    return {"method": "draft_model", "model": str(draft_model), "num_speculative_tokens": int(K_KNOB.check(p["k"]))}


def missing_model(method: str, target: str = "default", draft: str | None = None,
                  eagle: str | None = None) -> str | None:
    """What ``method`` lacks to be served for ``target`` (None: nothing): draft_model needs a draft
    (``draft``, else the shipped one with the default target), eagle an EAGLE-3 head (``eagle``, else
    the shipped one with the default target); ``"none"`` means none."""
    if method == "draft_model":
        from playground.engine import default_draft_spec

        if not default_draft_spec(target, draft):
            return "no draft model for this target (--draft MODEL)"
    if method == "eagle":
        from playground.engine import eagle_spec

        if not eagle_spec(target, eagle):
            return "no EAGLE-3 head for this target (--eagle PATH_OR_HUB_ID)"
    return None


def params_for(method: str, params: dict | None = None, target: str = "default", draft: str | None = None) -> dict:
    """The knob values a method's server runs with (defaults filled in; draft_model's K from the
    draft it serves, as :func:`server_configs` sets it), for records."""
    if method == "draft_model":
        return _draft_params(target, draft, params)
    return {**knob_defaults(method), **(params or {})}


def default_target_folder(target: str = "default") -> str:
    """The model folder (or hub id) vLLM loads for a playground target spec; the embedded default is
    converted once into the playground cache (``playground.engine.models``), as the built-in engine
    loads it.

    Raises:
        playground.engine.ModelLoadError: the model cannot be found.
    """
    from playground.engine import model_source

    return model_source(target)


def server_configs(methods: list[str], params: dict[str, dict] | None = None, target: str = "default",
                   draft: str | None = None, dtype: str = "float32", max_model_len: int = 2048,
                   extra_args: tuple[str, ...] = (), eagle: str | None = None) -> list[ServerConfig]:
    """One :class:`ServerConfig` per method.

    Args:
        methods: method names (each in :data:`SUPPORTED`).
        params: method -> knobs.
        target: the playground's target spec (``default``, a folder, a hub id).
        draft: the draft for draft_model: a folder with the target's vocabulary, or a reduced one
            (exported on the fly with :func:`.export_draft.export_full_vocab`); default: the
            shipped draft with the default target.
        dtype, max_model_len, extra_args: passed to every server.
        eagle: the EAGLE-3 head for eagle: a folder or hub id (``"none"``: none); default: the
            shipped head with the default target.

    Raises:
        ValueError: an unsupported method or knob, draft_model without a draft, or eagle without a head.
    """
    model = local_path(default_target_folder(target))  # servers run in the repository's folder
    draft_folder = None
    params = dict(params or {})
    if "draft_model" in methods:
        draft_folder = local_path(vllm_draft_folder(target, draft))
        params["draft_model"] = _draft_params(target, draft, params.get("draft_model"))
    head = None
    if "eagle" in methods:
        from playground.engine import eagle_spec

        head = eagle_spec(target, eagle)
        head = local_path(head) if head else None
    return [ServerConfig(m, model, speculative_config(m, (params or {}).get(m), draft_folder, head), dtype,
                         max_model_len, extra_args=tuple(extra_args)) for m in methods]


def local_path(spec: str) -> str:
    """``spec`` as an absolute path when it names a file or folder here (relative to the current
    folder, as the user typed it), else unchanged (a hub id)."""
    return str(Path(spec).resolve()) if Path(spec).exists() else spec


def _draft_params(target: str, draft: str | None, given: dict | None) -> dict:
    """draft_model's knobs: those given, else the draft's own ``draft_knobs.json`` (K), else the engine's."""
    from playground.engine import default_draft_spec

    spec = default_draft_spec(target, draft)
    folder = spec if spec and Path(spec).is_dir() else None
    return {**knob_defaults("draft_model", folder), **(given or {})}


def vllm_draft_folder(target: str = "default", draft: str | None = None) -> str:
    """A draft folder vLLM accepts: the full-vocabulary export of a reduced-vocabulary draft
    (written once into the cache), or the draft itself.

    Raises:
        ValueError: no draft given and none is shipped for this target.
    """
    from playground.engine import TOKEN_MAP_FILE
    from playground.engine import default_draft_spec

    spec = default_draft_spec(target, draft)
    if not spec:
        raise ValueError("draft_model needs a draft model: pass --draft MODEL")
    if Path(spec).is_dir() and (Path(spec) / TOKEN_MAP_FILE).is_file():
        from .export_draft import export_full_vocab

        return str(export_full_vocab(spec))
    return spec


class ServeCommands(NamedTuple):
    """What :func:`serve_commands` returns: run ``prepare`` here first, copy ``folders`` to the serving
    machine, run each of ``commands`` there (each in its own terminal), then ``attach`` here."""

    prepare: list[str]
    commands: list[str]
    attach: str
    folders: list[str]


def serve_commands(methods: list[str], params: dict[str, dict] | None = None, target: str = "default",
                   draft: str | None = None, eagle: str | None = None, port: int = 8000,
                   host: str = "gpu-host") -> ServeCommands:
    """How to run ``methods`` on vLLM servers of your own (a GPU machine), and attach the playground.

    One ``vllm serve`` command per method (duplicates dropped) on ports ``port``, ``port + 1``, ...
    with the method's speculative config and the metrics the playground reads. Several servers on one
    GPU share it: each gets ``--gpu-memory-utilization`` 0.9 / n (vLLM's default, 0.92 each, stops the
    second). No ``--dtype``: vLLM's default, bfloat16 on a GPU, is what a deployment runs (servers
    started here run float32 to compare token for token with the built-in engine). The embedded
    default target is named by its hub id, the model its GGUF was made from (the shipped draft and
    head were trained and measured on the GGUF's weights). A reduced-vocabulary draft is named by its
    full-vocabulary export's folder; when that is not written yet, ``prepare`` holds the command that
    writes it. Local folders are given as absolute paths.

    Raises:
        ValueError: no method, an unsupported method or knob, or a draft or head missing.
    """
    from playground.engine import DEFAULT_HUB_ID, DEFAULT_TARGET, TOKEN_MAP_FILE, default_draft_spec, eagle_spec

    methods = list(dict.fromkeys(methods))
    if not methods:
        raise ValueError("no method to serve: name at least one, e.g. autoregressive,prompt_lookup")

    model = DEFAULT_HUB_ID if target == DEFAULT_TARGET else local_path(target)
    prepare, folders, commands, urls = [], [model] if Path(model).is_dir() else [], [], []
    share = gpu_share_args(len(methods))
    for i, m in enumerate(methods):
        draft_folder = head = None
        given = (params or {}).get(m)
        if m == "draft_model":
            spec = default_draft_spec(target, draft)
            given = _draft_params(target, draft, given)
            draft_folder = local_path(spec) if spec else None
            if spec and (Path(spec) / TOKEN_MAP_FILE).is_file():
                from .export_draft import EXPORT_INFO_FILE, default_export_dir

                draft_folder = str(default_export_dir(spec))
                if not (Path(draft_folder) / EXPORT_INFO_FILE).is_file():
                    prepare.append(shlex.join([".venv/bin/python", "-m", "playground.backends.vllm.export_draft",
                                               "--draft", local_path(spec)]))
        if m == "eagle":
            head = eagle_spec(target, eagle)
            head = local_path(head) if head else None
        config = speculative_config(m, given, draft_folder, head)
        args = ["vllm", "serve", model, "--port", str(port + i), "--served-model-name", m, *share,
                "--enable-per-request-metrics"]
        if config:
            args += ["--per-request-spec-decode-metrics", "detailed",
                     "--speculative-config", json.dumps(config, separators=(",", ":"))]
            folders += [f for f in (draft_folder, head) if f and Path(f).is_absolute()]
        commands.append(shlex.join(args))
        urls += ["--vllm-url", f"{m}=http://{host}:{port + i}"]
    attach = shlex.join([".venv/bin/python", "app.py", *([] if target == DEFAULT_TARGET else ["--target", target]),
                         *urls])
    return ServeCommands(prepare, commands, attach, list(dict.fromkeys(folders)))
