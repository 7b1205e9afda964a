"""A causal LM with a KV cache: one forward over a chain or a candidate tree, then commit.

Used for the target (verification) and for the draft model (drafting). The cache is
a transformers ``DynamicCache`` and is changed in place.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch
from transformers import DynamicCache

from .tree import additive_mask, tree_attention_inputs


def _hidden_kwargs(return_hidden: bool) -> dict:
    """Ask transformers for hidden states only when wanted (test doubles need not accept the flag)."""
    return {"output_hidden_states": True} if return_hidden else {}


def feature_layer(i: int, num_layers: int) -> int:
    """Feature layer ``i`` numbered from 0 to ``num_layers`` (as :meth:`CausalLM.capture_features` takes
    them: -1 is ``num_layers``, the last layer's output after the final norm).

    Raises:
        ValueError: ``i`` outside ``[-num_layers - 1, num_layers]``.
    """
    n = num_layers
    if not -n - 1 <= int(i) <= n:
        raise ValueError(f"feature layer {i} is outside [{-n - 1}, {n}] for a target of {n} layers")
    return int(i) % (n + 1)


class CausalLM:
    """Forward passes with a KV cache for one model.

    Args:
        model: a transformers causal LM in eval mode.
        device: the model's device (clocks synchronise on CUDA).
    """

    def __init__(self, model, device: torch.device | str | None = None):
        self.model = model
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.vocab_size = int(model.config.vocab_size)

    @property
    def num_layers(self) -> int:
        return int(self.model.config.get_text_config().num_hidden_layers)

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.get_text_config().hidden_size)

    @contextmanager
    def capture_features(self, layers: tuple[int, ...]):
        """Record the hidden states at ``layers`` during the forward passes inside the block.

        ``layers`` are numbered as transformers' ``output_hidden_states``: 0 = the embeddings
        (the input of decoder layer 0), i = the input of decoder layer i (the output of layer
        i - 1), ``num_layers`` = the last layer's output after the final norm; negative i counts
        from the end (-1 = ``num_layers``). Forward hooks read only these, so no pass collects
        every layer's states.

        Yields:
            a function returning ``(q_len, len(layers) * hidden_size)``: the features of the
            latest pass, concatenated in the order of ``layers``, in the model's dtype.

        Raises:
            ValueError: a layer index outside ``[-num_layers - 1, num_layers]``.
        """
        if not layers:
            yield lambda: None
            return
        n = self.num_layers
        decoder = self.model.get_decoder()
        seen: dict[int, torch.Tensor] = {}
        handles = []
        for pos, i in enumerate(layers):
            i = feature_layer(i, n)
            if i == n:
                handles.append(decoder.norm.register_forward_hook(
                    lambda mod, args, out, pos=pos: seen.__setitem__(pos, out)))
            else:
                handles.append(decoder.layers[i].register_forward_pre_hook(
                    lambda mod, args, kwargs, pos=pos: seen.__setitem__(
                        pos, args[0] if args else kwargs["hidden_states"]), with_kwargs=True))
        try:
            yield lambda: torch.cat([seen[pos][0] for pos in range(len(layers))], dim=-1)
        finally:
            for h in handles:
                h.remove()

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.model.config)

    def sync(self) -> None:
        """Wait for queued device work, so that a clock read after it is honest."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elif self.device.type == "mps":
            torch.mps.synchronize()

    def clock(self) -> float:
        """Seconds, read after synchronising the device."""
        self.sync()
        return time.perf_counter()

    @torch.inference_mode()
    def forward(self, cache: DynamicCache, input_ids: torch.Tensor, parents: torch.Tensor | None = None,
                return_hidden: bool = False, last_only: bool = False):
        """Run ``input_ids`` after the cached prefix and append them to the cache.

        Args:
            cache: the KV cache holding the prefix (``past_len`` tokens); grows by ``q_len``.
            input_ids: ``(q_len,)`` int64. With ``parents`` None they form a chain
                (ordinary causal attention).
            parents: optional ``(q_len - 1,)`` parent indices: ``input_ids[0]`` is the root
                and ``input_ids[1:]`` a candidate tree (see :mod:`playground.engine.tree`);
                attention then follows the tree and position ids are ``past_len + depth``.

            return_hidden: also return the last layer's hidden states (after the final norm).
            last_only: compute the output layer for the last query only (a prefill needs no
                more; over a long prompt the full ``(q_len, vocab_size)`` logits cost seconds
                and hundreds of MB). Logits (and hidden states) are then ``(1, ...)``.

        Returns:
            ``(q_len, vocab_size)`` float32 logits; row i predicts the token after node i.
            With ``return_hidden``: ``(logits, hidden)``, hidden ``(q_len, hidden_size)`` in the
            model's dtype.
        """
        if input_ids.dim() != 1 or input_ids.shape[0] == 0:
            raise ValueError(f"input_ids must have shape (q_len,) with q_len >= 1, got {tuple(input_ids.shape)}")
        past_len = cache.get_seq_length()
        q_len = input_ids.shape[0]
        ids = input_ids.to(self.device)[None]
        if parents is not None and parents.shape != (q_len - 1,):
            raise ValueError(f"parents must have shape ({q_len - 1},), got {tuple(parents.shape)}")
        is_chain = parents is None or bool((parents.cpu() == torch.arange(-1, q_len - 2)).all())
        if is_chain:
            position_ids = torch.arange(past_len, past_len + q_len, device=self.device)[None]
            keep = {"logits_to_keep": 1} if last_only and q_len > 1 else {}
            out = self.model(input_ids=ids, position_ids=position_ids, cache=cache, use_cache=True,
                             **_hidden_kwargs(return_hidden), **keep)
        else:
            mask, position_ids = tree_attention_inputs(parents, past_len, self.dtype, self.device)
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=position_ids,
                             cache=cache, use_cache=True, **_hidden_kwargs(return_hidden))
        logits = out.logits[0, -1:] if last_only else out.logits[0]
        if return_hidden:
            hidden = out.hidden_states[-1][0]
            return logits.float(), hidden[-1:] if last_only else hidden
        return logits.float()

    @torch.inference_mode()
    def forward_masked(self, cache: DynamicCache, input_ids: torch.Tensor, allowed: torch.Tensor,
                       position_offsets: torch.Tensor, return_hidden: bool = False):
        """Run ``input_ids`` after the cached prefix with an explicit attention matrix and positions.

        The general path behind :meth:`forward` (used for passes that carry a drafter's extra
        queries, e.g. Lookahead's Jacobi window, beside the candidate tree).

        Args:
            cache: the KV cache holding the prefix (``past_len`` tokens); grows by ``q_len``.
            input_ids: ``(q_len,)`` int64.
            allowed: ``(q_len, q_len)`` bool; ``allowed[i, k]``: query i may attend to query k
                (every query always sees the whole cached prefix).
            position_offsets: ``(q_len,)`` int64; position id of query i is ``past_len + offsets[i]``.

        Returns:
            ``(q_len, vocab_size)`` float32 logits (and the hidden states with ``return_hidden``,
            as for :meth:`forward`).
        """
        q_len = input_ids.shape[0] if input_ids.dim() == 1 else -1
        if q_len < 1 or allowed.shape != (q_len, q_len) or position_offsets.shape != (q_len,):
            raise ValueError(f"input_ids (q_len,), allowed (q_len, q_len) and position_offsets (q_len,) must agree, "
                             f"got {tuple(input_ids.shape)}, {tuple(allowed.shape)}, {tuple(position_offsets.shape)}")
        past_len = cache.get_seq_length()
        mask = additive_mask(allowed, past_len, self.dtype, self.device)
        position_ids = (past_len + position_offsets.long()).to(self.device)[None]
        out = self.model(input_ids=input_ids.to(self.device)[None], attention_mask=mask,
                         position_ids=position_ids, cache=cache, use_cache=True, **_hidden_kwargs(return_hidden))
        return (out.logits[0].float(), out.hidden_states[-1][0]) if return_hidden else out.logits[0].float()

    @staticmethod
    def crop(cache: DynamicCache, length: int) -> None:
        """Drop cached tokens beyond the first ``length``."""
        extra = cache.get_seq_length() - length
        if extra > 0:
            cache.crop(-extra)

    @staticmethod
    @torch.inference_mode()
    def keep(cache: DynamicCache, past_len: int, keep_offsets: list[int]) -> None:
        """Keep the prefix plus the nodes at ``keep_offsets`` of the last forward's queries.

        Args:
            past_len: cache length before the last forward.
            keep_offsets: increasing offsets (0 = the root) of the queries to keep, e.g. the
                root followed by the accepted path. The leading run ``0, 1, ..., j - 1`` is
                already in place; only the rest is moved, into the slots after it (one query by
                a copy per layer, more by a gather), then the tail is dropped. With one query
                out of place this took 0.73 ms where gathering every kept query took 1.09
                (the default target's 30 layers, 300 cached tokens, a 2-vCPU AMD EPYC).
        """
        n = len(keep_offsets)
        first = next((i for i, o in enumerate(keep_offsets) if o != i), n)
        if first < n:
            start = past_len + first
            tail = keep_offsets[first:]
            if len(tail) == 1:
                src = past_len + tail[0]
                for layer in cache.layers:
                    layer.keys[:, :, start].copy_(layer.keys[:, :, src])
                    layer.values[:, :, start].copy_(layer.values[:, :, src])
            else:
                idx = torch.tensor([past_len + o for o in tail], device=cache.layers[0].keys.device)
                end = start + len(tail)
                for layer in cache.layers:
                    layer.keys[:, :, start:end] = layer.keys.index_select(2, idx)
                    layer.values[:, :, start:end] = layer.values.index_select(2, idx)
        CausalLM.crop(cache, past_len + n)
