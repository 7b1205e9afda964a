"""What the Models tab offers: presets that load here, local model folders, models in the Hugging Face
cache, and the hub's presets only when the hub answers (:func:`hub_reachable`).
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
from pathlib import Path

from playground import presets

log = logging.getLogger(__name__)

AUTO, NONE, SAME = "auto", "none", "same"
"""Companion choices: the one shipped for the target (if any), none, and (draft only) the target itself."""
HUB_HOST = ("huggingface.co", 443)
HUB_TIMEOUT_S = 1.5
"""Seconds :func:`hub_reachable` waits for the hub (once per process)."""


@functools.lru_cache(maxsize=1)
def hub_reachable() -> bool:
    """Whether the Hugging Face hub answers (asked once per process; False in offline mode)."""
    from huggingface_hub import constants

    if constants.is_offline_mode():
        return False
    answered: list[bool] = []

    def probe() -> None:  # in a thread: a name lookup is not bounded by the socket's timeout
        try:
            socket.create_connection(HUB_HOST, timeout=HUB_TIMEOUT_S).close()
            answered.append(True)
        except OSError:
            pass
    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(HUB_TIMEOUT_S)
    return bool(answered)


def models_dir(given: str | None = None) -> Path | None:
    """The folder searched for local models: ``given``, else ``$PLAYGROUND_MODELS_DIR``, else None."""
    value = given or os.environ.get("PLAYGROUND_MODELS_DIR")
    return Path(value).expanduser() if value else None


def local_models(folder: Path | None = None) -> list[tuple[str, str]]:
    """``(name, spec)`` of models found on this machine: in ``folder`` (subfolders with ``config.json``
    and ``.gguf`` files, one level deep) and in the Hugging Face cache (hub ids with a snapshot)."""
    found: list[tuple[str, str]] = []
    if folder is not None and folder.is_dir():
        for p in sorted(folder.iterdir()):
            if p.is_dir() and (p / "config.json").is_file():
                found.append((p.name, str(p)))
            elif p.is_file() and p.suffix == ".gguf":
                found.append((p.name, str(p)))
    try:
        from huggingface_hub import constants

        cache = Path(constants.HF_HUB_CACHE)
        for repo in sorted(cache.glob("models--*")):
            if any(repo.glob("snapshots/*/config.json")):
                hub_id = repo.name.removeprefix("models--").replace("--", "/")
                found.append((hub_id, hub_id))
    except OSError as e:
        log.warning("could not read the Hugging Face cache: %s", e)
    return found


def usable_presets(local_specs: set[str], hub: bool) -> list[presets.ModelPreset]:
    """Presets that can load here: offline ones, and hub ones when the hub answers or their target
    is cached."""
    return [p for p in presets.PRESETS.values() if p.offline or hub or p.target in local_specs]


def choice_lists(folder: Path | None = None, hub: bool | None = None) -> dict[str, list[tuple[str, str]]]:
    """Dropdown choices ``(label, value)`` for ``target``, ``draft``, ``medusa``, ``eagle`` and ``preset``."""
    local = local_models(folder)
    hub = hub_reachable() if hub is None else hub
    usable = usable_presets({s for _, s in local}, hub)
    targets = [("Embedded SmolLM2-135M-Instruct", "default")] + local
    drafts = [("The draft made for this target, if there is one", AUTO), ("No draft", NONE),
              ("The target itself (accepts every draft token: a check of the machinery)", SAME)] + local
    for p in usable:
        targets += [(p.target, p.target)] if p.target != "default" else []
        drafts += [(d, d) for d in p.drafts]
    heads = [("The heads trained for this target, if any", AUTO), ("None", NONE)]
    medusa = heads + [(p.medusa, p.medusa) for p in usable if p.medusa]
    return {"target": list(dict.fromkeys(targets)), "draft": list(dict.fromkeys(drafts)),
            "medusa": list(dict.fromkeys(medusa)), "eagle": [("The head trained for this target, if any", AUTO),
                                                                ("None", NONE)],
            "preset": [(p.label, p.name) for p in usable]}


def preset_values(name: str) -> tuple[str, str, str, str]:
    """``(target, draft, medusa, eagle)`` dropdown values of preset ``name``.

    Raises:
        ValueError: unknown preset.
    """
    p = presets.get_preset(name)
    return p.target, p.draft or AUTO, p.medusa or AUTO, AUTO
