"""Comparing answers, in the grader's process: a stdio run's stdout against the expected
output (:func:`outputs_match`), a call's plain return value against the expected one
(:func:`values_match`)."""

from __future__ import annotations

import json
import math
import re
from typing import Any

_INT = re.compile(r"[+-]?\d+")


def outputs_match(got: str, expected: str) -> bool:
    """stdout against the expected output: line by line (trailing whitespace and blank
    lines at the ends ignored), else token by token. Tokens that are both integers compare
    as integers, exactly (``1000001`` is not ``1000000``); a tolerance (1e-6, relative or
    absolute) applies only when both tokens are numbers and neither is an integer; an
    integer and a decimal compare exactly as numbers (``2`` is ``2.0``); anything else
    compares as text."""
    g = [line.rstrip() for line in got.strip().splitlines()]
    e = [line.rstrip() for line in expected.strip().splitlines()]
    if g == e:
        return True
    gt, et = got.split(), expected.split()
    if len(gt) != len(et):
        return False
    return all(_tokens_match(a, b) for a, b in zip(gt, et, strict=True))


def _tokens_match(a: str, b: str) -> bool:
    if a == b:
        return True
    a_int, b_int = _INT.fullmatch(a) is not None, _INT.fullmatch(b) is not None
    if a_int and b_int:
        return int(a) == int(b)
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    if a_int or b_int:
        return x == y
    return math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-6)


def values_match(got: Any, expected: Any) -> bool:
    """A call's return value (as plain data) against the expected one, by type: integers,
    strings and booleans exactly (a bool is not an int, a number is not a string), floats
    with a 1e-6 tolerance only against floats, an int and a float exactly as numbers;
    tuples compare as lists (JSON has no tuples); APPS's list wrap of a single output
    counts either way."""
    if _equal(got, expected):
        return True
    return type(expected) is list and len(expected) == 1 and _equal(got, expected[0])


def _equal(a: Any, b: Any) -> bool:
    ta, tb = type(a), type(b)
    if ta is float and tb is float:
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)
    if ta in (int, float) and tb in (int, float):
        return a == b
    if ta in (list, tuple) and tb in (list, tuple):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if ta is dict and tb is dict:
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if ta is not tb:
        return False  # bool vs int, str vs number, None vs anything else
    return bool(a == b) if ta in (str, bool, type(None)) else False


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
        return json.dumps(k)
    return k  # a tuple key: no JSON form, so it matches no expected object
