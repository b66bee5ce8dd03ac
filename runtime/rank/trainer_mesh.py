"""The trainer ranks of a layout epoch as a data-parallel mesh.

The **trainer group** holds every trainer rank: gradients are summed over it
(runtime/rank/gradients.py), a new replica gets the training state over it
(runtime/engines/torch/shard_handoff.py), a checkpoint is written by it. Under FSDP2 the
ranks form a grid, a row per replica group of ``trainer_gpus_per_replica`` consecutive
ranks: the **shard** group of a rank is its row (FSDP2 shards within it), its
**replicate** group its column (the ranks holding the same shard in the other replicas).

One object per rank, rebuilt in place at each epoch whose trainer ranks differ
(:meth:`TrainerMesh.rebuild`, by :class:`runtime.rank.collective.Collective`), so a
component that holds it sees the current groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch

from runtime.rank.groups import CollectiveError, destroy_groups, epoch_group


def trainer_grid(trainers: Sequence[int], group_size: int) -> list[list[int]]:
    """The trainer ranks as rows of replica groups (consecutive ranks, as layouts place
    whole groups)."""
    ranks = list(trainers)
    return [ranks[i : i + group_size] for i in range(0, len(ranks), group_size)]


class TrainerMesh:
    """This rank's view of the epoch's trainer ranks and their groups (None where this
    rank is not a member)."""

    def __init__(self, rank: int, group_size: int) -> None:
        self.rank = rank
        self.group_size = group_size  # ranks per replica group (FSDP2 shards within one)
        self.ranks: list[int] = []
        self.group: Any = None  # every trainer rank
        self.shard_group: Any = None  # this rank's replica group
        self.replicate_group: Any = None  # this rank's shard across the replica groups
        self._groups: list[Any] = []  # every group this rank made, to destroy

    def rebuild(self, trainers: list[int], tag: str, timeout: timedelta) -> None:
        """Make the groups of ``trainers`` (every live rank calls it, in epoch order;
        groups are made by their members only)."""
        self.destroy()
        self.ranks = list(trainers)
        # a survivor of a lost rank may still be leaving the aborted step's collective,
        # held for up to one collective timeout (runtime.rank.groups.await_members)
        self.group = epoch_group(trainers, f"{tag}-trainer", timeout, arrival=2 * timeout)
        grid = trainer_grid(trainers, self.group_size)
        rows, columns = [], []
        self.shard_group = self.replicate_group = None
        for i, row in enumerate(grid):  # replica groups: FSDP2 shards within each
            rows.append(epoch_group(row, f"{tag}-shard{i}", timeout))
            if self.rank in row:
                self.shard_group = rows[-1]
        for i, col in enumerate(zip(*grid, strict=True)):  # one shard across the replicas
            columns.append(epoch_group(list(col), f"{tag}-replicate{i}", timeout))
            if self.rank in col:
                self.replicate_group = columns[-1]
        self._groups = [self.group, *rows, *columns]

    def destroy(self) -> None:
        destroy_groups(self._groups)
        self._groups = []
        self.group = self.shard_group = self.replicate_group = None

    @property
    def member(self) -> bool:
        return self.rank in self.ranks

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def replicas(self) -> int:
        return len(self.ranks) // self.group_size

    def grid(self) -> list[list[int]]:
        return trainer_grid(self.ranks, self.group_size)

    def leader_replica(self) -> list[int]:
        """The leader's replica group: the ranks whose shards make the whole model."""
        return self.grid()[0]

    def device_mesh(self, device_type: str) -> Any:
        """The 2-D device mesh ``("replicate", "shard")``, a row per replica group. Built
        from the groups of :meth:`rebuild`, so no rank outside the trainer takes part."""
        from torch.distributed.device_mesh import DeviceMesh

        if self.shard_group is None or self.replicate_group is None:
            raise CollectiveError(f"rank {self.rank} is not a trainer rank in this layout")
        return DeviceMesh.from_group(
            [self.replicate_group, self.shard_group],
            device_type,
            mesh=torch.tensor(self.grid(), dtype=torch.int),
            mesh_dim_names=("replicate", "shard"),
        )
