"""Which GPUs a rollout replica's engine runs on (CUDA).

A replica of ``rollout_gpus_per_replica`` ranks runs one vLLM engine, started by its first
rank (runtime/config/layout.py ``is_rollout_driver``); its tensor-parallel workers take the
GPUs of the replica's ranks: node-local GPUs ``L .. L + s - 1`` for a driver at local rank
``L``. vLLM places its workers on the first ``s`` devices it sees, so the driver shows it
exactly those, through ``CUDA_VISIBLE_DEVICES``, while the engine's processes start, and
puts the variable back afterwards: the same rank's trainer side picks its GPU by local rank
among all of the node's.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping


def local_rank(rank: int, gpus_per_node: int, env: Mapping[str, str]) -> int:
    """The rank's index on its node: the launcher's, else the global rank modulo the node's
    GPUs (ranks fill nodes in order)."""
    local = env.get("LOCAL_RANK") or env.get("SLURM_LOCALID")
    return int(local) if local is not None else rank % gpus_per_node


def replica_devices(rank: int, group_size: int, gpus_per_node: int, env: Mapping[str, str]) -> str:
    """``CUDA_VISIBLE_DEVICES`` for the engine the driver ``rank`` starts: its replica's
    GPUs, as entries of the variable already set (a Slurm job's own list) or as indices."""
    first = local_rank(rank, gpus_per_node, env)
    if first + group_size > gpus_per_node:
        raise ValueError(
            f"rank {rank}: a rollout replica of {group_size} GPUs from local GPU {first} "
            f"does not fit a node of {gpus_per_node}"
        )
    visible = env.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(gpus_per_node)]
    if first + group_size > len(ids):
        raise ValueError(
            f"rank {rank}: CUDA_VISIBLE_DEVICES={visible!r} lists {len(ids)} GPUs, the "
            f"replica needs local GPUs {first}..{first + group_size - 1}"
        )
    return ",".join(ids[first : first + group_size])


@contextlib.contextmanager
def visible_devices(devices: str | None) -> Iterator[None]:
    """``CUDA_VISIBLE_DEVICES=devices`` for the block (nothing changes for None)."""
    if devices is None:
        yield
        return
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = devices
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before
