"""EAGLE-3 checkpoints in the layout vLLM's ``eagle3`` speculative method loads for a Llama target.

Checked against vLLM's ``vllm/model_executor/models/llama_eagle3.py`` (``Eagle3LlamaForCausalLM``
and its ``load_weights``) and the model registry:

* ``config.json``: a Llama config with ``architectures: ["LlamaForCausalLMEagle3"]``,
  ``num_hidden_layers: 1``, ``vocab_size`` (the target's), ``draft_vocab_size``,
  ``target_hidden_size`` (the fc layer reads ``3 * target_hidden_size``) and
  ``eagle_aux_hidden_state_layer_ids`` (the target layers whose outputs are read; vLLM's
  numbering, the same as transformers' ``hidden_states`` index: 0 = embeddings).
* ``model.safetensors``: ``fc.weight``, ``midlayer.*`` (vLLM renames it ``layers.0``; q/k/v read
  ``2 * hidden_size``), ``norm.weight``, ``lm_head.weight`` ``(draft_vocab_size, hidden_size)``,
  ``d2t`` (int64 offsets: target id = draft id + d2t[draft id]) and ``t2d`` (bool over the target
  vocabulary; vLLM skips it). No ``embed_tokens``: vLLM then shares the target's embedding, as
  the playground does.

Our own additions live in ``recipe.json`` (how it was trained, held-out acceptance per depth).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..models import ModelLoadError, shipped_asset_spec
from .head import EagleHead

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
RECIPE_NAME = "recipe.json"
ARCHITECTURE = "LlamaForCausalLMEagle3"
DEFAULT_EAGLE_DIR = Path(__file__).resolve().parents[3] / "assets" / "eagle" / "default"
"""Where the head trained for the embedded default target lives (loaded automatically when present)."""


class EagleLoadError(ModelLoadError):
    """An EAGLE checkpoint that cannot be found or does not fit the target."""


def default_feature_layers(num_layers: int) -> tuple[int, int, int]:
    """vLLM's default EAGLE-3 layers for a target of ``num_layers`` decoder layers: (2, n // 2, n - 3)."""
    return (2, num_layers // 2, num_layers - 3)


def head_config(target_config, draft_vocab_size: int, feature_layers=None, intermediate_size=None) -> dict:
    """A draft config for ``target_config`` (a transformers Llama config): one layer of the target's width."""
    c = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
    heads = int(c.num_attention_heads)
    head_dim = int(getattr(c, "head_dim", None) or c.hidden_size // heads)
    rope = getattr(c, "rope_parameters", None) or {}
    theta = float(rope.get("rope_theta", getattr(c, "rope_theta", 10000.0)) if isinstance(rope, dict) else 10000.0)
    layers = tuple(feature_layers or default_feature_layers(int(c.num_hidden_layers)))
    return {
        "architectures": [ARCHITECTURE], "model_type": "llama", "num_hidden_layers": 1,
        "hidden_size": int(c.hidden_size), "target_hidden_size": int(c.hidden_size),
        "intermediate_size": int(intermediate_size or c.intermediate_size), "num_attention_heads": heads,
        "num_key_value_heads": int(getattr(c, "num_key_value_heads", heads)), "head_dim": head_dim,
        "hidden_act": "silu", "rms_norm_eps": float(c.rms_norm_eps), "rope_theta": theta,
        "rope_scaling": None, "max_position_embeddings": int(c.max_position_embeddings),
        "vocab_size": int(c.vocab_size), "draft_vocab_size": int(draft_vocab_size),
        "eagle_aux_hidden_state_layer_ids": list(layers), "tie_word_embeddings": False,
        "bos_token_id": getattr(c, "bos_token_id", None), "eos_token_id": getattr(c, "eos_token_id", None),
        "torch_dtype": "float16",
    }


def save_eagle(head: EagleHead, folder: str | Path, recipe: dict | None = None,
               dtype: torch.dtype = torch.float16) -> Path:
    """Write ``config.json``, ``model.safetensors`` (vLLM names) and ``recipe.json`` into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in head.state_dict().items()}
    tensors["d2t"] = head.d2t().cpu().contiguous()
    tensors["t2d"] = head.t2d.cpu().contiguous()
    save_file(tensors, str(folder / WEIGHTS_NAME), metadata={"format": "pt"})
    config = dict(head.config, torch_dtype=str(dtype).removeprefix("torch."))
    (folder / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
    if recipe is not None:
        (folder / RECIPE_NAME).write_text(json.dumps(recipe, indent=2) + "\n")
    return folder


def read_eagle(folder: str | Path) -> EagleHead:
    """An :class:`EagleHead` from a folder written by :func:`save_eagle` (or any vLLM EAGLE-3 Llama head
    without its own embedding), float32, eval mode."""
    folder = Path(folder)
    try:
        config = json.loads((folder / CONFIG_NAME).read_text())
        tensors = load_file(str(folder / WEIGHTS_NAME))
    except (OSError, ValueError) as e:
        raise EagleLoadError(f"could not load EAGLE head {str(folder)!r}: {e}") from None
    if not {"draft_vocab_size", "vocab_size", "hidden_size"} <= config.keys():
        raise EagleLoadError(f"{folder / CONFIG_NAME} is not an EAGLE-3 config (draft_vocab_size, vocab_size, "
                             f"hidden_size needed)")
    config.setdefault("eagle_aux_hidden_state_layer_ids", None)
    if not config["eagle_aux_hidden_state_layer_ids"]:
        raise EagleLoadError(f"{folder / CONFIG_NAME} names no eagle_aux_hidden_state_layer_ids")
    config.setdefault("head_dim", config["hidden_size"] // config["num_attention_heads"])
    dv = int(config["draft_vocab_size"])
    d2t = tensors.pop("d2t", torch.zeros(dv, dtype=torch.long)).long()
    tensors.pop("t2d", None)
    tensors = {k.replace("layers.0.", "midlayer."): v for k, v in tensors.items()}
    tensors.pop("embed_tokens.weight", None)
    head = EagleHead(config, torch.arange(dv) + d2t)
    missing, unexpected = head.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=False)
    if missing or unexpected:
        raise EagleLoadError(f"EAGLE head {str(folder)!r}: missing {missing}, unexpected {unexpected}")
    return head.eval().requires_grad_(False)


def load_eagle(spec: str | Path, target=None) -> EagleHead:
    """Load an EAGLE-3 head from a folder or a hub id; with ``target`` (a ``LoadedModel`` or anything
    with ``.model``) check it fits, move it to the target's device and dtype and share its embedding.

    Raises:
        EagleLoadError: not found, malformed, or trained for another hidden size / vocabulary / depth.
    """
    path = Path(str(spec)).expanduser()
    if not path.is_dir():
        if str(spec).startswith(("/", ".", "~")) or path.exists():
            raise EagleLoadError(f"could not load EAGLE head {str(spec)!r}: no such folder")
        try:
            from huggingface_hub import snapshot_download
            path = Path(snapshot_download(str(spec), allow_patterns=[CONFIG_NAME, WEIGHTS_NAME, RECIPE_NAME]))
        except Exception as e:
            raise EagleLoadError(f"could not load EAGLE head {str(spec)!r} from the hub: {type(e).__name__}") from None
    head = read_eagle(path)
    recipe = path / RECIPE_NAME
    head.recipe = json.loads(recipe.read_text()) if recipe.exists() else {}
    if target is not None:
        model = target.model
        c = model.config.get_text_config()
        if int(c.hidden_size) != head.target_hidden_size or int(c.vocab_size) != int(head.config["vocab_size"]):
            raise EagleLoadError(f"EAGLE head {str(spec)!r} was trained for hidden size {head.target_hidden_size} "
                                 f"and vocabulary {head.config['vocab_size']}, but the target has {c.hidden_size} "
                                 f"and {c.vocab_size}")
        if max(head.feature_layers) > int(c.num_hidden_layers):
            raise EagleLoadError(f"EAGLE head {str(spec)!r} reads layer {max(head.feature_layers)}, but the target "
                                 f"has {c.num_hidden_layers} layers")
        param = next(model.parameters())
        head.to(device=param.device, dtype=param.dtype)
        head.attach_embedding(model.get_input_embeddings())
        if param.device.type == "cpu" and param.dtype == torch.float32:
            # A drafted level is a few rows through small layers: time goes to reading the weights, so a
            # float16 checkpoint's layers read float16 copies (the products are the float32 layer's) and
            # the layer and output layer int8 copies (half those bytes again; every proposal is verified).
            # ``fc`` keeps float16: it reads the target's raw features, whose few huge channels would
            # swamp the one 8-bit scale of a dynamically quantized input.
            from ..cpu_linear import half_weight_linear_layers, int8_weight_linear_layers
            half_weight_linear_layers(head)
            int8_weight_linear_layers(head, skip=("fc",))
    return head


def eagle_spec(target_spec: str, eagle_spec_: str | None = None) -> str | None:
    """The head to load: ``eagle_spec_`` when given (``"none"`` for none); otherwise the shipped head
    (``assets/eagle/default``) for the embedded default target."""
    return shipped_asset_spec(DEFAULT_EAGLE_DIR, target_spec, eagle_spec_, CONFIG_NAME)
