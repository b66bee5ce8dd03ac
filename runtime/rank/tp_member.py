"""The rollout side of a rank that does not drive its rollout replica's engine.

A rollout replica of ``resources.rollout_gpus_per_replica`` ranks runs one engine with
``tensor_parallel_size`` equal to that size. Its first rank (``rank % size == 0``:
:func:`runtime.config.layout.is_rollout_driver`) builds the engine, asks rank 0 for work
and joins the weight-sync group; the other ranks of the group are its *members*. A member
holds no engine, never asks for work and takes no part in the weight broadcast (the
engine's tensor-parallel shards are reloaded by the driver's engine workers: one
``collective_rpc`` reaches every shard). On CUDA the member's GPU is the one a
tensor-parallel worker process of the driver's engine runs on; the member process itself
keeps nothing on it while it plays rollout (its trainer side is asleep, offloaded).

Every pool boundary is a multiple of the rollout group size, so a member joins and leaves
the rollout pool together with its driver, and stays a member in every layout. Its
trainer side is an ordinary one: the same rank trains in a layout where it is a trainer.

The member still heartbeats (it is alive and switches roles like every rank); it reports
``idle``, and rank 0 leaves its rollout seconds out of the idle accounting (the driver's
count for its whole replica: runtime/control/idle.py, runtime/control/membership.py).
"""

from __future__ import annotations

import logging

from runtime.rank.sides import Keepalive, PlaceholderSide, Send, nothing
from runtime.transport import frames as wire
from runtime.transport import protocol as p
from runtime.transport.protocol import Message

log = logging.getLogger(__name__)


class TensorParallelMember(PlaceholderSide):
    """The rollout side of a non-driving rank: a placeholder (no engine, no work, idle)
    that hands back any work that reaches it."""

    def __init__(self, rank: int, driver: int) -> None:
        if driver == rank:
            raise ValueError(f"rank {rank} drives its rollout replica; it is not a member")
        super().__init__("rollout")
        self.rank = rank
        self.driver = driver  # the rank whose engine uses this rank's device
        self.returned = 0  # requests handed back (rank 0 sent work it should not have)
        self._send: Send = lambda m: None

    def attach(self, send: Send, rank: int, keepalive: Keepalive = nothing) -> None:
        self._send, self.rank = send, rank

    def on_message(self, msg: Message) -> None:
        """A member asks for nothing. Work that reaches it anyway (a rank 0 that does not
        know it is a member) is handed back at once, so rank 0 requeues it rather than
        waiting for its request timeout; a WeightSync is not for it (the driver's engine
        reloads every shard)."""
        if isinstance(msg, p.Work) and msg.requests:
            for req in wire.requests(msg):
                self._send(
                    p.SampleFailed(
                        rank=self.rank,
                        sample_id=req.sample_id,
                        reason=f"rank {self.rank} is a tensor-parallel member of rank "
                        f"{self.driver}'s rollout replica and runs no engine",
                    )
                )
                self.returned += 1
            log.warning("rank %d handed back %d requests", self.rank, len(msg.requests))


def tensor_parallel_member(rank: int, rollout_group_size: int) -> TensorParallelMember:
    """The member side of ``rank``, whose driver is the first rank of its group."""
    return TensorParallelMember(rank, rank - rank % rollout_group_size)
