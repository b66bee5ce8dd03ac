"""Numeric command-line options: ASCII digits within a range, or a one-line refusal.

click's own ``INT`` and ``FLOAT`` call ``int()`` and ``float()``, which take full-width
and other Unicode digits, any number of them, ``nan`` and ``inf``: a 23-digit count went
on to msgpack (OverflowError). Every numeric option of the CLI takes one of these parsers
instead (``typer.Option(parser=...)``); ``tests/unit/test_cli_numbers.py`` fails on an
option that does not.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import typer

_WHOLE = re.compile(r"[0-9]{1,12}", re.ASCII)
_DECIMAL = re.compile(r"[0-9]{1,12}(\.[0-9]{1,12})?", re.ASCII)


def _shown(text: object) -> str:
    s = str(text)
    return repr(s) if len(s) <= 24 else repr(s[:24]) + "..."


def whole(low: int, high: int) -> Callable[[object], int]:
    """A parser of whole numbers from ``low`` to ``high`` in ASCII digits."""

    def parse(value: object) -> int:
        if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
            return value  # a default
        text = str(value).strip()
        if not _WHOLE.fullmatch(text) or not low <= int(text) <= high:
            raise typer.BadParameter(
                f"{_shown(value)} is not a whole number from {low} to {high} in ASCII digits"
            )
        return int(text)

    parse.__name__ = f"whole_{low}_{high}"
    return parse


def decimal(low: float, high: float) -> Callable[[object], float]:
    """A parser of decimal numbers from ``low`` to ``high`` in ASCII digits (no sign, no
    exponent, no nan or inf)."""

    def parse(value: object) -> float:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= high:
            return float(value)  # a default
        text = str(value).strip()
        if not _DECIMAL.fullmatch(text) or not low <= float(text) <= high:
            raise typer.BadParameter(
                f"{_shown(value)} is not a number from {low:g} to {high:g} in ASCII digits"
            )
        return float(text)

    parse.__name__ = f"decimal_{low:g}_{high:g}"
    return parse


# the ranges the CLI's options take
NODES = whole(1, 100_000)
GPUS = whole(1, 10_000_000)
RANK = whole(0, 10_000_000)
MINUTES = whole(1, 10_000_000)  # a Slurm time limit
LINES = whole(0, 10_000_000)
SEED = whole(0, 2**32 - 1)
WORKERS = whole(1, 4096)
STEPS = whole(0, 10_000_000)
GIB = decimal(1, 100_000)  # a GPU's memory
SECONDS = decimal(0, 10_000_000)
