"""Samples on the wire: their fields in msgpack, response token ids and log-probs as raw
frames. One :class:`runtime.data.sample.Sample` travels as a ``SampleDone`` (rollout rank
-> rank 0) and, inside a ``Batch``, as a ``BatchSample`` plus two frames (rank 0 -> the
trainer ranks); requests travel inside ``Work`` (rank 0 -> a rollout rank)."""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Sequence

from runtime.data.sample import Batch, PartialRollout, Request, Sample, Turn
from runtime.transport import protocol as p
from runtime.transport.sample_shape import PartialEntry, turns_mask

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


def _ints(values: Sequence[int]) -> list[int]:
    return values if type(values) is list else list(values)


# --- rank 0 -> a rollout rank --------------------------------------------------------------


def work_message(requests: Iterable[Request], policy_version: int) -> p.Work:
    entries: list[dict] = []
    blobs: list[bytes] = []
    for r in requests:
        entry = {
            "sample_id": r.sample_id,
            "group_id": r.group_id,
            "prompt_id": r.prompt_id,
            "prompt": r.prompt,
        }
        if r.resume is not None:  # its tokens and log-probs: the next two frames
            entry["resume"] = partial_entry(r.sample_id, r.resume)
            blobs += partial_frames(r.resume)
        entries.append(entry)
    return p.Work(policy_version=policy_version, requests=entries, blobs=tuple(blobs))


def requests(msg: p.Work) -> list[Request]:
    """The requests of a ``Work`` answer (the rollout rank's copy: no dispatch time)."""
    out, frame = [], 0
    for r in msg.requests:
        resume = None
        if r.get("resume") is not None:
            resume = partial(r["resume"], msg.blobs[frame], msg.blobs[frame + 1])
            frame += 2
        out.append(
            Request(r["sample_id"], r["group_id"], r["prompt_id"], r["prompt"], resume=resume)
        )
    return out


def partial_entry(sample_id: int, r: PartialRollout) -> PartialEntry:
    return {
        "sample_id": sample_id,
        "versions": [list(v) for v in r.versions],
        "turns": [
            {"start": t.start, "end": t.end, "finish": t.finish, "stop": t.stop} for t in r.turns
        ],
    }


def partial_frames(r: PartialRollout) -> list[bytes]:
    return [pack(r.token_ids, "i"), pack(r.logprobs, "f")]


def partial(e: PartialEntry, tokens: bytes, logprobs: bytes) -> PartialRollout:
    ids = unpack(tokens, "i")
    turns = [Turn(t["start"], t["end"], t["finish"], t["stop"]) for t in e["turns"]]
    return PartialRollout(
        token_ids=ids,
        logprobs=unpack(logprobs, "f"),
        loss_mask=turns_mask([(t.start, t.end) for t in turns], len(ids)),
        versions=[(v[0], v[1], v[2]) for v in e["versions"]],
        turns=turns,
    )


def parked_message(rank: int, partials: dict[int, PartialRollout]) -> p.Parked:
    """A rollout rank's report at a stop: its partial rollouts by sample id."""
    blobs: list[bytes] = []
    for r in partials.values():
        blobs += partial_frames(r)
    entries = [partial_entry(sid, r) for sid, r in partials.items()]
    return p.Parked(rank=rank, partials=entries, blobs=tuple(blobs))


def parked(msg: p.Parked) -> dict[int, PartialRollout]:
    return {
        e["sample_id"]: partial(e, msg.blobs[2 * i], msg.blobs[2 * i + 1])
        for i, e in enumerate(msg.partials)
    }


# --- a rollout rank -> rank 0 --------------------------------------------------------------


def sample_done(s: Sample, rank: int) -> p.SampleDone:
    return p.SampleDone(
        rank=rank,
        sample_id=s.sample_id,
        group_id=s.group_id,
        prompt_id=s.prompt_id,
        versions=list(map(list, s.versions)),
        prompt_token_ids=_ints(s.prompt_token_ids),
        loss_mask=None if s.loss_mask is None else _ints(s.loss_mask),
        n_valid=s.n_valid,
        reward=float(s.reward),
        info=s.info,
        started_at=s.started_at,
        finished_at=s.finished_at,
        blobs=(pack(s.token_ids, "i"), pack(s.logprobs, "f")),
    )


def sample(msg: p.SampleDone) -> Sample:
    """Rank 0's copy of a finished sample. Token ids and log-probs stay typed arrays (a
    sequence like a list): rank 0 only counts, stores and forwards them, and turning every
    frame into a list and back was a fifth of its time per sample."""
    return Sample(
        sample_id=msg.sample_id,
        group_id=msg.group_id,
        prompt_id=msg.prompt_id,
        versions=list(map(tuple, msg.versions)),
        prompt_token_ids=msg.prompt_token_ids,
        token_ids=_frame(msg.blobs[0], "i"),
        logprobs=_frame(msg.blobs[1], "f"),
        loss_mask=msg.loss_mask,
        n_valid=msg.n_valid,
        reward=msg.reward,
        info=dict(msg.info),
        worker=msg.rank,
        started_at=msg.started_at,
        finished_at=msg.finished_at,
    )


# --- rank 0 -> the trainer ranks -----------------------------------------------------------


def batch_message(b: Batch, positions: Sequence[int] | None = None) -> p.Batch:
    """The batch as rank 0 sends it: whole, or only the samples at ``positions`` (a
    trainer rank's share) with the layout of the whole batch."""
    samples: list[p.BatchSample] = []
    blobs: list[bytes] = []
    carried = b.samples if positions is None else [b.samples[i] for i in positions]
    for s in carried:
        samples.append(
            {
                "sample_id": s.sample_id,
                "group_id": s.group_id,
                "prompt_id": s.prompt_id,
                "versions": [list(v) for v in s.versions],
                "prompt_token_ids": _ints(s.prompt_token_ids),
                "loss_mask": None if s.loss_mask is None else _ints(s.loss_mask),
                "n_valid": s.n_valid,
                "reward": s.reward,
                "advantage": s.advantage,
                "replay_count": s.replay_count,
                "info": s.info,
            }
        )
        blobs += [pack(s.token_ids, "i"), pack(s.logprobs, "f")]
    whole: p.BatchLayout | None = None
    if positions is not None:
        whole = {
            "lengths": [len(s.prompt_token_ids) + len(s.token_ids) for s in b.samples],
            "n_valid": [s.n_valid for s in b.samples],
            "replayed": [s.replay_count > 0 for s in b.samples],
            "positions": list(positions),
        }
    return p.Batch(
        batch_id=b.batch_id,
        policy_version=b.policy_version,
        samples=samples,
        whole=whole,
        blobs=tuple(blobs),
    )


def whole_batch(msg: p.Batch) -> tuple[list[Sample], list[int]]:
    """A trainer rank's view of the whole batch and every sample's length: the samples it
    was sent at their positions, stand-ins elsewhere that carry what the loss normalisers
    read of another rank's samples (valid tokens, replay flag) and nothing to train on."""
    carried = batch(msg).samples
    w = msg.whole
    if w is None:
        return carried, [len(s.prompt_token_ids) + len(s.token_ids) for s in carried]
    out = [
        Sample(
            sample_id=-1,
            group_id=-1,
            prompt_id=-1,
            versions=[],
            prompt_token_ids=[],
            token_ids=[],
            logprobs=[],
            n_valid=n_valid,
            reward=0.0,
            advantage=0.0,
            replay_count=int(replayed),
        )
        for n_valid, replayed in zip(w["n_valid"], w["replayed"], strict=True)
    ]
    for s, at in zip(carried, w["positions"], strict=True):
        out[at] = s
    return out, list(w["lengths"])


def batch(msg: p.Batch) -> Batch:
    """The trainer's copy of a batch: its samples with token ids and log-probs as lists."""
    samples = [
        Sample(
            sample_id=m["sample_id"],
            group_id=m["group_id"],
            prompt_id=m["prompt_id"],
            versions=[(v[0], v[1], v[2]) for v in m["versions"]],
            prompt_token_ids=m["prompt_token_ids"],
            token_ids=unpack(msg.blobs[2 * i], "i"),
            logprobs=unpack(msg.blobs[2 * i + 1], "f"),
            loss_mask=m["loss_mask"],
            n_valid=m["n_valid"],
            reward=m["reward"],
            info=m["info"],
            advantage=m["advantage"],
            replay_count=m["replay_count"],
        )
        for i, m in enumerate(msg.samples)
    ]
    n_replay = sum(1 for s in samples if s.replay_count > 0)
    return Batch(msg.batch_id, msg.policy_version, samples, len(samples) - n_replay, n_replay)
