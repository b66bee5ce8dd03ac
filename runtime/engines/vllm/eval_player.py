"""The pinned rollout driver's part of an eval round (runtime/control/evals.py): each
episode rank 0 hands it (``EvalWork``) played by the workload's own agent loop,
environment and reward on this rank's engine, batched with whatever else it runs, and
its reward sent back (``EvalDone``).

An episode plays the eval set's record (its file loaded here once, as rank 0 rendered its
prompts: runtime/workloads/eval_sets.py ``eval_prompts``), greedily (``sample`` 0) or at
``eval.temperature``, through an :class:`AgentEnv` of its own per set and temperature.
An episode that fails or ends without a score reports no reward and why: rank 0 counts
it as 0 and ``unscored``, as the trainer-side path does. Every result carries the
engine's version, which rank 0 checks against the round's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from runtime.workloads.agents.base import AgentEnv, Generation
from runtime.workloads.agents.settings import AgentEnvConfig

# a set's name -> its record lookup by index (None: the run has no such set)
RecordsOf = Callable[[str], Callable[[int], Any] | None]

log = logging.getLogger(__name__)


class AtTemperature:
    """The engine as an agent's generator, sampling at a fixed temperature (0: greedy)."""

    def __init__(self, engine: Any, temperature: float) -> None:
        self.engine, self.temperature = engine, temperature

    async def generate_turn(
        self, request_id: str, prompt_ids: list[int], max_tokens: int, stop: list[str] | None
    ) -> Generation:
        return await self.engine.generate_turn(
            request_id, prompt_ids, max_tokens, stop, temperature=self.temperature
        )


class EvalPlayer:
    def __init__(
        self,
        agent_config: AgentEnvConfig,
        records_of: RecordsOf,
        temperature: float,
        engine: Any,
        codec: Any,
        pool: Any,
        agent: Any,
        submit: Callable[[Any], Future],
    ) -> None:
        """``records_of``: each set's record lookup, loaded on first use (the rollout side
        loads the set's file as rank 0 rendered it); ``temperature``: the sampled
        episodes' (``eval.temperature``); ``submit`` runs a coroutine on the engine's loop
        (the rollout side's)."""
        self.agent_config, self.records_of, self.temperature = agent_config, records_of, temperature
        self.engine, self.codec, self.pool, self.agent = engine, codec, pool, agent
        self.submit = submit
        self.running: dict[tuple[int, int], Future] = {}  # (round, task) -> its episode
        self._envs: dict[tuple[str, float], AgentEnv] = {}
        self._records: dict[str, Callable[[int], Any] | None] = {}

    def start(self, rank: int, round_id: int, version: int, tasks: list[Any]) -> None:
        for t in tasks:
            key = (round_id, t["task_id"])
            if key not in self.running:  # a task handed again while it runs: once
                self.running[key] = self.submit(self._play(rank, round_id, version, t))

    def reap(self, send: Callable[[Any], None]) -> None:
        """The results of the episodes that ended, to ``send`` (the loop's outbox)."""
        for key in [k for k, f in self.running.items() if f.done()]:
            fut = self.running.pop(key)
            if not fut.cancelled() and fut.exception() is None:
                send(fut.result())

    def cancel(self) -> list[str]:
        """Leaving the rollout pool: the round ends without these (rank 0 ends it
        incomplete when the rank leaves); the engine request ids to abort."""
        turns = range(self.agent_config.workload.max_turns)
        ids = [f"eval{r}-{t}" for r, t in self.running]
        ids += [f"{rid}-t{n}" for rid in list(ids) for n in turns]
        for fut in self.running.values():
            fut.cancel()
        self.running.clear()
        return ids

    def records(self, set_name: str) -> Callable[[int], Any] | None:
        if set_name not in self._records:
            self._records[set_name] = self.records_of(set_name)
        return self._records[set_name]

    def env(self, set_name: str, temperature: float) -> AgentEnv:
        key = (set_name, temperature)
        if key not in self._envs:
            self._envs[key] = AgentEnv(
                self.agent_config,
                self.codec,
                AtTemperature(self.engine, temperature),
                self.records(set_name),
                self.pool,
            )
        return self._envs[key]

    async def _play(self, rank: int, round_id: int, version: int, task: dict[str, Any]) -> Any:
        from runtime.transport import protocol as p

        rid = f"eval{round_id}-{task['task_id']}"
        reward: float | None = None
        why = ""
        at_start = self.engine.version
        if self.records(task["set_name"]) is None:
            why = f"no eval set {task['set_name'][:100]!r} in this run"
        else:
            temperature = 0.0 if task["sample"] == 0 else self.temperature
            env = self.env(task["set_name"], temperature)
            try:
                ep = await self.agent.run(env, rid, task["prompt"])
                if ep is None:
                    why = "no room for a response"
                else:
                    reward = float(ep.reward)
            except Exception as exc:  # scored 0 and counted at rank 0: an eval never fails a run
                why = f"{type(exc).__name__}: {exc}"[:300]
                log.warning("eval episode %s failed: %s", rid, why)
            finally:
                env.forget(rid)
        # the version the episode saw: rank 0 refuses the round's figures from another
        served = at_start if at_start != version else self.engine.version
        return p.EvalDone(
            rank=rank,
            round_id=round_id,
            task_id=task["task_id"],
            policy_version=served,
            reward=reward,
            reason=why,
        )
