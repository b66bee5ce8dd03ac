"""Weights over NCCL straight into the vLLM engines' workers (``resources.device: cuda``).

vLLM's weight-transfer API (``vllm/distributed/weight_transfer/``, enabled by the engine
argument ``weight_transfer_config={"backend": "nccl"}``) is driven from both ends here:

- the trainer leader (:class:`NcclBucketSender`, a
  :class:`runtime.weights.protocols.BucketSender`) is rank 0 of an NCCL group with every
  worker of every rollout engine of the layout; it mints the group's ``ncclUniqueId`` and
  announces it in the weights header, which travels over the gloo sync group like every
  header (no second store to listen on, nothing unpickled: vLLM's unique-id rendezvous,
  ``nccl_common.uid_init_process_group``, the one it offers trainers that bring their
  own), joins with ``PyNcclCommunicator.from_unique_id_bytes`` and broadcasts each bucket
  as its raw bytes;
- each rollout driver passes its workers their ranks (``init_weight_transfer_engine``,
  once per layout epoch), and per sync pauses its engine (``mode="keep"``), opens the
  update (``start_weight_update``: vLLM's layerwise reload), receives bucket by bucket
  (``update_weights`` with that bucket's names, dtypes and shapes; the workers receive
  it and hand the tensors to ``model.load_weights``), closes it (``finish_weight_update``),
  bumps the weight version and resumes: partial rollout, as on the CPU path.

Wire format: a bucket is the concatenated bytes of its tensors in header order, which is
vLLM's packed format (``packed_tensor.pack_tensors``). The workers are set up with
``packed_buffer_size_bytes`` equal to the bucket budget, so each ``update_weights`` call
(one bucket, at most that many bytes, or a single larger tensor) is exactly one broadcast.

A driver whose engine already has the version (another rank joined the pool) still takes
part in the broadcast, through ``reflow_drain_weights`` (runtime/engines/vllm/worker_ext.py):
received and dropped, without pausing generation.

CUDA only: none of this has run on the CPU machines this project is built on
(tests/gpu/test_nccl_weight_sync.py).
"""

from __future__ import annotations

import asyncio
import base64
import ctypes
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from runtime.rank.groups import CollectiveError
from runtime.rank.sync_pairs import SyncPairs
from runtime.weights.wire import WeightsHeader

T = TypeVar("T")


def _within(timeout_s: float, what: str, fn: Callable[[], T]) -> T:
    """``fn()`` on a helper thread, given up after ``timeout_s`` (an NCCL rendezvous waits
    for every peer and has no timeout of its own)."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append((True, fn()))
        except BaseException as exc:  # handed to the caller
            out.append((False, exc))

    thread = threading.Thread(target=run, daemon=True, name="nccl-rendezvous")
    thread.start()
    thread.join(timeout_s)
    if not out:
        raise CollectiveError(f"{what}: no answer within {timeout_s:.0f} s")
    ok, value = out[0]
    if not ok:
        raise value
    return value


def _wait_stream(stream: Any, timeout_s: float) -> None:
    """Until ``stream``'s work so far is done, polling (an NCCL broadcast whose receivers
    never come would block ``synchronize`` for ever)."""
    event = torch.cuda.Event()
    event.record(stream)
    deadline = time.monotonic() + timeout_s
    while not event.query():
        if time.monotonic() > deadline:
            raise CollectiveError(
                f"the NCCL weight transfer did not complete within {timeout_s:.0f} s "
                "(a rollout engine is not receiving)"
            )
        time.sleep(0.001)


def mint_unique_id() -> bytes:
    """A fresh ``ncclUniqueId`` (its 128 bytes; it names this process's NCCL bootstrap
    address, which ``NCCL_SOCKET_IFNAME`` selects)."""
    from vllm.distributed.device_communicators.pynccl_wrapper import NCCLLibrary

    uid = NCCLLibrary().ncclGetUniqueId()
    return ctypes.string_at(ctypes.addressof(uid), ctypes.sizeof(uid))


class NcclBucketSender:
    """The leader's end: rank 0 of one NCCL group per layout epoch with the workers of
    every rollout engine (a driver's engine has ``rollout_gpus_per_replica`` of them)."""

    name = "nccl"

    def __init__(
        self, sync: SyncPairs, rollout_group_size: int, bucket_bytes: int, timeout_s: float
    ) -> None:
        self.sync = sync
        self.rollout_group_size = rollout_group_size
        self.bucket_bytes = bucket_bytes
        self.timeout_s = timeout_s
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.comm: Any = None
        self.epoch = -1
        self._pending: tuple[bytes, int] | None = None

    def rendezvous(self) -> dict[str, Any] | None:
        if self.comm is not None and self.epoch == self.sync.epoch:
            return None
        self.close()  # the layout changed: the old group's members are not this one's
        size = self.rollout_group_size
        drivers = self.sync.drivers
        uid = mint_unique_id()
        world = 1 + len(drivers) * size
        self._pending = (uid, world)
        return {
            "unique_id_b64": base64.b64encode(uid).decode(),
            "world_size": world,
            "rank_offsets": {str(d): 1 + i * size for i, d in enumerate(drivers)},
            "buffer_bytes": self.bucket_bytes,
        }

    def open(self) -> None:
        if self._pending is None:
            return
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.utils.nccl import unpinned_nccl_env

        uid, world = self._pending
        self._pending = None

        def join() -> Any:
            with unpinned_nccl_env():  # as vLLM builds the workers' end
                return PyNcclCommunicator.from_unique_id_bytes(
                    uid, rank=0, world_size=world, device=self.device
                )

        self.comm = _within(self.timeout_s, "the NCCL weight group's rendezvous", join)
        self.epoch = self.sync.epoch

    def send(self, flat: torch.Tensor) -> None:
        if self.comm is None:
            raise CollectiveError("NCCL weight transfer: send before the group is open")
        if flat.device != self.device:
            raise CollectiveError(f"NCCL weight transfer: a bucket on {flat.device}")
        self.comm.broadcast(flat.view(torch.uint8), src=0, stream=torch.cuda.current_stream())

    def flush(self) -> None:
        _wait_stream(torch.cuda.current_stream(), self.timeout_s)

    def close(self) -> None:
        if self.comm is not None:
            self.comm.destroy()
            self.comm = None
        self.epoch = -1


# --- the engine's end (the rollout driver) ------------------------------------------


def worker_init_info(header: WeightsHeader, rank: int) -> dict[str, Any]:
    """``init_weight_transfer_engine``'s info for this driver's engine, from a header that
    announces a new group (vLLM's ``NCCLWeightTransferInitInfo`` fields)."""
    n = header.nccl
    if n is None:
        raise CollectiveError("the weights header announces no NCCL group")
    try:
        offset = int(n["rank_offsets"][str(rank)])
        world = int(n["world_size"])
        buffer = int(n["buffer_bytes"])
        uid = str(n["unique_id_b64"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CollectiveError(f"rank {rank}: malformed NCCL rendezvous {exc!r}") from None
    for i, r in enumerate(header.ranges()):
        if len(r) > 1 and header.bucket_nbytes(i) > buffer:
            raise CollectiveError(f"bucket {i} is larger than the {buffer} bytes announced")
    return {
        "nccl_unique_id_b64": uid,
        "rank_offset": offset,
        "world_size": world,
        "packed": True,
        "packed_buffer_size_bytes": buffer,
    }


def update_infos(header: WeightsHeader) -> list[dict[str, Any]]:
    """One ``update_weights`` info per bucket (vLLM's ``NCCLWeightTransferUpdateInfo``)."""
    return [
        {
            "names": [t.name for t in specs],
            "dtype_names": [str(t.dtype).removeprefix("torch.") for t in specs],
            "shapes": [list(t.shape) for t in specs],
        }
        for specs in map(header.bucket_specs, range(len(header.buckets)))
    ]


async def join_group(llm: Any, init_info: dict[str, Any], timeout_s: float) -> None:
    """The engine's workers join the leader's new group (it joins at the same time)."""
    from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

    request = WeightTransferInitRequest(init_info=init_info)
    await asyncio.wait_for(llm.init_weight_transfer_engine(request), timeout_s)


async def leave_group(llm: Any, timeout_s: float) -> None:
    """Release the workers' end of the current group (the layout moved on)."""
    await asyncio.wait_for(llm.shutdown_weight_transfer_engine(), timeout_s)


async def receive_and_load(llm: Any, header: WeightsHeader, timeout_s: float) -> float:
    """Every bucket into the model (the engine paused by the caller). Returns the seconds
    of ``finish_weight_update`` (the layerwise reload's processing), the rest being the
    buckets' receive and load."""
    from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

    await asyncio.wait_for(llm.start_weight_update(), timeout_s)
    for info in update_infos(header):
        request = WeightTransferUpdateRequest(update_info=info)
        await asyncio.wait_for(llm.update_weights(request), timeout_s)
    start = time.perf_counter()
    await asyncio.wait_for(llm.finish_weight_update(), timeout_s)
    return time.perf_counter() - start


async def drain(llm: Any, header: WeightsHeader, timeout_s: float) -> None:
    """Take part in the broadcast and drop it (the engine has this version already)."""
    sizes = [header.bucket_nbytes(i) for i in range(len(header.buckets))]
    await asyncio.wait_for(llm.collective_rpc("reflow_drain_weights", args=(sizes,)), timeout_s)
