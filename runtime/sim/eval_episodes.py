"""The eval episodes of the simulated rollout replicas (:mod:`runtime.sim.rollout_pool`):
which ones each replica runs, which wait in a tool call, and the result each sends back.

Rank 0's eval rounds are the runtime's own (runtime/control/evals.py). An episode is
generated like a training one; it draws from a random stream of its own, so a run's
training draws are those of the same run without evals (a paired comparison), the rest of
the run depending on the evals through time only. Its reward is a draw at the training
samples' rate. Not modelled: the eval sets' own lengths.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from typing import Any

from runtime.transport import protocol as p


class EvalEpisodes:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        # leader -> its eval episodes in flight, by replica id (negative: no sample id is)
        self.running: dict[int, dict[int, Any]] = {}
        self._ids = itertools.count(1)
        # leader -> its episodes in a tool call: they keep their slot, as on a real rank
        # (the vLLM side's free_slots counts them)
        self.in_tools: dict[int, int] = {}
        self.done = 0  # episodes played to their end

    def add(self, leader: int, episode: Any) -> int:
        """``episode`` (the pool's generation, its ``eval_task`` set) now runs on
        ``leader``'s replica, under the replica id returned."""
        rid = -next(self._ids)
        self.running.setdefault(leader, {})[rid] = episode
        return rid

    def get(self, leader: int, rid: int) -> Any | None:
        return self.running.get(leader, {}).get(rid)

    def drop(self, leader: int) -> None:
        """The replica left the pool: its episodes end with it (rank 0 ends the round
        incomplete)."""
        self.running.pop(leader, None)
        self.in_tools.pop(leader, None)

    def tool_call(self, leader: int, started: bool) -> None:
        self.in_tools[leader] = self.in_tools.get(leader, 0) + (1 if started else -1)

    def slots(self, leader: int) -> tuple[int, int]:
        """(episodes in the replica, episodes in a tool call) of ``leader``."""
        tools = self.in_tools.get(leader, 0)
        return len(self.running.get(leader, ())) - tools, tools

    def finished(self, leader: int, rid: int, reward_p: Callable[[], float]) -> p.EvalDone:
        """An episode ended: the result its replica's leader sends rank 0."""
        episode = self.running[leader].pop(rid)
        self.done += 1
        round_id, task_id = episode.eval_task
        return p.EvalDone(
            rank=leader,
            round_id=round_id,
            task_id=task_id,
            policy_version=episode.version,
            reward=float(self.rng.random() < reward_p()),
            reason="",
        )
