"""What every part of a rank's process group shares: the leader's rank, the error, how a
layout epoch's subgroup is made and unmade, and how tensors are cut into buckets."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

LEADER = 0  # global rank of the trainer leader: the trainer pool starts at rank 0


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


def epoch_group(ranks: Sequence[int], name: str, timeout: timedelta) -> Any:
    """The process group of ``ranks``, made by its members only (None elsewhere).

    ``new_group`` over the world group waits for every rank of the world, a dead one
    included; with ``use_local_synchronization`` only the members take part, but torch
    then names the group by a hash of its ranks, so the same ranks in a later epoch would
    find the earlier group's rendezvous keys in the store. The group gets ``name`` (the
    epoch's) instead: its keys live under that prefix. torch offers no argument for it,
    so its naming function is replaced for the call (torch is pinned; the tests make
    groups of the same ranks in successive epochs)."""
    import torch.distributed.distributed_c10d as c10d

    if dist.get_rank() not in ranks:
        return None
    hashed = c10d._process_group_name
    c10d._process_group_name = lambda ranks, use_hashed_name: c10d.GroupName(name)
    try:
        return dist.new_group(list(ranks), timeout=timeout, use_local_synchronization=True)
    finally:
        c10d._process_group_name = hashed


def destroy_groups(groups: Iterable[Any]) -> None:
    """Unmake the groups this rank is a member of (None: not a member)."""
    for group in groups:
        if group is not None and group != dist.GroupMember.NON_GROUP_MEMBER:
            dist.destroy_process_group(group)
