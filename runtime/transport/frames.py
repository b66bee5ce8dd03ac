"""Samples on the wire: the fields their declaration (runtime/data/sample.py) puts in a
message as a msgpack record, their per-token fields as raw frames. One
:class:`runtime.data.sample.Sample` travels as a ``SampleDone`` (rollout rank -> rank 0)
and inside a ``Batch`` (rank 0 -> the trainer ranks); requests travel inside ``Work``
(rank 0 -> a rollout rank). Nothing here names a sample's fields: they follow from the
declaration."""

from __future__ import annotations

import dataclasses
import sys
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

from runtime.data.micro_batches import RankPlan, UpdatePlan
from runtime.data.sample import Batch, ParkedRollout, Request, Sample, Turn, Wire
from runtime.transport import protocol as p
from runtime.transport.sample_shape import (
    BATCH_FIELDS,
    BLOBS,
    DONE_FIELDS,
    FRAMES,
    SAMPLE_FRAMES,
    ParkedEntry,
    turns_mask,
)

_LITTLE = sys.byteorder == "little"


def pack(values: Sequence[int] | Sequence[float], typecode: str) -> bytes:
    if isinstance(values, array) and values.typecode == typecode and _LITTLE:
        return values.tobytes()  # a sample rank 0 received: its frame as it came
    a = array(typecode, values)
    if not _LITTLE:
        a.byteswap()
    return a.tobytes()


def _frame(data: bytes, typecode: str) -> array:
    a = array(typecode)
    a.frombytes(data)
    if not _LITTLE:
        a.byteswap()
    return a


def unpack(data: bytes, typecode: str) -> list:
    return _frame(data, typecode).tolist()


# --- rank 0 -> a rollout rank --------------------------------------------------------------


def work_message(requests: Iterable[Request], policy_version: int) -> p.Work:
    entries: list[p.RequestRecord] = []
    blobs: list[bytes] = []
    for r in requests:
        resume = None
        if r.resume is not None:  # its tokens and log-probs: the next two frames
            resume = parked_entry(r.sample_id, r.resume)
            blobs += parked_frames(r.resume)
        entries.append(
            {
                "sample_id": r.sample_id,
                "group_id": r.group_id,
                "prompt_id": r.prompt_id,
                "prompt": r.prompt,
                "resume": resume,
            }
        )
    return p.Work(policy_version=policy_version, requests=entries, blobs=tuple(blobs))


def requests(msg: p.Work) -> list[Request]:
    """The requests of a ``Work`` answer (the rollout rank's copy: no dispatch time)."""
    out, frame = [], 0
    for r in msg.requests:
        resume = None
        if r["resume"] is not None:
            resume = parked_rollout(r["resume"], msg.blobs[frame], msg.blobs[frame + 1])
            frame += 2
        out.append(
            Request(r["sample_id"], r["group_id"], r["prompt_id"], r["prompt"], resume=resume)
        )
    return out


def parked_entry(sample_id: int, r: ParkedRollout) -> ParkedEntry:
    return {
        "sample_id": sample_id,
        "versions": [list(v) for v in r.versions],
        "turns": [
            {"start": t.start, "end": t.end, "finish": t.finish, "stop": t.stop} for t in r.turns
        ],
    }


def parked_frames(r: ParkedRollout) -> list[bytes]:
    return [pack(r.token_ids, "i"), pack(r.logprobs, "f")]


def parked_rollout(e: ParkedEntry, tokens: bytes, logprobs: bytes) -> ParkedRollout:
    ids = unpack(tokens, "i")
    turns = [Turn(t["start"], t["end"], t["finish"], t["stop"]) for t in e["turns"]]
    return ParkedRollout(
        token_ids=ids,
        logprobs=unpack(logprobs, "f"),
        loss_mask=turns_mask([(t.start, t.end) for t in turns], len(ids)),
        versions=[(v[0], v[1], v[2]) for v in e["versions"]],
        turns=turns,
    )


def parked_message(rank: int, rollouts: dict[int, ParkedRollout]) -> p.Parked:
    """A rollout rank's report at a stop: its parked rollouts by sample id."""
    blobs: list[bytes] = []
    for r in rollouts.values():
        blobs += parked_frames(r)
    entries = [parked_entry(sid, r) for sid, r in rollouts.items()]
    return p.Parked(rank=rank, rollouts=entries, blobs=tuple(blobs))


def parked(msg: p.Parked) -> dict[int, ParkedRollout]:
    return {
        e["sample_id"]: parked_rollout(e, msg.blobs[2 * i], msg.blobs[2 * i + 1])
        for i, e in enumerate(msg.rollouts)
    }


# --- a sample's record and frames, from its declaration ---------------------------------


def _plain(value: Any) -> Any:
    """A field's value as the envelope checks it: typed arrays and tuples as lists, and a
    list of tuples (version spans) as a list of lists."""
    if isinstance(value, (array, tuple)):
        return list(value)
    if type(value) is list and value and type(value[0]) is tuple:
        return [list(v) for v in value]
    return value


def record(s: Sample, declared: dict[str, Wire]) -> dict[str, Any]:
    """The header record of ``s`` in a message that carries the ``declared`` fields."""
    return {name: _plain(getattr(s, name)) for name in declared}


def sample_frames(s: Sample) -> list[bytes]:
    per_token = [pack(getattr(s, name), code) for name, code in FRAMES]
    return per_token + [getattr(s, name) or b"" for name in BLOBS]


def _blob_fields(frames: Sequence[bytes]) -> dict[str, bytes | None]:
    """A sample's byte-string fields from its frames after the per-token ones."""
    return {name: blob or None for name, blob in zip(BLOBS, frames[len(FRAMES) :], strict=True)}


def _fields(rec: dict[str, Any], declared: dict[str, Wire]) -> dict[str, Any]:
    """The field values of a checked record (a float field sent as an int is a float)."""
    out = {}
    for k, w in declared.items():
        value = rec[k]
        out[k] = w.decode(value) if w.decode else float(value) if w.type is float else value
    return out


# --- a rollout rank -> rank 0 --------------------------------------------------------------


def sample_done(s: Sample, rank: int) -> p.SampleDone:
    return p.SampleDone(
        rank=rank,
        sample=record(s, DONE_FIELDS),  # type: ignore[arg-type]
        blobs=tuple(sample_frames(s)),
    )


def sample(msg: p.SampleDone) -> Sample:
    """Rank 0's copy of a finished sample. Per-token frames stay typed arrays (a sequence
    like a list): rank 0 only counts, stores and forwards them, and turning every frame
    into a list and back was a fifth of its time per sample."""
    fields = _fields(msg.sample, DONE_FIELDS)
    for (name, code), blob in zip(FRAMES, msg.blobs[: len(FRAMES)], strict=True):
        fields[name] = _frame(blob, code)
    fields.update(_blob_fields(msg.blobs))
    fields["info"] = dict(fields["info"])  # its own copy: rank 0 adds to it
    return Sample(**fields, worker=msg.rank)


# --- rank 0 -> the trainer ranks -----------------------------------------------------------


def batch_message(b: Batch, part: RankPlan | None = None) -> p.Batch:
    """The batch as rank 0 sends it: whole, or a trainer rank's ``part`` (its samples, in
    the plan's order, and its updates)."""
    carried = b.samples if part is None else [b.samples[i] for i in part.batch_positions]
    blobs = [frame for s in carried for frame in sample_frames(s)]
    return p.Batch(
        batch_id=b.batch_id,
        policy_version=b.policy_version,
        samples=[record(s, BATCH_FIELDS) for s in carried],  # type: ignore[misc]
        updates=None if part is None else [dataclasses.asdict(u) for u in part.updates],  # type: ignore[misc]
        blobs=tuple(blobs),
    )


def updates(msg: p.Batch) -> list[UpdatePlan] | None:
    """The updates of a trainer rank's part of a batch (None: the whole batch was sent)."""
    if msg.updates is None:
        return None
    return [UpdatePlan(**u) for u in msg.updates]


def batch(msg: p.Batch) -> Batch:
    """The trainer's copy of a batch (or of its part): its samples with their per-token
    fields as lists."""
    k = SAMPLE_FRAMES
    samples = []
    for i, rec in enumerate(msg.samples):
        own = msg.blobs[k * i : k * (i + 1)]
        frames = {name: unpack(own[j], code) for j, (name, code) in enumerate(FRAMES)}
        samples.append(Sample(**_fields(rec, BATCH_FIELDS), **frames, **_blob_fields(own)))
    n_replay = sum(1 for s in samples if s.replay_count > 0)
    return Batch(msg.batch_id, msg.policy_version, samples, len(samples) - n_replay, n_replay)
