"""Timing at packing, to choose a CPU model's linear kernels (:mod:`playground.engine.cpu_linear`):
sweeps of a few rows through every linear layer in model order (:func:`time_sweeps`), and whole
forward passes of the model (:func:`forward_timer`, :func:`time_mkl_copies`), which decide MKL's
copies for four to eight rows (:func:`playground.engine.cpu_linear.choose_mkl_packs`).

Timing the linear layers alone (sweeps through every layer in model order) misjudges MKL's weights
packed for four to eight rows against oneDNN's: on a 2-vCPU Sapphire Rapids Xeon (2 threads, the
default model, 2026-12-05) such sweeps put the two within 2-3 % of each other at four rows (21.1
against 21.6 ms; 17.0 against 17.1 in another process), so the choice at load flipped from one
process to the next (MKL's copies kept in two of four loads), while whole forward passes over 4 / 6
/ 8 tokens after a 200-token prompt (the timer steps after 48) took 41.8 / 44.4 / 46.3 ms with MKL's
copies against 45.9 / 46.8 / 51.4 ms without (lower quartiles of 20, alternated in one process; one
token 33.2 and 33.0 ms). Whole passes count what the sweeps leave out (the layers' inputs as a
forward hands them over, the attention and norms between them), so the choice follows the step.

With a timer, from four rows on the whole forwards decide for every small layer: ``F.linear``'s
per-shape wins at four to eight rows in the sweeps (the 576 x 1536 and 192 x 576 layers, at 4, 6 or
8 rows from one load to the next) are capped to three rows while MKL's copies are kept. In one
process, alternated (lower quartiles of 20, the same Xeon), steps over 4 / 5 / 6 / 8 tokens took
42.0 / 46.3 / 45.7 / 47.4 ms capped against 43.9 / 47.2 / 46.7 / 48.0 ms with the sweeps' verdicts.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import torch

log = logging.getLogger(__name__)

TIMER_CONTEXT = 48
"""Cached tokens before each timed forward (a short answer's context)."""


def forward_timer(model: torch.nn.Module, context: int = TIMER_CONTEXT) -> Callable[[int], float] | None:
    """A timer of ``model``'s decoding steps: ``time(rows)`` runs one forward over ``rows`` new tokens
    after ``context`` cached ones (random ids, fixed seed), crops the cache back, and returns its
    seconds. Logits are computed for every new token, as a verification pass does.

    Args:
        model: a transformers causal LM on the CPU (``config`` with a ``vocab_size``, a forward that
            takes ``cache=``).
        context: tokens in the cache before each timed pass.

    Returns:
        The timer, or None when ``model`` is not such a model, or its prefill, a first two-token
        step or cropping its cache fails (then the caller keeps its own timing).
    """
    config = getattr(model, "config", None)
    text = config.get_text_config() if config is not None and hasattr(config, "get_text_config") else config
    vocab = getattr(text, "vocab_size", None)
    if not isinstance(vocab, int) or vocab < 1 or not hasattr(model, "get_output_embeddings"):
        return None
    from transformers import DynamicCache

    g = torch.Generator().manual_seed(0)
    cache = None

    def time_rows(rows: int) -> float:
        ids = torch.randint(vocab, (1, rows), generator=g)
        with torch.inference_mode():
            try:
                t0 = time.perf_counter()
                model(input_ids=ids, cache=cache, use_cache=True)
                return time.perf_counter() - t0
            finally:
                if cache.get_seq_length() > context:
                    cache.crop(-(cache.get_seq_length() - context))

    try:
        cache = DynamicCache(config=config)
        with torch.inference_mode():
            model(input_ids=torch.randint(vocab, (1, context), generator=g), cache=cache, use_cache=True,
                  logits_to_keep=1)
        time_rows(2)  # a step it cannot take (or a cache it cannot crop) shows here, not mid-timing
    except Exception as e:  # not a causal LM we can step; the sweeps decide instead
        log.debug("no forward timer for %s: %s: %s", type(model).__name__, type(e).__name__, e)
        return None
    return time_rows


def time_mkl_copies(todo: list, step_time: Callable[[int], float], rows: int, rounds: int) -> tuple[float, float]:
    """Seconds of ``step_time(rows)`` (lower quartiles of ``rounds``, alternated, after one warm-up
    pair) as ``(with the MKL copies of todo serving, with them bypassed)``: ``todo`` are packed linear
    layers (:class:`~playground.engine.cpu_linear.PackedLinear`), bypassed meaning oneDNN's weights.
    Their routes are restored after, also when ``step_time`` raises."""
    routes = {id(layer): layer._mkl_route for layer in todo}
    times: dict[bool, list[float]] = {True: [], False: []}
    try:
        for i in range(rounds + 1):
            for use in ((True, False) if i % 2 == 0 else (False, True)):
                for layer in todo:
                    layer._mkl_route = routes[id(layer)] if use else []
                seconds = step_time(rows)
                if i:  # the first pair warms up
                    times[use].append(seconds)
    finally:
        for layer in todo:
            layer._mkl_route = routes[id(layer)]
    return tuple(sorted(times[use])[len(times[use]) // 4] for use in (True, False))


def _plain(layer, x):
    return torch.nn.functional.linear(x, layer.weight, layer.bias)


def time_sweeps(layers, todo: set[int], key, rows: int, rounds: int,
                 paths: dict | None = None) -> dict[str, dict[tuple, list[float]]]:
    """Per path (default ``plain``: ``F.linear``, ``packed``: oneDNN; else name -> ``f(layer, x)``)
    and weight shape, the summed seconds per sweep of ``rows`` rows through ``layers`` (model
    order), the layers in ``todo`` timed, the others run through oneDNN's packed weight."""
    paths = paths or {"plain": _plain, "packed": lambda layer, x: layer._packed_forward(x)}
    inputs = {n: torch.randn(rows, n) for n in {layer.in_features for layer in layers}}
    times: dict[str, dict[tuple, list[float]]] = {name: {} for name in paths}
    names = list(paths)
    for i in range(rounds + 1):
        for kind in (names if i % 2 == 0 else names[::-1]):
            sums: dict[tuple, float] = {}
            for layer in layers:
                x = inputs[layer.in_features]
                timed = id(layer) in todo
                t0 = time.perf_counter()
                if timed:
                    paths[kind](layer, x)
                else:
                    layer._packed_forward(x)
                if timed:
                    sums[key(layer)] = sums.get(key(layer), 0.0) + time.perf_counter() - t0
            if i:  # the first pair warms up
                for k, v in sums.items():
                    times[kind].setdefault(k, []).append(v)
    return times
