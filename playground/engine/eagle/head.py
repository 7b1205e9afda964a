"""The EAGLE-3 draft head: the target's low, middle and high features plus the token just chosen,
through one Llama-style decoder layer, into a reduced draft vocabulary.

Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration of Large Language Models via
Training-Time Test". One draft *entry* at sequence position t reads

* ``hidden``: ``fc(concat(f_low, f_mid, f_high))`` ``(hidden_size,)`` for a committed position
  (the target's features at t), or, for a drafted position, the head's own pre-norm output at
  its parent's entry (the head feeds itself for deeper steps);
* ``embed``: the target's embedding of token t + 1 (the token chosen after position t);

and predicts token t + 2 over the draft vocabulary. The decoder layer (names as in vLLM's
``llama_eagle3.py``, so the checkpoint loads there unchanged)::

    x = concat(input_layernorm(embed), hidden_norm(hidden))        (2 * hidden_size)
    h = hidden + o_proj(attention(q_proj(x), k_proj(x), v_proj(x)))  causal over the entries, RoPE
    h = h + mlp(post_attention_layernorm(h))                         SwiGLU
    logits = lm_head(norm(h))                                        (draft_vocab_size,)

and ``h`` (pre-norm) is the next deeper entry's ``hidden``. Draft id i is target id ``i + d2t[i]``;
``t2d`` marks the target ids in the draft vocabulary.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """``(..., head_dim)`` cos and sin of Llama's rotary embedding at ``positions`` ``(...)``."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim))
    freqs = positions.float()[..., None] * inv
    emb = torch.cat([freqs, freqs], -1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x`` ``(..., heads, n, head_dim)`` rotated; ``cos``/``sin`` ``(..., n, head_dim)``."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos.unsqueeze(-3) + rotated * sin.unsqueeze(-3)


class EagleLayer(nn.Module):
    """vLLM's EAGLE-3 ``midlayer``: q/k/v read ``2 * hidden_size`` (embedding and hidden side by side)."""

    def __init__(self, hidden_size: int, intermediate_size: int, num_heads: int, num_kv_heads: int,
                 head_dim: int, eps: float):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(2 * hidden_size, num_heads * head_dim, bias=False)
        self.self_attn.k_proj = nn.Linear(2 * hidden_size, num_kv_heads * head_dim, bias=False)
        self.self_attn.v_proj = nn.Linear(2 * hidden_size, num_kv_heads * head_dim, bias=False)
        self.self_attn.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.mlp.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.mlp.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.input_layernorm = RMSNorm(hidden_size, eps)
        self.hidden_norm = RMSNorm(hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(hidden_size, eps)

    def qkv(self, embed: torch.Tensor, hidden: torch.Tensor, q_rows: slice = slice(None)):
        """``embed``, ``hidden`` ``(..., n, hidden_size)`` -> q ``(..., heads, n_q, d)`` for the rows
        ``q_rows`` (default all n); k, v ``(..., kv_heads, n, d)``."""
        x = torch.cat([self.input_layernorm(embed), self.hidden_norm(hidden)], -1)
        a = self.self_attn

        def split(t, heads):
            return t.unflatten(-1, (heads, self.head_dim)).transpose(-3, -2)
        return (split(a.q_proj(x[..., q_rows, :]), self.num_heads), split(a.k_proj(x), self.num_kv_heads),
                split(a.v_proj(x), self.num_kv_heads))

    def finish(self, hidden: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Residual, o_proj and MLP: ``attn`` ``(..., heads, n, d)`` -> pre-norm output ``(..., n, hidden_size)``."""
        h = hidden + self.self_attn.o_proj(attn.transpose(-3, -2).flatten(-2))
        m = self.mlp
        x = self.post_attention_layernorm(h)
        return h + m.down_proj(F.silu(m.gate_proj(x)) * m.up_proj(x))


class EagleHead(nn.Module):
    """The draft head (see the module docstring).

    Args:
        config: ``hidden_size``, ``intermediate_size``, ``num_attention_heads``,
            ``num_key_value_heads``, ``head_dim``, ``rms_norm_eps``, ``rope_theta``,
            ``vocab_size`` (the target's), ``draft_vocab_size``, ``target_hidden_size``,
            ``eagle_aux_hidden_state_layer_ids`` (the three feature layers, 0 = embeddings).
        draft_to_target: ``(draft_vocab_size,)`` int64 target id of each draft id (sorted), or
            None for the first ``draft_vocab_size`` ids.

    The target's input embedding is attached with :meth:`attach_embedding` (not saved: vLLM
    shares the target's too).
    """

    def __init__(self, config: dict, draft_to_target: torch.Tensor | None = None):
        super().__init__()
        self.config = dict(config)
        c = self.config
        h, th = int(c["hidden_size"]), int(c.get("target_hidden_size") or c["hidden_size"])
        self.hidden_size, self.target_hidden_size = h, th
        self.feature_layers = tuple(int(i) for i in c["eagle_aux_hidden_state_layer_ids"])
        self.fc = nn.Linear(len(self.feature_layers) * th, h, bias=False)
        self.midlayer = EagleLayer(h, int(c["intermediate_size"]), int(c["num_attention_heads"]),
                                   int(c["num_key_value_heads"]), int(c["head_dim"]), float(c["rms_norm_eps"]))
        self.norm = RMSNorm(h, float(c["rms_norm_eps"]))
        dv = int(c["draft_vocab_size"])
        self.lm_head = nn.Linear(h, dv, bias=False)
        ids = torch.arange(dv) if draft_to_target is None else torch.as_tensor(draft_to_target, dtype=torch.long)
        if ids.shape != (dv,) or not bool((ids[1:] > ids[:-1]).all()):
            raise ValueError(f"draft_to_target must be ({dv},) increasing target ids, got {tuple(ids.shape)}")
        self.register_buffer("draft_ids", ids, persistent=False)
        t2d = torch.zeros(int(c["vocab_size"]), dtype=torch.bool)
        t2d[ids] = True
        self.register_buffer("t2d", t2d, persistent=False)
        self._embed: list[nn.Module] = []  # the target's embedding, shared (not a submodule: never saved)
        self.rope_theta = float(c.get("rope_theta", 10000.0))

    @property
    def draft_vocab_size(self) -> int:
        return int(self.draft_ids.shape[0])

    def attach_embedding(self, embedding: nn.Module) -> "EagleHead":
        self._embed = [embedding]
        return self

    def d2t(self) -> torch.Tensor:
        """vLLM's offset map: target id = draft id + ``d2t[draft id]``."""
        return self.draft_ids - torch.arange(self.draft_vocab_size, device=self.draft_ids.device)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """``(..., 3 * target_hidden_size)`` target features -> ``(..., hidden_size)``."""
        want = len(self.feature_layers) * self.target_hidden_size
        if features.shape[-1] != want:
            raise ValueError(f"features must have shape (..., {want}), got {tuple(features.shape)}")
        return self.fc(features.to(self.fc.weight.dtype))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """``(..., hidden_size)`` pre-norm outputs -> ``(..., draft_vocab_size)`` logits."""
        return self.lm_head(self.norm(h))

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        if not self._embed:
            raise RuntimeError("EagleHead needs the target's input embedding: call attach_embedding first")
        return self._embed[0](ids).to(self.fc.weight.dtype)

    # ----- inference: one call per draft level, with a KV cache -----------------------------------
    def _rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`rope_cos_sin` at ``positions`` ``(n,)``, looked up in a table kept per device and dtype
        (grown to twice the largest position asked for): a draft level asks for a handful of rows."""
        top = int(positions.max()) + 1 if positions.numel() else 0
        table = getattr(self, "_rope_table", None)
        if table is None or table[0].shape[0] < top or table[0].dtype != dtype or table[0].device != positions.device:
            size = max(2 * top, 1024)
            table = rope_cos_sin(torch.arange(size, device=positions.device), self.midlayer.head_dim,
                                 self.rope_theta, dtype)
            self._rope_table = table
        return table[0][positions], table[1][positions]

    def new_cache(self) -> "DraftCache":
        return DraftCache(self)

    def step(self, cache: "DraftCache", hidden: torch.Tensor, token_ids: torch.Tensor, positions: torch.Tensor,
             attend: torch.Tensor, last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Add ``n`` entries to ``cache`` and return their logits and pre-norm outputs.

        Args:
            hidden: ``(n, hidden_size)`` (already projected or the head's own outputs).
            token_ids: ``(n,)`` target ids of the tokens after each entry's position.
            positions: ``(n,)`` position ids.
            attend: ``(n, len(cache) + n)`` bool: which cached and new entries each new one sees.
            last_only: the output of the last entry only. The others still enter the cache, but
                need only their keys and values: catching up over a prompt of n tokens then costs
                the k/v projections of n rows, not the whole layer and output layer over n rows
                (on a CPU, hundreds of ms over a 1000-token passage).

        Returns:
            ``(n, draft_vocab_size)`` float32 logits and ``(n, hidden_size)`` outputs (``(1, ...)``
            with ``last_only``).
        """
        n = token_ids.shape[0]
        if hidden.shape != (n, self.hidden_size) or positions.shape != (n,) or attend.shape != (n, len(cache) + n):
            raise ValueError(f"hidden ({n}, {self.hidden_size}), positions ({n},) and attend ({n}, {len(cache) + n}) "
                             f"expected, got {tuple(hidden.shape)}, {tuple(positions.shape)}, {tuple(attend.shape)}")
        layer = self.midlayer
        rows = slice(n - 1, n) if last_only else slice(None)
        q, k, v = layer.qkv(self.embed_tokens(token_ids), hidden, q_rows=rows)
        cos, sin = self._rope(positions, q.dtype)
        q, k = apply_rope(q, cos[rows], sin[rows]), apply_rope(k, cos, sin)
        keys, values = cache.append(k, v)
        # Grouped-query attention without copying the cache per query head; a bool mask (True: attend).
        attn = F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=attend[rows].to(q.device),
                                              enable_gqa=layer.num_heads != layer.num_kv_heads)[0]
        out = layer.finish(hidden[rows], attn)
        return self.logits(out).float(), out

    # ----- training: the unrolled draft over whole sequences (training-time test) -----------------
    def unrolled(self, features: torch.Tensor, next_ids: torch.Tensor, steps: int,
                 outputs: bool = False, start: int = 0) -> list[torch.Tensor]:
        """Training-time test: ``steps`` draft steps over every position at once.

        Args:
            features: ``(B, T, 3 * target_hidden_size)`` the target's features at positions 0..T-1.
            next_ids: ``(B, T + steps - 1)`` token ids: ``next_ids[:, t + j]`` is the token after
                position t + j (what step j at position t reads; ground truth, as in EAGLE-3).
            steps: unrolled draft steps (depths).

        Step j at position t stands for the draft at depth j + 1 below root t + 1: it sits at position
        t + j, reads the previous step's own output at t, and attends to step 0's entries at
        positions <= t and to its own earlier steps at t (its ancestors), exactly the entries the
        draft's cache holds at that depth during decoding.

        Returns:
            ``steps`` logits tensors ``(B, T, draft_vocab_size)``; step j's row t predicts token t + j + 2.
            With ``outputs``: the pre-norm outputs ``(B, T, hidden_size)`` instead (the trainer applies
            :meth:`logits` to the positions it scores only). With ``start`` > 0, steps after the first
            run at positions ``start .. T - 1`` only (rows ``t - start``): no later step reads another
            position's later steps, so positions that score nothing there (prompts) can be skipped.
        """
        B, T, _ = features.shape
        layer = self.midlayer
        rep = layer.num_heads // layer.num_kv_heads
        scale = 1.0 / math.sqrt(layer.head_dim)
        hidden = self.project(features)
        causal = torch.ones(T, T, dtype=torch.bool, device=features.device).tril()
        base = torch.arange(T, device=features.device)
        keys0 = values0 = None
        diag_k, diag_v, out_logits = [], [], []
        for j in range(steps):
            a = 0 if j == 0 else start  # the first position this step runs at
            if j == 1 and start:
                hidden = hidden[:, start:]
            q, k, v = layer.qkv(self.embed_tokens(next_ids[:, a + j:j + T]), hidden)
            cos, sin = rope_cos_sin(base[a:] + j, layer.head_dim, self.rope_theta, q.dtype)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)  # (B, heads, T - a, d)
            if j == 0:
                keys0, values0 = k, v
            else:
                diag_k.append(k)
                diag_v.append(v)
            s0 = (q @ keys0.transpose(-1, -2)) * scale
            s0 = s0.masked_fill(~causal[a:], float("-inf"))
            sd = [(q * dk).sum(-1, keepdim=True) * scale for dk in diag_k]  # (B, heads, T, 1) each
            p = torch.softmax(torch.cat([s0] + sd, -1).float(), -1).to(q.dtype)
            attn = p[..., :T] @ values0
            for i, dv in enumerate(diag_v):
                attn = attn + p[..., T + i:T + i + 1] * dv
            hidden = layer.finish(hidden, attn)
            out_logits.append(hidden if outputs else self.logits(hidden).float())
        return out_logits


class DraftCache:
    """The head's KV cache: ``(kv_heads, length, head_dim)`` keys and values, grown by :meth:`append`."""

    def __init__(self, head: EagleHead):
        layer = head.midlayer
        p = head.fc.weight
        self.keys = torch.zeros(layer.num_kv_heads, 0, layer.head_dim, dtype=p.dtype, device=p.device)
        self.values = self.keys.clone()

    def __len__(self) -> int:
        return int(self.keys.shape[1])

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys = torch.cat([self.keys, k], 1)
        self.values = torch.cat([self.values, v], 1)
        return self.keys, self.values

    def crop(self, length: int) -> None:
        self.keys, self.values = self.keys[:, :length], self.values[:, :length]
