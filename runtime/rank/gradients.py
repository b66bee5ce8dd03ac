"""Data parallelism over the trainer group: gradients and a step's statistics summed, a
replica check. Every trainer rank calls these together."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.distributed as dist

from runtime.rank.groups import tensor_buckets
from runtime.rank.trainer_mesh import TrainerMesh


class DataParallel:
    """The reductions of one rank over its :class:`TrainerMesh`'s trainer group (the mesh
    is rebuilt in place at a new epoch, so this always reduces over the current one)."""

    def __init__(self, mesh: TrainerMesh, bucket_bytes: int) -> None:
        self.mesh = mesh
        self.bucket_bytes = bucket_bytes

    @property
    def alone(self) -> bool:
        return self.mesh.size <= 1

    def all_reduce_grads(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Sum gradients over the trainer group, bucket by bucket (DDP without overlap).

        Each replica's loss is already normalised by the whole batch, so the sum is the
        gradient of the whole batch's loss and every replica ends up with the same one.
        """
        if self.alone:
            return
        grads = [p.grad for p in params if p.grad is not None]
        for idx in tensor_buckets(grads, self.bucket_bytes):
            flat = torch.cat([grads[i].reshape(-1) for i in idx])
            dist.all_reduce(flat, group=self.mesh.group)
            unflatten(flat, [grads[i] for i in idx])

    def all_reduce_sum(self, values: Sequence[float]) -> list[float]:
        """Sum a few floats over the trainer group (per-shard loss statistics)."""
        t = torch.tensor(list(values), dtype=torch.float64)
        if not self.alone:
            dist.all_reduce(t, group=self.mesh.group)
        return t.tolist()

    def all_reduce_max(self, values: Sequence[float]) -> list[float]:
        """The maximum of a few floats over the trainer group (min is max of negatives)."""
        t = torch.tensor(list(values), dtype=torch.float64)
        if not self.alone:
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.mesh.group)
        return t.tolist()

    def replica_spread(self, checksum: float) -> float:
        """max - min of a per-replica checksum over the trainer group (0 = in agreement)."""
        if self.alone:
            return 0.0
        hi, neg_lo = self.all_reduce_max([checksum, -checksum])
        return hi + neg_lo


def unflatten(flat: torch.Tensor, targets: Sequence[torch.Tensor]) -> None:
    """Copy consecutive slices of ``flat`` into ``targets`` (which may be parameters)."""
    offset = 0
    with torch.no_grad():
        for t in targets:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view_as(t))
            offset += n
