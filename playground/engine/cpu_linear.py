"""Float32 linear layers on a CPU through oneDNN with pre-packed weights.

Verification runs the target on a few tokens at once (K + 1 for a draft, a tree, a Lookahead
step). On an x86 CPU PyTorch's default float32 ``Linear`` calls MKL's ``sgemm``, whose path for
a handful of rows costs about twice a single row (measured on the development machine, a
2-vCPU AVX2 EPYC, 2 threads: the 576 x 49152 output layer takes 10 ms for 1 token and 22 ms for
2 to 16). oneDNN's matmul on a weight packed once into its blocked layout (the same ops
``torch.compile`` uses when it freezes a CPU model) keeps that cost nearly flat: 5 ms for 1 or
2 tokens, 11 ms for 16. On the whole default model the forward pass over 1 / 2 / 5 / 11 tokens
went from 69 / 108 / 136 / 145 ms to 67 / 82 / 97 / 105 ms. The arithmetic is still float32;
only the summation order differs (the default model's logits within ~1e-3 of MKL's), and the baseline and every
method use the same layers, so exactness comparisons are unaffected.

``pack_linear_layers`` swaps each ``nn.Linear`` of a CPU float32 model for a
:class:`PackedLinear` that shares the original parameters (tied embeddings stay tied,
``state_dict`` is unchanged) and keeps the packed copy beside them. Which kernel serves how many
rows is timed on the machine at packing: ``F.linear`` (MKL's ``sgemm``) for the few rows where it
wins (:func:`choose_row_paths`; at most three where whole forwards chose MKL's copies), MKL's weights
packed for exactly 4, 6 or 8 rows where those win (:func:`choose_mkl_packs`, a Sapphire Rapids Xeon),
oneDNN's packed weight otherwise. Set the environment
variable ``PLAYGROUND_ONEDNN=0`` to keep PyTorch's default layers.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from typing import Callable

import torch
from torch import nn

from .kernel_timing import forward_timer, time_mkl_copies, time_sweeps

log = logging.getLogger(__name__)

ENV_SWITCH = "PLAYGROUND_ONEDNN"
PACKED_MIN = 8_000_000
"""Weights (elements) from which every call goes through the packed weight (the 28 M output
layer: 5 ms vs 10 for one row on the AVX2 development machine)."""
ROW_TIMING = True
"""Below :data:`PACKED_MIN`, time both paths per weight shape and row count at packing
(:func:`choose_row_paths`); False: one row through ``F.linear``, more through the packed weight
(the rule measured on AVX2)."""
TIMED_ROWS = (1, 2, 3, 4, 6, 8)
"""Row counts at which :func:`choose_row_paths` times both paths, in order; timing a shape stops at
the first count where the packed weight wins."""
MKL_ROWS = (4, 6, 8)
"""Row counts for which a small layer may also keep a weight packed by MKL for exactly that many
rows (MKL's packed ``sgemm`` is fast only at the row count it was packed for); an input of more
rows than the previous count, up to this one, is padded to it (:func:`choose_mkl_packs`)."""
MKL_PACK_BYTES = 3 << 29
"""At most this many bytes (1.5 GiB) of MKL-packed copies per model (each about its weights' size)."""


def mkl_packed_available() -> bool:
    """True when this PyTorch build has MKL's packed-``sgemm`` linear ops (x86 CPUs)."""
    return (torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight")
            and hasattr(torch.ops.mkl, "_mkl_linear"))


def onednn_available() -> bool:
    """True when this PyTorch build has oneDNN and the packed-linear ops (CPU only)."""
    return (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


class _PrepackedLinear(nn.Linear):
    """An ``nn.Linear`` that shares its original parameters and keeps an opaque prepacked copy of
    the weight (``_packed``, built by :meth:`repack`); copies and pickles rebuild that copy."""

    @classmethod
    def from_linear(cls, linear: nn.Linear):
        """Wrap ``linear``, sharing its ``weight`` and ``bias`` parameters."""
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        new.weight, new.bias = linear.weight, linear.bias
        new._setup()
        new.repack()
        return new

    def _setup(self) -> None:
        """Per-class settings derived from the weight (before the first repack)."""

    def repack(self) -> None:
        """(Re)build the packed copy of the weight from the current parameters."""
        raise NotImplementedError

    def __getstate__(self):  # the packed copy is opaque: copies and pickles rebuild it
        state = super().__getstate__().copy()
        state.pop("_packed", None)
        return state

    def __setstate__(self, state) -> None:
        super().__setstate__(state)
        self.repack()

    def _needs_autograd(self, x: torch.Tensor) -> bool:
        return torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)


class PackedLinear(_PrepackedLinear):
    """An ``nn.Linear`` whose inference forward uses oneDNN with a pre-packed weight.

    Input ``(..., in_features)`` float32 on the CPU, output ``(..., out_features)``. An input of at
    most ``_plain_rows`` rows through a layer under :data:`PACKED_MIN` weights goes to ``F.linear``
    instead (set by :func:`choose_row_paths` to whichever path is faster here, timed as inside a
    forward pass; capped at three by :func:`choose_mkl_packs` where it keeps MKL's copies). On an
    AVX-512 BF16 EPYC every layer of the default model is faster packed (a one-token forward 25 ms
    at one thread against 35 ms through ``F.linear``); on a Sapphire Rapids Xeon (2 threads) MKL's
    ``sgemm`` is faster for one to three rows (a forward over 1 / 2 / 3 tokens 32 / 32 / 34 ms
    against 32 / 41 / 41 ms with two and three rows packed) and the packed weight from four. So
    plain decoding loses nothing, and verifying one or two candidates costs what the device really
    charges for them. Inputs of 4 to 8 rows may go to MKL's weights packed for 4, 6 or 8 rows
    instead (``_mkl_packs``, set by :func:`choose_mkl_packs` where that is faster here; 5 and 7 rows
    padded). When autograd needs the result (training through the layer) it falls back to
    ``F.linear``, so the layer stays trainable; the packed copy is not updated by training, so
    re-pack (:func:`pack_linear_layers`) after changing the weights.
    """

    def __getstate__(self):  # MKL's copies are rebuilt (for the same row counts) like oneDNN's
        state = super().__getstate__()
        state["_mkl_packs"] = dict.fromkeys(state.get("_mkl_packs", {}))
        return state

    def _setup(self) -> None:
        self._plain_rows = 0  # :func:`choose_row_paths` decides
        self._mkl_packs: dict[int, torch.Tensor] = {}  # rows -> MKL-packed weight (:func:`choose_mkl_packs`)
        self._mkl_route: list[int | None] = []  # input rows -> the packed count serving them (None: oneDNN)

    def repack(self) -> None:
        self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), None)
        self.set_mkl_rows(tuple(getattr(self, "_mkl_packs", ())), fresh=True)

    def set_mkl_rows(self, rows: tuple[int, ...], fresh: bool = False) -> None:
        """Keep MKL-packed copies of the weight for exactly these row counts (none: drop them);
        copies already held are kept unless ``fresh``."""
        old = {} if fresh else self._mkl_packs
        self._mkl_packs = {r: old[r] if r in old else torch.ops.mkl._mkl_reorder_linear_weight(self.weight.detach(), r)
                           for r in sorted(rows)}
        counts = sorted(self._mkl_packs)
        self._mkl_route = [next((r for r in counts if r >= n), None) if MKL_ROWS and n >= MKL_ROWS[0] else None
                           for n in range(max(counts, default=-1) + 1)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if rows <= self._plain_rows or self._needs_autograd(x):
            return nn.functional.linear(x, self.weight, self.bias)
        if rows < len(self._mkl_route) and self._mkl_route[rows] is not None:
            return self._mkl_forward(x, self._mkl_route[rows])
        return self._packed_forward(x)

    def _mkl_forward(self, x: torch.Tensor, packed_rows: int) -> torch.Tensor:
        """MKL's packed ``sgemm`` on the weight packed for ``packed_rows`` rows, ``x`` zero-padded to
        that many rows (each output row depends on its own input row only)."""
        rows = x.numel() // self.in_features
        flat = x.reshape(rows, self.in_features)
        if rows < packed_rows:
            flat = torch.cat([flat, flat.new_zeros(packed_rows - rows, self.in_features)])
        bias = None if self.bias is None else self.bias.detach()
        out = torch.ops.mkl._mkl_linear(flat, self._mkl_packs[packed_rows], self.weight.detach(), bias, packed_rows)
        return out[:rows].reshape(*x.shape[:-1], self.out_features)

    def _packed_forward(self, x: torch.Tensor) -> torch.Tensor:
        """oneDNN's matmul on the packed weight (no autograd)."""
        bias = None if self.bias is None else self.bias.detach()
        return torch.ops.mkldnn._linear_pointwise(x, self._packed, bias, "none", [None], "")


def pack_linear_layers(model: nn.Module) -> int:
    """Replace every float32 CPU ``nn.Linear`` in ``model`` by a :class:`PackedLinear`, in place.

    Does nothing when oneDNN is missing, when ``PLAYGROUND_ONEDNN=0``, or when a packed layer
    disagrees with ``F.linear`` by more than 1e-3 relative on a random input (then every layer
    is restored). Which kernel serves how many rows is timed here (:func:`choose_row_paths`,
    :func:`choose_mkl_packs`, the latter on whole forwards of ``model`` where it can step it).
    Returns the number of layers packed.
    """
    if os.environ.get(ENV_SWITCH, "1") == "0" or not onednn_available():
        return 0
    swapped: list[tuple[nn.Module, str, nn.Linear]] = []
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if (type(child) is nn.Linear and child.weight.device.type == "cpu"
                    and child.weight.dtype == torch.float32):
                setattr(parent, name, PackedLinear.from_linear(child))
                swapped.append((parent, name, child))
    if swapped and not _agrees(getattr(swapped[0][0], swapped[0][1])):
        for parent, name, child in swapped:
            setattr(parent, name, child)
        log.warning("oneDNN packed linear layers disagree with F.linear here; keeping the defaults")
        return 0
    packed = [getattr(parent, name) for parent, name, _ in swapped]
    choose_row_paths(packed)
    choose_mkl_packs(packed, step_timer=lambda: forward_timer(model))
    return len(swapped)


_PLAIN_ROWS: dict[tuple[int, int, int], int] = {}
"""(out_features, in_features, threads) -> up to how many rows ``F.linear`` is faster (timed once)."""


@torch.inference_mode()
def choose_row_paths(layers: list["PackedLinear"], rounds: int = 8) -> None:
    """Set each layer's ``_plain_rows``: up to how many rows ``F.linear`` (MKL's ``sgemm``) is
    faster than the packed weight, on this CPU at the current thread count.

    Layers from :data:`PACKED_MIN` weights always take the packed weight; without
    :data:`ROW_TIMING` smaller ones take ``F.linear`` for one row. Otherwise both paths are timed
    at each row count of :data:`TIMED_ROWS` in turn, in *sweeps*: that many rows through every
    layer of ``layers`` in turn (model order), the small layers all plain in one sweep and all
    packed in the next, alternating, ``rounds`` sweeps each after a warm-up; each weight shape's
    summed time per sweep is compared by median. A shape's ``_plain_rows`` is the largest timed
    count up to which ``F.linear`` won every time (0 when it lost at one row); its timing stops
    at its first loss. Verdicts are kept per shape and thread count. Sweeping matters: a layer
    called in a loop finds its weight in the cache, as it never does inside a forward pass.
    Timed that way (until 2026-12-01), the default model's small layers chose ``F.linear`` on an
    AVX-512 BF16 EPYC and a one-token forward took 35 ms at one thread against 25 ms all packed,
    so plain decoding ran slower than a speculative step and every speedup was inflated. Until
    2026-12-03 only one row was timed, and two or three rows always went packed: on a Sapphire
    Rapids Xeon that made a step verifying one candidate 1.28x a plain step where ``sgemm`` takes
    1.01x. Both paths compute the same float32 products (summed in a different order), so the
    choice changes speed only.
    """
    threads = torch.get_num_threads()
    small = []
    for layer in layers:
        if layer.weight.numel() >= PACKED_MIN:
            layer._plain_rows = 0
        elif not ROW_TIMING:
            layer._plain_rows = 1
        else:
            small.append(layer)
    key = lambda layer: (layer.out_features, layer.in_features, threads)  # noqa: E731
    pending = {key(layer) for layer in small if key(layer) not in _PLAIN_ROWS}
    verdict = dict.fromkeys(pending, 0)
    for rows in TIMED_ROWS:
        if not pending:
            break
        times = time_sweeps(layers, {id(layer) for layer in small if key(layer) in pending}, key, rows, rounds)
        for k in list(pending):
            if statistics.median(times["plain"][k]) <= statistics.median(times["packed"][k]):
                verdict[k] = rows
            else:
                pending.discard(k)
    _PLAIN_ROWS.update(verdict)
    for layer in small:
        layer._plain_rows = _PLAIN_ROWS[key(layer)]


_MKL_ROWS: dict[tuple, tuple[tuple[int, ...], bool]] = {}
"""(the small layers' shapes in model order, threads) -> (the counts of :data:`MKL_ROWS` kept, whether
the small layers' ``F.linear`` rows are capped below ``MKL_ROWS[0]``) (timed once)."""


@torch.inference_mode()
def choose_mkl_packs(layers: list["PackedLinear"], rounds: int = 8,
                     step_timer: Callable[[], Callable[[int], float] | None] | None = None) -> None:
    """Give the small layers (under :data:`PACKED_MIN` weights) MKL-packed copies of their weights
    for the counts of :data:`MKL_ROWS` where those beat oneDNN's packed weights on this CPU.

    MKL packs a weight for one row count M (``cblas_sgemm_pack``; PyTorch's ``mkl._mkl_linear``
    takes the packed path only when the input has exactly M rows), so a count r serves the inputs of
    more rows than the count before it, zero-padded to r. For all small layers together, MKL's
    weights packed for r are timed against oneDNN's at r rows; counts are kept up to the first loss,
    and only while the copies stay under :data:`MKL_PACK_BYTES` in all; a layer skips the counts at
    or under its ``_plain_rows`` (``F.linear`` takes those inputs). On a 2-vCPU Sapphire Rapids Xeon
    (2 threads, the default model) whole decoding steps over 4 / 5 / 6 / 7 / 8 tokens (5 and 7 padded)
    took 40.2 / 42.9 / 43.6 / 46.0 / 45.4 ms with the copies against 43.6 / 45.1 / 47.1 / 49.9 / 50.2
    ms without (a plain step 33.3 ms).

    Args:
        layers: the model's packed layers in model order.
        rounds: timed rounds per count and path.
        step_timer: makes a timer of the whole model's forward (``rows -> seconds``,
            :func:`.kernel_timing.forward_timer`) or returns None. With a timer, whole forwards with
            and without the copies decide, the small layers' ``_plain_rows`` capped below
            ``MKL_ROWS[0]`` meanwhile, and the cap stays when every count is kept (from four rows the
            whole forwards decided; see :mod:`.kernel_timing`). Without one, or when timing fails
            (logged), sweeps through every layer in model order decide, as :func:`choose_row_paths`
            times. Called only when this model's shapes have no verdict yet.

    Does nothing without MKL's packed ops, without :data:`ROW_TIMING`, or when ``PLAYGROUND_ONEDNN=0``.
    """
    small = [layer for layer in layers if layer.weight.numel() < PACKED_MIN]
    if not small or not MKL_ROWS or not mkl_packed_available() or not ROW_TIMING:
        return
    sig = (tuple((layer.out_features, layer.in_features) for layer in small), torch.get_num_threads())
    if sig not in _MKL_ROWS:
        step_time = step_timer() if step_timer is not None else None
        try:
            kept = _choose_counts(layers, small, rounds, step_time)
        except Exception as e:
            if step_time is None:
                raise
            log.warning("timing whole forwards failed (%s: %s); layer sweeps choose MKL's copies", type(e).__name__, e)
            step_time, kept = None, _choose_counts(layers, small, rounds, None)
        _MKL_ROWS[sig] = (kept, step_time is not None and kept == tuple(MKL_ROWS))
    kept, capped = _MKL_ROWS[sig]
    for layer in small:
        if capped:
            layer._plain_rows = min(layer._plain_rows, MKL_ROWS[0] - 1)
        layer.set_mkl_rows(tuple(r for r in kept if r > layer._plain_rows))


def _choose_counts(layers, small, rounds: int, step_time) -> tuple[int, ...]:
    """The counts of :data:`MKL_ROWS` kept (see :func:`choose_mkl_packs`); ``_plain_rows`` restored."""
    uncapped = [layer._plain_rows for layer in small]
    try:
        if step_time is not None:
            for layer in small:
                layer._plain_rows = min(layer._plain_rows, MKL_ROWS[0] - 1)
        kept: list[int] = []
        budget = MKL_PACK_BYTES
        for r in MKL_ROWS:
            todo = [layer for layer in small if layer._plain_rows < r]
            cost = sum(layer.weight.numel() * layer.weight.element_size() for layer in todo)
            if not todo or cost > budget:
                break
            for layer in todo:
                layer.set_mkl_rows((*kept, r))
            if step_time is not None:
                mkl_s, packed_s = time_mkl_copies(todo, step_time, r, rounds)
            else:
                paths = {"mkl": lambda layer, x, r=r: layer._mkl_forward(x, r),
                         "packed": lambda layer, x: layer._packed_forward(x)}
                times = time_sweeps(layers, {id(layer) for layer in todo}, lambda layer: "all", r, rounds, paths)
                mkl_s, packed_s = statistics.median(times["mkl"]["all"]), statistics.median(times["packed"]["all"])
            if mkl_s >= packed_s:
                break
            kept.append(r)
            budget -= cost
        return tuple(kept)
    finally:
        for layer, rows in zip(small, uncapped):
            layer._plain_rows = rows


def _agrees(layer: nn.Linear, tolerance: float = 1e-3) -> bool:
    """The layer's output on a random ``(3, in_features)`` input is within ``tolerance`` (relative
    to the largest output) of ``F.linear``'s."""
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        x = torch.randn(3, layer.in_features, generator=g)
        want = nn.functional.linear(x, layer.weight, layer.bias)
        got = layer(x)
    return bool((got - want).abs().max() <= tolerance * want.abs().max().clamp_min(1e-6))


# ----- float16 weights for a draft -------------------------------------------------------------
HALF_ENV_SWITCH = "PLAYGROUND_HALF_DRAFT"


def half_weights_available() -> bool:
    """True when this PyTorch build has FBGEMM's float16-weight linear ops (x86 CPUs)."""
    return ("fbgemm" in torch.backends.quantized.supported_engines
            and hasattr(torch.ops.quantized, "linear_prepack_fp16")
            and hasattr(torch.ops.quantized, "linear_dynamic_fp16"))


class HalfWeightLinear(_PrepackedLinear):
    """An ``nn.Linear`` whose inference forward reads a float16 copy of its weight.

    Input and output stay float32 ``(..., in_features)`` -> ``(..., out_features)``; FBGEMM's
    float16 GEMM widens the weights to float32 as it multiplies, so the products are those of
    the float32 layer whenever the weights are float16 values already (what
    :func:`half_weight_linear_layers` requires). A drafted token is a single row through small
    layers, where time goes to reading the weights: half the bytes, measured on the development
    machine (2 threads) as 4.4 ms instead of 5.9 ms a token for the shipped draft. Shares the
    original parameters; autograd falls back to ``F.linear``.
    """

    def repack(self) -> None:
        bias = None if self.bias is None else self.bias.detach()
        self._packed = torch.ops.quantized.linear_prepack_fp16(self.weight.detach(), bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._needs_autograd(x):
            return nn.functional.linear(x, self.weight, self.bias)
        return torch.ops.quantized.linear_dynamic_fp16(x, self._packed)


def half_weight_linear_layers(model: nn.Module) -> int:
    """Give every float32 CPU linear layer of ``model`` whose weight (and bias) are exactly float16
    values a :class:`HalfWeightLinear`, in place; for drafts, which ship in float16.

    Does nothing when FBGEMM is missing, when ``PLAYGROUND_HALF_DRAFT=0``, when some layer's
    weights are not float16 values (a float32 or bfloat16 checkpoint: converting would change
    the model), or when a converted layer disagrees with ``F.linear`` by more than 1e-4 relative
    (then every layer is restored). Returns the number of layers converted.
    """
    if os.environ.get(HALF_ENV_SWITCH, "1") == "0" or not half_weights_available():
        return 0
    layers = [(parent, name, child) for parent in list(model.modules())
              for name, child in list(parent.named_children())
              if isinstance(child, nn.Linear) and not isinstance(child, HalfWeightLinear)
              and child.weight.device.type == "cpu" and child.weight.dtype == torch.float32]

    def exact(t: torch.Tensor | None) -> bool:
        return t is None or bool(torch.equal(t.detach().half().float(), t.detach()))
    if not layers or not all(exact(c.weight) and exact(c.bias) for _, _, c in layers):
        return 0
    for parent, name, child in layers:
        setattr(parent, name, HalfWeightLinear.from_linear(child))
    if not _agrees(getattr(layers[0][0], layers[0][1]), 1e-4):
        for parent, name, child in layers:
            setattr(parent, name, child)
        log.warning("float16-weight linear layers disagree with F.linear here; keeping the defaults")
        return 0
    return len(layers)


# ----- int8 weights for drafts and draft heads ----------------------------------------------------
INT8_ENV_SWITCH = "PLAYGROUND_INT8_DRAFT"


def int8_weights_available() -> bool:
    """True when this PyTorch build has FBGEMM's int8 dynamic linear ops (x86 CPUs)."""
    return ("fbgemm" in torch.backends.quantized.supported_engines
            and hasattr(torch.ops.quantized, "linear_prepack")
            and hasattr(torch.ops.quantized, "linear_dynamic"))


class Int8WeightLinear(_PrepackedLinear):
    """An ``nn.Linear`` whose inference forward runs FBGEMM's int8 GEMM on an int8 copy of its weight.

    ``(..., in_features)`` float32 -> ``(..., out_features)`` float32. The weight is quantized once,
    symmetrically per output row (scale = the row's largest magnitude / 127); each call quantizes its
    input to 8 bits with one scale and offset over the whole call (FBGEMM's dynamic quantization), so
    the outputs are close to, not equal to, the float layer's, and a row's output depends slightly on
    the other rows of its call. Meant for drafters, whose proposals the target verifies exactly (the
    draft model, EAGLE's head): a drafted token is a few rows through small layers, where time goes
    to reading weights, and int8 reads half the bytes of float16 (on the development Xeon a head
    level's linear layers took 0.089 ms a call against 0.147 ms with float16 weights). Shares the original parameters;
    autograd falls back to ``F.linear``.
    """

    def repack(self) -> None:
        import warnings
        w = self.weight.detach().float()
        scales = (w.abs().amax(1) / 127).clamp_min(1e-12).double()
        with warnings.catch_warnings():  # PyTorch flags quantized tensors as deprecated; the ops remain
            warnings.simplefilter("ignore")
            qw = torch.quantize_per_channel(w, scales, torch.zeros_like(scales, dtype=torch.long), 0, torch.qint8)
        bias = None if self.bias is None else self.bias.detach().float()
        self._packed = torch.ops.quantized.linear_prepack(qw, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._needs_autograd(x):
            return nn.functional.linear(x, self.weight, self.bias)
        if x.dim() == 1:  # FBGEMM wants rows; nn.Linear takes one vector too
            return torch.ops.quantized.linear_dynamic(x[None], self._packed, True)[0]
        return torch.ops.quantized.linear_dynamic(x, self._packed, True)


def int8_weight_linear_layers(model: nn.Module, skip: tuple[str, ...] = ()) -> int:
    """Give every float32 CPU linear layer of ``model`` (float16-weight ones included) but those named
    in ``skip`` an :class:`Int8WeightLinear`, in place; for drafts, whose every proposal is verified.
    Does nothing when FBGEMM's int8 ops are missing or ``PLAYGROUND_INT8_DRAFT=0``, or when
    a converted layer's outputs are off by more than 5 % of their largest magnitude (then every layer
    is restored). Returns the number of layers converted.
    """
    if os.environ.get(INT8_ENV_SWITCH, "1") == "0" or not int8_weights_available():
        return 0
    layers = [(parent, name, child) for parent in list(model.modules())
              for name, child in list(parent.named_children())
              if isinstance(child, nn.Linear) and not isinstance(child, Int8WeightLinear) and name not in skip
              and child.weight.device.type == "cpu" and child.weight.dtype == torch.float32]
    try:
        for parent, name, child in layers:
            setattr(parent, name, Int8WeightLinear.from_linear(child))
        ok = not layers or _agrees(getattr(layers[0][0], layers[0][1]), 0.05)
    except RuntimeError as e:  # an FBGEMM build that cannot pack these weights
        log.warning("int8-weight linear layers failed here (%s); keeping the defaults", e)
        ok = False
    if not ok:
        for parent, name, child in layers:
            setattr(parent, name, child)
        return 0
    return len(layers)
