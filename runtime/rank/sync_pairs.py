"""The sync group of a layout epoch: the trainer leader and the rollout rank driving each
rollout replica's engine, as one 2-rank group per receiver.

The leader sends each receiver point to point: gloo runs a group's sends on shared
threads, so one receiver that stops taking data (hung) would stall the sends to all the
others; apart, it stalls only its own. A receiver that dies or hangs during a sync is
dropped after ``peer_timeout`` (reported, see :meth:`SyncPairs.take_lost_peers`) and the
others still get the weights. What travels, and in what format, is the weight path's
(runtime/weights/p2p.py); this module moves tensors.

One object per rank, rebuilt in place at each epoch (:meth:`SyncPairs.rebuild`, by
:class:`runtime.rank.collective.Collective`), so the weight path's sender and receiver
that hold it always use the current pairs.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from runtime.rank.groups import LEADER, CollectiveError, destroy_groups, epoch_group

log = logging.getLogger(__name__)


class SyncPairs:
    """This rank's part of the epoch's sync group (implements
    :class:`runtime.weights.protocols.SyncGroup`)."""

    def __init__(self, rank: int, timeout: timedelta, peer_timeout: timedelta) -> None:
        self.rank = rank
        self.timeout = timeout  # a receiver's wait for the leader
        self.peer_timeout = peer_timeout  # the leader's wait for one receiver
        self.epoch = -1
        self.ranks: list[int] = []  # the leader, then the receivers
        self.lost_peers: dict[int, str] = {}  # receivers dropped this epoch, and why
        self._reported: set[int] = set()
        self._pairs: dict[int, Any] = {}  # receiver -> its (leader, receiver) group
        # sends given up on (a hung receiver): kept, with their buffers, until the group
        # they belong to is destroyed
        self._abandoned: list[Any] = []

    @property
    def is_leader(self) -> bool:
        return self.rank == LEADER

    @property
    def drivers(self) -> list[int]:
        """The epoch's receivers, dropped ones included (the rollout drivers)."""
        return self.ranks[1:]

    def rebuild(self, epoch: int, receivers: list[int], tag: str) -> None:
        """Make the epoch's pairs: the leader makes every pair, each receiver its own."""
        self.destroy()
        self.epoch, self.ranks = epoch, [LEADER, *receivers]
        self.lost_peers, self._reported = {}, set()
        for peer in receivers:
            if self.rank == peer:
                self._pairs[peer] = epoch_group([LEADER, peer], f"{tag}-sync{peer}", self.timeout)
            elif self.is_leader:
                # a receiver that died before rank 0 knew (it is still in this epoch's
                # roles) never comes: dropped after the peer timeout, not the group's
                try:
                    self._pairs[peer] = epoch_group(
                        [LEADER, peer], f"{tag}-sync{peer}", self.peer_timeout
                    )
                except RuntimeError as exc:
                    self._lose(peer, f"pair group: {exc}")

    def destroy(self) -> None:
        destroy_groups(self._pairs.values())
        self._pairs = {}
        self._abandoned = []

    def receivers(self) -> list[int]:
        """The receivers still reachable this epoch."""
        return [r for r in self.drivers if r not in self.lost_peers]

    def take_lost_peers(self) -> dict[int, str]:
        """Receivers dropped since the last call, and why (the leader reports them)."""
        new = {r: why for r, why in self.lost_peers.items() if r not in self._reported}
        self._reported |= set(new)
        return new

    def send_to_receivers(self, tensor: torch.Tensor, what: str) -> None:
        """Leader: ``tensor`` to every reachable receiver at once. One that fails, or does
        not take it within ``peer_timeout``, is dropped for the rest of the epoch; the
        others go on (a dead or hung receiver never holds up the sync)."""
        works = []
        for peer in self.receivers():
            try:
                works.append((peer, dist.isend(tensor, dst=peer, group=self._pairs[peer])))
            except RuntimeError as exc:
                self._lose(peer, f"{what}: {exc}")
        for peer, work in works:
            try:
                work.wait(self.peer_timeout)
            except RuntimeError as exc:
                self._abandoned.append((work, tensor))
                self._lose(peer, f"{what}: {exc}")

    def receive_from_leader(self, tensor: torch.Tensor) -> None:
        """Receiver: ``tensor`` from the leader, within the group's timeout."""
        group = self._pairs.get(self.rank)
        if group is None:
            raise CollectiveError(f"rank {self.rank} receives nothing in epoch {self.epoch}")
        try:
            dist.irecv(tensor, src=LEADER, group=group).wait(self.timeout)
        except RuntimeError as exc:
            raise CollectiveError(f"weights from rank {LEADER}: {exc}") from None

    def _lose(self, peer: int, why: str) -> None:
        log.warning("weight sync: receiver rank %d dropped (%s)", peer, why[:300])
        self.lost_peers[peer] = why[:1000]
