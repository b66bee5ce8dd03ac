"""Code-execution reward: run a program against test cases in the sandbox.

Three test styles, as the public datasets write them:

- ``stdio`` (APPS/CodeContests ``{"inputs": [str], "outputs": [str]}``): each input is
  the program's stdin, its stdout must match the output (trailing whitespace ignored, then
  token by token with a float tolerance, as APPS's grader does);
- ``call`` (APPS ``fn_name``): each input is the argument list of ``fn_name`` (a function,
  or a method of LeetCode's ``class Solution``); the return value must equal the output
  (APPS wraps some outputs in a list: both forms count);
- ``script`` (HumanEval ``test`` + ``entry_point``): the test is code appended to the
  program; it passes when the whole runs without an error;
- ``asserts`` (MBPP ``test_list``, or a list of strings): each assert line is one test,
  run after the program (and ``test_setup_code``).

Each test is one sandboxed process (a program that ran in the grader's own process could
rewrite the grader), tests of one program run ``parallel`` at a time, and all of them
share ``total_timeout_s``. The score is 1.0 when every test passes, else 0.0;
``passed``/``total`` say how close it came.
"""

from __future__ import annotations

import json
import math
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from runtime.sandbox import RunResult, Sandbox, SandboxLimits

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
_PRELUDE_LINES = PRELUDE.count("\n")

_RESULT = "@@reflow-result@@"
_CALL_DRIVER = """
def _reflow_call():
    import json as _json, sys as _sys
    _args = _json.loads(_sys.stdin.read())
    _target = globals().get("Solution")
    _fn = getattr(_target(), {fn!r}) if _target is not None and hasattr(_target, {fn!r}) \\
        else globals()[{fn!r}]
    _out = _fn(*_args)
    _sys.stdout.write("\\n{marker}" + _json.dumps(_out, default=repr) + "\\n")
_reflow_call()
"""


class TestSpecError(ValueError):
    """Tests that cannot be run; the message is one line naming the problem."""


@dataclass(frozen=True)
class TestSpec:
    kind: str  # stdio | call | script | asserts
    inputs: list[Any] = field(default_factory=list)  # asserts: the assert lines
    outputs: list[Any] = field(default_factory=list)
    fn_name: str | None = None
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
        if obj.get("entry_point"):
            script += f"\n\ncheck({obj['entry_point']})\n"
        return TestSpec("script", script=script)
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


def outputs_match(got: str, expected: str) -> bool:
    g = [line.rstrip() for line in got.strip().splitlines()]
    e = [line.rstrip() for line in expected.strip().splitlines()]
    if g == e:
        return True
    gt, et = got.split(), expected.split()
    if len(gt) != len(et):
        return False
    for a, b in zip(gt, et, strict=True):
        if a == b:
            continue
        try:
            if not math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-6):
                return False
        except ValueError:
            return False
    return True


def values_match(got: Any, expected: Any) -> bool:
    """Call-based equality after a JSON round trip (tuples are lists); APPS's list wrap
    of single outputs counts either way; floats with a tolerance."""
    if _equal(got, expected):
        return True
    return isinstance(expected, list) and len(expected) == 1 and _equal(got, expected[0])


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-6)
        except (TypeError, ValueError):
            return False
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


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
    if tests.kind == "script":
        limits = sandbox.limits.with_wall(min(per_test, total_timeout_s))
        r = sandbox.run_python(PRELUDE + program + "\n\n" + tests.script, "", limits)
        fail = [] if r.ok else [TestFailure(0, None, None, _tail(r), r.status)]
        wall = time.monotonic() - start
        return CodeResult(float(r.ok), int(r.ok), 1, None if r.ok else r.describe(), fail, wall)

    def one(i: int) -> tuple[int, bool, RunResult | None, str]:
        left = deadline - time.monotonic()
        if left <= 0.05:
            return i, False, None, "total_timeout"
        limits = sandbox.limits.with_wall(min(per_test, left))
        if tests.kind == "stdio":
            r = sandbox.run_python(PRELUDE + program, tests.inputs[i], limits)
            return i, r.ok and outputs_match(r.stdout, tests.outputs[i]), r, r.stdout
        if tests.kind == "asserts":
            source = PRELUDE + program + "\n\n" + tests.script + "\n" + tests.inputs[i] + "\n"
            r = sandbox.run_python(source, "", limits)
            return i, r.ok, r, r.stdout
        source = PRELUDE + program + "\n" + _CALL_DRIVER.format(fn=tests.fn_name, marker=_RESULT)
        r = sandbox.run_python(source, json.dumps(tests.inputs[i]), limits)
        got = _call_result(r.stdout)
        return (
            i,
            r.ok and got is not _MISSING and values_match(got, tests.outputs[i]),
            r,
            (r.stdout if got is _MISSING else json.dumps(got)),
        )

    results: dict[int, tuple[bool, RunResult | None, str]] = {}
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        futures = [pool.submit(one, i) for i in range(tests.total)]
        for fut in futures:
            i, ok, r, got = fut.result()
            results[i] = (ok, r, got)
            if fail_fast and not ok:
                deadline = 0.0  # the rest return at once as not run
    failures = []
    for i in range(tests.total):
        ok, r, got = results[i]
        if not ok:
            status = "total_timeout" if r is None else ("wrong_answer" if r.ok else r.status)
            shown = _tail(r) if r is not None and not r.ok else got
            failures.append(TestFailure(i, tests.inputs[i], tests.outputs[i], shown, status))
    passed = tests.total - len(failures)
    error = None if not failures else f"test {failures[0].index}: {failures[0].status}"
    wall = time.monotonic() - start
    return CodeResult(float(passed == tests.total), passed, tests.total, error, failures, wall)


_MISSING = object()


def _call_result(stdout: str) -> Any:
    for line in reversed(stdout.splitlines()):
        if line.startswith(_RESULT):
            try:
                return json.loads(line[len(_RESULT) :])
            except json.JSONDecodeError:
                return _MISSING
    return _MISSING


def _tail(r: RunResult | None) -> str:
    if r is None:
        return ""
    if r.status == "error":
        return _renumber(r.stderr.strip()[-600:])
    return r.status


def _renumber(trace: str) -> str:
    # Line numbers as the model wrote them, not shifted by the prelude.
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
