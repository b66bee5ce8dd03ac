"""Comparing answers, in the grader's process: a stdio run's stdout against the expected
output (:func:`outputs_match`), a call's plain return value against the expected one
(:func:`values_match`)."""

from __future__ import annotations

import decimal
import json
import math
import re
from typing import Any

_INT = re.compile(r"[+-]?\d+")


def outputs_match(got: str, expected: str, tolerance: float | None = None) -> bool:
    """stdout against the expected output: line by line (trailing whitespace and blank
    lines at the ends ignored), else token by token. An expected integer must be printed
    as that integer, digit for digit (no ``1e20`` for 100000000000000000000, no ``7`` for
    ``007``); an expected decimal matches a number equal to it (``2.50`` is ``2.5``), or
    within ``tolerance`` where the problem states one; anything else compares as text.
    Never converts a token to ``int``: a 5,000-digit line is compared, not parsed."""
    g = [line.rstrip() for line in got.strip().splitlines()]
    e = [line.rstrip() for line in expected.strip().splitlines()]
    if g == e:
        return True
    gt, et = got.split(), expected.split()
    if len(gt) != len(et):
        return False
    return all(_tokens_match(a, b, tolerance) for a, b in zip(gt, et, strict=True))


_DECIMAL = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?")


def _tokens_match(a: str, b: str, tolerance: float | None) -> bool:
    if a == b:
        return True
    if not _DECIMAL.fullmatch(b) or not _DECIMAL.fullmatch(a):
        return False  # a word, or not a number printed where one was expected
    if _INT.fullmatch(b) and tolerance is None:
        return False  # an integer answer, digit for digit (a stated error bound makes the
        # problem's answers real numbers, its integers among them)
    if len(a) > 400 or len(b) > 400:
        return False  # longer decimals than any checker reads: only equal text passes
    try:
        x, y = decimal.Decimal(a), decimal.Decimal(b)
    except decimal.InvalidOperation:
        return False
    if x == y:
        return True
    if tolerance is None:
        return False
    fx, fy = float(x), float(y)
    return math.isclose(fx, fy, rel_tol=tolerance, abs_tol=tolerance)


# Floats returned by a call compare up to rounding: a correct program that sums in
# another order may differ in the last bits, never in the 9th significant digit (near 0,
# by 1e-12 at most).
_ROUNDING = 1e-9


def values_match(got: Any, expected: Any, tolerance: float | None = None) -> bool:
    """A call's return value (as plain data) against the expected one, by type: integers,
    strings and booleans exactly (a bool is not an int, a number is not a string), floats
    against floats up to rounding (relative 1e-9) or within the problem's stated
    ``tolerance``, an int and a float exactly as numbers; tuples compare as lists (JSON has
    no tuples); APPS's list wrap of a single output counts either way."""
    tol = _ROUNDING if tolerance is None else tolerance
    if _equal(got, expected, tol):
        return True
    return type(expected) is list and len(expected) == 1 and _equal(got, expected[0], tol)


def _equal(a: Any, b: Any, tol: float) -> bool:
    ta, tb = type(a), type(b)
    if ta is float and tb is float:
        if a != a or b != b:
            return False  # NaN equals nothing, not even an expected NaN
        return a == b or math.isclose(
            a, b, rel_tol=tol, abs_tol=tol * 1e-3 if tol == _ROUNDING else tol
        )
    if ta in (int, float) and tb in (int, float):
        if tol != _ROUNDING and float in (ta, tb):  # a stated tolerance: real numbers
            return a == b or math.isclose(a, b, rel_tol=tol, abs_tol=tol)
        return a == b
    if ta in (list, tuple) and tb in (list, tuple):
        return len(a) == len(b) and all(_equal(x, y, tol) for x, y in zip(a, b, strict=True))
    if ta is dict and tb is dict:
        return a.keys() == b.keys() and all(_equal(a[k], b[k], tol) for k in a)
    if ta is not tb:
        return False  # bool vs int, str vs number, None vs anything else
    return bool(a == b) if ta in (str, bool, type(None)) else False


def shown(value: Any, limit: int = 300) -> str:
    """A value as one clipped line for a failure message; never raises (an integer of
    more digits than ``str`` converts is shown by its size)."""
    try:
        text = value if isinstance(value, str) else json.dumps(value, default=repr)
    except (ValueError, TypeError, RecursionError):
        text = f"<a {type(value).__name__} too large to show>"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def _json_like(x: Any) -> Any:
    """A decoded return value as JSON would carry it (the form APPS's outputs are in):
    tuples as lists, dict keys as JSON object keys."""
    t = type(x)
    if t in (list, tuple):
        return [_json_like(v) for v in x]
    if t is dict:
        return {_json_key(k): _json_like(v) for k, v in x.items()}
    return x


def _json_key(k: Any) -> Any:
    if type(k) is str:
        return k
    if type(k) in (int, float, bool) or k is None:
        try:
            return json.dumps(k)
        except ValueError:
            return None  # an integer key too long to write: it matches no expected key
    return k  # a tuple key: no JSON form, so it matches no expected object
