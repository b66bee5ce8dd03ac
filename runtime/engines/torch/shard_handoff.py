"""A trainer's state moved rank to rank when its replica groups join or leave.

The layout rules this rests on (runtime/config/layout.py): the trainer ranks are the first
T ranks, in whole replica groups of ``G = resources.trainer_gpus_per_replica`` consecutive
ranks, and the pool grows or shrinks by whole groups at its end (a group that lost a rank
leaves from where it is, see below). A rank's shard index (its
column of the ``("replicate", "shard")`` grid, its place in its group) therefore never
changes, and over the new mesh a rank that stays holds exactly the local shards it held.

After the process groups change:

- a rank that stays builds the model over the new mesh and takes its old local tensors
  in (:func:`adopt`: parameters copied into FSDP2's new storage, AdamW moments wrapped as
  they are, no copy): nothing is sent;
- each rank of a joining replica group receives its column's local tensors (parameters,
  AdamW ``exp_avg``/``exp_avg_sq``/``step``) from a rank of an existing group holding the
  same column (:func:`plan_sources`: joiners spread round-robin over the existing groups),
  point to point on the new epoch's trainer group, every pair at once (:func:`transfer`).
  No rank holds more than its own shards and one bucket in flight. Not on the world group:
  a rank started again after a loss (``reflow rejoin``) is a new process there, and a
  peer's world-group pair with the old one stays connected to the dead process (measured:
  gloo's connect times out, tests/integration/test_trainer_rank_rejoin.py);
- a leaving group sends nothing.

A replicated trainer (``train.strategy: replicate``) is the case ``G = 1``: each rank
holds the whole model and a joining rank receives it from one of those that stay.

The tensors travel in buckets of ``engine.weight_bucket_mb`` (:func:`plan_buckets`): flat
tensors of one dtype, a tensor split over buckets where it does not fit, planned by both
ends alike from the new model's local shapes (:func:`training_tensors`). Before any bucket,
the receiver sends the source its plan's signature; the source answers whether its own
agrees, with the step, policy version and updates done of a step under way. A mismatch
raises :class:`HandoffError` on both ends before any bucket moves; a peer that died
surfaces as the trainer group's timeout.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from runtime.engines.torch.offload import local_tensor

# AdamW's per-parameter state, in the order it travels after the parameter
ADAM_KEYS = ("exp_avg", "exp_avg_sq", "step")
# P2P tags (gloo matches on them; NCCL ignores them and keeps per-pair order)
_TAG_PLAN, _TAG_VERDICT, _TAG_BUCKET = 1, 2, 16
_SIGNATURE_LEN = 3  # tensors, elements, CRC of dtypes and shapes
# the trainer's counters that travel with its state: step, policy version, and the
# updates of an aborted step already applied (TorchTrainer.updates_done)
Counters = tuple[int, int, int]
_VERDICT_LEN = 1 + 3 + _SIGNATURE_LEN  # ok, the counters, the source's signature


class HandoffError(RuntimeError):
    """The trainer state cannot move between these layouts, or the two ends disagree."""


# --- planning (pure) -------------------------------------------------------------------


@dataclass(frozen=True)
class Piece:
    """Elements ``[start, stop)`` of the flattened tensor number ``tensor``."""

    tensor: int
    start: int
    stop: int


@dataclass(frozen=True)
class Bucket:
    """One flat tensor on the wire: pieces of tensors of one dtype, back to back."""

    dtype: torch.dtype
    pieces: tuple[Piece, ...]

    @property
    def numel(self) -> int:
        return sum(p.stop - p.start for p in self.pieces)


def plan_buckets(specs: Sequence[tuple[torch.dtype, int]], bucket_bytes: int) -> list[Bucket]:
    """Buckets of at most ``bucket_bytes`` for tensors of ``(dtype, numel)``, in order.

    A bucket holds one dtype; consecutive tensors fill it, and a tensor that does not fit
    continues in the next (a bucket never exceeds the size, whatever a tensor's). Empty
    tensors (an FSDP2 shard of a dimension smaller than the group) take no place."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    out: list[Bucket] = []
    pieces: list[Piece] = []
    dtype: torch.dtype | None = None
    room = 0  # elements left in the open bucket
    for index, (dt, numel) in enumerate(specs):
        start = 0
        while start < numel:
            if pieces and (dt != dtype or room == 0):
                out.append(Bucket(dtype, tuple(pieces)))  # type: ignore[arg-type]
                pieces = []
            if not pieces:
                dtype, room = dt, max(1, bucket_bytes // dt.itemsize)
            take = min(numel - start, room)
            pieces.append(Piece(index, start, start + take))
            start, room = start + take, room - take
    if pieces:
        out.append(Bucket(dtype, tuple(pieces)))  # type: ignore[arg-type]
    return out


def signature(tensors: Sequence[torch.Tensor]) -> list[int]:
    """What both ends must agree on: the tensor count, total elements, and a CRC of every
    tensor's dtype and shape in order."""
    text = ";".join(f"{t.dtype}:{tuple(t.shape)}" for t in tensors)
    return [len(tensors), sum(t.numel() for t in tensors), zlib.crc32(text.encode())]


def plan_sources(before: Sequence[int], after: Sequence[int], group_size: int) -> dict[int, int]:
    """The rank each joining trainer rank receives its state from: ``{receiver: source}``.

    ``before`` and ``after`` are the trainer ranks in grid order (rows of ``group_size``).
    A joining rank in column ``j`` is served by a rank that stays in column ``j``; the
    joiners of a column take the existing holders in turn, so several existing replica
    groups share the sending. Raises :class:`HandoffError` when a rank that stays would
    change column (its shards would not be the new mesh's) or a column has no holder."""
    if group_size < 1:
        raise HandoffError(f"replica group size must be at least 1, got {group_size}")
    for name, ranks in (("before", before), ("after", after)):
        if len(ranks) % group_size:
            raise HandoffError(
                f"trainer ranks {name} the switch ({list(ranks)}) are not whole replica "
                f"groups of {group_size}"
            )
    old_column = {r: i % group_size for i, r in enumerate(before)}
    holders: dict[int, list[int]] = {}
    for i, r in enumerate(after):
        if r in old_column:
            if old_column[r] != i % group_size:
                raise HandoffError(
                    f"trainer rank {r} would move from shard {old_column[r]} to shard "
                    f"{i % group_size}: layouts must add and remove whole replica groups"
                )
            holders.setdefault(i % group_size, []).append(r)
    out: dict[int, int] = {}
    served: dict[int, int] = {}
    for i, r in enumerate(after):
        if r in old_column:
            continue
        column = i % group_size
        if column not in holders:
            raise HandoffError(
                f"trainer rank {r} joins as shard {column} but no trainer rank that stays "
                f"holds that shard (before {list(before)}, after {list(after)})"
            )
        k = served.get(column, 0)
        out[r] = holders[column][k % len(holders[column])]
        served[column] = k + 1
    return out


# --- the state -------------------------------------------------------------------------


def from_first_group(after: Sequence[int], group_size: int) -> dict[int, int]:
    """``{receiver: source}`` making every replica a copy of the first (the leader's): each
    rank of the other replica groups receives from the first group's rank of its column.

    After a trainer rank is lost mid-step the survivors may disagree: one may have applied
    an update whose collective failed on another. The leader's group is the run's record
    (it reports the steps), so the others take its state."""
    first = list(after[:group_size])
    return {r: first[i % group_size] for i, r in enumerate(after) if i >= group_size}


def _adam_state(opt: torch.optim.Optimizer, param: torch.Tensor) -> dict[str, torch.Tensor]:
    """``param``'s AdamW state, created as AdamW creates it where missing (a replica that
    never stepped), so that every rank lists the same tensors."""
    state = opt.state[param]
    if not state:
        state["step"] = torch.tensor(0.0)
        state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
    if set(state) != set(ADAM_KEYS):
        raise HandoffError(f"optimizer state {sorted(state)} is not AdamW's {sorted(ADAM_KEYS)}")
    return state


@torch.no_grad()
def training_tensors(model: torch.nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """This rank's local tensors of model and optimizer, in a fixed order: per parameter
    (``model.parameters()``, tied ones once, frozen ones left out) the parameter,
    ``exp_avg``, ``exp_avg_sq`` and ``step``. Under FSDP2 the local shards (views of the
    live storage: writing into them sets the state), else the tensors themselves."""
    out: list[torch.Tensor] = []
    for param in model.parameters():
        if not param.requires_grad:
            # a LoRA run's frozen base: every rank built it from the model folder, the
            # same bytes, so it is not sent (2 bytes a parameter against 16 an adapter's)
            continue
        state = _adam_state(opt, param)
        out.append(local_tensor(param))
        out += [local_tensor(state[k]) for k in ADAM_KEYS]
    return out


def _nbytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@torch.no_grad()
def adopt(
    old_model: torch.nn.Module,
    old_opt: torch.optim.Optimizer,
    new_model: torch.nn.Module,
    new_opt: torch.optim.Optimizer,
) -> int:
    """A rank that stays: its old local state into the model built over the new mesh.

    Parameters are copied into the new model's storage (FSDP2 owns and pads it); AdamW
    tensors are taken as they are, wrapped for the new mesh when sharded. Every shape is
    checked before anything moves. Returns the bytes taken over."""
    from torch.distributed.tensor import DTensor

    olds, news = list(old_model.parameters()), list(new_model.parameters())
    if len(olds) != len(news):
        raise HandoffError(f"the new model has {len(news)} parameters, the old {len(olds)}")
    for i, (old, new) in enumerate(zip(olds, news, strict=True)):
        a, b = local_tensor(old), local_tensor(new)
        if a.shape != b.shape or a.dtype != b.dtype:
            raise HandoffError(
                f"parameter {i}: local shard {tuple(a.shape)} {a.dtype} over the old mesh, "
                f"{tuple(b.shape)} {b.dtype} over the new one"
            )
    moved = 0
    for old, new in zip(olds, news, strict=True):
        local_tensor(new).copy_(local_tensor(old))
        moved += _nbytes([local_tensor(old)])
        state = old_opt.state.pop(old, None)
        if not state:
            continue  # never stepped: AdamW creates it on the first step
        taken: dict[str, torch.Tensor] = {"step": state["step"]}
        for key in ("exp_avg", "exp_avg_sq"):
            t = state[key]
            if isinstance(new, DTensor):
                t = DTensor.from_local(
                    local_tensor(t),
                    new.device_mesh,
                    new.placements,
                    run_check=False,
                    shape=new.shape,
                    stride=new.stride(),
                )
            taken[key] = t
        new_opt.state[new] = taken
        moved += _nbytes([local_tensor(v) for v in taken.values()])
    return moved


# --- the transfer ----------------------------------------------------------------------


@dataclass
class TransferStats:
    """One rank's part in a handoff."""

    seconds: float = 0.0
    sent_bytes: int = 0
    received_bytes: int = 0
    peers: list[int] = field(default_factory=list)


def _pack(bucket: Bucket, tensors: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    flat = torch.empty(bucket.numel, dtype=bucket.dtype, device=device)
    offset = 0
    for p in bucket.pieces:
        n = p.stop - p.start
        flat[offset : offset + n].copy_(tensors[p.tensor].reshape(-1)[p.start : p.stop])
        offset += n
    return flat


def _unpack(flat: torch.Tensor, bucket: Bucket, tensors: Sequence[torch.Tensor]) -> None:
    offset = 0
    for p in bucket.pieces:
        n = p.stop - p.start
        tensors[p.tensor].view(-1)[p.start : p.stop].copy_(flat[offset : offset + n])
        offset += n


def _wait(works: Sequence[dist.Work]) -> None:
    for w in works:
        w.wait()


@torch.no_grad()
def transfer(
    tensors: Sequence[torch.Tensor],
    sources: dict[int, int],
    rank: int,
    device: torch.device,
    bucket_bytes: int,
    counters: Counters,
    *,
    group: Any,
) -> tuple[TransferStats, Counters]:
    """Send or receive this rank's part of a handoff over ``group`` (every rank of it
    may call it; one that neither sends nor receives returns at once). ``group`` holds
    every source and receiver: the new epoch's trainer group (None, the world group, only
    where no rank was ever started again, as in a test of the transfer alone).

    ``tensors`` is :func:`training_tensors` of the new model; a receiver's are written in
    place. Returns the stats and the counters (step, version, updates done): a receiver's
    from its source, the others' ``counters`` as given. ``device`` is where the buffers
    live: the trainer's (gloo takes CPU tensors, NCCL CUDA ones)."""
    start = time.perf_counter()
    stats = TransferStats()
    receivers = sorted(r for r, s in sources.items() if s == rank)
    if rank not in sources and not receivers:
        return stats, counters
    for t in tensors:
        if not t.is_contiguous():
            raise HandoffError(f"a local tensor {tuple(t.shape)} is not contiguous")
    mine = torch.tensor(signature(tensors), dtype=torch.int64, device=device)
    buckets = plan_buckets([(t.dtype, t.numel()) for t in tensors], bucket_bytes)
    if rank in sources:
        counters = _receive(tensors, buckets, mine, sources[rank], device, stats, group)
    else:
        _send(tensors, buckets, mine, receivers, device, counters, stats, group)
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # NCCL's waits order streams, not the host
    stats.seconds = time.perf_counter() - start
    return stats, counters


def _receive(
    tensors: Sequence[torch.Tensor],
    buckets: list[Bucket],
    mine: torch.Tensor,
    source: int,
    device: torch.device,
    stats: TransferStats,
    group: Any,
) -> Counters:
    verdict = torch.zeros(_VERDICT_LEN, dtype=torch.int64, device=device)
    _wait(
        [
            dist.isend(mine, source, group=group, tag=_TAG_PLAN),
            dist.irecv(verdict, source, group=group, tag=_TAG_VERDICT),
        ]
    )
    ok, step, version, updates_done, *theirs = (int(x) for x in verdict.cpu())
    if not ok:
        ours = mine.tolist()
        why = (
            "another of its receivers expects other tensors"
            if theirs == ours
            else f"its plan {theirs} (tensors, elements, CRC) is not this rank's {ours}: the "
            "two models' local shards differ"
        )
        raise HandoffError(f"trainer state from rank {source} refused: {why}")
    stats.peers = [source]
    # one bucket received while the previous one is unpacked
    pending: tuple[dist.Work, torch.Tensor, Bucket] | None = None
    for k, bucket in enumerate(buckets):
        flat = torch.empty(bucket.numel, dtype=bucket.dtype, device=device)
        work = dist.irecv(flat, source, group=group, tag=_TAG_BUCKET + k)
        if pending is not None:
            pending[0].wait()
            _unpack(pending[1], pending[2], tensors)
        pending = (work, flat, bucket)
        stats.received_bytes += flat.numel() * flat.element_size()
    if pending is not None:
        pending[0].wait()
        _unpack(pending[1], pending[2], tensors)
    return step, version, updates_done


def _send(
    tensors: Sequence[torch.Tensor],
    buckets: list[Bucket],
    mine: torch.Tensor,
    receivers: list[int],
    device: torch.device,
    counters: Counters,
    stats: TransferStats,
    group: Any,
) -> None:
    plans = {r: torch.zeros(_SIGNATURE_LEN, dtype=torch.int64, device=device) for r in receivers}
    _wait([dist.irecv(plans[r], r, group=group, tag=_TAG_PLAN) for r in receivers])
    refused = [r for r in receivers if not torch.equal(plans[r], mine)]
    # all or none: a receiver told to go would wait for buckets that never come
    verdict = torch.tensor([int(not refused), *counters, *mine.tolist()], dtype=torch.int64)
    verdict = verdict.to(device)
    _wait([dist.isend(verdict, r, group=group, tag=_TAG_VERDICT) for r in receivers])
    if refused:
        raise HandoffError(
            f"trainer ranks {refused} expect another trainer state than this rank's "
            f"(their plans {[plans[r].tolist() for r in refused]}, this one {mine.tolist()})"
        )
    stats.peers = list(receivers)
    # a bucket goes to every receiver at once; the next is packed while it travels
    in_flight: list[dist.Work] = []
    held: torch.Tensor | None = None
    for k, bucket in enumerate(buckets):
        flat = _pack(bucket, tensors, device)
        _wait(in_flight)  # at most two buckets alive: this one and the one in flight
        in_flight = [dist.isend(flat, r, group=group, tag=_TAG_BUCKET + k) for r in receivers]
        held = flat  # kept alive until its sends are done
        stats.sent_bytes += flat.numel() * flat.element_size() * len(receivers)
    _wait(in_flight)
    del held
