"""What is graded: the tests, parsed from the four styles the public datasets write
(:func:`parse_tests`), and the program, taken from a model's response
(:func:`extract_program`)."""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.workloads.rewards.code import formats
from runtime.workloads.rewards.code.names import parse


class TestSpecError(ValueError):
    """Tests that cannot be run; the message is one line naming the problem."""


@dataclass(frozen=True)
class TestSpec:
    kind: str  # stdio | call | script | asserts
    inputs: list[Any] = field(default_factory=list)  # asserts: the assert lines
    outputs: list[Any] = field(default_factory=list)
    # call: the function (or a method of ``class Solution``); script: the program name the
    # entry point starts from (``add``, or ``Solution`` for ``Solution().minOperations``)
    fn_name: str | None = None
    script: str = ""  # script: the test code; asserts: the setup code
    # Code run before the program in its process and before the tests in theirs: the
    # dataset's own imports and helpers (LeetCodeDataset's ``prompt``). The tests' copy is
    # theirs: a helper it defines (``is_same_list``) judges as the dataset wrote it.
    preamble: str = ""
    # The absolute-or-relative error the problem allows on decimal answers (a checker's
    # stated 1e-6); None: decimals compare exactly as numbers, floats up to rounding.
    tolerance: float | None = None

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
            self.preamble,
            self.tolerance,
        )


def parse_tests(obj: Any, *, fn_name: str | None = None) -> TestSpec:
    """A TestSpec from an APPS ``input_output`` (dict or JSON string), a HumanEval-style
    ``{"test", "entry_point"?}``, an MBPP-style ``{"test_list", "test_setup_code"?}``, or a
    test script string."""
    try:
        return _parse(obj, fn_name)
    except formats.FormatError as exc:
        raise TestSpecError(str(exc)) from None


def _parse(obj: Any, fn_name: str | None) -> TestSpec:
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
            obj = {"test": obj}
    if not isinstance(obj, dict):
        raise TestSpecError(f"tests: expected an object, got {type(obj).__name__}")
    if isinstance(obj.get("verification_info"), (str, dict)):
        info = obj["verification_info"]
        if isinstance(info, str):
            try:
                info = json.loads(info)
            except json.JSONDecodeError as exc:
                raise TestSpecError(f"tests: verification_info is not JSON ({exc.msg})") from None
        if not isinstance(info, dict):
            raise TestSpecError("tests: verification_info must be an object")
        obj = {**obj, **info}
    if "public_test_cases" in obj or "private_test_cases" in obj:
        obj = {**obj, **formats.livecodebench_tests(obj)}
    elif "test_cases" in obj:
        obj = {**obj, **formats.verifiable_tests(obj)}
    preamble = obj.get("preamble") or ""
    if not isinstance(preamble, str):
        raise TestSpecError("tests: 'preamble' must be a string of code")
    tolerance = _tolerance(obj.get("tolerance"))
    if "test" in obj:
        script = str(obj["test"])
        entry = obj.get("entry_point") or None
        if not entry and formats.is_pytest(script):
            setup, calls = formats.pytest_tests(script)
            return TestSpec("asserts", calls, [None] * len(calls), script=setup, preamble=preamble)
        target = None
        if entry:
            target = entry_target(entry)
            script += f"\n\ncheck({entry})\n"
        return TestSpec("script", fn_name=target, script=script, preamble=preamble)
    if "test_list" in obj:
        asserts = obj["test_list"]
        if not isinstance(asserts, list) or not all(isinstance(a, str) for a in asserts):
            raise TestSpecError("tests: 'test_list' must be a list of strings")
        if not asserts:
            raise TestSpecError("tests: no test cases")
        setup = str(obj.get("test_setup_code") or "")
        return TestSpec(
            "asserts", list(asserts), [None] * len(asserts), script=setup, preamble=preamble
        )
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
        return TestSpec(
            "call", list(inputs), list(outputs), name, preamble=preamble, tolerance=tolerance
        )
    return TestSpec(
        "stdio",
        [_as_text(x) for x in inputs],
        [_as_text(x) for x in outputs],
        preamble=preamble,
        tolerance=tolerance,
    )


# The fields of a record that travel with its tests (each one a role ``data.fields`` can
# map a dataset's own column to: LeetCodeDataset's ``prompt`` is the ``preamble``).
TEST_FIELDS = ("entry_point", "preamble", "tolerance", "fn_name")
_LCB_FIELDS = ("public_test_cases", "private_test_cases", "metadata")


def tests_of(record: dict[str, Any]) -> Any:
    """What :func:`parse_tests` takes, from a dataset record or a ``reflow reward code``
    line: its ``tests`` (or ``test``: APPS ``input_output``, a test script, asserts, or an
    object holding them), with the :data:`TEST_FIELDS` it has beside them."""
    tests = record["tests"] if "tests" in record else record.get("test")
    if "public_test_cases" in record or "private_test_cases" in record:
        # LiveCodeBench keeps its tests in three columns: the record holds them all.
        tests = {k: record[k] for k in _LCB_FIELDS if k in record}
    extra = {k: record[k] for k in TEST_FIELDS if record.get(k) is not None}
    if not extra:
        return tests
    if isinstance(tests, str) and tests.lstrip().startswith("{"):
        try:
            tests = json.loads(tests)
        except json.JSONDecodeError as exc:
            raise TestSpecError(f"tests: not valid JSON ({exc.msg})") from None
    if isinstance(tests, str):
        tests = {"test": tests}
    elif isinstance(tests, list):
        tests = {"test_list": tests}
    if not isinstance(tests, dict):
        raise TestSpecError(f"tests: expected an object, got {type(tests).__name__}")
    return {**tests, **{k: v for k, v in extra.items() if k not in tests}}


def entry_target(entry: Any) -> str:
    """The program name an ``entry_point`` starts from: ``add`` for ``add``, ``Solution``
    for ``Solution().minOperations`` or ``Solution(3).run`` (constructor arguments must be
    literals: the object is built in the program's run, from the test's words only)."""
    bad = TestSpecError(
        f"tests: entry_point {entry!r} is not a function name or Class(args).method"
    )
    if not isinstance(entry, str):
        raise bad
    try:
        node = parse(entry.strip(), mode="eval").body  # type: ignore[attr-defined]
    except SyntaxError:
        raise bad from None
    if isinstance(node, ast.Name):
        return node.id
    if not (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
    ):
        raise bad
    call = node.value
    for arg in [*call.args, *(kw.value for kw in call.keywords)]:
        try:
            ast.literal_eval(arg)
        except (ValueError, TypeError, SyntaxError, RecursionError):
            raise bad from None
    if any(kw.arg is None for kw in call.keywords):
        raise bad
    return call.func.id


def _tolerance(value: Any) -> float | None:
    if value is None:
        return None
    if type(value) not in (int, float) or not math.isfinite(value) or not 0 < value < 1:
        raise TestSpecError(f"tests: tolerance {value!r} must be a number between 0 and 1")
    return float(value)


# "absolute or relative error does not exceed 10^{-6}", "within 1e-6", "error of at most
# 10^-9": the error a problem statement allows, as Codeforces/AtCoder/APPS write it.
_STATED = re.compile(
    r"(?:absolute|relative)[^.]{0,80}?error[^.]{0,60}?"
    r"(?:10\s*\^\s*\{?\s*[-\u2212]\s*(\d+)\s*\}?|10\*\*\s*[-\u2212]\s*(\d+)|1\s*e\s*[-\u2212]\s*(\d+)"
    r"|0\.(0*)1\b)",
    re.I | re.S,
)


def stated_tolerance(problem: str) -> float | None:
    """The error a problem statement allows on real-valued answers, or None when it states
    none (then answers compare exactly)."""
    m = _STATED.search(problem or "")
    if m is None:
        return None
    if m.group(4) is not None:
        return 10.0 ** -(len(m.group(4)) + 1)
    exp = int(next(g for g in m.groups()[:3] if g is not None))
    return 10.0**-exp if 0 < exp < 19 else None


def _as_text(x: Any) -> str:
    return "\n".join(map(str, x)) if isinstance(x, list) else str(x)


def extract_program(response: str) -> str:
    """The last fenced code block (```python preferred), else the whole response."""
    blocks = re.findall(r"```(\w*)[^\n]*\n(.*?)```", response, re.S)
    if not blocks:
        return response
    python = [code for lang, code in blocks if lang.lower() in ("python", "py", "python3")]
    return (python or [code for _, code in blocks])[-1]


def check_code_tests(records: list[dict[str, Any]], path: str | Path) -> None:
    """Every record's tests parse into a form the code grader grades under its guarantees,
    or one line names the record and the field (a run on tests it cannot grade would train
    on a reward of 0, silently). The dataset check's hook for the code kinds
    (runtime/data/datasets.py ``check_dataset``)."""
    from runtime.data.datasets import DatasetError

    for i, record in enumerate(records):
        try:
            parse_tests(tests_of(record), fn_name=record.get("fn_name") or None)
        except TestSpecError as exc:
            raise DatasetError(f"{path}: record {i}: {exc} (data.fields.tests)") from None


def record_check(kind: str) -> Callable[[list[dict[str, Any]], str], None] | None:
    """The dataset check of a workload kind's records (``check_dataset``'s hook):
    :func:`check_code_tests` for a kind whose records carry tests, else none."""
    from runtime.config.workload_kinds import workload_kind

    return check_code_tests if "tests" in workload_kind(kind).fields else None
