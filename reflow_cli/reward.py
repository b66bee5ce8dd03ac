"""``reflow reward``: check a reward on your own data before a long run.

JSON Lines in on stdin, one JSON line out per input line, in input order; inputs are
scored in parallel worker processes. A line that is not a valid input gets
``{"score": null, "error": "line N: ..."}`` in its place, so outputs still line up.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from reflow_cli import numbers

reward_app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.split("\n")[0])

_WORKERS = min(4, os.cpu_count() or 1)


def _record(lineno: int, line: str, fields: tuple[str, ...]) -> dict[str, Any] | str:
    """The parsed line, or the one-line error to report in its place."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        return f"line {lineno}: not valid JSON ({exc.msg})"
    if not isinstance(record, dict):
        return f"line {lineno}: expected a JSON object"
    missing = [k for k in fields if k not in record]
    if missing:
        return f"line {lineno}: missing field {missing[0]!r}"
    return record


def _score_math(item: tuple[int, str]) -> dict[str, Any]:
    lineno, line = item
    record = _record(lineno, line, ("response", "gold"))
    if isinstance(record, str):
        return {"score": None, "error": record}
    if not isinstance(record["response"], str):
        return {"score": None, "error": f"line {lineno}: field 'response' must be a string"}
    from runtime.workloads.rewards.math import math_reward

    return {"score": math_reward(record["response"], record["gold"])}


def _score_code(item: tuple[int, str], recipe: str | None, explain: bool = False) -> dict[str, Any]:
    lineno = item[0]
    try:
        return _grade_code(item, recipe, explain)
    except Exception as exc:
        return {"score": None, "error": f"line {lineno}: internal error: {type(exc).__name__}"}


def _grade_code(item: tuple[int, str], recipe: str | None, explain: bool) -> dict[str, Any]:
    lineno, line = item
    record = _record(lineno, line, ("program",))
    if isinstance(record, str):
        return {"score": None, "error": record}
    from runtime.workloads.rewards.code import TestSpecError, parse_tests, run_tests, tests_of
    from runtime.workloads.sandbox import sandbox_for

    if not isinstance(record["program"], str):
        return {"score": None, "error": f"line {lineno}: field 'program' must be a string"}
    if "tests" not in record and "test" not in record:
        return {"score": None, "error": f"line {lineno}: missing field 'tests' (or 'test')"}
    try:
        spec = parse_tests(tests_of(record))
    except TestSpecError as exc:
        return {"score": None, "error": f"line {lineno}: {exc}"}
    cfg = _config(recipe)
    result = run_tests(
        record["program"],
        spec,
        sandbox_for(cfg),
        test_timeout_s=cfg.sandbox.test_timeout_s,
        total_timeout_s=cfg.workload.reward_timeout_s,
        parallel=cfg.sandbox.parallel,
    )
    return result.as_json(explain=explain)


_CONFIGS: dict[str | None, Any] = {}


def _config(recipe: str | None):
    if recipe not in _CONFIGS:
        from runtime.config.recipe import load_recipe
        from runtime.config.schema import Config

        _CONFIGS[recipe] = Config() if recipe is None else load_recipe(recipe)
    return _CONFIGS[recipe]


def _serve(score: Callable[[tuple[int, str]], dict[str, Any]], workers: int) -> None:
    lines: Iterator[tuple[int, str]] = ((i, x) for i, x in enumerate(sys.stdin, 1) if x.strip())
    with ProcessPoolExecutor(max_workers=max(1, workers)) as pool:
        for result in pool.map(score, lines, chunksize=4):
            sys.stdout.write(json.dumps(result) + "\n")
            sys.stdout.flush()


@reward_app.command("math")
def math_cmd(
    workers: Annotated[
        int, typer.Option(help="parallel scoring processes", parser=numbers.WORKERS)
    ] = _WORKERS,
) -> None:
    """Score {"response", "gold"} lines with the math reward (math-verify)."""
    _serve(_score_math, workers)


@reward_app.command("code")
def code_cmd(
    workers: Annotated[
        int, typer.Option(help="programs scored at once", parser=numbers.WORKERS)
    ] = _WORKERS,
    recipe: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="take the sandbox limits from this recipe (default: the defaults)"),
    ] = None,
    explain: Annotated[
        bool, typer.Option(help="add 'tests': one line per test saying how it ended and why")
    ] = False,
) -> None:
    """Run {"program", "tests": {"inputs", "outputs", "fn_name"?}} (APPS) or
    {"program", "test", "entry_point"?, "preamble"?} (HumanEval/MBPP/LeetCode) lines in the
    sandbox; out: {"score", "passed", "total", "error"} (docs/code-reward.md)."""
    if recipe is not None:
        _config(str(recipe))  # a bad recipe is one line (RecipeError), before any input
    rec = None if recipe is None else str(recipe)
    _serve(partial(_score_code, recipe=rec, explain=explain), workers)


def _custom_input(lineno: int, line: str) -> tuple[Any, ...] | str:
    """verl's four arguments from one line, or the one-line error in its place."""
    record = _record(lineno, line, ("solution_str",))
    if isinstance(record, str):
        return record
    if not isinstance(record["solution_str"], str):
        return f"line {lineno}: field 'solution_str' must be a string"
    return (
        record.get("data_source", "custom"),
        record["solution_str"],
        record.get("ground_truth"),
        record.get("extra_info"),
    )


async def _score_custom(ref: str, lines: list[tuple[int, str]], workers: int, timeout_s: float):
    """Every line through the reward pool training uses (its processes, its timeout)."""
    import asyncio

    from runtime.workloads.agents.pool import RewardPool
    from runtime.workloads.rewards import custom

    pool = RewardPool(max(1, workers), timeout_s)
    gate = asyncio.Semaphore(max(1, workers))

    async def one(lineno: int, line: str) -> dict[str, Any]:
        args = _custom_input(lineno, line)
        if isinstance(args, str):
            return {"score": None, "error": args}
        async with gate:
            result, error = await pool.call(custom.score, ref, *args)
        if error is not None:
            return {"score": 0.0, "error": error}  # as training scores it
        return {"score": result["score"], **({"info": result["info"]} if result["info"] else {})}

    try:
        return await asyncio.gather(*(one(i, x) for i, x in lines))
    finally:
        pool.close()


@reward_app.command("custom")
def custom_cmd(
    fn: Annotated[str, typer.Option("--fn", help="PATH.py:NAME or module:NAME (verl's signature)")],
    workers: Annotated[int, typer.Option(help="calls at once", parser=numbers.WORKERS)] = _WORKERS,
    timeout_s: Annotated[
        float,
        typer.Option(
            help="per call, as workload.reward_timeout_s (then it scores 0)",
            parser=numbers.SECONDS,
        ),
    ] = 10.0,
) -> None:
    """Score {"solution_str", "ground_truth"?, "data_source"?, "extra_info"?} lines with
    your own reward function, as training calls it (workload.reward_fn); out: {"score",
    "info"?, "error"?} (a raise or a timeout scores 0 and says why)."""
    import asyncio

    from jobs.errors import UserError
    from runtime.workloads.rewards import custom

    try:
        ref = custom.check(fn)
    except custom.RewardFnError as exc:
        raise UserError(str(exc).replace(custom.FIELD, "--fn")) from None
    lines = [(i, x) for i, x in enumerate(sys.stdin, 1) if x.strip()]
    for result in asyncio.run(_score_custom(ref, lines, workers, timeout_s)):
        sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
