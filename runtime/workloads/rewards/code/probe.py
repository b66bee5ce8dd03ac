"""The probe: test code with its answers cut away (:func:`probe_code`), and the names in
it that stand for the program (:func:`program_names`). The record run executes the probe
beside the program; the answers stay in the test code, which only the replay runs."""

from __future__ import annotations

import ast
import builtins
import importlib
import sys
import warnings
from dataclasses import dataclass
from typing import Any

from runtime.workloads.rewards.code.prelude import PRELUDE

_BUILTINS = frozenset(dir(builtins))
_PRELUDE_NAMES = frozenset(
    n
    for stmt in ast.parse(PRELUDE).body
    if isinstance(stmt, (ast.Import, ast.ImportFrom))
    for a in stmt.names
    if a.name != "*"
    for n in [(a.asname or a.name).split(".")[0]]
) | frozenset(__import__("typing").__all__)
_CONTROL = (ast.Return, ast.Pass, ast.Break, ast.Continue, ast.Global, ast.Nonlocal)
_REDUCIBLE = (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign)


def _parse(code: str) -> ast.Module:
    # Test code and programs are not ours to lint: their invalid escapes stay quiet.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.parse(code)


def _bound(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
            names.add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, ast.arg):
            names.add(n.arg)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in n.names}
        elif isinstance(n, ast.ExceptHandler) and n.name:
            names.add(n.name)
    return names


def _imported(tree: ast.AST) -> set[str]:
    return {
        (a.asname or a.name).split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in n.names
    }


@dataclass(frozen=True)
class Bindings:
    """What a program binds at module level (in its top-level ``if``/``try``/``with``/loop
    bodies too): by def, class or assignment (``defined``; imports left out, since a
    program's ``import math`` is the same ``math`` the tests get), the classes among them,
    and the names it imports."""

    defined: frozenset[str] = frozenset()
    classes: frozenset[str] = frozenset()
    imported: frozenset[str] = frozenset()


def program_bindings(program: str) -> Bindings:
    try:
        tree = _parse(program)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return Bindings()
    out: set[str] = set()
    classes: set[str] = set()
    imported: set[str] = set()
    todo = list(tree.body)
    while todo:
        s = todo.pop()
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(s.name)
            if isinstance(s, ast.ClassDef):
                classes.add(s.name)
        elif isinstance(s, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = s.targets if isinstance(s, ast.Assign) else [s.target]
            out |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(s, (ast.Import, ast.ImportFrom)):
            imported |= _imported(s)
        elif isinstance(s, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            todo += [c for c in ast.iter_child_nodes(s) if isinstance(c, ast.stmt)]
            todo += [c for h in getattr(s, "handlers", []) for c in h.body]
    return Bindings(frozenset(out), frozenset(classes), frozenset(imported))


def _star_imported(tree: ast.AST) -> set[str]:
    """The names ``from M import *`` binds, for the standard library's modules (a test's
    preamble star-imports math, collections, ...: ``comb`` there is the test's own)."""
    out: set[str] = set()
    for n in ast.walk(tree):
        if not isinstance(n, ast.ImportFrom) or n.level or not n.module:
            continue
        if not any(a.name == "*" for a in n.names):
            continue
        if n.module.split(".")[0] not in sys.stdlib_module_names:
            continue
        try:
            module = importlib.import_module(n.module)
        except Exception:  # a module missing here binds nothing we know of
            continue
        public = getattr(module, "__all__", None)
        out |= set(public if public is not None else (k for k in dir(module) if k[:1] != "_"))
    return out


def free_names(test_code: str) -> set[str]:
    """The names ``test_code`` reads without binding them itself."""
    tree = _parse(test_code)
    loaded = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    return loaded - _bound(tree) - _star_imported(tree)


def program_names(test_code: str, defined: set[str], entry: str | None) -> list[str]:
    """The names in ``test_code`` that stand for the program: free names that are neither
    builtins nor the prelude's imports, plus the entry point. A builtin or prelude name the
    program itself defines counts only where nothing else can be the function under test:
    no entry point (as MBPP), no other program name in the test, and exactly one such name
    (MBPP 126 tests ``sum``). Otherwise every builtin the tests use stays the real one, so
    the program's redefinition of ``set`` or ``abs`` cannot judge the expected side."""
    free = free_names(test_code)
    out = {n for n in free if n == entry or (n not in _BUILTINS and n not in _PRELUDE_NAMES)}
    if not out and entry is None:
        shadowed = free & defined
        if len(shadowed) == 1:
            out = shadowed
    return sorted(out)


def _carriers(tree: ast.Module, names: set[str], classes: set[str]) -> tuple[set[str], set[str]]:
    """The test's names that hold the program: ``names`` plus a parameter of a function the
    test defines, where a call passes it a program name (``check(candidate)`` called as
    ``check(add)``) or a method of a program object (``check(Solution().minOperations)``),
    and a variable assigned one (``fn = candidate``); and apart, the names that hold an
    object of one of the program's ``classes`` (``obj = LRUCache(2)``), whose method calls
    are calls into the program. Flow-insensitive; a name the test defines with
    ``def``/``class`` is never one."""
    defs = {
        n.name: n
        for n in ast.walk(tree)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    }
    funcs = {k: v for k, v in defs.items() if not isinstance(v, ast.ClassDef)}
    out, objects = set(names), set()
    shapes = _Shapes(out, objects, classes & names)
    changed = True
    while changed:
        changed = False
        for n in ast.walk(tree):
            new: set[str] = set()
            new_objects: set[str] = set()
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in funcs:
                a = funcs[n.func.id].args  # type: ignore[union-attr]
                params = [p.arg for p in (*a.posonlyargs, *a.args)]
                passed = []
                for i, arg in enumerate(n.args):
                    if isinstance(arg, ast.Starred):
                        break
                    if i < len(params):
                        passed.append((params[i], arg))
                passed += [(kw.arg, kw.value) for kw in n.keywords if kw.arg]
                for param, arg in passed:
                    if shapes.callable(arg):
                        new.add(param)
                    elif shapes.obj(arg):
                        new_objects.add(param)
            elif isinstance(n, ast.Assign):
                targets = {t.id for t in n.targets if isinstance(t, ast.Name)}
                if shapes.callable(n.value):
                    new |= targets
                elif shapes.obj(n.value):
                    new_objects |= targets
            new -= set(defs)
            new_objects -= set(defs)
            if new - out or new_objects - objects:
                out |= new
                objects |= new_objects
                changed = True
    return out, objects


class _Shapes:
    """What an expression of the test is, as far as the program goes: something callable
    of the program's (a program name, or a method of a program object), or a program
    object (a name holding one, or a call of a program class)."""

    def __init__(self, names: set[str], objects: set[str], classes: set[str]) -> None:
        self.names, self.objects, self.classes = names, objects, classes

    def obj(self, e: ast.AST) -> bool:
        if isinstance(e, ast.Name):
            return e.id in self.objects
        return (
            isinstance(e, ast.Call)
            and isinstance(e.func, ast.Name)
            and e.func.id in self.classes
            and e.func.id in self.names
        )

    def method(self, e: ast.AST) -> bool:
        # Only a program object's methods: an attribute of a value the program returned
        # (``candidate(x).count(5)``) is the test's own call, answers and all.
        return isinstance(e, ast.Attribute) and self.obj(e.value)

    def callable(self, e: ast.AST) -> bool:
        return (isinstance(e, ast.Name) and e.id in self.names) or self.method(e)


class _Probe:
    def __init__(self, tree: ast.Module, names: list[str], classes: set[str]) -> None:
        self.names, self.objects = _carriers(tree, set(names), classes)
        self.shapes = _Shapes(self.names, self.objects, classes)

    def kept_call(self, n: ast.AST) -> bool:
        # A call into the program: a program name, a name that holds one (``candidate``),
        # or a method of a program object (``Solution().twoSum(...)``, ``obj.get(1)``).
        # Calls of builtins, imports, other methods and the test's own helpers are the
        # test's own work: they are never kept whole (their arguments hold the answers),
        # only the calls into the program inside them are.
        if not isinstance(n, ast.Call):
            return False
        if isinstance(n.func, ast.Name):
            return n.func.id in self.names or self.hand_off(n)
        return self.shapes.method(n.func)

    def hand_off(self, n: ast.Call) -> bool:
        # ``check(add)``, ``check(Solution().minOperations)``: a call of the test's own
        # function that passes it the program and nothing else (an answer beside the
        # program would be kept with it).
        given = [*n.args, *(kw.value for kw in n.keywords)]
        return (
            bool(given)
            and all(kw.arg is not None for kw in n.keywords)
            and all(self.shapes.callable(a) or self.shapes.obj(a) for a in given)
        )

    def calls_in(self, expr: ast.AST) -> list[ast.expr]:
        """The outermost kept calls of an expression, in source order; one inside a
        comprehension keeps the comprehension's loop around it (its names are bound
        there)."""
        if self.kept_call(expr):
            return [expr]  # type: ignore[list-item]
        if isinstance(expr, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            inner = [*self.calls_in(getattr(expr, "elt", None) or expr.value)]  # type: ignore[attr-defined]
            if isinstance(expr, ast.DictComp):
                inner = self.calls_in(expr.key) + inner
            gens = [self.calls_in(g.iter) for g in expr.generators]
            if not inner:
                return [c for g in gens for c in g]
            return [
                ast.ListComp(elt=ast.Tuple(elts=inner, ctx=ast.Load()), generators=expr.generators)
            ]
        if isinstance(expr, ast.Lambda):
            return []
        return [c for child in ast.iter_child_nodes(expr) for c in self.calls_in(child)]

    def neuter(self, body: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for s in body:
            if isinstance(s, ast.Assert):
                out += [ast.Expr(value=c) for c in self.calls_in(s.test)]
                continue
            for name in ("body", "orelse", "finalbody"):
                if isinstance(getattr(s, name, None), list) and getattr(s, name):
                    setattr(s, name, self.neuter(getattr(s, name)) or [ast.Pass()])
            for h in getattr(s, "handlers", []):
                h.body = self.neuter(h.body) or [ast.Pass()]
            out.append(s)
        return out


def _children(s: ast.stmt) -> list[ast.stmt]:
    kids = [c for name in ("body", "orelse", "finalbody") for c in getattr(s, name, []) or []]
    return kids + [c for h in getattr(s, "handlers", []) for c in h.body]


def _own_parts(s: ast.stmt) -> list[ast.AST]:
    if isinstance(s, (ast.For, ast.AsyncFor)):
        return [s.target, s.iter]
    if isinstance(s, (ast.While, ast.If)):
        return [s.test]
    if isinstance(s, (ast.With, ast.AsyncWith)):
        return list(s.items)
    if isinstance(s, ast.Try):
        return [h.type for h in s.handlers if h.type is not None]
    if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return [*s.decorator_list, s.args]
    if isinstance(s, ast.ClassDef):
        return [*s.decorator_list, *s.bases, *s.keywords]
    return [s]


def _base(n: ast.AST) -> str | None:
    while isinstance(n, (ast.Attribute, ast.Subscript, ast.Starred)):
        n = n.value
    return n.id if isinstance(n, ast.Name) else None


def _binds(s: ast.stmt) -> set[str]:
    """Names a statement (re)binds or changes in place: assignment targets (``a.b = ``
    and ``a[i] = `` change ``a``), ``a.append(x)``-style calls, imports, defs, loop and
    ``with`` targets."""
    if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {s.name}
    if isinstance(s, (ast.Import, ast.ImportFrom)):
        return _imported(s)
    targets: list[ast.AST] = []
    if isinstance(s, ast.Assign):
        targets = list(s.targets)
    elif isinstance(s, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor)):
        targets = [s.target]
    elif isinstance(s, (ast.With, ast.AsyncWith)):
        targets = [i.optional_vars for i in s.items if i.optional_vars is not None]
    elif isinstance(s, ast.Delete):
        targets = list(s.targets)
    elif (
        isinstance(s, ast.Expr)
        and isinstance(s.value, ast.Call)
        and isinstance(s.value.func, ast.Attribute)
    ):
        targets = [s.value.func.value]
    out = set()
    for t in targets:
        out |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
        if (b := _base(t)) is not None:
            out.add(b)
    return out


def _value_calls(probe: _Probe, s: ast.stmt) -> list[ast.expr]:
    value = getattr(s, "value", None)
    return [] if value is None else probe.calls_in(value)


def probe_code(test_code: str, names: list[str], classes: set[str] | None = None) -> str:
    """``test_code`` as the record run executes it: each ``assert`` becomes the calls it
    makes into the program (its comparison and message, where the answers are, are
    dropped); then only statements that those calls' arguments and the control flow around
    them need are kept (a backward slice over names, flow-insensitive, so it keeps more
    rather than less). ``classes``: the program names that are classes (their objects'
    methods are calls into the program). Raises SyntaxError for test code that does not
    parse."""
    tree = _parse(test_code)
    probe = _Probe(tree, names, set(classes or ()))
    tree.body = probe.neuter(tree.body)
    # A def or class of the test's that makes no call into the program (``list_node``,
    # ``TreeNode``) is one unit: where an argument needs it, it is kept whole, its body
    # included, since slicing a helper's body would change what it computes.
    atomic = {
        id(n): n
        for n in ast.walk(tree)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and not any(probe.kept_call(c) for c in ast.walk(n))
    }
    inside_atomic = {id(c) for n in atomic.values() for c in ast.walk(n) if c is not n}
    stmts = [n for n in ast.walk(tree) if isinstance(n, ast.stmt) and id(n) not in inside_atomic]
    kept: set[int] = set()  # kept as written
    reduced: set[int] = set()  # kept as the calls into the program in it, nothing else
    needed: set[str] = set()

    def names_in(nodes: list[Any]) -> set[str]:
        return {n.id for p in nodes for n in ast.walk(p) if isinstance(n, ast.Name)}

    changed = True
    while changed:
        changed = False
        for s in stmts:
            if id(s) in kept:
                continue
            if id(s) in atomic:
                if _binds(s) & needed:
                    kept.add(id(s))
                    needed |= names_in([s])
                    changed = True
                continue
            parts = _own_parts(s)
            calls = any(probe.kept_call(n) for p in parts for n in ast.walk(p))
            inner = any(id(c) in kept or id(c) in reduced for c in _children(s))
            if isinstance(s, _REDUCIBLE) and not _binds(s) & needed:
                # An expression or assignment that no later call needs: only its calls into
                # the program run (``ok = _close(candidate(x), 1.41)`` keeps no 1.41).
                if calls and id(s) not in reduced:
                    reduced.add(id(s))
                    needed |= names_in(_value_calls(probe, s))
                    changed = True
                continue
            if calls or inner or _binds(s) & needed:
                kept.add(id(s))
                reduced.discard(id(s))
                needed |= names_in(parts)
                changed = True

    def prune(body: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for s in body:
            if id(s) in reduced:
                out += [ast.Expr(value=c) for c in _value_calls(probe, s)]
                continue
            if id(s) not in kept and not isinstance(s, _CONTROL):
                continue
            if id(s) in atomic:
                out.append(s)
                continue
            for name in ("body", "orelse", "finalbody"):
                if isinstance(getattr(s, name, None), list) and getattr(s, name):
                    setattr(s, name, prune(getattr(s, name)) or [ast.Pass()])
            for h in getattr(s, "handlers", []):
                h.body = prune(h.body) or [ast.Pass()]
            out.append(s)
        return out

    tree.body = prune(tree.body)
    return ast.unparse(ast.fix_missing_locations(tree))
