"""Medusa heads and their checkpoints: extra decoding heads on the target's last hidden state propose a tree of candidates.

Source: Cai, Li, Geng, Peng, Lee, Chen, Dao 2024, "Medusa: Simple LLM Inference Acceleration
Framework with Multiple Decoding Heads" (ICML), and its reference implementation
(FasterDecoding/Medusa), read for facts: the checkpoint format, the tree format, the defaults.

* A head is ``num_layers`` residual blocks ``x + SiLU(W x + b)`` (W, b zero-initialised, so a
  new head is the identity) followed by a projection to the vocabulary; a head saved without
  one reuses the base model's output projection (``lm_head``). Each head has its own blocks.
* On the last hidden state ``h_t`` (whose ``lm_head`` output predicts token t+1, the step's
  root) head k (0-based) predicts token t+k+2, i.e. candidates at depth k+1 below the root.
* Each step, each head's top-k tokens fill the tree given by ``tree_choices``
  (:func:`~playground.engine.tree.tree_buffers`); the target verifies the whole tree in one
  pass, and the exact rule (greedy: lossless) or typical acceptance picks the path.

Checkpoints (the reference format): a folder or hub repository with ``config.json`` holding
``medusa_num_heads``, ``medusa_num_layers``, ``base_model_name_or_path``, and weights in
``medusa_lm_head.safetensors`` or ``medusa_lm_head.pt`` with keys ``{k}.{layer}.linear.weight``,
``{k}.{layer}.linear.bias`` and, when the head has its own projection, ``{k}.{num_layers}.weight``.
The head count and layer count are read from the tensors (configs are sometimes wrong). We also
write ``top_k_accuracy`` (per head, the held-out top-1..top-10 accuracy) when training measured it,
and ``proposal_vocab`` (the token ids the heads propose from, see :class:`MedusaHeads`) when
training used a label vocabulary; other tools ignore both keys.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from torch import nn

from ..limits import MAX_MEDUSA_HEADS
from ..models import ModelLoadError, probe_hub, shipped_asset_spec

CONFIG_NAME = "config.json"
WEIGHTS_SAFETENSORS = "medusa_lm_head.safetensors"
WEIGHTS_PT = "medusa_lm_head.pt"
DEFAULT_HEADS_DIR = Path(__file__).resolve().parents[3] / "assets" / "medusa" / "default"
"""Where the heads trained for the embedded default target live (loaded automatically when present)."""
HEAD_LOSS_DECAY = 0.8
"""Head k's loss weight is HEAD_LOSS_DECAY ** k (Medusa-1 training, Cai et al. 2024, section 2.2)."""


def head_source(k: int) -> str:
    """Source tag of tokens accepted from head ``k`` (1-based): ``medusa_head_k``."""
    return f"medusa_head_{k}"


class MedusaLoadError(ModelLoadError):
    """Medusa heads could not be found or loaded; the message is meant for the user."""


# ----- the heads ---------------------------------------------------------------------------------
class ResBlock(nn.Module):
    """``x + SiLU(linear(x))`` with the linear layer zero-initialised (the block starts as the identity)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """``num_heads`` Medusa heads over a base model's last hidden state.

    Args:
        hidden_size: the base model's hidden size.
        vocab_size: output width (the base model's ``lm_head`` rows when shared).
        num_heads: heads; head k (0-based) predicts the token k+2 positions after the hidden state.
        num_layers: residual blocks per head (each head its own).
        share_lm_head: no per-head projection: every head ends in the base model's ``lm_head``
            (attach it with :meth:`attach_lm_head`); keeps a checkpoint to a few MB.
        base_model_name_or_path: recorded in ``config.json``.
        top_k_accuracy: optional ``(num_heads, <= MEDUSA_TOP_K)`` held-out top-1..top-k accuracy
            per head, used to choose a tree (:mod:`playground.engine.medusa.trees`).
        proposal_vocab: optional sorted token ids the heads propose from (shared-``lm_head`` heads
            only; our extension, saved in ``config.json``). The heads then project onto those
            rows of the base ``lm_head`` only and every other token gets logit -inf: a head costs
            a fraction of a full output layer. The trainer sets it to the tokens that occurred
            as labels, which are the only ones the heads learned to put first. Verification
            does not depend on it (the target checks every candidate).

    The state dict is the reference's: ``heads.{k}.{layer}.linear.*`` and ``heads.{k}.{num_layers}.weight``
    (the ``heads.`` prefix dropped on save).
    """

    def __init__(self, hidden_size: int, vocab_size: int, num_heads: int, num_layers: int = 1,
                 share_lm_head: bool = True, base_model_name_or_path: str = "",
                 top_k_accuracy: list[list[float]] | None = None, proposal_vocab: list[int] | None = None):
        super().__init__()
        if not 1 <= num_heads <= MAX_MEDUSA_HEADS:
            raise ValueError(f"num_heads must be in [1, {MAX_MEDUSA_HEADS}], got {num_heads}")
        if num_layers < 0:
            raise ValueError(f"num_layers must be >= 0, got {num_layers}")
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        self.num_heads, self.num_layers = num_heads, num_layers
        self.share_lm_head = share_lm_head
        self.base_model_name_or_path = base_model_name_or_path
        self.top_k_accuracy = top_k_accuracy
        self.heads = nn.ModuleList()
        for _ in range(num_heads):
            layers: list[nn.Module] = [ResBlock(hidden_size) for _ in range(num_layers)]
            if not share_lm_head:
                layers.append(nn.Linear(hidden_size, vocab_size, bias=False))
            self.heads.append(nn.Sequential(*layers))
        self._lm_head: list[nn.Module] = []  # a plain list: the base projection is not ours to save
        self.proposal_vocab: torch.Tensor | None = None
        self._proposal_rows: tuple | None = None  # (ids, nn.Linear of those lm_head rows) on its device, cached
        if proposal_vocab is not None:
            self.set_proposal_vocab(proposal_vocab)

    def attach_lm_head(self, lm_head: nn.Module) -> "MedusaHeads":
        """Use ``lm_head`` (the base model's output projection, frozen) for heads without their own."""
        if self.share_lm_head:
            w = getattr(lm_head, "weight", None)
            if w is not None and w.shape[-1] != self.hidden_size:
                raise ValueError(f"the base model's lm_head takes hidden size {w.shape[-1]}, but the Medusa "
                                 f"heads have hidden size {self.hidden_size}")
            if w is not None:
                self.vocab_size = int(w.shape[0])
        self._lm_head = [lm_head]
        self._proposal_rows = None
        return self

    def set_proposal_vocab(self, token_ids: list[int] | torch.Tensor | None) -> "MedusaHeads":
        """Propose only from ``token_ids`` (see the class docstring); None: the whole vocabulary.

        Raises:
            ValueError: heads with their own projections, an empty list, or ids out of range.
        """
        if token_ids is None:
            self.proposal_vocab, self._proposal_rows = None, None
            return self
        if not self.share_lm_head:
            raise ValueError("a proposal vocabulary needs heads that share the base model's lm_head")
        ids = torch.unique(torch.as_tensor(token_ids, dtype=torch.long).flatten())
        if ids.numel() == 0 or int(ids[0]) < 0 or (self.vocab_size and int(ids[-1]) >= self.vocab_size):
            raise ValueError(f"proposal vocabulary ids must be a non-empty list in [0, {self.vocab_size}), "
                             f"got {ids.numel()} ids in [{int(ids.min()) if ids.numel() else '-'}, "
                             f"{int(ids.max()) if ids.numel() else '-'}]")
        self.proposal_vocab, self._proposal_rows = ids, None
        return self

    def _proposal_logits(self, x: torch.Tensor, lm_head: nn.Module) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The proposal vocabulary's ids ``(m,)``, their logits ``(..., m)`` and the lm_head's width."""
        weight = getattr(lm_head, "weight", None)
        if weight is None:
            raise RuntimeError("a proposal vocabulary needs an lm_head with a weight")
        if self._proposal_rows is None or self._proposal_rows[0].device != weight.device:
            ids = self.proposal_vocab.to(weight.device)
            bias = getattr(lm_head, "bias", None)
            rows = nn.Linear(weight.shape[1], ids.numel(), bias=bias is not None, device=weight.device,
                             dtype=weight.dtype).requires_grad_(False)
            rows.weight.copy_(weight.detach()[ids])
            if bias is not None:
                rows.bias.copy_(bias.detach()[ids])
            # On a CPU in float32 the rows (a few MB to read per step) go through oneDNN's packed
            # weight: for the heads' 1-4 rows MKL's sgemm costs up to 2.5x one row (cpu_linear).
            holder = nn.Module()
            holder.rows = rows
            from ..cpu_linear import pack_linear_layers
            pack_linear_layers(holder)
            self._proposal_rows = (ids, holder.rows)
        ids, rows = self._proposal_rows
        return ids, rows(x.to(rows.weight.dtype)), int(weight.shape[0])

    def _proposal_projection(self, x: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """Full-width logits with only the proposal vocabulary's rows computed (the rest -inf)."""
        ids, sub, width = self._proposal_logits(x, lm_head)
        out = sub.new_full((*sub.shape[:-1], width), float("-inf"))
        out[..., ids] = sub
        return out

    def top_tokens(self, hidden: torch.Tensor, num_heads: int, k: int, vocab_size: int | None = None) -> torch.Tensor:
        """The ``k`` most likely tokens of each of the first ``num_heads`` heads.

        Args:
            hidden: ``(..., hidden_size)`` last hidden states (decoding passes one, ``(hidden_size,)``).
            num_heads: heads to run; k: tokens per head; vocab_size: only ids below it (the
                tokenizer's vocabulary when the lm_head is padded wider); None: every id.

        Returns:
            ``(..., num_heads, k)`` token ids, most likely first:
            ``topk(self(hidden, num_heads)[..., :vocab_size], k)``.
            With a proposal vocabulary of at least ``k`` usable ids the top-k runs over those
            ids' logits only, with no full-width row built (the decoding hot path).
        """
        if self.share_lm_head and self.proposal_vocab is not None and self._lm_head:
            ids, sub, _ = self._proposal_logits(self.residual(hidden, num_heads), self._lm_head[0])
            if vocab_size is not None and int(ids[-1]) >= vocab_size:  # ids are sorted: drop the padding rows
                keep = int(torch.searchsorted(ids, vocab_size))
                ids, sub = ids[:keep], sub[..., :keep]
            if ids.numel() >= k:
                return ids[torch.topk(sub, k, dim=-1).indices]
        logits = self(hidden, num_heads)
        return torch.topk(logits[..., :vocab_size] if vocab_size is not None else logits, k, dim=-1).indices

    def residual(self, hidden: torch.Tensor, num_heads: int | None = None) -> torch.Tensor:
        """``(..., hidden_size)`` -> ``(..., num_heads, hidden_size)``: each head's blocks (shared-lm_head heads)."""
        return torch.stack([head[:self.num_layers](hidden) for head in self.heads[:num_heads]], dim=-2)

    def forward(self, hidden: torch.Tensor, num_heads: int | None = None) -> torch.Tensor:
        """Head logits.

        Args:
            hidden: ``(..., hidden_size)`` last hidden states (after the base model's final norm).
            num_heads: compute only the first ``num_heads`` heads (a shallow tree needs no more).

        Returns:
            ``(..., num_heads, vocab_size)``; ``[..., k, :]`` predicts the token k+2 positions on.
        """
        if hidden.shape[-1] != self.hidden_size:
            raise ValueError(f"hidden must have shape (..., {self.hidden_size}), got {tuple(hidden.shape)}")
        if self.share_lm_head:
            if not self._lm_head:
                raise RuntimeError("these Medusa heads share the base model's lm_head: call attach_lm_head first")
            lm_head = self._lm_head[0]
            x = self.residual(hidden, num_heads)
            if self.proposal_vocab is not None:
                return self._proposal_projection(x, lm_head)
            weight = getattr(lm_head, "weight", None)
            return lm_head(x if weight is None else x.to(weight.dtype))  # one matmul for all heads
        return torch.stack([head(hidden) for head in self.heads[:num_heads]], dim=-2)

    # ----- the reference format ------------------------------------------------------------------
    def reference_state_dict(self) -> dict[str, torch.Tensor]:
        """Tensors under the reference's keys (``{k}.{layer}.linear.weight``, ...), contiguous, on CPU."""
        return {k: v.detach().cpu().contiguous() for k, v in self.heads.state_dict().items()}

    def config_dict(self) -> dict:
        config = {"medusa_num_heads": self.num_heads, "medusa_num_layers": self.num_layers,
                  "base_model_name_or_path": self.base_model_name_or_path, "hidden_size": self.hidden_size,
                  "vocab_size": self.vocab_size, "share_lm_head": self.share_lm_head}
        if self.top_k_accuracy is not None:
            config["top_k_accuracy"] = [[round(float(a), 4) for a in row] for row in self.top_k_accuracy]
        if self.proposal_vocab is not None:
            config["proposal_vocab"] = self.proposal_vocab.tolist()
        return config

    def save(self, folder: str | Path, fmt: str = "safetensors", dtype: torch.dtype | None = None) -> Path:
        """Write ``config.json`` and the weights (``fmt`` ``"safetensors"`` or ``"pt"``) into ``folder``,
        stored in ``dtype`` when given (e.g. ``torch.float16`` halves the file; :func:`load_heads`
        casts to the target's dtype)."""
        if fmt not in ("safetensors", "pt"):
            raise ValueError(f"fmt must be 'safetensors' or 'pt', got {fmt!r}")
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tensors = self.reference_state_dict()
        if dtype is not None:
            tensors = {k: v.to(dtype) for k, v in tensors.items()}
        for stale in (WEIGHTS_SAFETENSORS, WEIGHTS_PT):
            (folder / stale).unlink(missing_ok=True)
        if fmt == "safetensors":
            from safetensors.torch import save_file

            save_file(tensors, str(folder / WEIGHTS_SAFETENSORS), metadata={"format": "pt"})
        else:
            torch.save(tensors, folder / WEIGHTS_PT)
        config = self.config_dict()
        text = json.dumps({**config, "proposal_vocab": "@"} if "proposal_vocab" in config else config, indent=2)
        # The proposal vocabulary on one line: thousands of ids, one a line, would bury the rest.
        text = text.replace('"proposal_vocab": "@"', '"proposal_vocab": ' + json.dumps(config.get("proposal_vocab")))
        (folder / CONFIG_NAME).write_text(text + "\n")
        return folder

    @classmethod
    def from_reference(cls, tensors: dict[str, torch.Tensor], config: dict) -> "MedusaHeads":
        """Build heads from reference-format tensors; head and layer counts come from the tensors.

        Raises:
            MedusaLoadError: unknown keys, missing layers, heads that disagree on having a projection.
        """
        tensors = {re.sub(r"^(medusa_head|heads)\.", "", k): v for k, v in tensors.items()}
        pattern = re.compile(r"^(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)$")
        parsed = {}
        for key in tensors:
            m = pattern.match(key)
            if m is None:
                raise MedusaLoadError(f"unexpected tensor {key!r} in Medusa weights (expected keys like "
                                      "'0.0.linear.weight' and '0.1.weight')")
            parsed[key] = (int(m.group(1)), int(m.group(2)), m.group(3))
        if not parsed:
            raise MedusaLoadError("the Medusa weights file holds no tensors")
        num_heads = 1 + max(k for k, _, _ in parsed.values())
        layers = {k: sorted({i for kk, i, what in parsed.values() if kk == k and what.startswith("linear")})
                  for k in range(num_heads)}
        num_layers = len(layers[0])
        for k in range(num_heads):
            if layers[k] != list(range(num_layers)):
                raise MedusaLoadError(f"Medusa head {k} has residual layers {layers[k]}, head 0 has "
                                      f"{list(range(num_layers))}")
        projected = [f"{k}.{num_layers}.weight" in tensors for k in range(num_heads)]
        if any(projected) and not all(projected):
            raise MedusaLoadError("some Medusa heads have their own output projection and some do not")
        if num_layers:
            hidden = int(tensors["0.0.linear.weight"].shape[1])
        elif all(projected):
            hidden = int(tensors[f"0.{num_layers}.weight"].shape[1])
        else:
            raise MedusaLoadError("Medusa heads with no residual layers and no projection hold nothing")
        vocab = int(tensors[f"0.{num_layers}.weight"].shape[0]) if projected[0] else int(config.get("vocab_size", 0))
        declared = config.get("medusa_num_heads")
        if declared is not None and declared != num_heads:
            import logging

            logging.getLogger(__name__).info("config.json says %s Medusa heads; the weights hold %d (using %d)",
                                             declared, num_heads, num_heads)
        accuracy = config.get("top_k_accuracy")
        heads = cls(hidden, vocab, num_heads, num_layers, share_lm_head=not projected[0],
                    base_model_name_or_path=str(config.get("base_model_name_or_path") or ""),
                    top_k_accuracy=accuracy if isinstance(accuracy, list) and len(accuracy) == num_heads else None)
        proposal = config.get("proposal_vocab")
        if proposal is not None:
            if not isinstance(proposal, list) or not all(isinstance(t, int) for t in proposal) or projected[0]:
                raise MedusaLoadError("config.json's proposal_vocab must be a list of token ids, for heads that "
                                      "share the base model's lm_head")
            try:
                heads.set_proposal_vocab(proposal)
            except ValueError as e:
                raise MedusaLoadError(f"config.json's proposal_vocab: {e}") from None
        missing, unexpected = heads.heads.load_state_dict(tensors, strict=False)
        if missing or unexpected:
            raise MedusaLoadError(f"Medusa weights do not fit: missing {missing[:4]}, unexpected {unexpected[:4]}")
        return heads


def _read_folder(folder: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config, tensors) from a local checkpoint folder."""
    config_path = folder / CONFIG_NAME
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    if (folder / WEIGHTS_SAFETENSORS).is_file():
        from safetensors.torch import load_file

        return config, load_file(str(folder / WEIGHTS_SAFETENSORS))
    if (folder / WEIGHTS_PT).is_file():
        import pickle

        try:  # weights_only: torch's restricted unpickler, so a pickle cannot run code
            return config, torch.load(folder / WEIGHTS_PT, map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError) as e:
            raise MedusaLoadError(f"could not load Medusa heads from {str(folder)!r}: {WEIGHTS_PT} holds more "
                                  f"than tensors, or is damaged ({type(e).__name__}); save the heads as "
                                  f"{WEIGHTS_SAFETENSORS}") from None
    raise MedusaLoadError(f"could not load Medusa heads from {str(folder)!r}: no {WEIGHTS_SAFETENSORS} or "
                          f"{WEIGHTS_PT} in the folder")


def _download(repo_id: str) -> Path:
    """A local folder holding ``repo_id``'s config and weights (hub cache first, then one probe, then download)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise MedusaLoadError(f"could not load Medusa heads {repo_id!r}: no such folder, and not a valid "
                              f"Hugging Face hub id ({e})") from None

    def fetch(offline: bool) -> Path:
        folder = None
        for name in (WEIGHTS_SAFETENSORS, WEIGHTS_PT):
            try:
                folder = Path(hf_hub_download(repo_id, name, local_files_only=offline)).parent
                break
            except Exception as e:  # missing file, or not cached
                last = e
        if folder is None:
            raise last
        try:
            hf_hub_download(repo_id, CONFIG_NAME, local_files_only=offline)
        except Exception:
            pass  # the tensors say everything that matters
        return folder

    try:
        return fetch(offline=True)
    except Exception:
        pass
    try:
        probe_hub(repo_id)
    except ModelLoadError as e:
        raise MedusaLoadError(str(e).replace("could not load model", "could not load Medusa heads")) from None
    try:
        return fetch(offline=False)
    except Exception as e:
        raise MedusaLoadError(f"could not load Medusa heads {repo_id!r} from the hub: {type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''} (expected {WEIGHTS_SAFETENSORS} or "
                              f"{WEIGHTS_PT})") from None


def load_heads(spec: str | Path, target=None) -> MedusaHeads:
    """Load Medusa heads from a local folder or a hub id, in eval mode with gradients off.

    Args:
        spec: a checkpoint folder or a Hugging Face hub id (see the module docstring).
        target: optional :class:`~playground.engine.models.LoadedModel` (or anything with
            ``model``): the heads move to its device and dtype and share its ``lm_head``.

    Raises:
        MedusaLoadError: not found, unreachable hub, malformed weights, or a hidden size
            that does not match the target's.
    """
    path = Path(str(spec)).expanduser()
    if path.is_dir():
        config, tensors = _read_folder(path)
    elif str(spec).startswith(("/", ".", "~")) or path.exists():
        raise MedusaLoadError(f"could not load Medusa heads {str(spec)!r}: no such folder")
    else:
        config, tensors = _read_folder(_download(str(spec)))
    heads = MedusaHeads.from_reference(tensors, config)
    if target is not None:
        model = target.model
        hidden = int(model.config.get_text_config().hidden_size)
        if hidden != heads.hidden_size:
            raise MedusaLoadError(f"Medusa heads {str(spec)!r} were trained for hidden size {heads.hidden_size}, "
                                  f"but the target has hidden size {hidden}")
        param = next(model.parameters())
        heads.to(device=param.device, dtype=param.dtype)
        heads.attach_lm_head(model.get_output_embeddings())
    heads.eval().requires_grad_(False)
    return heads


def heads_spec(target_spec: str, medusa_spec: str | None = None) -> str | None:
    """The heads to load: ``medusa_spec`` when given (``"none"`` for none); otherwise the shipped
    heads (``assets/medusa/default``) for the embedded default target (``models.shipped_asset_spec``)."""
    return shipped_asset_spec(DEFAULT_HEADS_DIR, target_spec, medusa_spec, CONFIG_NAME)
