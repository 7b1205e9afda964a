"""Command-line pieces shared by the training commands: a help formatter that shows defaults,
and argparse types that check numbers before any model loads (so a bad value costs no waiting)."""

from __future__ import annotations

import argparse
import math
import sys
import time


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` with each option's default, except where there is none (None) or it is a flag's off state."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def int_at_least(minimum: int, why: str = "", maximum: int | None = None):
    """An argparse ``type``: an integer >= ``minimum`` (and <= ``maximum`` when given); ``why``, when
    given, follows the complaint about a value below ``minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if maximum is not None and not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"must be in [{minimum}, {maximum}], got {value}")
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}" + (f": {why}" if why else ""))
        return value
    return parse


def float_in(low: float, high: float = math.inf, *, low_open: bool = False, high_open: bool = False):
    """An argparse ``type``: a finite number in the interval from ``low`` to ``high``, each end
    included unless ``low_open`` / ``high_open`` (e.g. ``float_in(0, 1, low_open=True, high_open=True)``: (0, 1))."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if not ((value > low if low_open else value >= low) and (value < high if high_open else value <= high)):
            if high == math.inf:
                raise argparse.ArgumentTypeError(f"must be {'>' if low_open else '>='} {low:g}, got {text}")
            interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
            raise argparse.ArgumentTypeError(f"must be in {interval}, got {text}")
        return value
    return parse


class _PlainBar:
    def __init__(self, total: int, desc: str):
        self.total, self.desc, self.n, self.post, self.last = total, desc, 0, "", 0.0

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.perf_counter() - self.last > 5 or self.n >= self.total:
            print(f"{self.desc}: {self.n}/{self.total} {self.post}", file=sys.stderr, flush=True)
            self.last = time.perf_counter()

    def set_postfix_str(self, text: str, refresh: bool = False) -> None:
        self.post = text

    def close(self) -> None:
        pass


def progress_bar(total: int, desc: str, enabled: bool):
    """A tqdm progress bar on stderr (a printed line every few seconds without tqdm; nothing when disabled)."""
    if not enabled:
        bar = _PlainBar(total, desc)
        bar.update = lambda n=1: None  # type: ignore[method-assign]
        return bar
    try:
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, file=sys.stderr, dynamic_ncols=True, mininterval=0.5)
    except ImportError:
        return _PlainBar(total, desc)


def read_data(read, paths: list) -> list | None:
    """``read(paths)`` (a trainer's record reader) for ``--data``; None after one error line on
    stderr when a file is missing or holds other records, so the trainer can exit with status 2
    before any model loads."""
    try:
        return read(paths)
    except (OSError, ValueError, KeyError) as e:
        print(f"error: cannot read --data {' '.join(map(str, paths))}: {e}", file=sys.stderr)
        return None
