"""Plain values: the only thing that crosses from the program's process.

:func:`_encode` and :func:`_decode` are also pasted, by their source, into the in-sandbox
harness (:mod:`runtime.workloads.rewards.code.harness`), so each must stay self-contained:
no name from this module but ``_NotPlain`` and ``_DEPTH``, no import outside the body."""

from __future__ import annotations

from typing import Any


class _NotPlain(Exception):
    """A value the grader will not carry: not one of the exact plain types."""


_DEPTH = 200  # deeper (or cyclic) structures are refused rather than recursed through


def _encode(x: Any, handle_of: Any = None, depth: int = 0) -> Any:
    """``x`` as JSON data, tagged so that :func:`_decode` rebuilds the same exact types.

    Only exact built-in value types (and a few exact ``collections`` types) are plain: a
    subclass, or anything with an ``__eq__`` of its own, is refused, so what is compared is
    data, never an object the program wrote. ``handle_of`` names objects that may stand for
    themselves (instances of the program's classes passed between its calls)."""
    t = type(x)
    if x is None or t is bool or t is int or t is str:
        return x
    if depth > _DEPTH:
        raise _NotPlain("nested too deep")
    if t is float:
        return x if x == x and x not in (float("inf"), float("-inf")) else ["f", repr(x)]
    d = depth + 1
    if t is list or t is tuple or t is set or t is frozenset:
        tag = {list: "l", tuple: "t", set: "s", frozenset: "fs"}[t]
        return [tag, [_encode(v, handle_of, d) for v in x]]
    if t is dict:
        return ["d", [[_encode(k, handle_of, d), _encode(v, handle_of, d)] for k, v in x.items()]]
    if t is bytes:
        return ["b", x.hex()]
    if t is complex:
        return ["c", [_encode(x.real), _encode(x.imag)]]
    import collections

    pairs = None
    if t is collections.Counter or t is collections.OrderedDict:
        pairs = [[_encode(k, handle_of, d), _encode(v, handle_of, d)] for k, v in dict.items(x)]
        return ["C" if t is collections.Counter else "O", pairs]
    if t is collections.defaultdict:
        factory = x.default_factory
        names = {None: None, int: "int", list: "list", set: "set", str: "str", float: "float"}
        if factory not in names:
            raise _NotPlain("defaultdict with a default_factory of its own")
        pairs = [[_encode(k, handle_of, d), _encode(v, handle_of, d)] for k, v in dict.items(x)]
        return ["D", [names[factory], pairs]]
    if t is collections.deque:
        return ["Q", [[_encode(v, handle_of, d) for v in x], x.maxlen]]
    h = handle_of(x) if handle_of is not None else None
    if h is not None:
        return ["h", h]
    raise _NotPlain(f"{t.__module__}.{t.__qualname__}")


def _decode(v: Any, resolve: Any = None) -> Any:
    """The value :func:`_encode` wrote (``resolve`` maps a handle number to its object)."""
    t = type(v)
    if v is None or t is bool or t is int or t is str or t is float:
        return v
    if t is not list or len(v) != 2 or type(v[0]) is not str:
        raise _NotPlain("malformed value")
    tag, body = v
    if tag == "f":
        return float(body)
    if tag in ("l", "t", "s", "fs"):
        items = [_decode(x, resolve) for x in body]
        return {"l": list, "t": tuple, "s": set, "fs": frozenset}[tag](items)
    if tag == "b":
        return bytes.fromhex(body)
    if tag == "c":
        return complex(_decode(body[0]), _decode(body[1]))
    import collections

    if tag in ("d", "C", "O"):
        kind = {"d": dict, "C": collections.Counter, "O": collections.OrderedDict}[tag]
        out = kind()
        for k, x in body:
            out[_decode(k, resolve)] = _decode(x, resolve)
        return out
    if tag == "D":
        factories = {"int": int, "list": list, "set": set, "str": str, "float": float}
        out = collections.defaultdict(factories.get(body[0]))
        for k, x in body[1]:
            out[_decode(k, resolve)] = _decode(x, resolve)
        return out
    if tag == "Q":
        return collections.deque([_decode(x, resolve) for x in body[0]], body[1])
    if tag == "h" and resolve is not None:
        return resolve(body)
    raise _NotPlain(f"unknown tag {tag!r}")
