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
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, NamedTuple

from runtime.data.routes import wire_problem as routes_wire_problem


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
    resume: ParkedRollout | None = None


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
class ParkedRollout:
    """An unfinished trajectory of one request, as a rollout rank reports it at a stop:
    the response so far (model and environment tokens, the model's log-probs, version spans
    as in :class:`Sample`) and its model turns, the last one possibly cut off (``abort``).
    A resumed run replays the finished turns and continues the cut one from its last token
    (runtime/workloads/agents/base.py), so none of them is generated again. Not a partial
    rollout, which is a generation paused across a weight sync inside its engine and
    resumed there (``Phase.HELD``)."""

    token_ids: list[int]
    logprobs: list[float]
    loss_mask: list[int]
    versions: list[tuple[int, int, int]]
    turns: list[Turn]

    def __len__(self) -> int:
        return len(self.token_ids)


def parked_state(r: ParkedRollout) -> dict[str, Any]:
    """A parked rollout as plain data (msgpack-able), on the wire and in checkpoints."""
    return {
        "token_ids": list(r.token_ids),
        "logprobs": list(r.logprobs),
        "loss_mask": list(r.loss_mask),
        "versions": [list(v) for v in r.versions],
        "turns": [list(t) for t in r.turns],
    }


def parked_from_state(d: dict[str, Any]) -> ParkedRollout:
    return ParkedRollout(
        token_ids=[int(x) for x in d["token_ids"]],
        logprobs=[float(x) for x in d["logprobs"]],
        loss_mask=[int(x) for x in d["loss_mask"]],
        versions=[(int(a), int(b), int(c)) for a, b, c in d["versions"]],
        turns=[
            Turn(int(a), int(b), str(f), None if s is None else str(s)) for a, b, f, s in d["turns"]
        ],
    )


@dataclass(frozen=True)
class Wire:
    """How a :class:`Sample` field travels: the declaration that runtime/transport/frames.py
    encodes and decodes from and runtime/transport/sample_shape.py checks against. A field
    with no ``Wire`` stays where it is set."""

    # the type the envelope checks the header value against (unused for a frame)
    type: Any = None
    done: bool = True  # in a rollout rank's SampleDone to rank 0
    batch: bool = True  # in rank 0's Batch to the trainer ranks
    # A per-token field (one value per response token) names an ``array`` typecode: it
    # travels as a raw frame (little-endian) beside the header, in both messages.
    frame: str | None = None
    per_token: bool = False  # a header list of one value per response token (or None)
    # A per-sample byte string (None: none) too large for the header: it travels as a raw
    # frame of its own after the per-token frames (empty for None), in both messages.
    blob: bool = False
    # a blob's own shape check, ``(value, prompt tokens, response tokens) -> problem or
    # None``, run on every non-empty blob frame that arrives
    check: Any = None
    # header value -> the field's value (the envelope has checked its type)
    decode: Any = None


def _spans(value: list[list[int]]) -> list[tuple[int, int, int]]:
    return [(v[0], v[1], v[2]) for v in value]


def wire(tp: Any, **how: Any) -> dict[str, Wire]:
    """A field's metadata: it travels in the header as ``tp``."""
    return {"wire": Wire(type=tp, **how)}


def per_token(typecode: str) -> dict[str, Wire]:
    """A field's metadata: one value per response token, as a frame of ``typecode``."""
    return {"wire": Wire(frame=typecode)}


def blob(check: Any) -> dict[str, Wire]:
    """A field's metadata: a per-sample byte string (or None), as a frame of its own,
    whose shape ``check`` judges (see :class:`Wire`)."""
    return {"wire": Wire(type=bytes, blob=True, check=check)}


@dataclass(slots=True, kw_only=True)
class Sample:
    """One finished completion of one request: the same type on the rollout rank that made
    it, at rank 0 (buffer, checkpoints, ``samples.jsonl``) and on the trainer ranks.

    The class is its own wire schema: each field's :class:`Wire` says which messages carry
    it and how. A new per-token field (say ``entropy``, one float per response token) is
    one line here, ``entropy: Sequence[float] = field(default=(), metadata=per_token("f"))``:
    both messages carry it as a frame, the envelope checks it has a value per token, and
    checkpoints keep it (docs/architecture.md, "One declaration per message")."""

    sample_id: int = field(metadata=wire(int))
    group_id: int = field(metadata=wire(int))
    # the prompt's index in the run's prompt stream
    prompt_id: int = field(metadata=wire(int))
    # (policy_version, first_token, end_token) per span: a partial rollout resumed after a
    # weight sync has several spans. Staleness counts the oldest.
    versions: list[tuple[int, int, int]] = field(metadata=wire(list[list[int]], decode=_spans))
    # the prompt as the engine saw it (none: synthetic)
    prompt_token_ids: Sequence[int] = field(default=(), metadata=wire(list[int]))
    # The response: a list, or at rank 0 the typed arrays that came over the wire.
    token_ids: Sequence[int] = field(metadata=per_token("i"))
    # behaviour log-probs, one per response token
    logprobs: Sequence[float] = field(metadata=per_token("f"))
    # 1 for the response tokens trained on (the model's), 0 for those it did not write
    # (tool output, feedback between turns). None: the first ``n_valid`` tokens.
    loss_mask: Sequence[int] | None = field(
        default=None, metadata=wire(list[int] | None, per_token=True)
    )
    # A mixture of experts' routes (runtime/data/routes.py ``ExpertRoutes`` as bytes): the
    # experts each layer chose for each input position, replayed by the trainer's forward
    # (algorithm.routing_replay). None: a dense model, or none taken.
    routes: bytes | None = field(default=None, metadata=blob(routes_wire_problem))
    # response tokens trained on: sum(loss_mask), or the prefix length
    n_valid: int = field(metadata=wire(int))
    reward: float = field(metadata=wire(float))
    # Free-form JSON diagnostics from the workload (e.g. ``reward_error``), logged only.
    info: dict[str, Any] = field(default_factory=dict, metadata=wire(dict[str, Any]))
    worker: int = -1  # the rank that generated it (-1: not known here; SampleDone's rank)
    dispatched_at: float = 0.0  # rank 0's own (its dispatcher's clock)
    started_at: float = field(default=0.0, metadata=wire(float, batch=False))
    finished_at: float = field(default=0.0, metadata=wire(float, batch=False))
    # Set at rank 0 when the sample's group completes (runtime/control/replay_buffer.py).
    advantage: float = field(default=0.0, metadata=wire(float, done=False))
    group_mean_reward: float = 0.0
    # batches it was trained in before this one
    replay_count: int = field(default=0, metadata=wire(int, done=False))
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
    """A sample as plain data (msgpack-able), for checkpoints: every field."""
    out: dict[str, Any] = {}
    for f in fields(Sample):
        value = getattr(t, f.name)
        if isinstance(value, Phase):
            value = value.value
        elif f.name == "versions":
            value = [list(v) for v in value]
        elif isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
            value = list(value)  # typed arrays and tuples as lists
        out[f.name] = value
    return out


def sample_from_state(d: dict[str, Any]) -> Sample:
    """The inverse of :func:`sample_state` (a checkpoint from before typed samples, whose
    samples had an ``extra`` map, does not load: its coordinator state format is older)."""
    return Sample(
        **{
            **d,
            "versions": _spans(d["versions"]),
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
        "resume": None if r.resume is None else parked_state(r.resume),
    }


def request_from_state(d: dict[str, Any]) -> Request:
    resume = d.get("resume")
    return Request(**{**d, "resume": None if resume is None else parked_from_state(resume)})


def frame_fields() -> list[tuple[str, str]]:
    """The per-token fields that travel as frames, ``(name, typecode)``, in frame order."""
    return [(f.name, f.metadata["wire"].frame) for f in fields(Sample) if _frame_of(f)]


def _frame_of(f: Any) -> bool:
    w = f.metadata.get("wire")
    return w is not None and w.frame is not None


def blob_fields() -> list[str]:
    """The per-sample byte-string fields that travel as frames, after the per-token ones."""
    return list(blob_wires())


def blob_wires() -> dict[str, Wire]:
    """:func:`blob_fields` with their declarations, in frame order."""
    return {
        f.name: f.metadata["wire"] for f in fields(Sample) if f.metadata.get("wire", Wire()).blob
    }


def frames_per_sample() -> int:
    """The frames one sample travels with: its per-token fields' and its blobs'."""
    return len(frame_fields()) + len(blob_fields())


def sample_digest(t: Sample) -> str:
    """A checksum of what a sample is (ids, prompt, its per-token frames, loss mask, reward,
    version spans), to compare a buffer before a crash with the one restored from its
    checkpoint."""
    h = hashlib.sha256()
    h.update(struct.pack("<3q", t.sample_id, t.group_id, t.prompt_id))
    frames = frame_fields()
    ints = [getattr(t, name) for name, code in frames if code not in "fd"]
    for values in (t.prompt_token_ids, *ints, t.loss_mask or ()):
        h.update(struct.pack(f"<q{len(values)}q", len(values), *values))
    for values in (getattr(t, name) for name, code in frames if code in "fd"):
        h.update(struct.pack(f"<{len(values)}d", *values))
    h.update(struct.pack("<dq", t.reward, t.n_valid))
    for span in t.versions:
        h.update(struct.pack("<3q", *span))
    for name in blob_fields():
        value = getattr(t, name)
        h.update(struct.pack("<q", -1 if value is None else len(value)) + (value or b""))
    return h.hexdigest()
