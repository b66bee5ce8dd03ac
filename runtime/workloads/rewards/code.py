"""Code-execution reward: run a program against test cases in the sandbox, with a verdict
the program cannot forge.

Four test styles, as the public datasets write them:

- ``stdio`` (APPS/CodeContests ``{"inputs": [str], "outputs": [str]}``): each input is
  the program's stdin; its stdout must match the output (trailing whitespace ignored, then
  token by token; see :func:`outputs_match` for where a tolerance applies);
- ``call`` (APPS ``fn_name``): each input is the argument list of ``fn_name`` (a function,
  or a method of LeetCode's ``class Solution``); the return value must equal the output
  (APPS wraps some outputs in a list: both forms count; see :func:`values_match`);
- ``script`` (HumanEval ``test`` + ``entry_point``): test code that calls the program; it
  passes when it runs to its end without an error;
- ``asserts`` (MBPP ``test_list``, or a list of strings): each assert line is one test,
  run after ``test_setup_code``.

How a verdict is reached (docs/code-reward.md has the whole argument):

- The expected answers never enter the program's process. stdio: the program runs alone
  (its file holds only itself) and its stdout is compared here. call: a harness calls the
  function and reports the return value as *plain data* (exact built-in types, see
  :func:`_encode`; a subclass or an object with an ``__eq__`` of its own is refused), which
  is compared here.
- script/asserts tests hold their answers in code, so each runs twice. The *record* run
  (program + harness) executes a probe made from the test code: every ``assert`` is cut
  down to the calls into the program it makes, and statements that only compute expected
  values are sliced away (:func:`probe_code`). The harness records each call's arguments
  and plain result. The *replay* run (harness + the test code as written, no program in
  it) runs the real asserts with every call into the program answered from that record.
  The test passes only when the replay ran to its end: an early exit, a missing or
  duplicated record, a call the record lacks, or a non-plain result is a failure.
- The program's file is the harness alone; the program and the tests come on stdin, the
  probe having no answers in it. Whatever the record run prints (it is the program's to
  forge) is only a claim about what the program's functions returned, which the program
  could as well have returned; it cannot name the answers, which it never saw.

What the program's code may decide is kept to its own calls. A probe keeps whole only the
calls of program names, of names that hold one (``candidate``, by
:func:`_carriers`), and hand-offs like ``check(add)`` whose arguments are all such names;
of any other call (builtins, imports, the test's own helpers such as ``_close(candidate(x),
1.41)``) it keeps only the program calls inside the arguments, and an expression or
assignment that no later call needs is cut down the same way. A builtin or prelude name the
program redefines counts as the program's only with no entry point, no other program name
in the test and no second such name (MBPP 126 tests ``sum``); elsewhere the replay, which
holds no program code, runs the real builtin. A recorded ``StopIteration`` or
``StopAsyncIteration`` is refused: raised into ``map`` or ``iter(f, x)`` it would end the
test's iteration early.

Residual risk, honestly: a probe keeps what the calls' arguments need, so a test that
derives an argument from its answer gives the answer away (HumanEval 38/50 encode the
answer with the prompt's ``encode_*``, which is the program's own code); a check that
judges with a helper the program defines (HumanEval 32's ``poly``) is judged by the
program, as in HumanEval's own harness; a table of ``(input, answer)`` pairs that a loop
walks stays in the probe whole, and so do the headers of ``if``/``while``/``for`` and
``return``/``raise`` statements that call the program (their comparisons and lambdas
included); a builtin-named function under test (MBPP 126's ``sum``, or an entry point
named like a builtin) is the program's throughout its test, expected side included, as
in the datasets' own harnesses. A test helper that calls the program itself, or is handed
it beside other arguments, has no calls in the probe: such a test fails even for a right
program (a cost in correctness, never a pass). The sandbox (runtime/sandbox) bounds what
either run can do; nothing here depends on the program failing to inspect its own process.

Each run is one sandboxed process, tests of one program run ``parallel`` at a time, and
all of them share ``total_timeout_s``. The score is 1.0 when every test passes, else 0.0;
``passed``/``total`` say how close it came.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import json
import math
import re
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from runtime.workloads.sandbox import RunResult, Sandbox, SandboxLimits

# Imports APPS's own grader gives every program (minus numpy, absent from the sandbox's
# interpreter), so solutions written against that grader run unchanged.
PRELUDE = """\
import sys, time, itertools, collections, math, fractions, random, heapq, bisect, string, re
from itertools import accumulate, product, permutations, combinations
from collections import Counter, OrderedDict, deque, defaultdict, ChainMap
from functools import lru_cache, reduce, cmp_to_key
from math import sqrt, sin, cos, tan, ceil, fabs, floor, gcd, exp, log, log2
from typing import *
from heapq import *
sys.setrecursionlimit(10**6)
"""

_MARK = "@@reflow-verdict@@"


class TestSpecError(ValueError):
    """Tests that cannot be run; the message is one line naming the problem."""


@dataclass(frozen=True)
class TestSpec:
    kind: str  # stdio | call | script | asserts
    inputs: list[Any] = field(default_factory=list)  # asserts: the assert lines
    outputs: list[Any] = field(default_factory=list)
    fn_name: str | None = None  # call: the function; script: the entry point, when given
    script: str = ""  # script: the test code; asserts: the setup code

    @property
    def total(self) -> int:
        return 1 if self.kind == "script" else len(self.inputs)

    def subset(self, indices: list[int]) -> TestSpec:
        if self.kind == "script":
            return self
        return TestSpec(
            self.kind,
            [self.inputs[i] for i in indices],
            [self.outputs[i] for i in indices],
            self.fn_name,
            self.script,
        )


def parse_tests(obj: Any, *, fn_name: str | None = None) -> TestSpec:
    """A TestSpec from an APPS ``input_output`` (dict or JSON string), a HumanEval-style
    ``{"test", "entry_point"?}``, an MBPP-style ``{"test_list", "test_setup_code"?}``, or a
    test script string."""
    if isinstance(obj, list):
        obj = {"test_list": obj}
    if isinstance(obj, str):
        text = obj.strip()
        if text.startswith("{"):
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise TestSpecError(f"tests: not valid JSON ({exc.msg})") from None
        else:
            return TestSpec("script", script=obj)
    if not isinstance(obj, dict):
        raise TestSpecError(f"tests: expected an object, got {type(obj).__name__}")
    if "test" in obj:
        script = str(obj["test"])
        entry = obj.get("entry_point") or None
        if entry:
            if not isinstance(entry, str) or not entry.isidentifier():
                raise TestSpecError(f"tests: entry_point {entry!r} is not a Python identifier")
            script += f"\n\ncheck({entry})\n"
        return TestSpec("script", fn_name=entry, script=script)
    if "test_list" in obj:
        asserts = obj["test_list"]
        if not isinstance(asserts, list) or not all(isinstance(a, str) for a in asserts):
            raise TestSpecError("tests: 'test_list' must be a list of strings")
        if not asserts:
            raise TestSpecError("tests: no test cases")
        setup = str(obj.get("test_setup_code") or "")
        return TestSpec("asserts", list(asserts), [None] * len(asserts), script=setup)
    if "inputs" not in obj or "outputs" not in obj:
        raise TestSpecError("tests: need 'inputs' and 'outputs' (APPS) or 'test' (HumanEval)")
    inputs, outputs = obj["inputs"], obj["outputs"]
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise TestSpecError("tests: 'inputs' and 'outputs' must be lists")
    if len(inputs) != len(outputs):
        raise TestSpecError(
            f"tests: {len(inputs)} inputs but {len(outputs)} outputs; they pair up one to one"
        )
    if not inputs:
        raise TestSpecError("tests: no test cases")
    name = obj.get("fn_name") or fn_name
    if name:
        if not isinstance(name, str) or not name.isidentifier():
            raise TestSpecError(f"tests: fn_name {name!r} is not a Python identifier")
        return TestSpec("call", list(inputs), list(outputs), name)
    return TestSpec("stdio", [_as_text(x) for x in inputs], [_as_text(x) for x in outputs])


def _as_text(x: Any) -> str:
    return "\n".join(map(str, x)) if isinstance(x, list) else str(x)


@dataclass
class TestFailure:
    index: int
    input: Any
    expected: Any
    got: str
    status: str


@dataclass
class CodeResult:
    score: float
    passed: int
    total: int
    error: str | None = None
    failures: list[TestFailure] = field(default_factory=list)
    wall_s: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "score": self.score,
            "passed": self.passed,
            "total": self.total,
            "error": self.error,
        }


def extract_program(response: str) -> str:
    """The last fenced code block (```python preferred), else the whole response."""
    blocks = re.findall(r"```(\w*)[^\n]*\n(.*?)```", response, re.S)
    if not blocks:
        return response
    python = [code for lang, code in blocks if lang.lower() in ("python", "py", "python3")]
    return (python or [code for _, code in blocks])[-1]


# ---- comparing answers (in the grader's process) ----

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


# ---- the probe: test code with its answers cut away ----

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


def _top_level_definitions(program: str) -> set[str]:
    """Names the program binds at module level by def, class or assignment (imports left
    out: a program's ``import math`` is the same ``math`` the tests get)."""
    try:
        tree = _parse(program)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()
    out: set[str] = set()
    todo = list(tree.body)
    while todo:
        s = todo.pop()
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(s.name)
        elif isinstance(s, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = s.targets if isinstance(s, ast.Assign) else [s.target]
            out |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(s, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            todo += [c for c in ast.iter_child_nodes(s) if isinstance(c, ast.stmt)]
            todo += [c for h in getattr(s, "handlers", []) for c in h.body]
    return out


def program_names(test_code: str, defined: set[str], entry: str | None) -> list[str]:
    """The names in ``test_code`` that stand for the program: free names that are neither
    builtins nor the prelude's imports, plus the entry point. A builtin or prelude name the
    program itself defines counts only where nothing else can be the function under test:
    no entry point (as MBPP), no other program name in the test, and exactly one such name
    (MBPP 126 tests ``sum``). Otherwise every builtin the tests use stays the real one, so
    the program's redefinition of ``set`` or ``abs`` cannot judge the expected side."""
    tree = _parse(test_code)
    loaded = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    free = loaded - _bound(tree)
    out = {n for n in free if n == entry or (n not in _BUILTINS and n not in _PRELUDE_NAMES)}
    if not out and entry is None:
        shadowed = free & defined
        if len(shadowed) == 1:
            out = shadowed
    return sorted(out)


def _carriers(tree: ast.Module, names: set[str]) -> set[str]:
    """``names`` plus the test's names that hold one of them: a parameter of a function the
    test defines, where a call passes it a program name (``check(candidate)`` called as
    ``check(add)``), and a variable assigned one (``fn = candidate``). Flow-insensitive; a
    name the test defines with ``def``/``class`` is never one."""
    defs = {
        n.name: n
        for n in ast.walk(tree)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    }
    funcs = {k: v for k, v in defs.items() if not isinstance(v, ast.ClassDef)}
    out = set(names)
    changed = True
    while changed:
        changed = False
        for n in ast.walk(tree):
            new: set[str] = set()
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in funcs:
                a = funcs[n.func.id].args  # type: ignore[union-attr]
                params = [p.arg for p in (*a.posonlyargs, *a.args)]
                for i, arg in enumerate(n.args):
                    if isinstance(arg, ast.Starred):
                        break
                    if isinstance(arg, ast.Name) and arg.id in out and i < len(params):
                        new.add(params[i])
                for kw in n.keywords:
                    if kw.arg and isinstance(kw.value, ast.Name) and kw.value.id in out:
                        new.add(kw.arg)
            elif isinstance(n, ast.Assign) and isinstance(n.value, ast.Name) and n.value.id in out:
                new |= {t.id for t in n.targets if isinstance(t, ast.Name)}
            new -= set(defs)
            if new - out:
                out |= new
                changed = True
    return out


class _Probe:
    def __init__(self, tree: ast.Module, names: list[str]) -> None:
        self.names = _carriers(tree, set(names))

    def kept_call(self, n: ast.AST) -> bool:
        # A call into the program: a program name, or a name that holds one (``candidate``).
        # Calls of builtins, imports, methods and the test's own helpers are the test's own
        # work: they are never kept whole (their arguments hold the answers), only the
        # calls into the program inside them are.
        if not isinstance(n, ast.Call) or not isinstance(n.func, ast.Name):
            return False
        return n.func.id in self.names or self.hand_off(n)

    def hand_off(self, n: ast.Call) -> bool:
        # ``check(add)``: a call of the test's own function that passes it the program and
        # nothing else (an answer beside the program would be kept with it).
        given = [*n.args, *(kw.value for kw in n.keywords)]
        return (
            bool(given)
            and all(kw.arg is not None for kw in n.keywords)
            and all(isinstance(a, ast.Name) and a.id in self.names for a in given)
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


def probe_code(test_code: str, names: list[str]) -> str:
    """``test_code`` as the record run executes it: each ``assert`` becomes the calls it
    makes into the program (its comparison and message, where the answers are, are
    dropped); then only statements that those calls' arguments and the control flow around
    them need are kept (a backward slice over names, flow-insensitive, so it keeps more
    rather than less). Raises SyntaxError for test code that does not parse."""
    tree = _parse(test_code)
    probe = _Probe(tree, names)
    tree.body = probe.neuter(tree.body)
    stmts = [n for n in ast.walk(tree) if isinstance(n, ast.stmt)]
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
            for name in ("body", "orelse", "finalbody"):
                if isinstance(getattr(s, name, None), list) and getattr(s, name):
                    setattr(s, name, prune(getattr(s, name)) or [ast.Pass()])
            for h in getattr(s, "handlers", []):
                h.body = prune(h.body) or [ast.Pass()]
            out.append(s)
        return out

    tree.body = prune(tree.body)
    return ast.unparse(ast.fix_missing_locations(tree))


# ---- plain values: the only thing that crosses from the program's process ----
# Both functions are also pasted, by their source, into the in-sandbox harness.


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


# ---- the harness: /code/main.py of every call, record and replay run ----
# Everything else (the program, the tests, the recorded calls) comes on stdin as JSON, so
# no file in the sandbox holds the program or its tests.
_HARNESS_MAIN = r'''
import builtins, json, linecache, os, random, sys, traceback

_write, _exit, _dumps, _loads = os.write, os._exit, json.dumps, json.loads
_MISSING = object()


class _Refused(BaseException):
    """Raised into the tests where the program's answer cannot be used; a BaseException so
    that a test's ``except Exception`` does not swallow it (a flag also records it)."""


def _exc_name(e):
    for c in type(e).__mro__:
        if getattr(builtins, c.__name__, None) is c:
            return c.__name__
    return "BaseException"


def _tb(e):
    frames = traceback.extract_tb(e.__traceback__)
    frames = [f for f in frames if f.filename in ("main.py", "<test>")]
    text = "".join(
        ["Traceback (most recent call last):\n", *traceback.format_list(frames),
         *traceback.format_exception_only(type(e), e)]
    )
    return text[-800:]


def _compile(code, filename):
    # Tracebacks then quote the line (feedback shows the failing assert as written).
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    return compile(code, filename, "exec")


def _fresh():
    ns = {"__name__": "__main__", "__builtins__": builtins}
    exec(PRELUDE, ns)
    return ns


def _key(args, kwargs, handle_of):
    def one(a):
        try:
            return _encode(a, handle_of)
        except _NotPlain:
            return ["?", None]
    return [[one(a) for a in args], sorted([k, one(v)] for k, v in kwargs.items())]


def _opaque(k):
    return type(k) is list and k[0] == "?"


def _apply(orig, new):
    # An argument the program changed in place: the test sees the same change.
    t = type(orig)
    if t is list:
        orig[:] = new
    elif t is set or isinstance(orig, dict):
        orig.clear()
        orig.update(new)
    elif t.__name__ == "deque":
        orig.clear()
        orig.extend(new)


def _load(program):
    ns = _fresh()
    exec(_compile(program, "main.py"), ns)
    return ns


def _call(job):
    try:
        ns = _load(job["program"])
        name, target = job["fn"], ns.get("Solution")
        if target is not None and hasattr(target, name):
            fn = getattr(target(), name)
        else:
            fn = ns[name]
        out = fn(*job["args"])
    except BaseException as e:
        return {"status": "error", "error": _tb(e)}
    try:
        return {"value": _encode(out)}
    except _NotPlain as e:
        return {"status": "non_plain", "error": f"returned a {e}, not a plain value"}


def _record(job):
    try:
        ns = _load(job["program"])
    except BaseException as e:
        return {"status": "error", "error": _tb(e)}
    calls, objects, keep = [], {}, []

    def handle_of(x):
        return objects.get(id(x))

    def resolve(n):
        return keep[n]

    def proxy(name):
        target = ns.get(name, _MISSING)

        def call(*args, **kwargs):
            if target is _MISSING:
                raise NameError(f"name {name!r} is not defined")
            key = _key(args, kwargs, handle_of)
            copies = [a if _opaque(k) else _decode(k, resolve) for a, k in zip(args, key[0])]
            given = dict(key[1])
            kw = {n: v if _opaque(given[n]) else _decode(given[n], resolve)
                  for n, v in kwargs.items()}
            rec = {"n": name, "a": key}
            calls.append(rec)
            state = random.getstate()  # the tests' random numbers stay the tests' own
            try:
                out = target(*copies, **kw)
            except BaseException as e:
                rec["x"] = _exc_name(e)
                raise
            finally:
                random.setstate(state)
            if isinstance(target, type):
                objects[id(out)] = rec["h"] = len(keep)
                keep.append(out)
                return out
            try:
                rec["r"] = _encode(out, handle_of)
                changed = {}
                for i, (a, c, k) in enumerate(zip(args, copies, key[0])):
                    if c is not a and _encode(c, handle_of) != k:
                        changed[str(i)] = _encode(c, handle_of)
                        _apply(a, _decode(changed[str(i)], resolve))
            except _NotPlain as e:
                rec.pop("r", None)
                rec["np"] = str(e)
                raise _Refused("non-plain result")
            if changed:
                rec["u"] = changed
            return _decode(rec["r"], resolve)

        return call

    tests = _fresh()
    for name in job["names"]:
        tests[name] = proxy(name)
    random.seed(0)
    try:
        exec(_compile(job["probe"], "<test>"), tests)
    except BaseException:
        pass  # the replay meets the same end and judges it
    return {"calls": calls}


def _replay_one(code, calls, names):
    used = [False] * len(calls)
    handles, flags = {}, []

    class _Handle:
        """An object of the program's own class, in the replay: it may be passed back to
        the program and given attributes, never compared or tested."""

        def _refuse(self, *a, **k):
            flags.append("non_plain")
            raise _Refused("an object of the program's own class was compared")

        __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = _refuse
        __len__ = __iter__ = __contains__ = __hash__ = __int__ = __float__ = __index__ = _refuse

    def handle_of(x):
        return object.__getattribute__(x, "_n") if type(x) is _Handle else None

    def resolve(n):
        if n not in handles:
            h = _Handle()
            object.__setattr__(h, "_n", n)
            handles[n] = h
        return handles[n]

    def find(name, key):
        loose = '["?", null]' in _dumps(key)
        for exact in (True, False):
            for i, rec in enumerate(calls):
                if used[i] or rec.get("n") != name:
                    continue
                a = rec.get("a")
                if a == key if exact else loose and '["?", null]' in _dumps(a):
                    return i
        return None

    def proxy(name):
        def call(*args, **kwargs):
            i = find(name, _key(args, kwargs, handle_of))
            if i is None:
                flags.append("error")
                raise _Refused(f"{name}(...) here was not run by the program")
            used[i] = True
            rec = calls[i]
            if "x" in rec:
                cls = getattr(builtins, rec["x"], None)
                if not (isinstance(cls, type) and issubclass(cls, Exception)):
                    flags.append("error")
                    raise _Refused(f"{name}() ended the program ({rec['x']})")
                if issubclass(cls, (StopIteration, StopAsyncIteration)):
                    # Raised into map(), filter() or iter(f, x), it would end the test's
                    # loop there, as if every case had been checked.
                    flags.append("error")
                    raise _Refused(f"{name}() raised {rec['x']}, which ends an iteration")
                raise cls(f"raised by the program in {name}()")
            if "np" in rec:
                flags.append("non_plain")
                raise _Refused(f"{name}() returned a {rec['np']}, not a plain value")
            if "h" in rec:
                return resolve(rec["h"])
            for i_arg, after in rec.get("u", {}).items():
                _apply(args[int(i_arg)], _decode(after, resolve))
            return _decode(rec["r"], resolve)
        return call

    ns = _fresh()
    for name in names:
        ns[name] = proxy(name)
    random.seed(0)
    try:
        exec(_compile(code, "<test>"), ns)
    except AssertionError as e:
        return {"ok": False, "status": flags[0] if flags else "wrong_answer", "error": _tb(e)}
    except BaseException as e:
        return {"ok": False, "status": flags[0] if flags else "error", "error": _tb(e)}
    if flags:
        return {"ok": False, "status": flags[0], "error": "the test caught the grader's refusal"}
    return {"ok": True}


def _replay(job):
    return {"results": [_replay_one(u["code"], u["calls"], u["names"]) for u in job["units"]]}


def _main():
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)
    job = _loads(sys.stdin.read())
    out = os.dup(1)
    os.dup2(2, 1)  # what the program and the tests print goes to stderr, apart from this
    result = {"call": _call, "record": _record, "replay": _replay}[job["mode"]](job)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    data = ("\n" + MARK + _dumps(result) + "\n").encode()
    while data:
        data = data[_write(out, data):]
    _exit(0)  # no atexit handler or lingering thread of the program's runs after this


_main()
'''


def _harness_source() -> str:
    parts = [
        "from typing import Any\n",
        f"PRELUDE = {PRELUDE!r}\n",
        f"MARK = {_MARK!r}\n",
        f"_DEPTH = {_DEPTH!r}\n",
        inspect.getsource(_NotPlain),
        inspect.getsource(_encode),
        inspect.getsource(_decode),
        _HARNESS_MAIN,
    ]
    return "\n\n".join(parts)


_HARNESS = _harness_source()


def _verdict(r: RunResult) -> dict[str, Any] | None:
    """The harness's one record, or None: a run that printed none (an early exit, a crash)
    or more than one (the program printing a record of its own) has no verdict."""
    lines = [line for line in r.stdout.splitlines() if line.startswith(_MARK)]
    if len(lines) != 1:
        return None
    try:
        out = json.loads(lines[0][len(_MARK) :])
    except (ValueError, RecursionError):
        return None
    return out if isinstance(out, dict) else None


def _harness(sandbox: Sandbox, job: dict[str, Any], limits: SandboxLimits) -> RunResult:
    return sandbox.run_python(_HARNESS, json.dumps(job), limits)


def _no_verdict(r: RunResult) -> tuple[str, str]:
    if not r.ok:
        return r.status, _tail(r)
    return "early_exit", "the program ended before the harness reported every test"


def run_tests(
    program: str,
    tests: TestSpec,
    sandbox: Sandbox,
    *,
    test_timeout_s: float | None = None,
    total_timeout_s: float = 30.0,
    parallel: int = 4,
    fail_fast: bool = False,
) -> CodeResult:
    """Run ``program`` against ``tests``; never raises for anything the program does."""
    start = time.monotonic()
    deadline = start + total_timeout_s
    per_test = test_timeout_s or sandbox.limits.wall_s
    units: list[str] = []
    names: list[list[str]] = []
    probes: list[str | None] = []
    if tests.kind in ("script", "asserts"):
        defined = _top_level_definitions(program)
        if tests.kind == "script":
            units = [tests.script]
        else:
            units = [f"{tests.script}\n{line}\n" for line in tests.inputs]
        for code in units:
            try:
                names.append(program_names(code, defined, tests.fn_name))
                probes.append(probe_code(code, names[-1]))
            except (SyntaxError, ValueError, RecursionError):
                names.append([])
                probes.append(None)

    # (ok, status, got); a record run's calls wait in ``recorded`` for the replay
    outcome: dict[int, tuple[bool, str, str]] = {}
    recorded: dict[int, list[Any]] = {}

    def limits_left() -> SandboxLimits | None:
        left = deadline - time.monotonic()
        return None if left <= 0.05 else sandbox.limits.with_wall(min(per_test, left))

    def one(i: int) -> tuple[int, tuple[bool, str, str] | None]:
        limits = limits_left()
        if limits is None:
            return i, (False, "total_timeout", "")
        if tests.kind == "stdio":
            r = sandbox.run_python(PRELUDE + program, tests.inputs[i], limits)
            if not r.ok:
                return i, (False, r.status, _tail(r))
            ok = outputs_match(r.stdout, tests.outputs[i])
            return i, (ok, "ok" if ok else "wrong_answer", r.stdout)
        if tests.kind == "call":
            job = {"mode": "call", "program": program, "fn": tests.fn_name}
            r = _harness(sandbox, {**job, "args": tests.inputs[i]}, limits)
            v = _verdict(r)
            if v is None:
                return i, (False, *_no_verdict(r))
            if "value" not in v:
                return i, (False, str(v.get("status", "error")), str(v.get("error", "")))
            try:
                got = _json_like(_decode(v["value"]))
            except (_NotPlain, TypeError, ValueError, KeyError, IndexError, RecursionError):
                return i, (False, "non_plain", "the harness could not read the value")
            ok = values_match(got, tests.outputs[i])
            return i, (ok, "ok" if ok else "wrong_answer", json.dumps(got, default=repr))
        probe = probes[i]
        if probe is None:
            return i, (False, "error", "the test code does not parse")
        job = {"mode": "record", "program": program, "probe": probe, "names": names[i]}
        r = _harness(sandbox, job, limits)
        v = _verdict(r)
        if v is None:
            return i, (False, *_no_verdict(r))
        if not isinstance(v.get("calls"), list):
            return i, (False, str(v.get("status", "error")), str(v.get("error", "")))
        recorded[i] = v["calls"]
        return i, None

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        futures = [pool.submit(one, i) for i in range(tests.total)]
        for fut in futures:
            i, res = fut.result()
            if res is not None:
                outcome[i] = res
                if fail_fast and not res[0]:
                    deadline = 0.0  # the rest return at once as not run
    if recorded:
        _replay(sandbox, units, names, recorded, outcome, limits_left())

    failures = []
    for i in range(tests.total):
        ok, status, got = outcome[i]
        if not ok:
            failures.append(
                TestFailure(
                    i,
                    tests.inputs[i] if tests.inputs else None,
                    tests.outputs[i] if tests.outputs else None,
                    got,
                    status,
                )
            )
    passed = tests.total - len(failures)
    error = None if not failures else f"test {failures[0].index}: {failures[0].status}"
    wall = time.monotonic() - start
    return CodeResult(float(passed == tests.total), passed, tests.total, error, failures, wall)


def _replay(
    sandbox: Sandbox,
    units: list[str],
    names: list[list[str]],
    recorded: dict[int, list[Any]],
    outcome: dict[int, tuple[bool, str, str]],
    limits: SandboxLimits | None,
) -> None:
    """The real tests, with no program in the process: every call into the program is
    answered from its record. One run for all of a program's recorded tests."""
    order = sorted(recorded)
    if limits is None:
        outcome.update({i: (False, "total_timeout", "") for i in order})
        return
    job = {
        "mode": "replay",
        "units": [{"code": units[i], "calls": recorded[i], "names": names[i]} for i in order],
    }
    r = _harness(sandbox, job, limits)
    v = _verdict(r)
    results = v.get("results") if v else None
    if not isinstance(results, list) or len(results) != len(order):
        status, got = _no_verdict(r) if v is None else ("error", "the replay reported no results")
        outcome.update({i: (False, status, got) for i in order})
        return
    for i, res in zip(order, results, strict=True):
        ok = isinstance(res, dict) and res.get("ok") is True
        status = "ok" if ok else str(res.get("status", "error"))
        outcome[i] = (ok, status, "" if ok else str(res.get("error", "")))


def _tail(r: RunResult | None) -> str:
    if r is None:
        return ""
    if r.status == "error":
        return _renumber(r.stderr.strip()[-600:])
    return r.status


_PRELUDE_LINES = PRELUDE.count("\n")


def _renumber(trace: str) -> str:
    # Line numbers as the model wrote them, not shifted by the prelude (stdio runs).
    return re.sub(
        r'File "/code/main\.py", line (\d+)|File "[^"]*/main\.py", line (\d+)',
        lambda m: f'File "main.py", line {int(m.group(1) or m.group(2)) - _PRELUDE_LINES}',
        trace,
    )


_DEFAULT: dict[tuple, Sandbox] = {}


def sandbox_for(cfg: Any | None = None) -> Sandbox:
    """One Sandbox per process and settings: a Config, its ``sandbox`` section, or None for
    the defaults."""
    s = getattr(cfg, "sandbox", cfg)
    key = () if s is None else tuple(sorted(vars(s).items()))
    if key not in _DEFAULT:
        if s is None:
            _DEFAULT[key] = Sandbox()
        else:
            limits = SandboxLimits(
                wall_s=s.test_timeout_s,
                cpu_s=max(1, int(s.test_timeout_s)),
                memory_mb=s.memory_mb,
                max_processes=s.max_processes,
                file_size_mb=s.file_size_mb,
                scratch_mb=s.scratch_mb,
                output_bytes=s.output_kb * 1024,
            )
            _DEFAULT[key] = Sandbox(limits, isolation=s.isolation, python=s.python)
    return _DEFAULT[key]
