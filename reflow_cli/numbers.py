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
from typing import Any

import typer

_WHOLE = re.compile(r"[0-9]{1,12}", re.ASCII)
_DECIMAL = re.compile(r"[0-9]{1,12}(\.[0-9]{1,12})?", re.ASCII)


def _shown(text: object) -> str:
    s = str(text)
    return repr(s) if len(s) <= 24 else repr(s[:24]) + "..."


def _ranged(
    pattern: re.Pattern[str],
    convert: Callable[[str], float],
    defaults: tuple[type, ...],
    low: float,
    high: float,
    what: str,
) -> Callable[[object], Any]:
    def parse(value: object) -> Any:
        if isinstance(value, defaults) and not isinstance(value, bool) and low <= value <= high:
            return convert(value)  # type: ignore[arg-type]  # a default
        text = str(value).strip()
        if not pattern.fullmatch(text) or not low <= convert(text) <= high:
            raise typer.BadParameter(f"{_shown(value)} is not {what} in ASCII digits")
        return convert(text)

    parse.__name__ = f"{convert.__name__}_{low:g}_{high:g}"
    return parse


def whole(low: int, high: int) -> Callable[[object], int]:
    """A parser of whole numbers from ``low`` to ``high`` in ASCII digits."""
    return _ranged(_WHOLE, int, (int,), low, high, f"a whole number from {low} to {high}")


def decimal(low: float, high: float) -> Callable[[object], float]:
    """A parser of decimal numbers from ``low`` to ``high`` in ASCII digits (no sign, no
    exponent, no nan or inf)."""
    what = f"a number from {low:g} to {high:g}"
    return _ranged(_DECIMAL, float, (int, float), low, high, what)


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
