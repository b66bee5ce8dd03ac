"""The published policy's weights, kept in host memory between sync points for a lend.

With ``train.sync_every`` > 1 the trainer's weights run ahead of the version rollout
generates with (the version moves on at sync points only, ``TrainConfig.version_at``). A
lend (runtime/rank/worker.py, ``lend_switch``) wakes the trainer ranks' own engines with
the *published* policy, so that their samples carry a version rank 0 knows and their ages
follow the staleness rule like any other sample's. So each trainer rank keeps its own
shards of each published version in host memory (the whole model where the trainer is
not sharded: every data-parallel replica holds it) and a lend gathers them, one tensor at
a time, as the colocated phase's in-place load gathers the current weights.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.distributed.tensor import DTensor


class PublishedCopy:
    """This rank's shards of the last published version, on the host."""

    def __init__(self) -> None:
        self.version: int | None = None
        self._shards: dict[str, torch.Tensor] = {}

    def keep(self, version: int, state: dict[str, torch.Tensor]) -> None:
        """``state`` (the model's state dict) is version ``version``'s: keep a host copy
        of this rank's part of each tensor."""
        self._shards = {
            name: (v.to_local() if isinstance(v, DTensor) else v).detach().to("cpu", copy=True)
            for name, v in state.items()
        }
        self.version = version

    def like(self, current: dict[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
        """The kept version, tensor by tensor, in the form of ``current`` (the model's
        state dict now): a DTensor on the same mesh and placements where ``current``'s is
        one, for the caller to gather; a host tensor otherwise. Lazily: one shard at a
        time on the device."""
        missing = set(current) - set(self._shards)
        if missing:
            raise RuntimeError(f"no published copy of {sorted(missing)[:3]}")
        for name, now in current.items():
            local = self._shards[name]
            if isinstance(now, DTensor):
                yield (
                    name,
                    DTensor.from_local(
                        local.to(now.device),
                        now.device_mesh,
                        now.placements,
                        run_check=False,
                        shape=now.shape,
                        stride=now.stride(),
                    ),
                )
            else:
                yield name, local
