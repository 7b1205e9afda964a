"""Model presets: a target with its drafts and Medusa heads (``app.py --preset NAME``, the page's picker).

Presets (:data:`PRESETS`) load through ``Engine.load``, the same code as ``--target``/``--draft``,
so a hub preset without a hub fails with that loader's message (``ModelLoadError``), never a crash.
The method advisor is :mod:`playground.advisor`. This module imports no UI code and loads no model
at import time.
"""

from __future__ import annotations

from dataclasses import dataclass


# ----- model presets -------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelPreset:
    """A target with what its methods need.

    Attributes:
        name: the preset's key (``--preset NAME``); label: display name.
        target: model spec for ``Engine.load`` (``"default"``, hub id, folder or .gguf).
        drafts: draft specs, the first one used by default (same tokenizer as the target).
        medusa: Medusa heads (hub id or folder), or None.
        params_b: target size in billions of parameters (for the advisor).
        offline: loads without a hub connection.
        note: one line shown next to the picker.
    """

    name: str
    label: str
    target: str
    drafts: tuple[str, ...] = ()
    medusa: str | None = None
    params_b: float = 0.0
    offline: bool = False
    note: str = ""

    @property
    def draft(self) -> str | None:
        return self.drafts[0] if self.drafts else None


PRESETS: dict[str, ModelPreset] = {p.name: p for p in (
    ModelPreset("default", "Embedded SmolLM2-135M-Instruct (offline)", "default", params_b=0.135, offline=True,
                note="The small model embedded in the app, with its distilled draft and Medusa heads; runs anywhere, no hub needed."),
    ModelPreset("smollm2-1.7b", "SmolLM2-1.7B-Instruct + SmolLM2-360M/135M drafts",
                "HuggingFaceTB/SmolLM2-1.7B-Instruct",
                ("HuggingFaceTB/SmolLM2-360M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"), params_b=1.7,
                note="Same family, same tokenizer: 4.7x and 12.6x smaller drafts."),
    ModelPreset("qwen2.5-7b", "Qwen2.5-7B-Instruct + Qwen2.5-0.5B-Instruct draft", "Qwen/Qwen2.5-7B-Instruct",
                ("Qwen/Qwen2.5-0.5B-Instruct",), params_b=7.6, note="A GPU is needed for useful speed."),
    ModelPreset("vicuna-7b-medusa", "Vicuna-7B-v1.3 + published Medusa heads", "lmsys/vicuna-7b-v1.3",
                medusa="FasterDecoding/medusa-vicuna-7b-v1.3", params_b=6.7,
                note="The Medusa paper's model and heads (Cai et al. 2024); a GPU is needed."),
    ModelPreset("llama-2-70b", "Llama-2-70B-chat + Llama-2-7B-chat draft", "meta-llama/Llama-2-70b-chat-hf",
                ("meta-llama/Llama-2-7b-chat-hf",), params_b=69.0,
                note="The classic draft-model pairing (10x smaller); gated on the hub, several GPUs."),
)}
"""Model presets by name (``app.py --preset NAME``, the page's preset picker)."""


def get_preset(name: str) -> ModelPreset:
    """The preset called ``name``.

    Raises:
        ValueError: unknown name (the message lists the presets).
    """
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}") from None


def load_preset(name: str, device="auto", dtype="auto", progress=None, draft: str | None = None):
    """Load a preset's target, draft and Medusa heads (``Engine.load``).

    Args:
        name: a key of :data:`PRESETS`.
        device, dtype: as for ``Engine.load``.
        progress: optional ``progress(fraction, message)``.
        draft: which of the preset's drafts to load (default: its first; ignored without drafts).

    Returns:
        an ``Engine`` holding the loaded models.

    Raises:
        ValueError: unknown preset, or a draft that is not one of the preset's.
        models.ModelLoadError: the model cannot be found or loaded (e.g. no hub connection).
    """
    from playground.engine import Engine

    preset = get_preset(name)
    if draft is not None and draft not in preset.drafts:
        raise ValueError(f"preset {name!r} has no draft {draft!r}; its drafts are {', '.join(preset.drafts) or 'none'}")
    return Engine.load(preset.target, draft or preset.draft, preset.medusa, device=device, dtype=dtype,
                       progress=progress)
