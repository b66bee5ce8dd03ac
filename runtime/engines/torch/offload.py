"""A trainer's device memory moved to host memory and back, for the role it is not playing.

A rank that leaves the trainer role for rollout gives its GPU to the rollout engine: the
trainer's parameters (under FSDP2 its local shards), buffers and AdamW state are copied
to one pinned host buffer and their device storages shrunk to nothing; gradients are
dropped beforehand (the next step makes new ones). Restoring grows each storage back and
copies its bytes in.

The storages are resized in place rather than the tensors replaced, so everything that
points at them stays valid: FSDP2's views of its padded shard storage (the ``DTensor``
parameter's local tensor is one), the optimizer's state keyed by parameter, tied weights.
FSDP2 frees and re-allocates its unsharded parameters the same way
(``UntypedStorage.resize_``).

On the CPU there is nothing to move: the state machine runs and no byte is copied
(``move=False``). ``move=True`` on the CPU runs the real copy and resize, which is how the
mechanism is tested without a GPU.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The rank's own part of ``t``: a ``DTensor``'s local shard (the tensor itself, not a
    copy: no autograd), else ``t``."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        with torch.no_grad():
            return t.to_local()
    return t


def _bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    """A uint8 tensor over all of ``storage`` (the copy source or target of its bytes)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


@dataclass
class OffloadRecord:
    """What one offload or restore moved, and how long it took."""

    seconds: float
    bytes: int

    def __add__(self, other: OffloadRecord) -> OffloadRecord:
        return OffloadRecord(self.seconds + other.seconds, self.bytes + other.bytes)


class HostOffload:
    """The device storages of a set of tensors, held in host memory while offloaded.

    ``offload`` then ``restore``, once each: an object per offload. ``keep_host``: for
    state that never changes (a LoRA run's frozen base), the host copy is made at the
    first offload and kept, so later offloads only free the device memory."""

    def __init__(
        self,
        tensors: Iterable[torch.Tensor],
        device: torch.device,
        move: bool,
        keep_host: bool = False,
    ) -> None:
        self.device = device
        self.move = move
        self.keep_host = keep_host
        # One entry per storage (tied weights and views share one), those on ``device``
        # only: AdamW's step counters live on the CPU whatever the parameters' device.
        seen: dict[int, torch.UntypedStorage] = {}
        for t in tensors:
            storage = local_tensor(t).untyped_storage()
            if storage.device != device or storage.nbytes() == 0:
                continue
            seen.setdefault(storage.data_ptr(), storage)
        self.storages = list(seen.values())
        fixed = [s.nbytes() for s in self.storages if not s.resizable()]
        if move and fixed:
            # e.g. tensors memory-mapped from a checkpoint (safetensors on the CPU): their
            # memory is not the allocator's to free
            raise RuntimeError(
                f"{len(fixed)} storages ({sum(fixed)} bytes) cannot be resized and so not "
                f"offloaded from {device}"
            )
        self.sizes = [s.nbytes() for s in self.storages]
        self.host: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        return sum(self.sizes)

    def offload(self) -> OffloadRecord:
        """Copy every storage to one host buffer (pinned on CUDA), then free it on the
        device. Without ``move``: nothing is copied (the bytes stay where they are)."""
        start = time.perf_counter()
        if not self.move:
            return OffloadRecord(time.perf_counter() - start, 0)
        if self.host is not None and self.keep_host:  # copied before, unchanged since
            return OffloadRecord(self.free().seconds, 0)
        cuda = self.device.type == "cuda"
        # one allocation: pinning is a driver call per buffer, and costs more than the copy
        host = torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=cuda)
        offset = 0
        for storage, size in zip(self.storages, self.sizes, strict=True):
            host[offset : offset + size].copy_(_bytes_of(storage), non_blocking=cuda)
            offset += size
        if cuda:
            torch.cuda.synchronize(self.device)  # the copies have landed before the frees
        for storage in self.storages:
            storage.resize_(0)
        if cuda:
            torch.cuda.empty_cache()  # back to the driver, for the rollout engine to take
        self.host = host
        return OffloadRecord(time.perf_counter() - start, self.nbytes)

    def free(self) -> OffloadRecord:
        """Free every storage on the device without a copy: for state that is not wanted
        back (a sharded trainer's rank leaving the trainer, whose shards go stale). The
        bytes freed, in no time worth a copy; the device memory back to the driver."""
        start = time.perf_counter()
        for storage in self.storages:
            storage.resize_(0)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return OffloadRecord(time.perf_counter() - start, self.nbytes)

    def restore(self) -> OffloadRecord:
        """Grow every storage back on the device and copy its bytes in."""
        start = time.perf_counter()
        if not self.move:
            return OffloadRecord(time.perf_counter() - start, 0)
        if self.host is None:
            raise RuntimeError("restore without an offload: the state is on the device")
        cuda = self.device.type == "cuda"
        offset = 0
        for storage, size in zip(self.storages, self.sizes, strict=True):
            storage.resize_(size)
            _bytes_of(storage).copy_(self.host[offset : offset + size], non_blocking=cuda)
            offset += size
        if cuda:
            torch.cuda.synchronize(self.device)  # the host buffer is read before it goes
        if not self.keep_host:
            self.host = None
        return OffloadRecord(time.perf_counter() - start, self.nbytes)

    def discard(self) -> None:
        """Forget the host copy (the state it held is not wanted back)."""
        self.host = None
        if self.move and self.device.type == "cuda":
            # torch keeps freed pinned blocks cached; a discarded copy should not hold host
            # memory the rollout engine may want (torch's own call, as torch.cuda.graphs)
            release = getattr(torch._C, "_host_emptyCache", None)
            if release is not None:
                release()


def training_state(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    device: torch.device,
    move: bool,
    trainable_only: bool = False,
) -> HostOffload:
    """A trainer's device state by storage, gradients dropped first (the next step makes
    new ones): parameters (local shards), buffers and AdamW's state; ``trainable_only``:
    the frozen parameters and the buffers left to :func:`frozen_state`."""
    opt.zero_grad(set_to_none=True)
    for param in model.parameters():
        param.grad = None  # FSDP2 and the stand-in head included: nothing left behind
    if trainable_only:
        tensors = [p for p in model.parameters() if p.requires_grad]
    else:
        tensors = [*model.parameters(), *model.buffers()]
    for state in opt.state.values():
        tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return HostOffload(tensors, device, move)


def frozen_state(model: torch.nn.Module, device: torch.device, move: bool) -> HostOffload:
    """A LoRA run's frozen base and the buffers: never updated, so copied to host memory
    at the first offload only (``keep_host``)."""
    frozen = [p for p in model.parameters() if not p.requires_grad]
    return HostOffload([*frozen, *model.buffers()], device, move, keep_host=True)


class TrainerResidency:
    """Where one trainer's state is between steps: on the device, or offloaded (host
    copies it holds), and the moves between. A LoRA run's frozen base is copied the first
    time only, then freed and restored from that copy."""

    def __init__(self, lora: bool) -> None:
        self.lora = lora
        self.held: HostOffload | None = None  # set while the state is in host memory
        self.frozen: HostOffload | None = None  # a LoRA run's frozen base, kept once made

    def state(self, model: torch.nn.Module | None) -> str:
        """``"on_device"``, ``"offloaded"`` or ``"none"`` (no model)."""
        if model is None:
            return "none"
        return "offloaded" if self.held is not None else "on_device"

    def offload(
        self,
        model: torch.nn.Module,
        opt: torch.optim.Optimizer,
        device: torch.device,
        move: bool | None,
    ) -> OffloadRecord:
        """Gradients dropped, then parameters (local shards), buffers and AdamW state to
        host memory, pinned. ``move`` None: copied where the device is a GPU; on the CPU
        the bytes already are in host memory."""
        if self.state(model) != "on_device":
            raise RuntimeError(f"offload with the trainer state {self.state(model)}")
        if move is None:
            move = device.type != "cpu"
        self.held = training_state(model, opt, device, move, self.lora)
        record = self.held.offload()
        if self.lora:  # the base: copied the first time, only freed after that
            if self.frozen is None or self.frozen.move != move:
                self.frozen = frozen_state(model, device, move)
            record += self.frozen.offload()
        return record

    def free(
        self, model: torch.nn.Module, opt: torch.optim.Optimizer, device: torch.device
    ) -> OffloadRecord:
        """The state on the device freed, no copy kept (the caller drops the model)."""
        if self.state(model) != "on_device":
            raise RuntimeError(f"drop with the trainer state {self.state(model)}")
        return training_state(model, opt, device, move=True).free()

    def reload(self) -> OffloadRecord:
        """The state :meth:`offload` moved, back on the device, values unchanged."""
        if self.held is None:
            raise RuntimeError("reload with the trainer state on the device or none")
        record = self.held.restore()
        if self.frozen is not None:
            record += self.frozen.restore()
        self.held = None
        return record

    def discard(self) -> None:
        """Forget every host copy (the model is being dropped)."""
        for held in (self.held, self.frozen):
            if held is not None:
                held.discard()
        self.held = self.frozen = None
