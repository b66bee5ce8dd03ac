"""The public code-RL formats whose tests are not already APPS, HumanEval or MBPP shaped,
turned into those shapes (:func:`runtime.workloads.rewards.code.spec.parse_tests` calls
these):

- pytest files (KodCode): ``def test_...():`` functions that ``from solution import f``;
  each test function is one test, run as MBPP runs an assert (:func:`pytest_tests`);
- LiveCodeBench: ``public_test_cases``/``private_test_cases`` of ``testtype`` ``stdin``
  (stdin/stdout) or ``functional`` (one JSON argument per input line, a method of ``class
  Solution`` named by ``metadata.func_name``) (:func:`livecodebench_tests`);
- the verifiable-coding sets' ``verification_info``: ``{"test_cases": [{"type":
  "stdin_stdout", "input", "output"}]}`` (:func:`verifiable_tests`).

Whatever a format holds that the grader cannot grade under its guarantees is refused here
in one line naming the field, so that ``reflow launch`` stops on it instead of training on
a reward of 0.
"""

from __future__ import annotations

import ast
import base64
import io
import json
import math
import pickle
import zlib
from typing import Any

from runtime.workloads.rewards.code.names import parse


class FormatError(ValueError):
    """Tests in a public format the grader cannot take; one line naming the field."""


# -- pytest (KodCode) --

# The module name the tests import the program as (KodCode: ``from solution import f``).
SOLUTION_MODULES = frozenset({"solution"})


def is_pytest(code: str) -> bool:
    """Whether ``code`` is a pytest file: top-level ``test_`` functions and no top-level
    statement that runs anything (a HumanEval test calls its ``check`` itself)."""
    try:
        tree = parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    tests = [s for s in tree.body if _is_test_function(s) or _is_test_class(s)]
    runs = [s for s in tree.body if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)]
    return bool(tests) and not runs


def _is_test_function(s: ast.stmt) -> bool:
    return isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name.startswith("test")


def _is_test_class(s: ast.stmt) -> bool:
    # As pytest collects them: ``class Test...`` without an ``__init__``.
    return (
        isinstance(s, ast.ClassDef)
        and s.name.startswith("Test")
        and not any(isinstance(m, ast.FunctionDef) and m.name == "__init__" for m in s.body)
    )


def _is_main_block(s: ast.stmt) -> bool:
    # ``if __name__ == "__main__": pytest.main([__file__])``: how a file runs itself.
    return isinstance(s, ast.If) and "__name__" in ast.unparse(s.test)


def pytest_tests(code: str) -> tuple[str, list[str]]:
    """(setup, tests): the file without its test functions, its imports of the program
    removed and every ``solution.f`` made ``f`` (so ``f`` is a name of the program's, as
    a test's free names are); and each test function's body as code of its own, one per
    parameter set of a ``pytest.mark.parametrize``, its parameters bound before it. A body
    runs inline, not as a call, as an MBPP assert does. Raises :class:`FormatError` for
    what it cannot run: fixtures, other decorators."""
    tree = _Unqualify().visit(parse(code))
    tests: list[str] = []
    setup: list[ast.stmt] = []
    for s in tree.body:
        if _is_main_block(s):
            continue
        if _is_test_function(s):
            tests += _test_bodies(s)  # type: ignore[arg-type]
            continue
        if _is_test_class(s):
            for m in s.body:  # type: ignore[attr-defined]
                if _is_test_function(m):
                    tests += _test_bodies(m, instance_of=s.name)  # type: ignore[attr-defined]
            s.body = [m for m in s.body if not _is_test_function(m)] or [ast.Pass()]  # type: ignore[attr-defined]
        setup.append(s)
    if not tests:
        raise FormatError("tests: a pytest file with no test function")
    return ast.unparse(ast.Module(body=setup, type_ignores=[])), tests


class _Unqualify(ast.NodeTransformer):
    """The program's module out of the tests, wherever they import it: ``solution.f`` is
    ``f``; ``from solution import f`` goes (``f`` is then a free name, the program's);
    ``from solution import f as g`` becomes ``g = f``."""

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if isinstance(node.value, ast.Name) and node.value.id in SOLUTION_MODULES:
            return ast.copy_location(ast.Name(id=node.attr, ctx=node.ctx), node)
        return self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> Any:
        if node.module not in SOLUTION_MODULES:
            return node
        return [
            ast.copy_location(
                ast.Assign(
                    targets=[ast.Name(id=a.asname, ctx=ast.Store())],
                    value=ast.Name(id=a.name, ctx=ast.Load()),
                ),
                node,
            )
            for a in node.names
            if a.asname and a.name != "*"
        ] or ast.copy_location(ast.Pass(), node)

    def visit_Import(self, node: ast.Import) -> Any:
        if any(a.name in SOLUTION_MODULES and a.asname for a in node.names):
            raise FormatError("tests: 'import solution as ...' is not supported")
        node.names = [a for a in node.names if a.name not in SOLUTION_MODULES]
        return node if node.names else ast.copy_location(ast.Pass(), node)


def _test_bodies(fn: ast.FunctionDef, instance_of: str | None = None) -> list[str]:
    if isinstance(fn, ast.AsyncFunctionDef) or any(
        isinstance(n, (ast.Return, ast.Yield, ast.YieldFrom, ast.Global, ast.Nonlocal))
        for n in _own_statements(fn)
    ):
        raise FormatError(f"tests: {fn.name} returns, yields or is async (not supported)")
    params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)]
    prefix = ""
    if instance_of is not None and params:  # a method of a test class: self is an instance
        prefix = f"{params[0]} = {instance_of}()\n"
        params = params[1:]
    cases: list[dict[str, Any]] = [{}]
    for dec in fn.decorator_list:
        cases = _parametrize(fn.name, dec, cases)
    body = ast.unparse(ast.Module(body=fn.body, type_ignores=[]))
    out = []
    for case in cases:
        missing = [p for p in params if p not in case]
        if missing:
            raise FormatError(
                f"tests: {fn.name} takes {missing[0]!r}, a pytest fixture (not supported)"
            )
        bound = prefix + "".join(f"{k} = {_literal(v)}\n" for k, v in case.items() if k in params)
        out.append(f"# {fn.name}\n{bound}{body}\n")
    return out


def _literal(v: Any) -> str:
    """``v`` as source that makes it again with no free name (``float('inf')``, not
    ``inf``, which would be looked up among the program's names)."""
    if isinstance(v, float) and not math.isfinite(v):
        return f"float({str(v)!r})"
    if isinstance(v, (list, tuple, set)) and v:
        items = ", ".join(_literal(x) for x in v)
        if isinstance(v, list):
            return f"[{items}]"
        return f"({items},)" if isinstance(v, tuple) else f"{{{items}}}"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_literal(k)}: {_literal(x)}" for k, x in v.items()) + "}"
    return repr(v)


def _own_statements(fn: ast.FunctionDef) -> list[ast.AST]:
    """The nodes of ``fn``'s body outside any function or class defined in it."""
    out: list[ast.AST] = []
    todo: list[ast.AST] = list(fn.body)
    while todo:
        n = todo.pop()
        out.append(n)
        if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo += list(ast.iter_child_nodes(n))
    return out


def _parametrize(name: str, dec: ast.expr, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    text = ast.unparse(dec.func if isinstance(dec, ast.Call) else dec)
    if text not in ("pytest.mark.parametrize", "mark.parametrize", "parametrize"):
        raise FormatError(f"tests: {name} is decorated with {text} (not supported)")
    try:
        assert isinstance(dec, ast.Call) and len(dec.args) >= 2 and not dec.keywords
        names = ast.literal_eval(dec.args[0])
        values = ast.literal_eval(dec.args[1])
    except (AssertionError, ValueError, TypeError, SyntaxError, RecursionError):
        raise FormatError(f"tests: {name}'s parametrize needs literal names and values") from None
    names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
    out = []
    for case in cases:
        for v in values:
            row = (v,) if len(names) == 1 else tuple(v)
            if len(row) != len(names):
                raise FormatError(f"tests: {name}'s parametrize row {v!r} has the wrong size")
            out.append({**case, **dict(zip(names, row, strict=True))})
    return out


# The pytest the tests import, in the sandbox (its interpreter has no pytest): raises,
# approx and fail, the parts test files of the code-RL sets use. It is the tests' code, so
# it runs in the tests' process (the program's process has it too, unused).
PYTEST_SHIM = """
import math as _math
import re as _re


class _Raises:
    def __init__(self, expected, match=None):
        self.expected, self.match = expected, match

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is None:
            raise AssertionError(f"DID NOT RAISE {self.expected}")
        if not issubclass(kind, self.expected):
            return False
        if self.match is not None and not _re.search(self.match, str(value)):
            raise AssertionError(f"{value!s} does not match {self.match!r}")
        self.value = value
        return True


def raises(expected, *args, match=None, **kwargs):
    if not args:
        return _Raises(expected, match)
    with _Raises(expected, match):
        args[0](*args[1:], **kwargs)


class _Approx:
    def __init__(self, expected, rel=None, abs=None):
        self.expected = expected
        self.rel = 1e-6 if rel is None else rel
        self.abs = 1e-12 if abs is None else abs

    def _near(self, a, b):
        if type(b) in (list, tuple):
            return type(a) in (list, tuple) and len(a) == len(b) and all(
                self._near(x, y) for x, y in zip(a, b))
        if type(b) is dict:
            return type(a) is dict and a.keys() == b.keys() and all(
                self._near(a[k], b[k]) for k in b)
        if type(a) in (int, float) and type(b) in (int, float):
            return a == b or _math.isclose(a, b, rel_tol=self.rel, abs_tol=self.abs)
        return a == b

    def __eq__(self, other):
        return self._near(other, self.expected)

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = None

    def __repr__(self):
        return f"approx({self.expected!r})"


def approx(expected, rel=None, abs=None):
    return _Approx(expected, rel, abs)


def fail(msg=""):
    raise AssertionError(msg)


def main(*args, **kwargs):
    return 0  # a file that runs itself: its tests are run one by one instead
"""


# -- LiveCodeBench --


def livecodebench_tests(obj: dict[str, Any]) -> dict[str, Any]:
    """An LCB record's tests as APPS ``input_output``: stdin tests as ``inputs``/
    ``outputs`` text, functional ones as argument lists with ``fn_name`` (a method of
    ``class Solution``). Public and private cases together; private ones may be stored as
    base64 of zlib of a pickled JSON string, read here with an unpickler that builds
    strings only."""
    cases = _lcb_cases(obj.get("public_test_cases"), "public_test_cases")
    cases += _lcb_cases(obj.get("private_test_cases"), "private_test_cases")
    if not cases:
        raise FormatError("tests: no test cases in public_test_cases/private_test_cases")
    kinds = {c.get("testtype") for c in cases}
    if not kinds <= {"stdin", "functional"} or len(kinds) != 1:
        raise FormatError(f"tests: testtype {sorted(map(str, kinds))} (stdin or functional)")
    if kinds == {"stdin"}:
        return {
            "inputs": [str(c.get("input", "")) for c in cases],
            "outputs": [str(c.get("output", "")) for c in cases],
        }
    meta = obj.get("metadata") or {}
    if isinstance(meta, str):
        try:
            meta = json.loads(meta)
        except json.JSONDecodeError:
            raise FormatError("tests: metadata is not valid JSON") from None
    name = meta.get("func_name") if isinstance(meta, dict) else None
    if not name:
        raise FormatError("tests: functional tests need metadata.func_name")
    try:
        inputs = [[json.loads(x) for x in str(c["input"]).split("\n") if x.strip()] for c in cases]
        outputs = [json.loads(str(c["output"])) for c in cases]
    except (KeyError, json.JSONDecodeError):
        raise FormatError("tests: a functional test's input or output is not JSON") from None
    return {"inputs": inputs, "outputs": outputs, "fn_name": name}


def _lcb_cases(raw: Any, field: str) -> list[dict[str, Any]]:
    if raw is None or raw == "":
        return []
    if isinstance(raw, str):
        text = raw.strip()
        if not text.startswith("["):
            text = _unpickle_text(text, field)
        try:
            raw = json.loads(text)
        except json.JSONDecodeError:
            raise FormatError(f"tests: {field} is not valid JSON") from None
    if not isinstance(raw, list) or not all(isinstance(c, dict) for c in raw):
        raise FormatError(f"tests: {field} must be a list of test cases")
    return raw


_MAX_PICKLE = 256 << 20


class _StringsOnly(pickle.Unpickler):
    # No class is ever looked up, so nothing is called: the pickle can only build plain
    # objects, and LCB's holds one string.
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"{module}.{name}")


def _unpickle_text(text: str, field: str) -> str:
    try:
        inflate = zlib.decompressobj()
        data = inflate.decompress(base64.b64decode(text), _MAX_PICKLE)
        if inflate.unconsumed_tail:
            raise FormatError(f"tests: {field} inflates to over {_MAX_PICKLE >> 20} MB")
        value = _StringsOnly(io.BytesIO(data)).load()
    except (ValueError, zlib.error, pickle.UnpicklingError, EOFError, TypeError):
        raise FormatError(
            f"tests: {field} is neither JSON nor base64 of a compressed pickled string"
        ) from None
    if not isinstance(value, str):
        raise FormatError(f"tests: {field} unpickles to a {type(value).__name__}, not text")
    return value


# -- verifiable-coding-problems (verification_info) --


def verifiable_tests(obj: dict[str, Any]) -> dict[str, Any]:
    """``{"test_cases": [{"type": "stdin_stdout", "input", "output"}], "language"?}`` as
    APPS stdin/stdout tests; other case types and languages are refused."""
    language = str(obj.get("language") or "python").lower()
    if language not in ("python", "python3"):
        raise FormatError(f"tests: language {language!r} (only Python programs are graded)")
    cases = obj.get("test_cases")
    if not isinstance(cases, list) or not cases:
        raise FormatError("tests: 'test_cases' must be a non-empty list")
    kinds = {c.get("type") if isinstance(c, dict) else None for c in cases}
    if kinds != {"stdin_stdout"}:
        raise FormatError(f"tests: test case type {sorted(map(str, kinds))} (stdin_stdout)")
    return {
        "inputs": [str(c.get("input", "")) for c in cases],
        "outputs": [str(c.get("output", "")) for c in cases],
    }
