"""Mixture: one candidate tree merged from several drafters, pruned to the budget, verified in one pass.

Each member drafter proposes as it would alone; the proposals are merged into one prefix tree
(:func:`merge_candidates`: nodes with the same token path are one node, which keeps the source
of the first member that proposed it and the highest of the members' acceptance estimates), the
per-step budget (:mod:`playground.engine.budget`) keeps the part that pays on this device, and
the target verifies it in one pass. Every member then sees the step's verdict, so each keeps
learning (suffix trees, the adjacency table, the n-gram pool) whoever proposed the tokens.

Members must be deterministic (the mixture's nodes carry one-hot proposals, so the one-hot
speculative-sampling rule keeps the target's distribution): suffix decoding, prompt lookup,
token recycling, Lookahead (its Jacobi window rides in the pass as extra queries), Medusa and
EAGLE (its dynamic tree is a deterministic function of the prefix). Members that read the
target's features must read the same layers, so Medusa and EAGLE do not mix.
With EAGLE the mixture is no longer training-free: the head drafts where the answer is new
text, suffix trees and prompt lookup where it copies.
The idea of merging several drafters' trees under one verification is SpecInfer's (Miao et al.
2024, "collective boost-tuned" small models merged into a token tree).
"""

from __future__ import annotations

import torch

from .budget import AcceptanceEstimator, GateMemory, probability_bin, with_budget_knob
from .step_cost import build_with_budget
from .drafter import DecodeState, Drafter, StepResult
from .events import SOURCE_LOOKAHEAD, SOURCE_PROMPT_LOOKUP, SOURCE_TARGET
from .limits import ChoiceKnob
from .registry import MethodInfo, register
from .tree import Candidates, ExtraQueries

MIXTURE_MEMBERS = ("suffix", "prompt_lookup", "recycling", "rest", "lookahead", "medusa", "eagle")
"""Drafters a mixture may hold (the deterministic ones)."""
DEFAULT_MEMBERS = "suffix,rest,recycling,prompt_lookup"
TRAINING_FREE_MEMBERS = "suffix,recycling,prompt_lookup"
"""The members that need nothing but the target (no datastore)."""
MIXTURE_SUFFIX_SPEC_FACTOR = 1.0
"""Suffix decoding's ``max_spec_factor`` as a mixture member (the method alone defaults to 2.0). The
other members fill the merged tree, and at 2.0 the default mixture ran at 1.39x against 1.41x at 1.0
(dev set, 2 first turns a category, 64 tokens, one round-robin run, a 2-vCPU Zen 5 EPYC, 2026-12-06)."""
EAGLE_MEMBERS = "eagle,rest,suffix,prompt_lookup"
"""The mixture with EAGLE: the trained head for new text, the two copying drafters for the rest."""
SOURCE_EAGLE = "eagle"
"""Source tag of an EAGLE member's tokens in a mixture (EAGLE alone tags them by depth)."""
UNKNOWN_ACCEPT = 0.3
"""Acceptance estimate of a node whose member gives none."""


def parse_members(value) -> str:
    """Check a comma-separated member list (order = priority of sources); returns it normalised.

    Raises:
        ValueError: empty, unknown or repeated members.
    """
    names = [v.strip() for v in (value.split(",") if isinstance(value, str) else list(value)) if str(v).strip()]
    if not names:
        raise ValueError("members must name at least one drafter among " + ", ".join(MIXTURE_MEMBERS))
    bad = [n for n in names if n not in MIXTURE_MEMBERS]
    if bad:
        raise ValueError(f"members must be among {', '.join(MIXTURE_MEMBERS)}, separated by commas (as in "
                         f"{DEFAULT_MEMBERS}), got {', '.join(bad)}")
    if len(set(names)) != len(names):
        raise ValueError(f"members must not repeat, got {','.join(names)}")
    return ",".join(names)


MEMBERS_KNOB = ChoiceKnob(
    "members", "Members", (DEFAULT_MEMBERS, TRAINING_FREE_MEMBERS, "suffix,rest,recycling,prompt_lookup,lookahead",
                           EAGLE_MEMBERS),
    DEFAULT_MEMBERS, info="Mixture: drafters whose candidates are merged into one tree, in priority order "
                          "(a node shared by several keeps the first one's source).",
    parse=parse_members, custom_label="a comma-separated list of " + ", ".join(MIXTURE_MEMBERS))


def merge_candidates(parts: list[Candidates]) -> tuple[Candidates, list[list[int]]]:
    """Merge candidate trees into one prefix tree.

    Steps: 1. walk each part's nodes in order (parents first); 2. a node whose (merged parent,
    token) already exists is that node (its acceptance estimate becomes the higher of the two);
    3. otherwise it is a new node with the part's source. The merged tree is in topological order.

    Args:
        parts: candidate trees rooted at the same token; ``draft_probs`` must be None.

    Returns:
        ``(merged, maps)``: ``maps[k][i]`` is the merged index of part k's node i. ``accept_probs``
        is None only when every part's is None (else :data:`UNKNOWN_ACCEPT` fills missing ones).

    Raises:
        ValueError: a part with ``draft_probs`` (a sampled proposal cannot be merged exactly).
    """
    tokens: list[int] = []
    parents: list[int] = []
    sources: list[str] = []
    accept: list[float] = []
    index: dict[tuple[int, int], int] = {}
    maps: list[list[int]] = []
    any_accept = any(p.accept_probs is not None for p in parts)
    for part in parts:
        if part.draft_probs is not None:
            raise ValueError("merge_candidates: a part has draft_probs; only deterministic proposals can be merged")
        acc = part.accept_probs.tolist() if part.accept_probs is not None else [UNKNOWN_ACCEPT] * len(part)
        mapping: list[int] = []
        for t, p, s, a in zip(part.tokens.tolist(), part.parents.tolist(), part.sources, acc):
            parent = mapping[p] if p >= 0 else -1
            key = (parent, t)
            j = index.get(key)
            if j is None:
                j = index[key] = len(tokens)
                tokens.append(t)
                parents.append(parent)
                sources.append(s)
                accept.append(a)
            else:
                accept[j] = max(accept[j], a)
            mapping.append(j)
        maps.append(mapping)
    device = parts[0].tokens.device if parts else "cpu"
    merged = Candidates(torch.tensor(tokens, dtype=torch.long, device=device),
                        torch.tensor(parents, dtype=torch.long, device=device), sources,
                        accept_probs=torch.tensor(accept, dtype=torch.float32) if any_accept else None)
    return merged, maps


def reference_merge(parts: list[Candidates]) -> dict[tuple[int, ...], str]:
    """Slow obvious reference of :func:`merge_candidates`: token path -> source of the first part
    proposing it (the merged tree must hold exactly these paths, with these sources)."""
    out: dict[tuple[int, ...], str] = {}
    for part in parts:
        tokens, paths = part.tokens.tolist(), []
        for i, p in enumerate(part.parents.tolist()):
            paths.append((paths[p] if p >= 0 else ()) + (tokens[i],))
            out.setdefault(paths[-1], part.sources[i])
    return out


def _remap_extras(extras: ExtraQueries, mapping: list[int], merged_nodes: int) -> ExtraQueries:
    """The extras' attention ``(m, part_nodes + 1 + m)`` re-indexed to the merged tree's queries."""
    m, n = len(extras), len(mapping)
    attention = torch.zeros(m, merged_nodes + 1 + m, dtype=torch.bool)
    attention[:, 0] = extras.attention[:, 0]
    if n:
        attention[:, 1 + torch.tensor(mapping)] = extras.attention[:, 1:n + 1]
    attention[:, merged_nodes + 1:] = extras.attention[:, n + 1:]
    return ExtraQueries(extras.tokens, extras.positions, attention)


class CalibratedMember(Drafter):
    """A member whose ``accept_probs`` are its raw draft probabilities (EAGLE's), calibrated.

    Each node's estimate becomes an :class:`AcceptanceEstimator` posterior keyed by (probability
    bin, depth) with the raw probability as prior, so the merged tree's budget compares this
    member's nodes with the other members' calibrated ones on one scale.

    Args:
        inner: the member drafter; estimator: where the verdicts are counted; source: the tag of
            every node it proposes (:data:`SOURCE_EAGLE` for EAGLE, whatever the depth).
    """

    def __init__(self, inner: Drafter, estimator: AcceptanceEstimator, source: str):
        self.inner, self.estimator = inner, estimator
        self.name, self.source, self.feature_layers = inner.name, source, inner.feature_layers

    def begin(self, prompt_ids: list[int]) -> None:
        self.inner.begin(prompt_ids)

    def propose(self, state: DecodeState) -> Candidates:
        c = self.inner.propose(state)
        if c.accept_probs is not None and len(c):
            raw = c.accept_probs.tolist()
            keys = [(probability_bin(p), min(d, 4)) for p, d in zip(raw, c.depths())]
            c.accept_probs = self.estimator.estimate(c, keys, raw)
            c.sources = [self.source] * len(c)  # one colour for the member in the mixture's panel
        return c

    def update(self, result: StepResult) -> None:
        self.estimator.observe(result)
        self.inner.update(result)

    def finish(self, tokens: list[int], prompt_len: int) -> None:
        self.inner.finish(tokens, prompt_len)

    def info(self) -> dict:
        return self.inner.info()


def merged_keys(merged: Candidates, maps: list[list[int]], probs: list[float]) -> list[tuple[int, int, int]]:
    """The :class:`AcceptanceEstimator` key of each merged node, given its merged estimate in ``probs``:
    (bin of that estimate, depth up to 4, members proposing it up to 2). Members that agree on a
    token are right more often than either alone, which the merged estimate (the higher one) does
    not know."""
    agree = [0] * len(merged)
    for mapping in maps:
        for j in mapping:
            agree[j] += 1
    return [(probability_bin(p), min(d, 4), min(a, 2)) for p, d, a in zip(probs, merged.depths(), agree)]


class MixtureDrafter(Drafter):
    """Several drafters' candidates in one tree (see the module docstring).

    The merged tree's estimates are calibrated once more (``estimator``): each member's estimates
    are calibrated on its own nodes, but the budget keeps the merged nodes whose estimates are
    highest, so it picks each position's most hopeful member, and their errors add up. Measured on
    the dev set (2 first turns of each of 4 categories, 64 tokens, Sapphire Rapids Xeon), the kept
    trees promised 2.0-2.3 tokens a step where 1.5-1.8 came, and steps verified trees too large to
    pay. Each merged node's estimate becomes an :class:`AcceptanceEstimator` posterior keyed by
    :func:`merged_keys`, with the member's estimate as its prior.

    Args:
        members: ``(name, drafter)`` pairs in priority order; at most one may add extra queries.
        estimator: where the merged nodes' verdicts are counted (None: the members' estimates as
            they are).

    Raises:
        ValueError: no member, or a member that is not deterministic under sampling.
    """

    name = "mixture"
    source = "mixture"

    def __init__(self, members: list[tuple[str, Drafter]], estimator: AcceptanceEstimator | None = None):
        if not members:
            raise ValueError("a mixture needs at least one member drafter")
        self.members, self.estimator = members, estimator
        layers = {tuple(d.feature_layers) for _, d in members if d.feature_layers}
        if len(layers) > 1:
            raise ValueError(f"mixture members read different target features {sorted(layers)}; merge drafters that "
                             "read the same layers")
        self.feature_layers = layers.pop() if layers else ()  # every member sees the same DecodeState
        self.accepted_by: dict[str, int] = {}
        self.extras_owner: int | None = None

    def begin(self, prompt_ids: list[int]) -> None:
        for _, d in self.members:
            d.begin(list(prompt_ids))
        self.accepted_by = {}

    def propose(self, state: DecodeState) -> Candidates:
        parts, extras, owner = [], None, None
        for k, (_, d) in enumerate(self.members):
            c = d.propose(state)
            if c.draft_probs is not None:
                raise ValueError(f"mixture member {self.members[k][0]} proposed sampled tokens (draft_probs); "
                                 "only deterministic drafters can be merged")
            if c.extras is not None and extras is None:
                extras, owner = c.extras, k
            parts.append(Candidates(c.tokens, c.parents, c.sources, accept_probs=c.accept_probs))
        merged, maps = merge_candidates(parts)
        if self.estimator is not None and merged.accept_probs is not None and len(merged):
            probs = merged.accept_probs.tolist()
            merged.accept_probs = self.estimator.estimate(merged, merged_keys(merged, maps, probs), probs)
        self.extras_owner = owner
        if extras is not None:
            merged.extras = _remap_extras(extras, maps[owner], len(merged))
            merged.__post_init__()
        return merged

    def update(self, result: StepResult) -> None:
        if self.estimator is not None:
            self.estimator.observe(result)
        for c in result.path:
            s = result.candidates.sources[c]
            self.accepted_by[s] = self.accepted_by.get(s, 0) + 1
        for k, (_, d) in enumerate(self.members):
            d.update(result if k == self.extras_owner else
                     StepResult(result.candidates, result.path, result.bonus_token, result.tokens, None,
                                logits=result.logits))

    def finish(self, tokens: list[int], prompt_len: int) -> None:
        for _, d in self.members:
            d.finish(tokens, prompt_len)

    def info(self) -> dict[str, int]:
        """Accepted tokens so far by member source (``accepted_<source>``)."""
        return {f"accepted_{s}": n for s, n in sorted(self.accepted_by.items())}


def _build(engine, params: dict) -> MixtureDrafter:
    from .recycling import RECYCLING_METHOD, build_recycling
    from .registry import MethodSpec
    from .rest import REST_METHOD, build_rest, datastore_available
    from .suffix import SUFFIX_METHOD, build_suffix

    def defaults(info) -> dict:
        return {**{k.name: k.default for k in info.knobs}, "budget": "off"}

    # Each (members, budget) setting learns on its own: two mixtures side by side (the benchmark's
    # ``mixture`` and ``mixture:budget=off``) never read each other's outputs of the same prompt.
    budget = params.get("budget", "off")

    def make(p: dict) -> MixtureDrafter:
        members = []
        owner = f"mixture[{parse_members(p['members'])};budget={budget}]"
        for name in parse_members(p["members"]).split(","):
            if name == "medusa" and getattr(engine, "medusa", None) is None:
                continue  # Medusa joins only when heads are loaded
            if name == "rest" and p["members"] in MEMBERS_KNOB.choices and not datastore_available(engine):
                continue  # the presets run on any target; REST joins where a datastore exists (a custom list raises)
            if name == "eagle":
                if getattr(engine, "eagle", None) is None:
                    raise ValueError("mixture member eagle needs an EAGLE head: pass --eagle PATH_OR_HUB_ID (the "
                                     "default target loads assets/eagle/default)")
                estimator = engine.persistent(f"learned/{owner}/acceptance/eagle", AcceptanceEstimator)
                member = engine.make_drafter(MethodSpec("eagle", {}))
                member.gate_memory = engine.persistent(f"learned/{owner}/gate/eagle", GateMemory)  # not eagle's own
                members.append((name, CalibratedMember(member, estimator, SOURCE_EAGLE)))
                continue
            # Each member with its default knobs and no budget of its own (the merged tree is pruned);
            # learned state of its own (the mixture never reads what the suffix method learnt).
            if name == "suffix":
                knobs = {**defaults(SUFFIX_METHOD), "max_spec_factor": MIXTURE_SUFFIX_SPEC_FACTOR}
                members.append((name, build_suffix(engine, knobs, owner=owner)))
            elif name == "recycling":
                members.append((name, build_recycling(engine, defaults(RECYCLING_METHOD), owner=owner)))
            elif name == "rest":
                members.append((name, build_rest(engine, defaults(REST_METHOD), owner=owner)))
            else:
                member = engine.make_drafter(MethodSpec(name, {"budget": "off"}))
                if isinstance(getattr(member, "estimator", None), AcceptanceEstimator):  # calibration of its own
                    member.estimator = engine.persistent(f"learned/{owner}/acceptance/{name}", AcceptanceEstimator)
                members.append((name, member))
        return MixtureDrafter(members, engine.persistent(f"learned/{owner}/acceptance/merged", AcceptanceEstimator))
    return build_with_budget(engine, params, make)


METHOD = MIXTURE_METHOD = register(MethodInfo(
    name="mixture", label="Mixture",
    description="Candidates of several drafters (by default suffix trees, the REST datastore, token recycling and "
                "prompt lookup; optionally Lookahead, Medusa or EAGLE) merged into one tree, pruned to this device's budget and "
                "verified in one pass; each token keeps the colour of the drafter that proposed it.",
    lossless=True, knobs=with_budget_knob((MEMBERS_KNOB,)),
    sources=(SOURCE_TARGET, "suffix", "recycling", "rest", SOURCE_PROMPT_LOOKUP, SOURCE_LOOKAHEAD, "medusa_head_1",
             SOURCE_EAGLE),
    source_labels={SOURCE_EAGLE: "EAGLE (in a mixture)"}, build=_build, learns_across_runs=True,
    uses=lambda params: tuple(parse_members(params.get("members", DEFAULT_MEMBERS)).split(","))))
