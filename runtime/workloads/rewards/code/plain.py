"""Plain values: the only thing that crosses from the program's process.

:func:`_encode` and :func:`_decode` are also pasted, by their source, into the in-sandbox
harness (:mod:`runtime.workloads.rewards.code.harness`), so each must stay self-contained:
no name from this module but ``_NotPlain``, ``_DEPTH``, ``_NODES``, ``_PLAIN_TYPES``,
``_OWN_MODULES`` and the two node helpers, no import outside the body.

LeetCode's linked lists and binary trees (``ListNode(val, next)``, ``TreeNode(val, left,
right)``) cross as data too: an object of a class so named is read by its ``val`` and links
only (its methods never run here), walked without recursion, and refused when a node is
reached twice (a cycle, or a tree sharing a subtree). The other side rebuilds it as its
own class of that name: the tests' class in the tests' process, the program's in the
program's."""

from __future__ import annotations

from typing import Any


class _NotPlain(Exception):
    """A value the grader will not carry: not one of the exact plain types."""


_DEPTH = 200  # deeper (or cyclic) structures are refused rather than recursed through
_NODES = 1_000_000  # nodes of one linked list or tree; more is refused
# The module names of classes the tests (run as ``__main__``) and the program (run as
# ``solution``) define: their objects cross as their attributes.
_OWN_MODULES = ("__main__", "solution")
# Built-in types that may cross by name (the real one on each side).
_PLAIN_TYPES = (int, float, str, bool, bytes, complex, list, tuple, dict, set, frozenset)


def _encode_nodes(x: Any, handle_of: Any, depth: int) -> Any:
    """A ListNode chain as ``["LN", [val, ...]]``, a TreeNode as ``["TN", [[val, left,
    right], ...]]`` in breadth-first order (links are indices, -1 for none); None when
    ``x`` is neither. Only the instance's own ``val`` and link attributes are read."""
    kind = type(x).__name__
    links = {"ListNode": ("next",), "TreeNode": ("left", "right")}.get(kind)
    if links is None:
        return None
    seen: set[int] = set()
    order = [x]
    out = []
    i = 0
    while i < len(order):
        node = order[i]
        i += 1
        if type(node).__name__ != kind:
            raise _NotPlain(f"{kind} linked to a {type(node).__qualname__}")
        if id(node) in seen or len(order) > _NODES:
            raise _NotPlain(f"{kind} reached twice (a cycle or a shared node)")
        seen.add(id(node))
        try:
            own = object.__getattribute__(node, "__dict__")
        except AttributeError:
            raise _NotPlain(f"{kind} without attributes") from None
        if "val" not in own:
            raise _NotPlain(f"{kind} without a val")
        row = [_encode(own["val"], handle_of, depth + 1)]
        for link in links:
            child = own.get(link)
            if child is None:
                row.append(-1)
            else:
                row.append(len(order))
                order.append(child)
        out.append(row)
    if kind == "ListNode":
        return ["LN", [row[0] for row in out]]
    return ["TN", out]


def _decode_nodes(tag: Any, body: Any, resolve: Any, classes: Any) -> Any:
    """The object :func:`_encode_nodes` read, built of ``classes[kind]`` (a class taking
    no arguments is not needed: nodes are made with ``__new__`` and given attributes)."""
    kind = "ListNode" if tag == "LN" else "TreeNode"
    cls = (classes or {}).get(kind) or _DEFAULT_NODE_CLASSES[kind]
    if type(body) is not list or len(body) > _NODES:
        raise _NotPlain("malformed nodes")
    nodes = []
    for _ in body:
        node = cls.__new__(cls)
        nodes.append(node)
    if tag == "LN":
        for i, v in enumerate(body):
            nodes[i].val = _decode(v, resolve, classes)
            nodes[i].next = nodes[i + 1] if i + 1 < len(nodes) else None
        return nodes[0] if nodes else None
    linked: set[int] = set()
    for i, (node, row) in enumerate(zip(nodes, body, strict=True)):
        if type(row) is not list or len(row) != 3:
            raise _NotPlain("malformed tree")
        node.val = _decode(row[0], resolve, classes)
        for link, j in (("left", row[1]), ("right", row[2])):
            # Each node has one parent that comes before it: an answer cannot make a cycle.
            if type(j) is not int or not (j == -1 or i < j < len(nodes)) or j in linked:
                raise _NotPlain("malformed tree")
            if j != -1:
                linked.add(j)
            setattr(node, link, None if j == -1 else nodes[j])
    return nodes[0] if nodes else None


def _encode(x: Any, handle_of: Any = None, depth: int = 0) -> Any:
    """``x`` as JSON data, tagged so that :func:`_decode` rebuilds the same exact types.

    Only exact built-in value types (and a few exact ``collections`` types) are plain: a
    subclass, or anything with an ``__eq__`` of its own, is refused, so what is compared is
    data, never an object the program wrote. ``handle_of`` names objects that may stand for
    themselves (instances of the program's classes passed between its calls)."""
    t = type(x)
    if x is None or t is bool or t is str:
        return x
    if t is int:
        # JSON readers (the grader's among them) refuse integers of over 4,300 digits:
        # a longer one travels as its digits, up to 100,000 of them.
        if x.bit_length() <= 13_000:
            return x
        if x.bit_length() > 332_200:
            raise _NotPlain("an integer of over 100,000 digits")
        return ["I", str(x)]
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
    if t is type and x in _PLAIN_TYPES:
        return ["T", x.__name__]  # remove_datatype(xs, int): a built-in type by its name
    h = handle_of(x) if handle_of is not None else None
    if h is not None:
        return ["h", h]
    nodes = _encode_nodes(x, handle_of, depth)
    if nodes is not None:
        return nodes
    if t.__module__ == "fractions" and t.__name__ == "Fraction":
        return ["Fr", [_encode(x.numerator, None, d), _encode(x.denominator, None, d)]]
    if t.__module__ == "decimal" and t.__name__ == "Decimal":
        return ["Dc", str(x)]
    if t.__module__ in _OWN_MODULES and type(t) is type:
        # An object of a class the tests or the program wrote (MBPP's setup builds trees
        # of its own Node): its class's name and its own attributes, as data. Nothing of
        # the class crosses: the other side rebuilds it as its own class of that name, or
        # a bare one.
        try:
            own = object.__getattribute__(x, "__dict__")
        except AttributeError:
            raise _NotPlain(f"{t.__module__}.{t.__qualname__}") from None
        attrs = [[k, _encode(v, handle_of, d)] for k, v in own.items() if type(k) is str]
        return ["o", [t.__name__, attrs]]
    raise _NotPlain(f"{t.__module__}.{t.__qualname__}")


def _decode(v: Any, resolve: Any = None, classes: Any = None) -> Any:
    """The value :func:`_encode` wrote (``resolve`` maps a handle number to its object,
    ``classes`` names the ``ListNode``/``TreeNode`` classes to rebuild nodes as)."""
    t = type(v)
    if v is None or t is bool or t is int or t is str or t is float:
        return v
    if t is not list or len(v) != 2 or type(v[0]) is not str:
        raise _NotPlain("malformed value")
    tag, body = v
    if tag == "f":
        return float(body)
    if tag == "I":
        digits = body[1:] if type(body) is str and body[:1] == "-" else body
        if type(digits) is not str or not 0 < len(digits) <= 100_000:
            raise _NotPlain("malformed integer")
        if any(c not in "0123456789" for c in digits):
            raise _NotPlain("malformed integer")
        import decimal  # int() of a str is capped at 4,300 digits; a Decimal is not

        return int(decimal.Decimal(body))
    if tag in ("l", "t", "s", "fs", "G"):
        items = [_decode(x, resolve, classes) for x in body]
        if tag == "G":
            return iter(items)  # a generator the program returned, drawn to its end there
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
            out[_decode(k, resolve, classes)] = _decode(x, resolve, classes)
        return out
    if tag == "D":
        factories = {"int": int, "list": list, "set": set, "str": str, "float": float}
        out = collections.defaultdict(factories.get(body[0]))
        for k, x in body[1]:
            out[_decode(k, resolve, classes)] = _decode(x, resolve, classes)
        return out
    if tag == "Q":
        return collections.deque([_decode(x, resolve, classes) for x in body[0]], body[1])
    if tag == "h" and resolve is not None:
        return resolve(body)
    if tag == "T":
        found = [c for c in _PLAIN_TYPES if c.__name__ == body]
        if not found:
            raise _NotPlain("unknown type")
        return found[0]
    if tag in ("LN", "TN"):
        return _decode_nodes(tag, body, resolve, classes)
    if tag == "Fr":
        import fractions

        return fractions.Fraction(_decode(body[0]), _decode(body[1]))
    if tag == "Dc":
        import decimal

        return decimal.Decimal(str(body))
    if tag == "o":
        name, attrs = body
        cls = (classes or {}).get(name)
        if not (isinstance(cls, type) and cls.__module__ in _OWN_MODULES):
            cls = type(str(name), (), {"__module__": _OWN_MODULES[0]})
        out = cls.__new__(cls)
        own = object.__getattribute__(out, "__dict__")
        for k, v in attrs:
            own[str(k)] = _decode(v, resolve, classes)
        return out
    raise _NotPlain(f"unknown tag {tag!r}")


def _has_nan(v: Any) -> bool:
    """Whether an encoded value holds a NaN anywhere (a float, a complex part, a Decimal,
    an attribute of an object); a dict's values are walked too (changed arguments)."""
    todo = [v]
    while todo:
        v = todo.pop()
        if type(v) is float and v != v:
            return True
        if type(v) is dict:
            todo += list(v.values())
            continue
        if type(v) is not list or len(v) != 2 or type(v[0]) is not str:
            continue
        tag, body = v
        if tag == "f" or tag == "Dc":
            if "nan" in str(body).lower():
                return True
        elif tag in ("l", "t", "s", "fs", "LN", "G", "c"):
            todo += body
        elif tag in ("d", "C", "O"):
            todo += [x for pair in body for x in pair]
        elif tag == "D":
            todo += [x for pair in body[1] for x in pair]
        elif tag == "Q":
            todo += body[0]
        elif tag == "TN":
            todo += [row[0] for row in body]
        elif tag == "o" and type(body) is list and len(body) == 2:
            todo += [pair[1] for pair in body[1] if type(pair) is list and len(pair) == 2]
    return False


def _object_name(v: Any) -> Any:
    """The class name of an encoded object of a tests' or program's class (``["o", ...]``),
    None for anything else."""
    if type(v) is list and len(v) == 2 and v[0] == "o" and type(v[1]) is list and v[1]:
        return str(v[1][0])
    return None


class _DefaultListNode:
    """What a ListNode is rebuilt as where no class of that name is at hand."""

    def __init__(self, val: Any = 0, next: Any = None) -> None:
        self.val, self.next = val, next


class _DefaultTreeNode:
    def __init__(self, val: Any = 0, left: Any = None, right: Any = None) -> None:
        self.val, self.left, self.right = val, left, right


_DEFAULT_NODE_CLASSES = {"ListNode": _DefaultListNode, "TreeNode": _DefaultTreeNode}
