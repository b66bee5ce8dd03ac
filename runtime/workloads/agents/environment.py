"""Your own multi-turn environment (``workload.agent: PATH.py:Class``), and the agent loop
that plays it (:class:`EnvAgent`).

An environment is a class with two methods, each plain or ``async``::

    class NumberGame(Environment):
        def reset(self, record: dict, tools: Tools) -> None:
            self.target = int(record["target"])       # a dataset record, after data.fields

        def step(self, action: str) -> Step:         # the model's turn, decoded
            guess = ...
            if guess == self.target:
                return Step(reward=1.0, done=True)
            return Step(observation="higher" if guess < self.target else "lower")

A new instance plays each episode. The prompt is the record's, as for every kind
(``data.prompt_template``). After each model turn ``step`` returns the next user message
(``observation``), this turn's reward and whether the episode is over; the episode's
reward is the sum of its steps' rewards, unless ``workload.reward_fn`` scores it. The loop
ends on ``done``, after ``workload.max_turns`` model turns, or when the context is full.

What the built-in agents guarantee holds here too, because this loop is built the same
way (runtime/workloads/agents/base.py): the observations are environment tokens (loss
mask 0) between the model's turns; a stop keeps the episode so far (a parked rollout) and
a resume replays the model's turns while the environment answers as before; an episode
inside ``reset`` or ``step`` holds no generation slot (it counts as waiting on a tool).
``tools.run_python`` runs code in the sandbox through the reward pool. A raise, a timeout
(``workload.reward_timeout_s`` per call) or a malformed return ends the episode with
reward 0 and ``reward_error`` saying why; nothing is lost.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.workloads import user_code
from runtime.workloads.agents.base import AgentEnv, Episode
from runtime.workloads.sandbox import RunResult
from runtime.workloads.user_code import UserCodeError

FIELD = "workload.agent"


@dataclass
class Step:
    """What an environment says after a model turn."""

    observation: str | None = None  # the next user message (ignored when done)
    reward: float = 0.0  # this turn's; the episode's reward is the sum
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)  # diagnostics (JSON values)


class Tools:
    """What an environment may use: code in the sandbox, through the reward pool."""

    def __init__(self, env: AgentEnv) -> None:
        self._env = env

    async def run_python(self, code: str) -> RunResult:
        """Run ``code`` in the sandbox (``sandbox:`` limits); raises if the run failed to
        happen at all (a timeout, a dead process)."""
        from runtime.workloads.agents import scoring

        result, error = await self._env.call(
            scoring.run_snippet, code, self._env.config.sandbox, on_thread=True
        )
        if result is None:
            raise RuntimeError(f"the sandbox run failed: {error}")
        return result


class Environment:
    """The base of your environment: override :meth:`reset` and :meth:`step`."""

    def reset(self, record: dict[str, Any], tools: Tools) -> None:
        """Start an episode from a dataset record."""

    def step(self, action: str) -> Step:
        raise NotImplementedError


AgentClassError = UserCodeError  # one line naming workload.agent


def load_class(ref: str) -> type:
    """The class ``ref`` (``PATH.py:Class`` or ``module:Class``) names, with ``reset`` and
    ``step``."""
    target, name, cls = user_code.load_object(ref, FIELD, "Class")
    if not isinstance(cls, type):
        raise AgentClassError(f"{FIELD}: {target}:{name} is not a class")
    for method in ("reset", "step"):
        if not callable(getattr(cls, method, None)):
            raise AgentClassError(f"{FIELD}: {target}:{name} has no {method} method")
    return cls


def check(ref: str, base: Path | None = None) -> str:
    """``reflow launch``'s check: the resolved reference, after loading the class once."""
    resolved = user_code.resolve(ref, FIELD, base)
    load_class(resolved)
    return resolved


async def _call(fn: Callable[..., Any], timeout_s: float, *args: Any) -> Any:
    """``fn(*args)`` within ``timeout_s``: awaited if async, else in a thread (the event
    loop drives every episode of the rank)."""
    if inspect.iscoroutinefunction(fn):
        return await asyncio.wait_for(fn(*args), timeout_s)
    out = await asyncio.wait_for(asyncio.to_thread(fn, *args), timeout_s)
    if inspect.isawaitable(out):
        out = await asyncio.wait_for(out, timeout_s)
    return out


def _started(_: Any) -> bool:
    return True  # whatever reset returns: it set the environment up


def _checked(step: Any) -> Step:
    if not isinstance(step, Step):
        raise TypeError(f"step returned {type(step).__name__}, not a Step")
    reward = float(step.reward)
    if not math.isfinite(reward):
        raise ValueError(f"step returned a reward of {reward}")
    if not step.done and not isinstance(step.observation, str):
        raise TypeError("step returned no observation and not done")
    return step


_CLASSES: dict[str, type] = {}


class EnvAgent:
    """The agent loop of ``workload.agent``: the environment's turns between the model's."""

    async def run(self, env: AgentEnv, request_id: str, prompt: dict[str, Any]) -> Episode | None:
        w = env.config.workload
        if w.agent is None:
            raise ValueError(f"{FIELD}: workload.kind custom needs an environment class")
        cls = _CLASSES.get(w.agent) or _CLASSES.setdefault(w.agent, load_class(w.agent))
        ep = env.episode(request_id, prompt)
        game, total = cls(), 0.0
        ep.info["turns"] = 0
        record = env.record(prompt)
        if not await _env_call(env, ep, game.reset, _started, record, Tools(env)):
            return ep
        for turn in range(w.max_turns):
            g = await env.generate(ep, f"{request_id}-t{turn}")
            if g is None:
                break  # no room left in the context
            if g.finish == "abort":
                return None
            ep.add_model(g)
            ep.info["turns"] = turn + 1
            step = await _env_call(env, ep, game.step, _checked, env.codec.decode(g.tokens))
            if step is None:
                return ep  # the environment failed: reward 0, reward_error says why
            total += float(step.reward)
            ep.info.update({f"env/{k}": v for k, v in step.info.items()})
            if step.done or turn == w.max_turns - 1:
                break
            ids = env.codec.user_turn_ids(step.observation or "", g.finish == "stop")
            if len(ep.context) + len(ids) >= env.config.max_seq_len:
                break
            ep.add_env(ids)
        if not await env.custom_reward(ep, prompt):
            ep.reward = total
        return ep


async def _env_call(
    env: AgentEnv,
    ep: Episode,
    fn: Callable[..., Any],
    check: Callable[[Any], Any],
    *args: Any,
) -> Any:
    """One call into the environment, holding no generation slot: ``check`` of its
    result (a :class:`Step` from ``step``, True from ``reset``), or None when it raised,
    timed out or returned something ``check`` refuses; then the episode scores 0 and
    ``reward_error`` says why."""
    env.in_tools += 1
    try:
        return check(await _call(fn, env.config.workload.reward_timeout_s, *args))
    except asyncio.TimeoutError:
        why = f"timed out after {env.config.workload.reward_timeout_s:g} s"
    except Exception as exc:  # the user's environment failed: recorded, not raised
        text = str(exc).splitlines()[0] if str(exc) else ""
        why = f"{type(exc).__name__}: {text}"
    finally:
        env.in_tools -= 1
    ep.reward = 0.0
    ep.info["reward_error"] = f"environment {fn.__name__}: {why}"[:300]
    return None
