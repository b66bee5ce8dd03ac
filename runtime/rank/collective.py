"""The ``torch.distributed`` edge of a rank: one process group per run, regrouped per layout.

Every rank of a run with real engines joins one world group (gloo on CPU, NCCL on GPU;
runtime/rank/rendezvous.py), which is used for nothing but making the others. At each
layout epoch the live ranks build, in the same order, the epoch's subgroups; each group is
made by its members only, under a name of the epoch's own
(:func:`runtime.rank.groups.epoch_group`), so a rank that has left the run (dead, hung:
``"gone"`` in the layout's roles) is never waited for. :class:`Collective` owns that
lifecycle; each kind of subgroup is a part of its own:

- :class:`~runtime.rank.trainer_mesh.TrainerMesh`: the trainer ranks, their data-parallel
  group and FSDP2's mesh, with :class:`~runtime.rank.gradients.DataParallel`'s reductions
  over it;
- :class:`~runtime.rank.sync_pairs.SyncPairs`: the leader and the driver of each rollout
  replica, for the weights of each sync point (runtime/weights/).

A trainer group whose ranks do not change (a rollout rank lost) is kept as it is: the
trainer's model is built over its mesh.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from runtime.config.layout import ranks_with, rollout_drivers
from runtime.rank.gradients import DataParallel
from runtime.rank.groups import LEADER, CollectiveError
from runtime.rank.rendezvous import join_world
from runtime.rank.sync_pairs import SyncPairs
from runtime.rank.trainer_mesh import TrainerMesh

log = logging.getLogger(__name__)


class Collective:
    """A rank's membership of the run's process group and of the current layout's
    subgroups. :meth:`regroup` is collective: every live rank calls it, in epoch order."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        *,
        bucket_bytes: int,
        timeout_s: float,
        trainer_group_size: int = 1,
        rollout_group_size: int = 1,
        peer_timeout_s: float | None = None,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.rollout_group_size = rollout_group_size
        self.bucket_bytes = bucket_bytes
        self.timeout = timedelta(seconds=timeout_s)
        self.epoch = -1
        self.roles: tuple[str, ...] = ()
        self.mesh = TrainerMesh(rank, trainer_group_size)
        self.data_parallel = DataParallel(self.mesh, bucket_bytes)
        # how long the leader waits for one receiver to take a header or a bucket
        self.sync = SyncPairs(rank, self.timeout, timedelta(seconds=peer_timeout_s or timeout_s))

    @classmethod
    def join(
        cls,
        *,
        rank: int,
        world_size: int,
        rendezvous: Path,
        bind_host: str,
        advertise_host: str,
        backend: str,
        bucket_bytes: int,
        timeout_s: float,
        endpoint: tuple[str, int] | None = None,
        trainer_group_size: int = 1,
        rollout_group_size: int = 1,
        peer_timeout_s: float | None = None,
    ) -> Collective:
        join_world(
            rank=rank,
            world_size=world_size,
            rendezvous=rendezvous,
            bind_host=bind_host,
            advertise_host=advertise_host,
            backend=backend,
            timeout_s=timeout_s,
            endpoint=endpoint,
        )
        return cls(
            rank,
            world_size,
            bucket_bytes=bucket_bytes,
            timeout_s=timeout_s,
            trainer_group_size=trainer_group_size,
            rollout_group_size=rollout_group_size,
            peer_timeout_s=peer_timeout_s,
        )

    def regroup(self, epoch: int, roles: Sequence[str]) -> None:
        """Build this epoch's trainer and sync groups. Every live rank calls it, in epoch
        order; a ``"gone"`` rank is in no group."""
        if epoch <= self.epoch:
            return
        trainers = ranks_with(roles, "trainer")
        if LEADER not in trainers:
            raise CollectiveError(f"layout {list(roles)}: rank {LEADER} must be a trainer")
        size = self.mesh.group_size
        if len(trainers) % size:
            raise CollectiveError(
                f"layout {list(roles)}: {len(trainers)} trainer ranks are not whole replica "
                f"groups of {size}"
            )
        keep_trainer = self.mesh.group is not None and trainers == self.mesh.ranks
        # every rank unmakes, then makes, in the same order: sync pairs, then the trainer's
        self.sync.destroy()
        if not keep_trainer:
            self.mesh.destroy()
        tag = f"reflow-e{epoch}"
        # a tensor-parallel rollout replica receives through its driver's engine
        self.sync.rebuild(epoch, rollout_drivers(roles, self.rollout_group_size), tag)
        if not keep_trainer:
            self.mesh.rebuild(trainers, tag, self.timeout)
        self.epoch, self.roles = epoch, tuple(roles)

    @property
    def trainer_ranks(self) -> list[int]:
        return self.mesh.ranks

    @property
    def is_leader(self) -> bool:
        return self.rank == LEADER

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
