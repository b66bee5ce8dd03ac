"""The driver: :func:`run_tests` runs a program against its tests, one sandboxed process
per run (stdio and call tests one run each; script and asserts tests a record run each and
one replay for all of them), and turns the runs into a :class:`CodeResult`."""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from runtime.workloads.rewards.code.compare import _json_like, outputs_match, values_match
from runtime.workloads.rewards.code.harness import _harness, _verdict
from runtime.workloads.rewards.code.plain import _decode, _NotPlain
from runtime.workloads.rewards.code.prelude import PRELUDE
from runtime.workloads.rewards.code.probe import _top_level_definitions, probe_code, program_names
from runtime.workloads.rewards.code.spec import TestSpec
from runtime.workloads.sandbox import RunResult, Sandbox, SandboxLimits


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
