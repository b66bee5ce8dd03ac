"""A sample's data and its lifecycle.

One *request* (a prompt to complete) becomes one *trajectory* (the completion with its
metadata). GRPO groups ``n`` requests of one prompt under one ``group_id``.

Lifecycle (every transition is counted by :class:`runtime.replay_buffer.ReplayBuffer`
and :class:`runtime.dispatcher.Dispatcher`)::

    pending -> running <-> held -> finished -> available -> consumed -> replayed
                                       |            |           |  ^        |
                                       '-> evicted <'           |  '--------'
                                                                '-> retired
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Phase(str, Enum):
    PENDING = "pending"  # queued at the dispatcher
    RUNNING = "running"  # generating on a rollout worker
    HELD = "held"  # paused across a weight sync (partial rollout)
    FINISHED = "finished"  # delivered; its group is not complete yet
    AVAILABLE = "available"  # unused, eligible for a batch
    CONSUMED = "consumed"  # in a batch being trained on
    REPLAYED = "replayed"  # back in the pool as a replay sample
    EVICTED = "evicted"  # dropped: too stale, or filtered
    RETIRED = "retired"  # trained on and not kept for replay


@dataclass(frozen=True, slots=True)
class Request:
    sample_id: int
    group_id: int
    prompt_id: int
    prompt: dict[str, Any]
    dispatched_at: float = 0.0
    admitted_version: int = 0


@dataclass(slots=True)
class Trajectory:
    sample_id: int
    group_id: int
    prompt_id: int
    # (policy_version, first_token, end_token) per span: a partial rollout resumed after a
    # weight sync has several spans. Staleness counts the oldest.
    versions: list[tuple[int, int, int]]
    token_ids: list[int]
    logprobs: list[float]
    reward: float
    n_valid: int
    worker: int
    dispatched_at: float = 0.0
    started_at: float = 0.0
    finished_at: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    advantage: float = 0.0
    group_mean_reward: float = 0.0
    replay_count: int = 0
    phase: Phase = Phase.FINISHED

    @property
    def oldest_version(self) -> int:
        return min(v for v, _, _ in self.versions)

    @property
    def is_replay(self) -> bool:
        return self.replay_count > 0

    def age(self, current_version: int) -> int:
        return current_version - self.oldest_version
