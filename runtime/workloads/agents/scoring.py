"""The functions agents run in the reward pool (top level, so they pickle)."""

from __future__ import annotations

from typing import Any

from runtime.workloads.sandbox import RunResult, sandbox_for


def math_score(response: str, gold: Any) -> float:
    from runtime.workloads.rewards.math import math_reward

    return math_reward(response, gold)


def code_score(
    program: str,
    tests: Any,
    fn_name: str | None,
    indices: list[int] | None,
    settings: Any,
    total_timeout_s: float,
) -> dict[str, Any]:
    """Run ``program`` against the selected tests; the result and the first failure."""
    from runtime.workloads.rewards.code import parse_tests, run_tests

    spec = parse_tests(tests, fn_name=fn_name)
    if indices is not None:
        spec = spec.subset(indices)
    result = run_tests(
        program,
        spec,
        sandbox_for(settings),
        test_timeout_s=settings.test_timeout_s,
        total_timeout_s=total_timeout_s,
        parallel=settings.parallel,
    )
    out = result.as_json()
    if result.failures:
        f = result.failures[0]
        out["failure"] = {
            "input": f.input,
            "expected": f.expected,
            "got": f.got,
            "status": f.status,
        }
    return out


def run_snippet(code: str, settings: Any) -> RunResult:
    from runtime.workloads.rewards.code import PRELUDE

    return sandbox_for(settings).run_python(PRELUDE + code)
