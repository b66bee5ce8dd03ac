"""``reflow reward``: check a reward on your own data before a long run.

JSON Lines in on stdin, one JSON line out per input line, in input order; inputs are
scored in parallel worker processes. A line that is not a valid input gets
``{"score": null, "error": "line N: ..."}`` in its place, so outputs still line up.
"""

from __future__ import annotations

import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Annotated, Any

import typer

reward_app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.split("\n")[0])


def _score_math(item: tuple[int, str]) -> dict[str, Any]:
    lineno, line = item
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        return {"score": None, "error": f"line {lineno}: not valid JSON ({exc.msg})"}
    if not isinstance(record, dict):
        return {"score": None, "error": f"line {lineno}: expected a JSON object"}
    missing = [k for k in ("response", "gold") if k not in record]
    if missing:
        return {"score": None, "error": f"line {lineno}: missing field {missing[0]!r}"}
    if not isinstance(record["response"], str):
        return {"score": None, "error": f"line {lineno}: field 'response' must be a string"}
    from runtime.rewards.math import math_reward

    return {"score": math_reward(record["response"], record["gold"])}


@reward_app.command("math")
def math_cmd(
    workers: Annotated[int, typer.Option(help="parallel scoring processes")] = min(
        4, os.cpu_count() or 1
    ),
) -> None:
    """Score {"response", "gold"} lines with the math reward (math-verify)."""
    lines = [(i, x) for i, x in enumerate(sys.stdin, 1) if x.strip()]
    with ProcessPoolExecutor(max_workers=max(1, workers)) as pool:
        for result in pool.map(_score_math, lines, chunksize=16):
            sys.stdout.write(json.dumps(result) + "\n")
