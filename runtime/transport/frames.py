"""Trajectories on the wire: metadata in msgpack, token ids and log-probs as raw frames."""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from typing import Any

from runtime.control.replay_buffer import Batch
from runtime.data.sample import Trajectory
from runtime.transport import protocol as p

_LITTLE = sys.byteorder == "little"


def pack(values: Sequence[int] | Sequence[float], typecode: str) -> bytes:
    if isinstance(values, array) and values.typecode == typecode and _LITTLE:
        return values.tobytes()  # a trajectory rank 0 received: its frame as it came
    a = array(typecode, values)
    if not _LITTLE:
        a.byteswap()
    return a.tobytes()


def unpack(data: bytes, typecode: str) -> list:
    a = array(typecode)
    a.frombytes(data)
    if not _LITTLE:
        a.byteswap()
    return a.tolist()


def sample_done(t: Trajectory, rank: int) -> p.SampleDone:
    return p.SampleDone(
        rank=rank,
        sample_id=t.sample_id,
        group_id=t.group_id,
        prompt_id=t.prompt_id,
        versions=[list(v) for v in t.versions],
        reward=float(t.reward),
        n_valid=t.n_valid,
        started_at=t.started_at,
        finished_at=t.finished_at,
        extra=t.extra,
        blobs=(pack(t.token_ids, "i"), pack(t.logprobs, "f")),
    )


def _frame(data: bytes, typecode: str) -> array:
    a = array(typecode)
    a.frombytes(data)
    if not _LITTLE:
        a.byteswap()
    return a


def trajectory(msg: p.SampleDone) -> Trajectory:
    """Rank 0's copy of a finished sample. Token ids and log-probs stay typed arrays (a
    sequence like a list): rank 0 only counts, stores and forwards them, and turning every
    frame into a list and back was a fifth of its time per sample."""
    return Trajectory(
        sample_id=msg.sample_id,
        group_id=msg.group_id,
        prompt_id=msg.prompt_id,
        versions=[(v[0], v[1], v[2]) for v in msg.versions],
        token_ids=_frame(msg.blobs[0], "i"),
        logprobs=_frame(msg.blobs[1], "f"),
        reward=msg.reward,
        n_valid=msg.n_valid,
        worker=msg.rank,
        started_at=msg.started_at,
        finished_at=msg.finished_at,
        extra=dict(msg.extra),
    )


META = ("sample_id", "group_id", "prompt_id", "reward", "advantage", "n_valid", "replay_count")


def batch_message(batch: Batch) -> p.Batch:
    samples: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for t in batch.samples:
        meta = {k: getattr(t, k) for k in META}
        meta["versions"] = [list(v) for v in t.versions]
        meta["extra"] = t.extra
        samples.append(meta)
        blobs += [pack(t.token_ids, "i"), pack(t.logprobs, "f")]
    return p.Batch(
        batch_id=batch.batch_id,
        policy_version=batch.policy_version,
        samples=samples,
        blobs=tuple(blobs),
    )


def batch_samples(msg: p.Batch) -> list[dict[str, Any]]:
    """The batch's samples as dicts with ``token_ids`` and ``logprobs`` lists."""
    out = []
    for i, meta in enumerate(msg.samples):
        d = dict(meta)
        d["token_ids"] = unpack(msg.blobs[2 * i], "i")
        d["logprobs"] = unpack(msg.blobs[2 * i + 1], "f")
        out.append(d)
    return out
