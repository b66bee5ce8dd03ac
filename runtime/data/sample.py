"""A sample's data and its lifecycle.

One *request* (a prompt to complete) becomes one *trajectory* (the completion with its
metadata). GRPO groups ``n`` requests of one prompt under one ``group_id``.

Lifecycle (every transition is counted by :class:`runtime.control.replay_buffer.ReplayBuffer`
and :class:`runtime.control.dispatcher.Dispatcher`)::

    pending -> running <-> held -> finished -> available -> consumed -> replayed
                                       |            |           |  ^        |
                                       '-> evicted <'           |  '--------'
                                                                '-> retired
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
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
    token_ids: Sequence[int]  # a list, or at rank 0 the array that came over the wire
    logprobs: Sequence[float]
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
        vs = self.versions  # one span unless a weight sync cut the generation (hot path)
        return vs[0][0] if len(vs) == 1 else min(v for v, _, _ in vs)

    @property
    def is_replay(self) -> bool:
        return self.replay_count > 0

    def age(self, current_version: int) -> int:
        return current_version - self.oldest_version


def trajectory_state(t: Trajectory) -> dict[str, Any]:
    """A trajectory as plain data (msgpack-able), for checkpoints."""
    return {
        "sample_id": t.sample_id,
        "group_id": t.group_id,
        "prompt_id": t.prompt_id,
        "versions": [list(v) for v in t.versions],
        "token_ids": list(t.token_ids),
        "logprobs": list(t.logprobs),
        "reward": t.reward,
        "n_valid": t.n_valid,
        "worker": t.worker,
        "dispatched_at": t.dispatched_at,
        "started_at": t.started_at,
        "finished_at": t.finished_at,
        "extra": t.extra,
        "advantage": t.advantage,
        "group_mean_reward": t.group_mean_reward,
        "replay_count": t.replay_count,
        "phase": t.phase.value,
    }


def trajectory_from_state(d: dict[str, Any]) -> Trajectory:
    return Trajectory(
        **{
            **d,
            "versions": [(int(a), int(b), int(c)) for a, b, c in d["versions"]],
            "phase": Phase(d["phase"]),
        }
    )


def request_state(r: Request) -> dict[str, Any]:
    return {
        "sample_id": r.sample_id,
        "group_id": r.group_id,
        "prompt_id": r.prompt_id,
        "prompt": r.prompt,
        "dispatched_at": r.dispatched_at,
        "admitted_version": r.admitted_version,
    }


def request_from_state(d: dict[str, Any]) -> Request:
    return Request(**d)


def trajectory_digest(t: Trajectory) -> str:
    """A checksum of what a sample is (ids, tokens, log-probs, reward, version spans), to
    compare a buffer before a crash with the one restored from its checkpoint."""
    h = hashlib.sha256()
    h.update(struct.pack("<3q", t.sample_id, t.group_id, t.prompt_id))
    h.update(struct.pack(f"<{len(t.token_ids)}q", *t.token_ids))
    h.update(struct.pack(f"<{len(t.logprobs)}d", *t.logprobs))
    h.update(struct.pack("<dq", t.reward, t.n_valid))
    for span in t.versions:
        h.update(struct.pack("<3q", *span))
    return h.hexdigest()
