"""What every part of a rank's process group shares: the leader's rank, the error, how a
layout epoch's subgroup is made and unmade, and how tensors are cut into buckets."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

LEADER = 0  # global rank of the trainer leader: the trainer pool starts at rank 0
_ARRIVAL_POLL_S = 0.05  # a member's look at the store while it waits for the others


class CollectiveError(RuntimeError):
    """The process group could not be formed or a transfer was malformed."""


def bucket_indices(items: Sequence[tuple[torch.dtype, int]], bucket_bytes: int) -> list[list[int]]:
    """Indices of ``(dtype, nbytes)`` items grouped into consecutive buckets of one dtype and
    at most ``bucket_bytes`` (an item larger than a bucket gets one of its own)."""
    out: list[list[int]] = []
    size = 0
    for i, (dtype, nbytes) in enumerate(items):
        if out and items[out[-1][0]][0] == dtype and size + nbytes <= bucket_bytes:
            out[-1].append(i)
            size += nbytes
        else:
            out.append([i])
            size = nbytes
    return out


def tensor_buckets(tensors: Sequence[torch.Tensor], bucket_bytes: int) -> list[list[int]]:
    """:func:`bucket_indices` of tensors (gradients, a trainer's state sent rank to rank)."""
    return bucket_indices([(t.dtype, t.numel() * t.element_size()) for t in tensors], bucket_bytes)


def epoch_group(
    ranks: Sequence[int], name: str, timeout: timedelta, *, arrival: timedelta | None = None
) -> Any:
    """The process group of ``ranks``, made by its members only (None elsewhere).

    ``new_group`` over the world group waits for every rank of the world, a dead one
    included; with ``use_local_synchronization`` only the members take part, but torch
    then names the group by a hash of its ranks, so the same ranks in a later epoch would
    find the earlier group's rendezvous keys in the store. The group gets ``name`` (the
    epoch's) instead: its keys live under that prefix. torch offers no argument for it,
    so its naming function is replaced for the call (torch is pinned; the tests make
    groups of the same ranks in successive epochs).

    ``arrival``: how long the members wait for each other before torch's rendezvous
    (which waits ``timeout``), where one may come late (:func:`await_members`)."""
    import torch.distributed.distributed_c10d as c10d

    if dist.get_rank() not in ranks:
        return None
    if arrival is not None:
        await_members(ranks, name, arrival)
    hashed = c10d._process_group_name
    c10d._process_group_name = lambda ranks, use_hashed_name: c10d.GroupName(name)
    try:
        return dist.new_group(list(ranks), timeout=timeout, use_local_synchronization=True)
    finally:
        c10d._process_group_name = hashed


def await_members(ranks: Sequence[int], name: str, wait: timedelta) -> None:
    """Return once every rank of ``ranks`` has called this for group ``name``; a
    :class:`CollectiveError` naming the missing ranks after ``wait``.

    Why: after a trainer rank is lost, the survivors leave the aborted step at different
    times. The first to see the dead peer aborts at once but keeps its connections open
    (gloo closes them when the group is freed; destroying or aborting a group still
    referenced did not close them, in a probe), so a survivor blocked on a receive from it
    waits out the whole collective timeout before it aborts in turn. The first survivor
    comes to the new group up to one collective timeout before the last, and torch's
    rendezvous, bounded by that same timeout, can give up on the late one (it did in CI,
    2026-12-07). Members that wait here for twice the timeout cover it; once all are here,
    torch's rendezvous takes no time."""
    store = dist.distributed_c10d._get_default_store()
    prefix = f"reflow-arrival/{name}"
    me = dist.get_rank()
    store.set(f"{prefix}/{me}", b"1")
    deadline = time.monotonic() + wait.total_seconds()
    keys = [f"{prefix}/{r}" for r in ranks]
    while not store.check(keys):
        if time.monotonic() > deadline:
            missing = [r for r, key in zip(ranks, keys, strict=True) if not store.check([key])]
            raise CollectiveError(
                f"group {name}: rank(s) {missing} did not come within "
                f"{wait.total_seconds():.0f} s (lost, or still in a collective)"
            )
        time.sleep(_ARRIVAL_POLL_S)


def destroy_groups(groups: Iterable[Any]) -> None:
    """Unmake the groups this rank is a member of (None: not a member)."""
    for group in groups:
        if group is not None and group != dist.GroupMember.NON_GROUP_MEMBER:
            dist.destroy_process_group(group)
