"""Whole forward passes of a model, timed at packing to choose its linear kernels by what a
decoding step really costs (:func:`playground.engine.cpu_linear.choose_mkl_packs`).

Timing the linear layers alone (sweeps through every layer in model order) misjudges MKL's
weights packed for four to eight rows against oneDNN's: on a 2-vCPU Sapphire Rapids Xeon (2
threads, the default model, 2026-12-05) such sweeps put the two within 2-3 % of each other at four
rows (21.1 against 21.6 ms; 17.0 against 17.1 in another process), so the choice at load flipped
from one process to the next (MKL's copies kept in two of four loads), while whole forward passes
over 4 / 6 / 8 tokens after a 200-token prompt took 41.8 / 44.4 / 46.3 ms with MKL's copies against
45.9 / 46.8 / 51.4 ms without (lower quartiles of 20, alternated in one process; one token 33.2 and
33.0 ms). Whole passes count what the sweeps leave out (the layers' inputs as a forward hands them
over, the attention and norms between them), so the choice follows the step.

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
        The timer, or None when ``model`` is not such a model or its first forward fails (then the
        caller keeps its own timing).
    """
    config = getattr(model, "config", None)
    text = config.get_text_config() if config is not None and hasattr(config, "get_text_config") else config
    vocab = getattr(text, "vocab_size", None)
    if not isinstance(vocab, int) or vocab < 1 or not hasattr(model, "get_output_embeddings"):
        return None
    from transformers import DynamicCache

    g = torch.Generator().manual_seed(0)
    try:
        cache = DynamicCache(config=config)
        with torch.inference_mode():
            model(input_ids=torch.randint(vocab, (1, context), generator=g), cache=cache, use_cache=True,
                  logits_to_keep=1)
    except Exception as e:  # not a causal LM we can step; the sweeps decide instead
        log.debug("no forward timer for %s: %s: %s", type(model).__name__, type(e).__name__, e)
        return None

    def time_rows(rows: int) -> float:
        ids = torch.randint(vocab, (1, rows), generator=g)
        with torch.inference_mode():
            t0 = time.perf_counter()
            model(input_ids=ids, cache=cache, use_cache=True)
            seconds = time.perf_counter() - t0
        cache.crop(-rows)
        return seconds

    try:
        time_rows(2)  # a step it cannot take shows here, not in the middle of the timing
    except Exception as e:
        log.debug("no forward timer for %s: %s: %s", type(model).__name__, type(e).__name__, e)
        return None
    return time_rows


def time_mkl_copies(todo: list, step_time: Callable[[int], float], rows: int, rounds: int) -> tuple[float, float]:
    """Lower quartiles of ``step_time(rows)`` seconds with the MKL copies of ``todo`` (packed linear
    layers, :class:`~playground.engine.cpu_linear.PackedLinear`) serving and with them bypassed
    (oneDNN), alternated, after one warm-up pair; the layers' routes are restored after."""
    routes = {id(layer): layer._mkl_route for layer in todo}
    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(rounds + 1):
        for use in ((True, False) if i % 2 == 0 else (False, True)):
            for layer in todo:
                layer._mkl_route = routes[id(layer)] if use else []
            seconds = step_time(rows)
            if i:  # the first pair warms up
                times[use].append(seconds)
    for layer in todo:
        layer._mkl_route = routes[id(layer)]
    return tuple(sorted(times[use])[len(times[use]) // 4] for use in (True, False))
