"""Which names of the tests stand for the program (:func:`program_names`), and what a
program binds (:func:`program_bindings`): the tests' process binds those names to
stand-ins that call into the program's process; every other name stays the tests' own."""

from __future__ import annotations

import ast
import builtins
import importlib
import threading
import warnings
from dataclasses import dataclass

from runtime.workloads.rewards.code.prelude import PRELUDE

_BUILTINS = frozenset(dir(builtins))


def _prelude_names() -> frozenset[str]:
    """Every name the prelude binds, its star imports' included (``from heapq import *``:
    a test's ``nsmallest`` is heapq's, on the tests' side, never the program's)."""
    out: set[str] = set()
    for stmt in ast.parse(PRELUDE).body:
        if not isinstance(stmt, (ast.Import, ast.ImportFrom)):
            continue
        for a in stmt.names:
            if a.name != "*":
                out.add((a.asname or a.name).split(".")[0])
            elif isinstance(stmt, ast.ImportFrom) and stmt.module:
                module = importlib.import_module(stmt.module)
                public = getattr(module, "__all__", None)
                out |= set(
                    public if public is not None else (k for k in dir(module) if k[:1] != "_")
                )
    return frozenset(out)


_PRELUDE_NAMES = _prelude_names()


# CPython 3.11's parser keeps its AST recursion depth in shared state: two threads
# parsing at once (a reward pool grading several programs) can fail with "AST constructor
# recursion depth mismatch". One parse at a time.
_PARSE_LOCK = threading.Lock()


def parse(code: str, mode: str = "exec") -> ast.AST:
    """``ast.parse`` of test code or a program, one thread at a time, its invalid escapes
    quiet (they are not ours to lint)."""
    with _PARSE_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.parse(code, mode=mode)


def _returns_at_top_level(tree: ast.Module) -> bool:
    """Whether the module has a ``return`` outside any function (in its body or a block of
    it): what APPS's harness allows by running a stdin program inside a function, and
    Python refuses in a module."""
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Return):
            return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        todo.extend(ast.iter_child_nodes(node))
    return False


def _parse(code: str) -> ast.Module:
    return parse(code)  # type: ignore[return-value]


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
    the names it imports, and whether it returns at its top level (outside any function,
    as APPS's stdin programs may)."""

    defined: frozenset[str] = frozenset()
    classes: frozenset[str] = frozenset()
    imported: frozenset[str] = frozenset()
    returns_at_top_level: bool = False


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
    return Bindings(
        frozenset(out), frozenset(classes), frozenset(imported), _returns_at_top_level(tree)
    )


# The standard library modules whose names a test may star-import (LeetCodeDataset's
# preamble takes these), imported in the grader's process to list them.
_STAR_MODULES = frozenset(
    {
        "math", "cmath", "collections", "itertools", "functools", "heapq", "bisect",
        "string", "operator", "typing", "random", "re", "datetime", "statistics",
        "fractions", "decimal", "copy", "array", "numbers",
    }
)  # fmt: skip


def _star_imported(tree: ast.AST) -> set[str]:
    """The names ``from M import *`` binds, for the standard library's modules (a test's
    preamble star-imports math, collections, ...: ``comb`` there is the test's own)."""
    out: set[str] = set()
    for n in ast.walk(tree):
        if not isinstance(n, ast.ImportFrom) or n.level or not n.module:
            continue
        if not any(a.name == "*" for a in n.names):
            continue
        if n.module not in _STAR_MODULES:
            continue  # no other module is imported here (some do things on import)
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


def program_sources(program: str) -> dict[str, str]:
    """The program's own text of each function and class it defines at top level, and of
    each method of its classes (``Solution.f``, indented as written): what
    ``inspect.getsource`` of its stand-in gives a test ("do not call sorted"). Data only:
    nothing of it runs in the tests' process."""
    try:
        tree = _parse(program)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {}
    lines = program.splitlines(keepends=True)

    def text(node: ast.AST) -> str:
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        return "".join(lines[first - 1 : node.end_lineno])

    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = text(node)
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out[f"{node.name}.{item.name}"] = text(item)
    return out
