"""Weights point to point over the run's process group (the gloo strategy).

The trainer leader sends each transfer's header, then its buckets, to the rollout driver
of every replica over the sync group's 2-rank pairs (runtime/rank/collective.py): a
receiver that fails or hangs is dropped for the epoch and the others still get the
weights. The header of every transfer travels this way, whatever carries its buckets
(:func:`send_stream` takes the strategy's :class:`BucketSender`); metadata is JSON in a
``uint8`` tensor, never pickled, and buckets are raw bytes (gloo needs no support for the
dtype), each checked against the header on both ends.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterable
from typing import Any

import torch

from runtime.rank.groups import CollectiveError
from runtime.weights.protocols import BucketSender, SyncGroup
from runtime.weights.wire import MAX_HEADER_BYTES, TensorSpec, WeightsHeader, plan_buckets


class GlooBucketSender:
    """Buckets over the sync group, as raw bytes, each to every reachable receiver."""

    name = "gloo"
    device = torch.device("cpu")

    def __init__(self, group: SyncGroup) -> None:
        self.group = group
        self._sent = 0

    def rendezvous(self) -> dict[str, Any] | None:
        return None  # the sync group stands for the whole epoch

    def open(self) -> None:
        self._sent = 0

    def send(self, flat: torch.Tensor) -> None:
        self.group.send_to_receivers(flat.view(torch.uint8), f"bucket {self._sent}")
        self._sent += 1

    def flush(self) -> None:
        """Every send above waited for its receivers (or dropped them)."""

    def close(self) -> None:
        """Nothing held between transfers."""


def send_header(group: SyncGroup, header: dict[str, Any]) -> None:
    """Leader: a JSON header to every reachable receiver (its length first, then bytes)."""
    raw = torch.frombuffer(bytearray(json.dumps(header).encode()), dtype=torch.uint8)
    group.send_to_receivers(torch.tensor([raw.numel()], dtype=torch.int64), "header size")
    group.send_to_receivers(raw, "header")


def receive_header(group: SyncGroup) -> dict[str, Any]:
    """Receiver: the leader's JSON header, its size bounded before anything is allocated."""
    size = torch.zeros(1, dtype=torch.int64)
    group.receive_from_leader(size)
    n = int(size.item())
    if not 0 < n <= MAX_HEADER_BYTES:
        raise CollectiveError(f"malformed transfer header: {n} bytes")
    raw = torch.empty(n, dtype=torch.uint8)
    group.receive_from_leader(raw)
    try:
        out = json.loads(bytes(raw.numpy()).decode())
    except ValueError as exc:
        raise CollectiveError(f"malformed transfer header: {exc}") from None
    if not isinstance(out, dict):
        raise CollectiveError("malformed transfer header: not an object")
    return out


def send_stream(
    group: SyncGroup,
    header: WeightsHeader,
    buckets: Iterable[torch.Tensor],
    sender: BucketSender | None = None,
) -> int:
    """Leader: the header over the sync group (naming ``sender``'s transport, with its
    rendezvous), then each bucket (one flat tensor, made by ``buckets`` as it is asked
    for) through ``sender`` (None: over the sync group). Returns the bytes sent; the
    receivers check every size against the header."""
    sender = sender if sender is not None else GlooBucketSender(group)
    header = dataclasses.replace(header, transport=sender.name, nccl=sender.rendezvous())
    send_header(group, header.to_json())
    sender.open()
    sent = count = 0
    for flat in buckets:
        if count >= len(header.buckets):
            raise CollectiveError(f"more than the {len(header.buckets)} buckets announced")
        header.check_bucket(count, flat)
        sender.send(flat)
        sent += flat.numel() * flat.element_size()
        count += 1
        del flat  # before the next bucket is made: one bucket at a time
    if count != len(header.buckets):
        raise CollectiveError(f"{count} buckets sent, {len(header.buckets)} announced")
    sender.flush()
    return sent


def send_whole(
    group: SyncGroup, version: int, weights: dict[str, torch.Tensor], bucket_bytes: int
) -> float:
    """Leader: whole weights held here to the sync group (the wire format of
    :func:`send_stream`). Returns seconds taken."""
    start = time.perf_counter()
    names = list(weights)
    spec = [TensorSpec(n, weights[n].dtype, tuple(weights[n].shape)) for n in names]
    header = WeightsHeader(version, tuple(spec), tuple(plan_buckets(spec, bucket_bytes)))
    flats = (
        torch.cat([weights[names[i]].detach().reshape(-1) for i in r]) for r in header.ranges()
    )
    send_stream(group, header, flats)
    return time.perf_counter() - start


def receive_weights_header(group: SyncGroup) -> WeightsHeader:
    """Rollout driver: the header of the leader's next weight transfer."""
    return WeightsHeader.from_json(receive_header(group))


def receive_bucket(group: SyncGroup, header: WeightsHeader, index: int) -> torch.Tensor:
    """Rollout driver: bucket ``index`` of a gloo transfer, as one flat tensor."""
    if header.transport != GlooBucketSender.name:
        raise CollectiveError(f"a {header.transport} transfer goes to the engine itself")
    raw = torch.empty(header.bucket_nbytes(index), dtype=torch.uint8)
    group.receive_from_leader(raw)
    return raw.view(header.tensors[header.ranges()[index].start].dtype)


def receive_all(group: SyncGroup, header: WeightsHeader) -> dict[str, torch.Tensor]:
    """Rollout driver: every bucket of a gloo transfer, as named tensors (each its own
    storage, as a safetensors file wants them; one bucket more held meanwhile)."""
    out: dict[str, torch.Tensor] = {}
    for i in range(len(header.buckets)):
        flat = receive_bucket(group, header, i)
        out.update((name, view.clone()) for name, view in header.split(i, flat))
        del flat
    return out


def receive_whole(group: SyncGroup) -> tuple[int, dict[str, torch.Tensor]]:
    """Rollout driver: the leader's next policy version, as named tensors."""
    header = receive_weights_header(group)
    return header.version, receive_all(group, header)
