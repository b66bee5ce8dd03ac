"""What a weight-transfer strategy implements, and what it needs of the process group."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from runtime.weights.wire import WeightsHeader


class SyncGroup(Protocol):
    """The sync group of the current layout (runtime/rank/collective.py ``Collective``):
    the trainer leader and the rollout driver of each replica, point to point. A receiver
    that fails or hangs is dropped by the leader for the rest of the epoch."""

    rank: int
    epoch: int

    @property
    def is_leader(self) -> bool: ...

    def send_to_receivers(self, tensor: torch.Tensor, what: str) -> None:
        """Leader: ``tensor`` to every reachable receiver (``what`` names it in a drop)."""
        ...

    def receive_from_leader(self, tensor: torch.Tensor) -> None:
        """Receiver: ``tensor`` (allocated by the caller) from the leader, bounded."""
        ...


class BucketSender(Protocol):
    """How the buckets of a transfer leave the leader (the header always goes over the
    sync group first, runtime/weights/p2p.py): ``rendezvous`` gives the header's fields of
    a new group (None: none, or the current one stands), ``open`` joins it once the header
    is out, ``send`` takes one flat bucket, ``flush`` returns once all sent has left."""

    name: str  # the header's transport
    device: torch.device  # where the buckets it sends are made

    def rendezvous(self) -> dict[str, Any] | None: ...

    def open(self) -> None: ...

    def send(self, flat: torch.Tensor) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class PolicyTarget(Protocol):
    """What a rollout engine offers the weight path (runtime/weights/receive.py): the
    policy it holds, and its hooks to take a new one. Each hook pauses generation keeping
    the requests in flight, loads, sets the version, and resumes (partial rollout)."""

    version: int  # the policy version the engine generates with
    weights_valid: bool  # False after a sleep that dropped the weights
    serves_adapter: bool  # a LoRA engine: the policy is an adapter over a fixed base
    model_path: str

    async def update_weights(self, path: str, version: int) -> float:
        """Load the policy folder ``path`` (a model, or an adapter); seconds paused."""
        ...

    async def join_transfer_group(
        self, header: WeightsHeader, rank: int, epoch: int, timeout_s: float
    ) -> None:
        """Join the NCCL group the header announces (once per layout epoch)."""
        ...

    async def update_weights_nccl(
        self, header: WeightsHeader, timeout_s: float
    ) -> tuple[float, float]:
        """Receive the header's buckets into the model: (seconds paused, finishing)."""
        ...

    async def drain_transfer(self, header: WeightsHeader, timeout_s: float) -> None:
        """Take part in an NCCL transfer of a version held already: received, dropped."""
        ...
