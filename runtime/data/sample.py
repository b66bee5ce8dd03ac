"""A sample's data and its lifecycle.

One *request* (a prompt to complete) becomes one *sample* (the completion with its
metadata): a :class:`Sample` from the rollout engine to the trainer, which trains on a
:class:`Batch` of them. GRPO groups ``n`` requests of one prompt under one ``group_id``.

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
from typing import Any, NamedTuple


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


@dataclass(slots=True)
class Request:
    """A prompt to complete, as rank 0 queues and dispatches it and a rollout rank runs it.
    Read-only by convention (the dispatcher makes a new one per hand-out); not a frozen
    dataclass, which costs four times as much to create on this hot path."""

    sample_id: int
    group_id: int
    prompt_id: int
    prompt: dict[str, Any]
    dispatched_at: float = 0.0
    admitted_version: int = 0
    # What a rollout rank had generated of it when the run stopped (a checkpoint keeps it):
    # the rank that runs it next continues from there instead of from the prompt.
    resume: PartialRollout | None = None


class Turn(NamedTuple):
    """One model turn of a trajectory: response tokens ``[start, end)``, how it ended
    (``stop``, ``length``, or ``abort``: cut off by a stop, to be continued) and the stop
    string that ended it, if any (a tool call's close tag)."""

    start: int
    end: int
    finish: str
    stop: str | None


def token_versions(spans: Sequence[tuple[int, int, int]], n: int) -> list[int | None]:
    """The policy version of each of the first ``n`` response tokens, from version spans
    ``(version, first, end)``; None for a token no span covers."""
    out: list[int | None] = [None] * n
    for version, first, end in spans:
        for i in range(max(first, 0), min(end, n)):
            out[i] = version
    return out


@dataclass(slots=True, kw_only=True)
class PartialRollout:
    """An unfinished trajectory of one request, as a rollout rank reports it at a stop:
    the response so far (model and environment tokens, the model's log-probs, version spans
    as in :class:`Sample`) and its model turns, the last one possibly cut off (``abort``).
    A resumed run replays the finished turns and continues the cut one from its last token
    (runtime/workloads/agents/base.py), so none of them is generated again."""

    token_ids: list[int]
    logprobs: list[float]
    loss_mask: list[int]
    versions: list[tuple[int, int, int]]
    turns: list[Turn]

    def __len__(self) -> int:
        return len(self.token_ids)


def partial_state(r: PartialRollout) -> dict[str, Any]:
    """A partial rollout as plain data (msgpack-able), on the wire and in checkpoints."""
    return {
        "token_ids": list(r.token_ids),
        "logprobs": list(r.logprobs),
        "loss_mask": list(r.loss_mask),
        "versions": [list(v) for v in r.versions],
        "turns": [list(t) for t in r.turns],
    }


def partial_from_state(d: dict[str, Any]) -> PartialRollout:
    return PartialRollout(
        token_ids=[int(x) for x in d["token_ids"]],
        logprobs=[float(x) for x in d["logprobs"]],
        loss_mask=[int(x) for x in d["loss_mask"]],
        versions=[(int(a), int(b), int(c)) for a, b, c in d["versions"]],
        turns=[
            Turn(int(a), int(b), str(f), None if s is None else str(s)) for a, b, f, s in d["turns"]
        ],
    )


@dataclass(slots=True, kw_only=True)
class Sample:
    """One finished completion of one request: the same type on the rollout rank that made
    it, at rank 0 (buffer, checkpoints, ``samples.jsonl``) and on the trainer ranks. The
    wire carries these fields explicitly (:mod:`runtime.transport.frames`)."""

    sample_id: int
    group_id: int
    prompt_id: int  # the prompt's index in the run's prompt stream
    # (policy_version, first_token, end_token) per span: a partial rollout resumed after a
    # weight sync has several spans. Staleness counts the oldest.
    versions: list[tuple[int, int, int]]
    prompt_token_ids: Sequence[int] = ()  # the prompt as the engine saw it (none: synthetic)
    # The response: a list, or at rank 0 the typed arrays that came over the wire.
    token_ids: Sequence[int]
    logprobs: Sequence[float]  # behaviour log-probs, one per response token
    # 1 for the response tokens trained on (the model's), 0 for those it did not write
    # (tool output, feedback between turns). None: the first ``n_valid`` tokens.
    loss_mask: Sequence[int] | None = None
    n_valid: int  # response tokens trained on: sum(loss_mask), or the prefix length
    reward: float
    # Free-form JSON diagnostics from the workload (e.g. ``reward_error``), logged only.
    info: dict[str, Any] = field(default_factory=dict)
    worker: int = -1  # the rank that generated it (-1: not known here)
    dispatched_at: float = 0.0
    started_at: float = 0.0
    finished_at: float = 0.0
    # Set at rank 0 when the sample's group completes (runtime/control/replay_buffer.py).
    advantage: float = 0.0
    group_mean_reward: float = 0.0
    replay_count: int = 0  # batches it was trained in before this one
    phase: Phase = Phase.FINISHED

    @property
    def oldest_version(self) -> int:
        vs = self.versions  # one span unless a weight sync cut the generation (hot path)
        return vs[0][0] if len(vs) == 1 else min(v for v, _, _ in vs)

    @property
    def newest_version(self) -> int:
        vs = self.versions
        return vs[-1][0] if len(vs) == 1 else max(v for v, _, _ in vs)

    @property
    def is_replay(self) -> bool:
        return self.replay_count > 0

    def age(self, current_version: int) -> int:
        return current_version - self.oldest_version


@dataclass(slots=True)
class Batch:
    """A training batch: ``n_unused`` fresh samples, then ``n_replay`` replayed ones. Rank 0's
    buffer makes it; the trainer ranks get the same type from the wire."""

    batch_id: int
    policy_version: int
    samples: list[Sample]
    n_unused: int
    n_replay: int

    @property
    def max_age(self) -> int:
        return max(t.age(self.policy_version) for t in self.samples)


def sample_state(t: Sample) -> dict[str, Any]:
    """A sample as plain data (msgpack-able), for checkpoints."""
    return {
        "sample_id": t.sample_id,
        "group_id": t.group_id,
        "prompt_id": t.prompt_id,
        "versions": [list(v) for v in t.versions],
        "prompt_token_ids": list(t.prompt_token_ids),
        "token_ids": list(t.token_ids),
        "logprobs": list(t.logprobs),
        "loss_mask": None if t.loss_mask is None else list(t.loss_mask),
        "n_valid": t.n_valid,
        "reward": t.reward,
        "info": t.info,
        "worker": t.worker,
        "dispatched_at": t.dispatched_at,
        "started_at": t.started_at,
        "finished_at": t.finished_at,
        "advantage": t.advantage,
        "group_mean_reward": t.group_mean_reward,
        "replay_count": t.replay_count,
        "phase": t.phase.value,
    }


def sample_from_state(d: dict[str, Any]) -> Sample:
    """The inverse of :func:`sample_state` (a checkpoint from before typed samples, whose
    samples had an ``extra`` map, does not load: its coordinator state format is older)."""
    return Sample(
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
        "resume": None if r.resume is None else partial_state(r.resume),
    }


def request_from_state(d: dict[str, Any]) -> Request:
    resume = d.get("resume")
    return Request(**{**d, "resume": None if resume is None else partial_from_state(resume)})


def sample_digest(t: Sample) -> str:
    """A checksum of what a sample is (ids, prompt, tokens, log-probs, loss mask, reward,
    version spans), to compare a buffer before a crash with the one restored from its
    checkpoint."""
    h = hashlib.sha256()
    h.update(struct.pack("<3q", t.sample_id, t.group_id, t.prompt_id))
    for values in (t.prompt_token_ids, t.token_ids, t.loss_mask or ()):
        h.update(struct.pack(f"<q{len(values)}q", len(values), *values))
    h.update(struct.pack(f"<{len(t.logprobs)}d", *t.logprobs))
    h.update(struct.pack("<dq", t.reward, t.n_valid))
    for span in t.versions:
        h.update(struct.pack("<3q", *span))
    return h.hexdigest()
