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
==================  ==============================================================================

Not served, with the reason shown wherever a user could pick them (:data:`UNSUPPORTED`).
"""

from __future__ import annotations

from pathlib import Path

from .server import ServerConfig

SUPPORTED = ("autoregressive", "prompt_lookup", "draft_model")
"""Methods the vLLM backend can serve."""

UNSUPPORTED = {
    "lookahead": "vLLM has no Lookahead (Jacobi) decoding",
    "medusa": "vLLM's medusa method loads heads in its own format (a MedusaModel checkpoint with a "
              "'medusa_config'), not the reference implementation's that the playground trains",
    "suffix": "vLLM's suffix decoding needs the arctic-inference package, which has no CPU build",
    "eagle": "no EAGLE head is shipped for the default target yet",
}
"""Method -> why the vLLM backend does not serve it."""

SOURCES = {"autoregressive": "target", "prompt_lookup": "prompt_lookup", "draft_model": "draft"}
"""Source tag of an accepted draft token per method (the built-in engine's tags)."""


def unsupported_reason(method: str) -> str | None:
    """Why ``method`` cannot be served by vLLM (None when it can)."""
    if method in SUPPORTED:
        return None
    return UNSUPPORTED.get(method, f"the vLLM backend does not know the method {method!r}")


def knob_defaults(method: str, draft_dir: str | Path | None = None) -> dict:
    """The knob values a method runs with when none are given (the built-in engine's defaults;
    for draft_model, the draft folder's ``draft_knobs.json`` first)."""
    from playground.engine import K_KNOB, PROMPT_LOOKUP_NGRAM_KNOB, PROMPT_LOOKUP_TOKENS_KNOB

    if method == "prompt_lookup":
        return {"max_ngram_size": int(PROMPT_LOOKUP_NGRAM_KNOB.default),
                "num_pred_tokens": int(PROMPT_LOOKUP_TOKENS_KNOB.default)}
    if method == "draft_model":
        from playground.engine import load_knob_defaults
        from playground.engine import DEFAULT_DRAFT_DIR

        values = {"k": int(K_KNOB.default)}
        values.update({k: v for k, v in load_knob_defaults(draft_dir or DEFAULT_DRAFT_DIR).items() if k == "k"})
        return values
    return {}


def speculative_config(method: str, params: dict | None = None, draft_model: str | None = None) -> dict | None:
    """vLLM's ``speculative_config`` for a method (None for the baseline).

    Args:
        method: one of :data:`SUPPORTED`.
        params: the method's knobs (missing ones take :func:`knob_defaults`); knobs vLLM has no
            equivalent of (draft_model's ``confidence``) must be absent or 0.
        draft_model: for draft_model, the full-vocabulary draft folder (or hub id) vLLM loads.

    Raises:
        ValueError: an unsupported method, a knob out of range, or a knob vLLM cannot honour.
    """
    reason = unsupported_reason(method)
    if reason:
        raise ValueError(f"{method} cannot run on vLLM: {reason}")
    p = {**knob_defaults(method), **(params or {})}
    if method == "autoregressive":
        return None
    from playground.engine import K_KNOB, PROMPT_LOOKUP_NGRAM_KNOB, PROMPT_LOOKUP_TOKENS_KNOB

    if method == "prompt_lookup":
        return {"method": "ngram", "num_speculative_tokens": int(PROMPT_LOOKUP_TOKENS_KNOB.check(p["num_pred_tokens"])),
                "prompt_lookup_max": int(PROMPT_LOOKUP_NGRAM_KNOB.check(p["max_ngram_size"])),
                "prompt_lookup_min": 1}
    if p.get("confidence"):
        raise ValueError(f"draft_model on vLLM drafts a fixed K tokens: confidence must be 0, got {p['confidence']}")
    if p.get("proposer", "model") != "model":
        raise ValueError("draft_model on vLLM drafts with the draft model itself: proposer must be 'model'")
    if not draft_model:
        raise ValueError("draft_model on vLLM needs a draft with the target's vocabulary (draft_model=...)")
    return {"method": "draft_model", "model": str(draft_model), "num_speculative_tokens": int(K_KNOB.check(p["k"]))}


def params_for(method: str, params: dict | None = None) -> dict:
    """The knob values a method's server runs with (defaults filled in), for records."""
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
                   extra_args: tuple[str, ...] = ()) -> list[ServerConfig]:
    """One :class:`ServerConfig` per method.

    Args:
        methods: method names (each in :data:`SUPPORTED`).
        params: method -> knobs.
        target: the playground's target spec (``default``, a folder, a hub id).
        draft: the draft for draft_model: a folder with the target's vocabulary, or a reduced one
            (exported on the fly with :func:`.export_draft.export_full_vocab`); default: the
            shipped draft with the default target.
        dtype, max_model_len, extra_args: passed to every server.

    Raises:
        ValueError: an unsupported method or knob, or draft_model without a draft.
    """
    model = default_target_folder(target)
    draft_folder = None
    if "draft_model" in methods:
        draft_folder = vllm_draft_folder(target, draft)
    return [ServerConfig(m, model, speculative_config(m, (params or {}).get(m), draft_folder), dtype,
                         max_model_len, extra_args=tuple(extra_args)) for m in methods]


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
