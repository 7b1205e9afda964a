"""Expected speedup of speculative decoding, and the measured costs that feed it.

Source: Leviathan, Kalman, Matias 2023, "Fast Inference from Transformers via Speculative
Decoding" (ICML), section 3. With acceptance rate alpha (each drafted token accepted
independently with probability alpha) and K drafted tokens per step:

* expected tokens per step (the bonus / correction token included, so it is tau)::

      E[tokens] = (1 - alpha^(K+1)) / (1 - alpha)          (= K + 1 when alpha = 1)

* cost of a step, in units of one target forward pass over one token::

      cost = K * c + verify_cost(K + 1)

  where c is the draft's cost per drafted token relative to one target forward, and
  ``verify_cost(n)`` is the cost of one target forward over n tokens relative to one over a
  single token. The paper assumes ``verify_cost(n) = 1`` (a GPU has idle compute at batch 1);
  on a CPU it grows quickly with n, which is why it is measured here
  (:func:`measure_verify_cost`);
* expected speedup over autoregressive decoding = E[tokens] / cost.

Plus the size of a Lookahead pass (Fu et al. 2024): ``1 + W*(N-1) + G*(N-1)`` tokens.

Everything here is plain arithmetic on floats except :func:`measure_verify_cost`, which
times the loaded target, and :func:`cpu_isa`, which asks torch for this CPU's vector instructions
(once, at import, to choose :data:`FALLBACK`). Errors are ``ValueError`` naming the bound.
"""

from __future__ import annotations

import bisect
import json
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence, Union

from .limits import MAX_SPECULATIVE_TOKENS

K_PRESETS = {"conservative": 2, "default": 4, "aggressive": 8}
"""Common choices of K (speculative tokens per step) by appetite for risk."""

MEASUREMENTS_FILE = Path(__file__).resolve().parents[2] / "assets" / "measurements.json"
"""The project's measured figures (written by ``python -m playground.measure``); its ``verify_cost``
records feed :data:`FALLBACK` (:func:`fallback_record`)."""

DEFAULT_MEASURE_SIZES = (1, 2, 3, 5, 9, 17)
VERIFY_COST_SIZES = (1, 2, 3, 4, 5, 8, 9, 12, 16, 17, 24, 32, 48, 65)
"""Pass sizes of the engine's one kept verify-cost curve (``Engine.verify_cost()``): K + 1 for the
draft model's K, and up to EAGLE's largest tree (64 nodes) plus its root."""
"""Token counts timed by :func:`measure_verify_cost` by default (K + 1 for K = 1, 2, 4, 8, 16)."""


def _check_alpha(alpha: float) -> float:
    alpha = float(alpha)
    if not (0.0 <= alpha <= 1.0) or alpha != alpha:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    return alpha


def _check_k(k: int, k_max: int = MAX_SPECULATIVE_TOKENS) -> int:
    if isinstance(k, bool) or int(k) != k or not (0 <= k <= k_max):
        raise ValueError(f"k must be in [0, {k_max}], got {k}")
    return int(k)


def _check_c(c: float) -> float:
    c = float(c)
    if not (c >= 0.0) or math.isinf(c):
        raise ValueError(f"c (draft cost per token relative to one target forward) must be >= 0, got {c}")
    return c


# ----- verification cost -------------------------------------------------------------------
ORIGIN_FORWARDS = "forwards"
"""A :class:`VerifyCost` timed on this device as target forwards over n tokens (the Theory tab's)."""
ORIGIN_STEPS = "steps"
"""A :class:`VerifyCost` timed on this device as real decoding steps (the per-step budget's)."""
ORIGINS = ("", ORIGIN_FORWARDS, ORIGIN_STEPS)


@dataclass(frozen=True)
class VerifyCost:
    """Relative cost of one target forward over n tokens (1.0 at n = 1), from a table.

    Between table sizes the cost is interpolated linearly; beyond the largest size it is
    extrapolated along the last segment's slope; below the smallest it is the smallest's.

    Attributes:
        table: tokens per forward n -> relative cost (needs n = 1 or is normalised to its smallest n).
        seconds: the measured absolute times behind the table (n -> seconds), when measured.
        source: where the numbers come from, in words (shown next to the chart).
        origin: how this device measured it: :data:`ORIGIN_FORWARDS` (target forwards over n
            random tokens, :func:`measure_verify_cost`: the Theory tab's curve),
            :data:`ORIGIN_STEPS` (real decoding steps verifying n - 1 candidates: the per-step
            budget's step cost, Medusa's tree calibration), or ``""`` when not measured on this
            device (the project's record, a constant). Panels tell the curves apart by it, never
            by the words of ``source``.

    Raises:
        ValueError: an empty table, an entry that is not n >= 1 -> cost > 0, or an unknown origin.
    """

    table: Mapping[int, float]
    seconds: Mapping[int, float] = field(default_factory=dict)
    source: str = ""
    origin: str = ""

    def __post_init__(self):
        if not self.table:
            raise ValueError("a verify-cost table needs at least one entry")
        if self.origin not in ORIGINS:
            raise ValueError(f"verify cost origin must be one of {ORIGINS}, got {self.origin!r}")
        for n, v in self.table.items():
            if int(n) != n or n < 1 or not (v > 0):
                raise ValueError(f"verify cost table entries must be n >= 1 -> cost > 0, got {n} -> {v}")
        # Sorted once: drafters price candidates dozens of times a step.
        object.__setattr__(self, "_sizes", sorted(self.table))
        object.__setattr__(self, "_costs", [float(self.table[n]) for n in self._sizes])

    def __call__(self, n: int) -> float:
        """Relative cost of a forward over ``n`` tokens (``n`` >= 1)."""
        if n < 1:
            raise ValueError(f"n (tokens per forward) must be >= 1, got {n}")
        sizes, costs = self._sizes, self._costs
        if len(sizes) == 1 or n <= sizes[0]:
            return costs[0]
        i = bisect.bisect_left(sizes, n)
        if i < len(sizes) and sizes[i] == n:
            return costs[i]
        lo, hi = (i - 1, i) if i < len(sizes) else (len(sizes) - 2, len(sizes) - 1)
        slope = (costs[hi] - costs[lo]) / (sizes[hi] - sizes[lo])
        return max(costs[0], costs[lo] + slope * (n - sizes[lo]))

    def monotone(self) -> "VerifyCost":
        """The same table fitted robustly to a non-decreasing curve in n (:func:`robust_monotone`):
        a spike (one size timed above both its neighbours, as a busy machine does) is capped at the
        larger neighbour, then dips are pooled with their neighbours (isotonic regression), so one
        noisy sample moves only its own neighbourhood, never the whole curve. The cost at the
        smallest n (1.0 at n = 1) stays the floor."""
        sizes = sorted(self.table)
        fitted = robust_monotone([float(self.table[n]) for n in sizes])
        return VerifyCost(dict(zip(sizes, fitted)), self.seconds,
                          f"{self.source} (made non-decreasing in n)" if self.source else "", self.origin)

    @property
    def measured_here(self) -> bool:
        """Whether this device measured the curve (:attr:`origin` set), not another machine."""
        return bool(self.origin)

    def as_dict(self) -> dict:
        """Plain data (JSON- and pickle-safe): ``{"table": {n: cost}, "seconds": {...}, "source": str,
        "origin": str}``."""
        return {"table": {int(k): float(v) for k, v in self.table.items()},
                "seconds": {int(k): float(v) for k, v in self.seconds.items()}, "source": self.source,
                "origin": self.origin}

    @classmethod
    def from_dict(cls, d: Mapping) -> "VerifyCost":
        return cls({int(k): float(v) for k, v in d["table"].items()},
                   {int(k): float(v) for k, v in (d.get("seconds") or {}).items()}, d.get("source", ""),
                   d.get("origin", ""))


def isotonic(values: Sequence[float]) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in least squares (pool-adjacent-violators):
    each run of values that decreases is replaced by its mean. ``[1, 3, 2, 4]`` -> ``[1, 2.5, 2.5, 4]``."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in values:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, n1), (m2, n2) = blocks.pop(-2), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    return [m for m, n in blocks for _ in range(int(n))]


def robust_monotone(costs: Sequence[float]) -> list[float]:
    """A non-decreasing fit of costs measured at increasing sizes, robust to one noisy sample.

    Steps: 1. cap each interior point at the larger of its two neighbours (a spike above both is
    noise: on a monotone curve the cap changes nothing); 2. isotonic regression
    (:func:`isotonic`) of the capped points; 3. nothing below the first point (the unit, n = 1),
    which keeps its value. ``[1, 2.58, 1.25, 1.4, 1.8]`` -> ``[1, 1.25, 1.25, 1.4, 1.8]``, where a
    running maximum would give ``[1, 2.58, 2.58, 2.58, 2.58]``.
    """
    costs = [float(c) for c in costs]
    if len(costs) < 2:
        return costs
    capped = [costs[0]] + [min(costs[i], max(costs[i - 1], costs[i + 1])) for i in range(1, len(costs) - 1)] \
        + [costs[-1]]
    fitted = isotonic(capped)
    return [costs[0]] + [max(costs[0], v) for v in fitted[1:]]


CONSTANT_VERIFY_COST = VerifyCost({1: 1.0}, source="constant 1 (the paper's assumption: verifying K + 1 "
                                                   "tokens costs one forward)")


def verify_cost_from_record(record: Mapping, label: str = "") -> VerifyCost:
    """A :class:`VerifyCost` from a ``verify_cost`` record of :data:`MEASUREMENTS_FILE`
    (``relative``: n -> cost), its source naming the machine. ``seconds`` stays empty: these are
    another machine's timings, not this device's."""
    table = {int(n): float(v) for n, v in record["relative"].items()}
    where = label or record.get("machine", "another machine")
    return VerifyCost(table, source=(
        f"measured on {where} ({record.get('device', 'cpu')}, {record.get('dtype', '?')}, "
        f"{record.get('threads', '?')} threads, {record.get('when', 'undated')}; the project's measurement), "
        "not on this device"))


def cpu_isa() -> str | None:
    """``"avx512"`` or ``"avx2"``: the vector instructions PyTorch uses on this CPU (None if neither
    or unknown). The project's CPU measurements differ between the two."""
    try:
        import torch

        cap = str(torch.backends.cpu.get_cpu_capability()).lower()
    except Exception:  # noqa: BLE001 - an old torch or an odd platform: unknown
        return None
    return "avx512" if "avx512" in cap else "avx2" if "avx2" in cap else None


def fallback_record(data: Mapping, isa: str | None = None) -> tuple[dict, dict] | None:
    """``(record, machine)`` of the CPU verify-cost record to use until this device is measured: the
    newest of a machine with instruction set ``isa`` (this CPU's, :func:`cpu_isa`, when None), else
    the newest of any CPU (records are kept newest first); None when ``data`` has no CPU record."""
    machines = data.get("machines") or {}
    cpu = [r for r in data.get("verify_cost", []) if r.get("device", "cpu") == "cpu"]
    isa = cpu_isa() if isa is None else isa
    record = next((r for r in cpu if machines.get(r.get("machine"), {}).get("isa") == isa), cpu[0] if cpu else None)
    return None if record is None else (record, machines.get(record.get("machine"), {}))


def load_fallback(path: Path | str = MEASUREMENTS_FILE, isa: str | None = None) -> VerifyCost:
    """The verify cost to use until this device is measured (:func:`fallback_record` of ``path``: the
    newest CPU measurement on a machine with this CPU's instruction set, else the newest on any);
    the paper's constant 1 when the file has none."""
    try:
        found = fallback_record(json.loads(Path(path).read_text()), isa)
    except (OSError, ValueError):
        found = None
    if found is None:
        return VerifyCost({1: 1.0}, source=f"constant 1 ({Path(path).name} has no CPU verify-cost measurement)")
    record, machine = found
    return verify_cost_from_record(record, machine.get("label", ""))


FALLBACK = load_fallback()
"""This project's measured verify cost (:data:`MEASUREMENTS_FILE`), used until this device is measured.
On a GPU at batch 1 the cost stays near 1 up to dozens of tokens; on a CPU it grows with n."""
FALLBACK_VERIFY_COST: dict[int, float] = dict(FALLBACK.table)
""":data:`FALLBACK`'s table (n -> relative cost)."""

VerifyCostLike = Union[VerifyCost, Callable[[int], float], Mapping[int, float], None]


def as_verify_cost(verify_cost: VerifyCostLike) -> Callable[[int], float]:
    """A callable n -> relative cost from a :class:`VerifyCost`, a callable, a table, or None (constant 1)."""
    if verify_cost is None:
        return CONSTANT_VERIFY_COST
    if isinstance(verify_cost, Mapping):
        return VerifyCost(verify_cost)
    return verify_cost


def measure_verify_cost(target, sizes: Sequence[int] = DEFAULT_MEASURE_SIZES, *, prefix_len: int = 128,
                        repeats: int = 5) -> VerifyCost:
    """Time one target forward over n tokens for each n in ``sizes``, relative to n = 1.

    Builds a KV cache of ``prefix_len`` tokens once, then runs ``repeats`` rounds, each timing one
    forward of n fresh tokens after that prefix for every size in turn (the cache is cropped back
    after each; rounds rather than one size at a time, so a burst of load spreads over all sizes),
    and keeps each size's median. n = 1 is always measured (it is the unit).

    Args:
        target: a :class:`~playground.engine.target.CausalLM`, or a loaded model
            (``models.LoadedModel``: anything with ``.model``).
        sizes: token counts n >= 1 (e.g. K + 1 for the K values of interest).
        prefix_len: cached prefix length in tokens (the cost of attention grows with it).
        repeats: timed forwards per size (the median is kept); one untimed warm-up precedes.

    Returns:
        :class:`VerifyCost` with ``table`` n -> median seconds(n) / median seconds(1) and
        ``seconds`` n -> median seconds.

    Raises:
        ValueError: a size below 1, ``repeats`` below 1, or a prefix too long for the model.
    """
    import torch

    from .target import CausalLM

    lm = target if isinstance(target, CausalLM) else CausalLM(target.model)
    sizes = sorted({1, *(int(n) for n in sizes)})
    if sizes[0] < 1:
        raise ValueError(f"sizes must be >= 1, got {sizes[0]}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    ctx = getattr(lm.model.config, "max_position_embeddings", None)
    if ctx is not None and prefix_len + sizes[-1] > ctx:
        raise ValueError(f"prefix_len + largest size = {prefix_len + sizes[-1]} exceeds the context of {ctx}")
    gen = torch.Generator().manual_seed(0)
    vocab = min(lm.vocab_size, 32000)
    low = 100 if vocab > 200 else 0  # past the special tokens of a real vocabulary
    cache = lm.new_cache()
    lm.forward(cache, torch.randint(low, vocab, (prefix_len,), generator=gen))
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for r in range(repeats + 1):  # rounds over all sizes: a burst of load hits every size alike
        for n in sizes:
            ids = torch.randint(low, vocab, (n,), generator=gen)
            t0 = lm.clock()
            lm.forward(cache, ids)
            t = lm.clock() - t0
            CausalLM.crop(cache, prefix_len)
            if r:  # the first round is a warm-up
                times[n].append(t)
    seconds = {n: statistics.median(ts) for n, ts in times.items()}
    name = getattr(target, "name", None) or type(lm.model).__name__
    device = str(lm.device)
    dtype = str(lm.dtype).removeprefix("torch.")
    return VerifyCost({n: s / seconds[1] for n, s in seconds.items()}, seconds,
                      source=f"measured on this device ({device}, {dtype}, {name}, {prefix_len}-token cache, "
                             f"median of {repeats}) at {time.strftime('%H:%M:%S')}", origin=ORIGIN_FORWARDS)


# ----- the formulas --------------------------------------------------------------------------
def expected_tokens_per_step(alpha: float, k: int) -> float:
    """Expected tokens per step with K drafted tokens: (1 - alpha^(K+1)) / (1 - alpha).

    Leviathan et al. 2023, eq. (1); counts the bonus / correction token, so it is tau.
    alpha = 1 gives K + 1 (the limit); K = 0 gives 1 (autoregressive).

    Raises:
        ValueError: alpha outside [0, 1] or K outside [0, MAX_SPECULATIVE_TOKENS].
    """
    alpha, k = _check_alpha(alpha), _check_k(k)
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def step_cost(k: int, c: float, verify_cost: VerifyCostLike = None) -> float:
    """Cost of one step relative to one single-token target forward: K * c + verify_cost(K + 1)."""
    k, c = _check_k(k), _check_c(c)
    return k * c + as_verify_cost(verify_cost)(k + 1)


def expected_speedup(alpha: float, k: int, c: float, verify_cost: VerifyCostLike = None) -> float:
    """Expected speedup over autoregressive decoding: E[tokens] / (K * c + verify_cost(K + 1)).

    With ``verify_cost`` None (constant 1) this is Leviathan et al.'s
    (1 - alpha^(K+1)) / ((1 - alpha)(K c + 1)). K = 0 gives 1 / verify_cost(1) = 1.

    Args:
        alpha: acceptance rate in [0, 1].
        k: drafted tokens per step, in [0, MAX_SPECULATIVE_TOKENS].
        c: draft cost per drafted token relative to one target forward (>= 0).
        verify_cost: relative cost of a forward over n tokens (see :func:`as_verify_cost`).
    """
    return expected_tokens_per_step(alpha, k) / step_cost(k, c, verify_cost)


def optimal_k(alpha: float, c: float, verify_cost: VerifyCostLike = None,
              k_max: int = MAX_SPECULATIVE_TOKENS) -> tuple[int, float]:
    """The K in [1, k_max] with the highest expected speedup, and that speedup.

    Ties go to the smaller K. Returns ``(k, speedup)``; when even the best speedup is below 1,
    speculation does not pay (the caller should say so; K = 0 means plain decoding).
    """
    _check_alpha(alpha), _check_c(c), _check_k(k_max)
    cost = as_verify_cost(verify_cost)
    best = max(range(1, k_max + 1), key=lambda k: (round(expected_speedup(alpha, k, c, cost), 12), -k))
    return best, expected_speedup(alpha, best, c, cost)


@dataclass(frozen=True)
class KSuggestion:
    """A suggested K with the numbers behind it.

    Attributes:
        k: the suggested K; alpha, c: the inputs (measured); speedup: expected speedup at k;
        tokens_per_step: expected tau at k; pays_off: speedup > 1.
    """

    k: int
    alpha: float
    c: float
    speedup: float
    tokens_per_step: float

    @property
    def pays_off(self) -> bool:
        return self.speedup > 1.0


def suggest_k(alpha: float, c: float, verify_cost: VerifyCostLike = None,
              k_max: int = MAX_SPECULATIVE_TOKENS) -> KSuggestion:
    """The K that a measured acceptance rate and draft cost imply (see :func:`optimal_k`).

    Args:
        alpha: measured acceptance rate (accepted / drafted) of the draft model.
        c: measured draft cost ratio (see :func:`draft_cost_ratio`).
        verify_cost: relative cost of verifying n tokens on this device.
    """
    k, speedup = optimal_k(alpha, c, verify_cost, k_max)
    return KSuggestion(k, float(alpha), float(c), speedup, expected_tokens_per_step(alpha, k))


def draft_cost_ratio(draft_s: float, proposed: int, verify_s: float, decode_steps: int) -> float | None:
    """Measured draft cost c = (draft seconds per drafted token) / (verify seconds per step).

    Args:
        draft_s: seconds spent drafting over the run (``RunStats.draft_s``).
        proposed: tokens drafted over the run (``RunStats.proposed``).
        verify_s: seconds spent verifying over the run (``RunStats.verify_s``, prefill excluded).
        decode_steps: steps after the prefill (``RunStats.steps - 1``).

    Note the unit: a verification pass scores K + 1 tokens, so on a device where that costs
    more than one single-token forward, this c is smaller than the paper's c (draft token vs one
    target token) by the factor verify_cost(K + 1). None when nothing was drafted or timed.
    """
    if proposed <= 0 or decode_steps <= 0 or verify_s <= 0:
        return None
    return (draft_s / proposed) / (verify_s / decode_steps)


# ----- Lookahead ---------------------------------------------------------------------------
def lookahead_tokens_per_pass(window: int, ngram_size: int, guess_set_size: int) -> int:
    """Tokens the target processes in one Lookahead pass: 1 + W*(N-1) + G*(N-1).

    The root, the Jacobi window (W columns x N-1 levels) and up to G guessed n-grams of N-1
    tokens each (Fu et al. 2024). With this many tokens per forward, a device whose cost grows
    with tokens per forward (a CPU) pays for every extra query.

    Raises:
        ValueError: W or G below 1, or N below 2.
    """
    for name, v, lo in (("window", window, 1), ("ngram_size", ngram_size, 2), ("guess_set_size", guess_set_size, 1)):
        if isinstance(v, bool) or int(v) != v or v < lo:
            raise ValueError(f"{name} must be an integer >= {lo}, got {v}")
    return 1 + int(window) * (int(ngram_size) - 1) + int(guess_set_size) * (int(ngram_size) - 1)
