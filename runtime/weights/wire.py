"""The wire format of a weight transfer: tensor specs, the JSON header, bucket plans.

A transfer is a header (every tensor's name, dtype and shape, the version, the bucket
boundaries, the transport) followed by one flat tensor per bucket; receivers check every
bucket against the header. No pickle: a process group's peers are not authenticated the
way the control plane is (runtime/rank/collective.py). Every strategy of the package
shares it: the buckets go over the sync group (runtime/weights/p2p.py) or over NCCL
(runtime/weights/nccl.py), the header names which.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from runtime.rank.groups import CollectiveError, bucket_indices

_DTYPES = {str(t): t for t in (torch.float32, torch.bfloat16, torch.float16, torch.int64)}
TRANSPORTS = ("gloo", "nccl")
MAX_HEADER_BYTES = 64 * 2**20  # a weights header names every tensor: far below this


class TensorSpec(NamedTuple):
    """One tensor of a weight transfer as the header announces it."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


def plan_buckets(spec: Sequence[TensorSpec], bucket_bytes: int) -> list[int]:
    """How many consecutive tensors of ``spec`` each bucket of a weight transfer holds."""
    return [len(b) for b in bucket_indices([(t.dtype, t.nbytes) for t in spec], bucket_bytes)]


@dataclasses.dataclass(frozen=True)
class WeightsHeader:
    """What a weight transfer announces before its first bucket: the policy version, every
    tensor (checkpoint name, dtype, shape), how many consecutive tensors each bucket holds,
    and the transport of the buckets: ``gloo`` (over the sync group) or ``nccl`` (straight
    into the vLLM engines' workers, runtime/weights/nccl.py; ``nccl`` then
    holds a new group's rendezvous, or None while the current one stands)."""

    version: int
    tensors: tuple[TensorSpec, ...]
    buckets: tuple[int, ...]
    transport: str = "gloo"
    nccl: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.transport not in TRANSPORTS:
            raise CollectiveError(f"weights header: unknown transport {self.transport!r}")
        if self.version < 0 or any(n < 1 for n in self.buckets):
            raise CollectiveError("weights header: negative version or an empty bucket")
        if sum(self.buckets) != len(self.tensors):
            raise CollectiveError(f"weights header: buckets of {sum(self.buckets)} tensors")
        if len({t.name for t in self.tensors}) != len(self.tensors):
            raise CollectiveError("weights header: a tensor name appears twice")
        for r in self.ranges():
            if len({self.tensors[i].dtype for i in r}) != 1:
                raise CollectiveError(f"weights header: bucket at tensor {r.start} mixes dtypes")

    def ranges(self) -> list[range]:
        """The tensor indices of each bucket."""
        ends = itertools.accumulate(self.buckets)
        return [range(end - n, end) for n, end in zip(self.buckets, ends, strict=True)]

    def bucket_specs(self, index: int) -> list[TensorSpec]:
        return [self.tensors[i] for i in self.ranges()[index]]

    def bucket_nbytes(self, index: int) -> int:
        return sum(t.nbytes for t in self.bucket_specs(index))

    def check_bucket(self, index: int, flat: torch.Tensor) -> None:
        """A bucket about to be sent is the one the header announced."""
        specs = self.bucket_specs(index)
        numel = sum(t.numel for t in specs)
        if flat.dim() != 1 or flat.dtype != specs[0].dtype or flat.numel() != numel:
            raise CollectiveError(
                f"bucket {index}: {flat.dtype} x {flat.numel()}, the header announced "
                f"{specs[0].dtype} x {numel}"
            )

    def split(self, index: int, flat: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """A received bucket (one flat tensor of its dtype) as named views."""
        self.check_bucket(index, flat)
        out, offset = [], 0
        for t in self.bucket_specs(index):
            out.append((t.name, flat[offset : offset + t.numel].view(t.shape)))
            offset += t.numel
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "tensors": [[t.name, str(t.dtype), list(t.shape)] for t in self.tensors],
            "buckets": list(self.buckets),
            "transport": self.transport,
            "nccl": self.nccl,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> WeightsHeader:
        try:
            tensors = []
            for name, dtype, shape in obj["tensors"]:
                dims = tuple(int(x) for x in shape)
                if not isinstance(name, str) or any(d < 0 for d in dims):
                    raise ValueError(f"tensor {name!r}: bad name or shape {shape}")
                tensors.append(TensorSpec(name, _DTYPES[dtype], dims))
            nccl = obj.get("nccl")
            if nccl is not None and not isinstance(nccl, dict):
                raise ValueError("nccl is not an object")
            return cls(
                version=int(obj["version"]),
                tensors=tuple(tensors),
                buckets=tuple(int(n) for n in obj["buckets"]),
                transport=str(obj.get("transport", "gloo")),
                nccl=nccl,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CollectiveError(f"malformed weights header: {exc!r}") from None
