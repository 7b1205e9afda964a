"""Candidate sets (chains and trees are one data type) and their tree attention buffers.

A drafter proposes :class:`Candidates`: ``n`` tokens, each with the index of its
parent (``-1`` for a child of the last emitted token, the *root*), in topological
order (``parents[i] < i``). The target scores the root plus all candidates in one
forward pass in which every query attends to the cached prefix, to the root, to its
own ancestors and to itself (tree attention, as in SpecInfer, Miao et al. 2024, and
Medusa, Cai et al. 2024), with position id = prefix length + depth.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Candidates:
    """Tokens proposed by a drafter, as a tree rooted at the last emitted token.

    Attributes:
        tokens: ``(num_nodes,)`` int64 candidate token ids.
        parents: ``(num_nodes,)`` int64; ``parents[i]`` is the index of node i's parent,
            ``-1`` for children of the root; ``parents[i] < i``.
        sources: ``num_nodes`` source tags (``"draft"``, ``"prompt_lookup"``, ...).
        draft_probs: ``(num_nodes, vocab_size)`` float32 or None: the distribution q each
            token was sampled from (after the same temperature/top-k/top-p as the target).
            None means the drafter is deterministic (q is one-hot on the token), which is
            also the case for greedy drafting.
        extras: optional :class:`ExtraQueries`, the drafter's own query tokens scored in the
            same forward pass after the candidates (Lookahead's Jacobi window); never verified,
            never kept in the cache, never seen by the candidates.
        accept_probs: ``(num_nodes,)`` float32 in [0, 1] or None: the drafter's estimate that node
            i is accepted given that its parent is (the per-step budget keeps only nodes whose
            expected accepted tokens pay for their verification cost). None: no estimate (the
            budget then keeps the proposal as it is).

    Raises:
        ValueError: on shape mismatch or parents not in topological order.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    sources: list[str]
    draft_probs: torch.Tensor | None = None
    extras: "ExtraQueries | None" = None
    accept_probs: torch.Tensor | None = None

    def __post_init__(self):
        n = self.tokens.shape[0] if self.tokens.dim() == 1 else -1
        if self.tokens.dim() != 1 or self.parents.shape != (n,) or len(self.sources) != n:
            raise ValueError(
                f"tokens (num_nodes,), parents (num_nodes,) and sources must agree; got "
                f"{tuple(self.tokens.shape)}, {tuple(self.parents.shape)}, {len(self.sources)} sources")
        if n and not bool((self.parents < torch.arange(n, device=self.parents.device)).all()):
            raise ValueError(f"parents must satisfy parents[i] < i, got {self.parents.tolist()}")
        if n and int(self.parents.min()) < -1:
            raise ValueError(f"parents must be >= -1, got {self.parents.tolist()}")
        if self.draft_probs is not None and (self.draft_probs.dim() != 2 or self.draft_probs.shape[0] != n):
            raise ValueError(f"draft_probs must have shape (num_nodes, vocab_size), got {tuple(self.draft_probs.shape)}")
        if self.accept_probs is not None and tuple(self.accept_probs.shape) != (n,):
            raise ValueError(f"accept_probs must have shape (num_nodes,) = ({n},), got {tuple(self.accept_probs.shape)}")
        if self.extras is not None and self.extras.attention.shape[1] != n + 1 + len(self.extras):
            raise ValueError(f"extras.attention must have shape (m, m + num_nodes + 1) = ({len(self.extras)}, "
                             f"{len(self.extras) + n + 1}), got {tuple(self.extras.attention.shape)}")

    @classmethod
    def empty(cls, device: torch.device | str = "cpu") -> "Candidates":
        """No proposal: the step is plain autoregressive decoding."""
        z = torch.zeros(0, dtype=torch.long, device=device)
        return cls(z, z.clone(), [])

    @classmethod
    def chain(cls, tokens: list[int] | torch.Tensor, source: str, draft_probs: torch.Tensor | None = None,
              device: torch.device | str = "cpu", accept_probs=None) -> "Candidates":
        """A chain: node i's parent is node i - 1 (``accept_probs``: optional ``(n,)`` estimates)."""
        t = torch.as_tensor(tokens, dtype=torch.long, device=device).reshape(-1)
        parents = torch.arange(-1, t.shape[0] - 1, dtype=torch.long, device=device)
        acc = None if accept_probs is None else torch.as_tensor(accept_probs, dtype=torch.float32).reshape(-1)
        return cls(t, parents, [source] * t.shape[0], draft_probs, accept_probs=acc)

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def is_chain(self) -> bool:
        n = len(self)
        return bool((self.parents == torch.arange(-1, n - 1, device=self.parents.device)).all())

    def depths(self) -> list[int]:
        """Depth of every node: 1 for children of the root."""
        depth: list[int] = []
        for p in self.parents.tolist():
            depth.append(1 if p < 0 else depth[p] + 1)
        return depth

    def children(self) -> list[list[int]]:
        """``children[0]`` lists the root's children; ``children[i + 1]`` lists node i's."""
        out: list[list[int]] = [[] for _ in range(len(self) + 1)]
        for i, p in enumerate(self.parents.tolist()):
            out[p + 1].append(i)
        return out


def tree_mask_bool(parents: torch.Tensor) -> torch.Tensor:
    """Ancestor-or-self matrix over the root plus the candidates.

    Args:
        parents: ``(num_nodes,)`` parent indices (``-1`` = root).

    Returns:
        ``(num_nodes + 1, num_nodes + 1)`` bool; entry ``[i, j]`` is True when query i may
        attend to key j (j is i itself or an ancestor of i). Row/column 0 is the root.
    """
    n = parents.shape[0]
    allowed = torch.eye(n + 1, dtype=torch.bool)
    allowed[:, 0] = True
    for i, p in enumerate(parents.tolist()):
        if p >= 0:
            allowed[i + 1] |= allowed[p + 1]
    return allowed


def tree_attention_inputs(parents: torch.Tensor, past_len: int, dtype: torch.dtype,
                          device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The additive 4D attention mask and position ids for one tree-verification pass.

    Args:
        parents: ``(num_nodes,)`` parent indices of the candidates.
        past_len: tokens already in the KV cache (the prefix).
        dtype: the model's dtype (transformers wants a float mask in that dtype; a bool
            mask is silently wrong with eager attention).
        device: the model's device.

    Returns:
        ``mask``: ``(1, 1, num_nodes + 1, past_len + num_nodes + 1)``, 0 where attention is
        allowed and ``finfo(dtype).min`` where it is blocked; ``position_ids``:
        ``(1, num_nodes + 1)`` = ``past_len + depth`` (depth 0 for the root).
    """
    n = parents.shape[0]
    allowed = tree_mask_bool(parents.cpu())
    mask = torch.full((n + 1, past_len + n + 1), torch.finfo(dtype).min, dtype=dtype)
    mask[:, :past_len] = 0
    mask[:, past_len:] = torch.where(allowed, torch.zeros((), dtype=dtype), mask[:, past_len:])
    depth = torch.tensor([0] + Candidates(torch.zeros(n, dtype=torch.long), parents.cpu(), [""] * n).depths(),
                         dtype=torch.long)
    return mask.to(device)[None, None], (past_len + depth).to(device)[None]


@dataclass
class ExtraQueries:
    """A drafter's own query tokens, scored in the verification pass after the candidates.

    The pass's queries are ``[root, candidates (num_nodes), extras (m)]``. Candidates never
    attend to extras; extras attend to the cached prefix and to whichever of the pass's
    queries ``attention`` allows. Their logits go back to the drafter in
    :class:`~playground.engine.drafter.StepResult` (``extra_logits``); their KV entries are dropped.

    Attributes:
        tokens: ``(m,)`` int64 token ids.
        positions: ``(m,)`` int64 position offsets from the root (the root is at ``past_len``,
            so an extra's position id is ``past_len + positions[i]``).
        attention: ``(m, num_nodes + 1 + m)`` bool; ``attention[i, k]`` is True when extra i may
            attend to query k of the pass (0 = root, 1..num_nodes = candidates, then extras).

    Raises:
        ValueError: on shape mismatch.
    """

    tokens: torch.Tensor
    positions: torch.Tensor
    attention: torch.Tensor

    def __post_init__(self):
        m = self.tokens.shape[0] if self.tokens.dim() == 1 else -1
        if (self.tokens.dim() != 1 or self.positions.shape != (m,) or self.attention.dim() != 2
                or self.attention.shape[0] != m or self.attention.dtype != torch.bool):
            raise ValueError(f"tokens (m,), positions (m,) and a bool attention (m, m + num_nodes + 1) must agree; "
                             f"got {tuple(self.tokens.shape)}, {tuple(self.positions.shape)}, "
                             f"{tuple(self.attention.shape)} {self.attention.dtype}")

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def pass_attention(candidates: Candidates) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention matrix and position offsets of one pass over ``[root, candidates, extras]``.

    Args:
        candidates: the proposal, possibly with ``extras``.

    Returns:
        ``allowed``: ``(q, q)`` bool with ``q = 1 + num_nodes + m``: the tree mask of
        :func:`tree_mask_bool` for root and candidates (which never see extras), then the
        extras' rows; ``offsets``: ``(q,)`` int64 position offsets from the root (depth for
        candidates, ``extras.positions`` for extras).
    """
    n, extras = len(candidates), candidates.extras
    m = len(extras) if extras is not None else 0
    allowed = torch.zeros(n + 1 + m, n + 1 + m, dtype=torch.bool)
    allowed[:n + 1, :n + 1] = tree_mask_bool(candidates.parents.cpu())
    offsets = torch.tensor([0] + candidates.depths(), dtype=torch.long)
    if m:
        allowed[n + 1:] = extras.attention.cpu()
        offsets = torch.cat([offsets, extras.positions.cpu().long()])
    return allowed, offsets


def additive_mask(allowed: torch.Tensor, past_len: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The float 4D mask transformers wants for a bool matrix over the new queries.

    Args:
        allowed: ``(q, q)`` bool over the pass's queries (True = may attend).
        past_len: cached prefix length; every query sees the whole prefix.

    Returns:
        ``(1, 1, q, past_len + q)`` in ``dtype``: 0 where allowed, ``finfo(dtype).min`` where blocked
        (a bool mask is silently wrong with eager attention).
    """
    q = allowed.shape[0]
    if allowed.shape != (q, q) or allowed.dtype != torch.bool:
        raise ValueError(f"allowed must be a square bool matrix (q, q), got {tuple(allowed.shape)} {allowed.dtype}")
    mask = torch.full((q, past_len + q), torch.finfo(dtype).min, dtype=dtype)
    mask[:, :past_len] = 0
    mask[:, past_len:] = torch.where(allowed.cpu(), torch.zeros((), dtype=dtype), mask[:, past_len:])
    return mask.to(device)[None, None]
