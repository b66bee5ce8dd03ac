"""Your own reward function, called as verl calls one (``custom_reward_function``).

``workload.reward_fn: PATH.py:NAME`` (a file) or ``module:NAME`` (an importable module)
names a function that takes the keyword arguments ``data_source``, ``solution_str``,
``ground_truth`` and ``extra_info`` and returns a float, or a dict with ``score`` whose
other keys are diagnostics (averaged into the step's metrics as ``reward_info/<key>``).
An ``async def`` is awaited. A file written for verl works here unchanged.

It replaces the reward of any workload kind: the agent loop still runs its turns (tools,
test feedback), and the final reward is the function's. It runs in the reward pool
(:mod:`runtime.workloads.agents.pool`): its own processes, ``workload.reward_timeout_s``,
and a raise, a hang or a crash is recorded as the sample's ``reward_error`` with reward
0, nothing lost. ``reflow launch`` loads it once first, so a missing file or name, an
import error or a signature verl's arguments cannot bind is one line before anything
starts (:func:`check`).
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runtime.workloads import user_code
from runtime.workloads.user_code import UserCodeError

# verl's call: compute_score(data_source=..., solution_str=..., ground_truth=...,
# extra_info=...) (verl/trainer/ppo/reward.py, the custom_reward_function it wraps)
VERL_KWARGS = ("data_source", "solution_str", "ground_truth", "extra_info")
FIELD = "workload.reward_fn"
_LOADED: dict[str, Callable[..., Any]] = {}  # per process: the pool's workers load once


RewardFnError = UserCodeError  # one line naming workload.reward_fn


def resolve(ref: str, base: Path | None = None) -> str:
    """``ref`` with a file's path made absolute (runtime/workloads/user_code.py)."""
    return user_code.resolve(ref, FIELD, base)


def load(ref: str) -> Callable[..., Any]:
    """The function ``ref`` names, imported now (a file by its path), its signature
    checked against verl's keyword arguments."""
    target, name, fn = user_code.load_object(ref, FIELD)
    if not callable(fn):
        raise RewardFnError(f"{FIELD}: {target}:{name} is a {type(fn).__name__}, not a function")
    try:
        inspect.signature(fn).bind(**dict.fromkeys(VERL_KWARGS))
    except TypeError as exc:
        raise RewardFnError(
            f"{FIELD}: {target}:{name} cannot be called with verl's keyword arguments "
            f"({', '.join(VERL_KWARGS)}): {exc}"
        ) from None
    except ValueError:
        pass  # no signature to read (a builtin): the call will tell
    return fn


def check(ref: str, base: Path | None = None) -> str:
    """``reflow launch``'s check: the resolved reference, after loading it once here."""
    resolved = resolve(ref, base)
    load(resolved)
    return resolved


def as_result(value: Any) -> dict[str, Any]:
    """A reward function's return as ``{"score": float, "info": {key: value}}``: a number,
    or a dict with a numeric ``score`` (its other keys are diagnostics)."""
    info: dict[str, Any] = {}
    if isinstance(value, dict):
        if "score" not in value:
            raise TypeError(f"returned a dict without 'score' (keys: {sorted(value)[:8]})")
        for key, v in value.items():
            if key == "score":
                continue
            if isinstance(v, bool | int | float):
                info[str(key)] = float(v)
            elif isinstance(v, str):
                info[str(key)] = v[:200]
            else:  # arrays, nested objects: kept as short text, JSON all the way
                info[str(key)] = repr(v)[:200]
        value = value["score"]
    if isinstance(value, str | bytes) or value is None:
        raise TypeError(f"returned {type(value).__name__}, not a number")
    if not isinstance(value, bool | int | float):
        # numpy scalars and 0-d tensors convert; anything else is the function's mistake
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise TypeError(f"returned {type(value).__name__}, not a number") from None
    score = float(value)
    if not math.isfinite(score):
        raise ValueError(f"returned a score of {score}")
    return {"score": score, "info": info}


def score(
    ref: str, data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any
) -> dict[str, Any]:
    """Call the function (in a reward-pool process): :func:`as_result` of its return."""
    fn = _LOADED.get(ref)
    if fn is None:
        fn = _LOADED[ref] = load(ref)
    out = fn(
        data_source=data_source,
        solution_str=solution_str,
        ground_truth=ground_truth,
        extra_info=extra_info,
    )
    if inspect.isawaitable(out):
        out = asyncio.run(_wait(out))
    return as_result(out)


async def _wait(awaitable: Any) -> Any:
    return await awaitable


def verl_arguments(record: dict[str, Any], default_source: str) -> tuple[Any, Any, Any]:
    """``(data_source, ground_truth, extra_info)`` of a dataset record, as verl's data
    files lay them out: ``data_source``; ``reward_model.ground_truth`` (verl's parquet) or
    the record's ``answer`` / ``ground_truth``; ``extra_info``."""
    source = record.get("data_source", default_source)
    truth = record.get("answer", record.get("ground_truth"))
    model = record.get("reward_model")
    if truth is None and isinstance(model, dict):
        truth = model.get("ground_truth")
    extra = record.get("extra_info")
    if extra is None:
        extra = {k: v for k, v in record.items() if k in ("index", "split", "id")}
    return source, truth, extra
