"""The driver: :func:`run_tests` runs a program against its tests (stdio and call tests one
sandboxed run each; script and asserts tests all in one conversation between the program's
process and the tests', :mod:`.relay`) and turns the runs into a :class:`CodeResult`."""

from __future__ import annotations

import re
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from runtime.workloads.rewards.code.compare import _json_like, outputs_match, shown, values_match
from runtime.workloads.rewards.code.harness import _harness, _verdict
from runtime.workloads.rewards.code.names import (
    free_names,
    program_bindings,
    program_names,
    program_sources,
)
from runtime.workloads.rewards.code.plain import _decode, _object_name
from runtime.workloads.rewards.code.prelude import NODE_HELPER_NAMES, NODE_HELPERS, PRELUDE
from runtime.workloads.rewards.code.relay import converse
from runtime.workloads.rewards.code.spec import TestSpec
from runtime.workloads.sandbox import RunResult, Sandbox, SandboxLimits


@dataclass
class TestFailure:
    index: int
    input: Any
    expected: Any
    got: str
    status: str
    why: str = ""  # one line: the exception and its message, the limit hit, what differed

    def line(self) -> str:
        return f"test {self.index}: {self.status}" + (f": {self.why}" if self.why else "")


@dataclass
class CodeResult:
    score: float
    passed: int
    total: int
    error: str | None = None
    failures: list[TestFailure] = field(default_factory=list)
    wall_s: float = 0.0

    def as_json(self, explain: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "score": self.score,
            "passed": self.passed,
            "total": self.total,
            "error": self.error,
        }
        if explain:
            failed = {f.index: f.line() for f in self.failures}
            out["tests"] = [failed.get(i, f"test {i}: ok") for i in range(self.total)]
        return out


def _no_verdict(r: RunResult) -> tuple[str, str]:
    if not r.ok:
        return r.status, _tail(r, 0)
    return "early_exit", "the program ended before the harness reported every test"


_LIMITS = {
    "cpu_limit": "the CPU-time limit",
    "memory_limit": "the memory limit",
    "output_limit": "the output limit",
    "file_limit": "the file-size limit",
    "signal": "a signal",
}


def _why(status: str, got: str, wall_s: float) -> str:
    """One line saying why a test failed: the last line of a traceback (the exception's
    type and message), the limit a run hit, or the grader's own refusal."""
    if status == "ok":
        return ""
    if status == "timeout":
        return f"timeout after {wall_s:g} s"
    if status == "total_timeout":
        return "not run: the program's time for all its tests ran out"
    if status in _LIMITS:
        return f"stopped by {_LIMITS[status]}"
    lines = [x.strip() for x in (got or "").strip().splitlines() if x.strip(" ^~\t")]
    last = lines[-1] if lines else ""
    if last.startswith("_Refused: "):
        last = last[len("_Refused: ") :]
    if status == "wrong_answer" and last == "AssertionError" and len(lines) > 1:
        last = f"AssertionError at {lines[-2]}"  # the failing assert, as written
    return last[:300]


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
    """Run ``program`` against ``tests``; never raises for anything the program does.

    The grading first holds the node's run slots for the programs it runs at once (one
    for the program and tests in turn, else up to ``parallel`` test cases): its limits
    count from then, not from a wait behind other gradings."""
    at_once = 1 if tests.kind in ("script", "asserts") else min(max(1, parallel), tests.total)
    with sandbox.admitted(max(1, at_once)) as admitted:
        return _graded(
            program, tests, admitted, test_timeout_s, total_timeout_s, parallel, fail_fast
        )


def _graded(
    program: str,
    tests: TestSpec,
    sandbox: Sandbox,
    test_timeout_s: float | None,
    total_timeout_s: float,
    parallel: int,
    fail_fast: bool,
) -> CodeResult:
    start = time.monotonic()
    deadline = start + total_timeout_s
    per_test = test_timeout_s or sandbox.limits.wall_s
    units: list[str] = []
    names: list[list[str] | None] = []
    preamble = tests.preamble
    bindings = program_bindings(program)
    if tests.kind in ("script", "asserts"):
        if tests.kind == "script":
            units = [f"{preamble}\n{tests.script}"]
        else:
            units = [f"{preamble}\n{tests.script}\n{line}\n" for line in tests.inputs]
        helpers = _node_helpers_needed(units)
        if helpers:
            # The tests' own copy of LeetCode's helpers, so that the judging one
            # (is_same_list) is never the program's; the program gets one too.
            units = [f"{NODE_HELPERS}\n{code}" for code in units]
            preamble = f"{NODE_HELPERS}\n{preamble}"
        for code in units:
            try:
                names.append(program_names(code, set(bindings.defined), tests.fn_name))
            except (SyntaxError, ValueError, RecursionError):
                names.append(None)

    outcome: dict[int, tuple[bool, str, str]] = {}  # (ok, status, got)
    stdin_program, wrapped = program, 0
    if tests.kind == "stdio" and bindings.returns_at_top_level:
        # APPS's harness runs a stdin program inside a function, so its references may
        # return at their top level (3 of the APPS sample's 101 do); such a program, and
        # only such, runs wrapped the same way (one line above its first).
        body = textwrap.indent(program, "    ")
        stdin_program, wrapped = f"def _program():\n{body}\n    pass\n_program()\n", 1

    def limits_left() -> SandboxLimits | None:
        left = deadline - time.monotonic()
        return None if left <= 0.05 else sandbox.limits.with_wall(min(per_test, left))

    def one(i: int) -> tuple[int, tuple[bool, str, str]]:
        limits = limits_left()
        if limits is None:
            return i, (False, "total_timeout", "")
        if tests.kind == "stdio":
            head = PRELUDE + (preamble + "\n" if preamble else "")
            r = sandbox.run_python(head + stdin_program, tests.inputs[i], limits)
            if not r.ok:
                return i, (False, r.status, _tail(r, head.count("\n") + wrapped))
            ok = outputs_match(r.stdout, tests.outputs[i], tests.tolerance)
            return i, (ok, "ok" if ok else "wrong_answer", r.stdout)
        else:  # call
            job = {
                "mode": "call",
                "program": program,
                "fn": tests.fn_name,
                "preamble": preamble,
                # what the program binds itself: the prelude's names are not its functions
                "own": sorted(bindings.defined | bindings.imported),
            }
            r = _harness(sandbox, {**job, "args": tests.inputs[i]}, limits)
            v = _verdict(r)
            if v is None:
                return i, (False, *_no_verdict(r))
            if "value" not in v:
                return i, (False, str(v.get("status", "error")), str(v.get("error", "")))
            value = v["value"]
            what = _object_name(value)
            if what is not None:
                why = f"returned a {what} object where a plain value was expected"
                return i, (False, "non_plain", why)
            try:
                got = _json_like(_decode(value))
            except Exception:  # a forged verdict may hold anything a decoder can choke on
                return i, (False, "non_plain", "the harness could not read the value")
            ok = values_match(got, tests.outputs[i], tests.tolerance)
            return i, (ok, "ok" if ok else "wrong_answer", shown(got))

    if tests.kind in ("stdio", "call"):
        with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
            futures = [pool.submit(one, i) for i in range(tests.total)]
            for fut in futures:
                i, res = fut.result()
                outcome[i] = res
                if fail_fast and not res[0]:
                    deadline = 0.0  # the rest return at once as not run
    else:
        bad = [i for i, n in enumerate(names) if n is None]
        outcome.update({i: (False, "error", "the test code does not parse") for i in bad})
        order = [i for i, n in enumerate(names) if n is not None]
        left = deadline - time.monotonic()
        if order and left <= 0.05:
            outcome.update({i: (False, "total_timeout", "") for i in order})
        elif order:
            job = {
                "program": program,
                "preamble": preamble,
                "own": sorted(bindings.defined | bindings.imported),
                "entry": tests.fn_name,
            }
            found = converse(
                sandbox,
                job,
                [{"code": units[i], "names": names[i]} for i in order],
                sandbox.limits.with_wall(min(per_test * len(order), left)),
                program_sources(program),
            )
            outcome.update(dict(zip(order, found, strict=True)))

    failures = []
    for i in range(tests.total):
        ok, status, got = outcome[i]
        if not ok:
            expected = tests.outputs[i] if tests.outputs else None
            why = _why(status, got, per_test)
            if status == "wrong_answer" and tests.kind in ("stdio", "call"):
                why = f"expected {shown(expected, 80)}, got {shown(got, 80)}"
            failures.append(
                TestFailure(
                    i, tests.inputs[i] if tests.inputs else None, expected, got, status, why
                )
            )
    passed = tests.total - len(failures)
    error = None if not failures else failures[0].line()
    wall = time.monotonic() - start
    return CodeResult(float(passed == tests.total), passed, tests.total, error, failures, wall)


def _node_helpers_needed(units: list[str]) -> bool:
    """Whether a test uses LeetCode's node helpers without defining them itself."""
    for code in units:
        try:
            if free_names(code) & NODE_HELPER_NAMES:
                return True
        except (SyntaxError, ValueError, RecursionError):
            continue
    return False


def _tail(r: RunResult | None, shift: int = 0) -> str:
    if r is None:
        return ""
    if r.status == "error":
        return _renumber(r.stderr.strip()[-600:], shift)
    return r.status


def _renumber(trace: str, shift: int) -> str:
    # Line numbers as the model wrote them, not shifted by what runs before it (stdio runs:
    # the prelude and the preamble).
    return re.sub(
        r'File "/code/main\.py", line (\d+)|File "[^"]*/main\.py", line (\d+)',
        lambda m: f'File "main.py", line {int(m.group(1) or m.group(2)) - shift}',
        trace,
    )
