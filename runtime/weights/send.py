"""Weight sync from the trainer, streamed: gathered one bucket at a time, sent as it goes.

At a sync point every rank of the leader's replica group (:func:`streaming_ranks`: its
FSDP2 shard group; the leader alone for a replicated model) calls
:meth:`WeightStreamer.stream` at the same time. They walk the model's state dict in its
fixed order, under checkpoint (Hugging Face) names, and per bucket of
``engine.weight_bucket_mb`` gather the full tensors (``DTensor.full_tensor()``: an
all-gather over the mesh's ``shard`` dimension only, since the ``replicate`` dimension is
already ``Replicate()`` and torch's redistribute plan skips a dimension whose placement
does not change, so the other replica groups, which hold the same shards, take no part),
cast them to the rollout dtype (``model.dtype``) into one flat bucket, and the leader sends
it to the sync group before the next bucket is gathered. No rank holds more than one
bucket and one gathered tensor beyond its shard; the full state is never built.

Names: the state dict of the trainer's model is the checkpoint's. FSDP2 adds no prefix,
and the trainer's :class:`runtime.engines.torch.logprobs.TargetLogprobHead` keeps
``lm_head.weight``; a tied ``lm_head`` is left out, as Hugging Face saves it and as
``TorchTrainer.checkpoint_format`` does, since vLLM ties it to ``embed_tokens`` itself.
A mixture of experts' fused expert tensors go out one matrix per expert under the hub's
names (runtime/checkpoint_layout.py), each fused tensor gathered once.

Senders (the same header and buckets either way, runtime/weights/wire.py; the header
always over the sync group, runtime/weights/p2p.py): on CPU the buckets too (the rollout
drivers write a file and reload it); ``resources.device: cuda`` sends them over NCCL
straight into the vLLM engines' workers (runtime/weights/nccl.py).
"""

from __future__ import annotations

import collections
import time
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from runtime import checkpoint_layout
from runtime.config.lora_config import LoraConfig
from runtime.rank.groups import LEADER
from runtime.rank.sync_pairs import SyncPairs
from runtime.rank.trainer_mesh import TrainerMesh
from runtime.weights import lora_format, p2p
from runtime.weights.protocols import BucketSender, SyncGroup
from runtime.weights.settings import WeightPathConfig
from runtime.weights.wire import TensorSpec, WeightsHeader, plan_buckets


@dataclass
class SyncRecord:
    """One weight sync as this rank saw it. ``peak_gathered_bytes``: the most bytes of
    gathered tensors and buckets alive at once here (counted until each is freed)."""

    version: int
    transport: str
    leader: bool
    bytes: int  # sent (the leader), in the rollout dtype
    tensors: int
    buckets: int
    seconds: float
    bucket_bytes: int  # the configured budget of one bucket
    largest_bucket_bytes: int
    largest_tensor_bytes: int  # the largest gathered tensor, in the trainer's dtype
    peak_gathered_bytes: int

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def metrics(self) -> dict[str, float]:
        """The step-metrics fields of this sync."""
        return {
            "weight_sync_s": self.seconds,
            "weight_sync_bytes": float(self.bytes),
            "weight_sync_gbps": self.gb_per_s,
            "weight_sync_buckets": float(self.buckets),
            "weight_sync_peak_bytes": float(self.peak_gathered_bytes),
        }

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "gb_per_s": self.gb_per_s}


class _Alive:
    """Bytes of the tensors this module allocated that are still alive, and the most at
    once: each counts until it is really freed (a weakref finaliser), whoever holds it."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0

    def track(self, t: torch.Tensor) -> torch.Tensor:
        n = t.numel() * t.element_size()
        self.now += n
        self.peak = max(self.peak, self.now)
        weakref.finalize(t, self._freed, n)
        return t

    def _freed(self, n: int) -> None:
        self.now -= n


class MergedWeight:
    """A base weight with its LoRA adapter merged in, computed when its bucket is
    gathered (``model.lora.sync: merged``): ``W + scale * B @ A``."""

    def __init__(
        self, weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float
    ) -> None:
        self.weight, self.a, self.b, self.scale = weight, a, b, scale
        self.shape = weight.shape

    def numel(self) -> int:
        return self.weight.numel()

    def element_size(self) -> int:
        return self.weight.element_size()

    def full(self, alive: _Alive) -> torch.Tensor:
        parts = [_full(t, alive) for t in (self.weight, self.a, self.b)]
        # float32: the bucket casts it to the rollout dtype, not through the base's
        return alive.track(lora_format.merged_weight(*parts, self.scale, dtype=torch.float32))


class _GatheredOnce:
    """A fused expert tensor whose per-expert parts go out one by one: gathered at the first
    part a bucket takes, kept until its last part is taken (every streaming rank takes
    them in the same order, so the gather stays collective)."""

    def __init__(self, source: torch.Tensor, parts: int) -> None:
        self.source, self.left = source, parts
        self.full: torch.Tensor | None = None

    def take(self, alive: _Alive) -> torch.Tensor:
        if self.full is None:
            self.full = _full(self.source, alive)
        full = self.full
        self.left -= 1
        if self.left == 0:
            self.full = None  # the caller's slice is the last reference
        return full


class ExpertPart:
    """One expert's matrix of a fused expert tensor, under the hub's name
    (runtime/checkpoint_layout.py): what vLLM's loader and the checkpoints take."""

    def __init__(self, fused: _GatheredOnce, index: int, rows: slice) -> None:
        self.fused, self.index, self.rows = fused, index, rows
        matrix = fused.source.shape[1:]
        self.shape = torch.Size((len(range(*rows.indices(matrix[0]))), *matrix[1:]))

    def numel(self) -> int:
        return self.shape.numel()

    def element_size(self) -> int:
        return self.fused.source.element_size()

    def full(self, alive: _Alive) -> torch.Tensor:
        return self.fused.take(alive)[self.index][self.rows]


Entry = torch.Tensor | MergedWeight | ExpertPart


def hub_entries(entries: list[tuple[str, Entry]]) -> list[tuple[str, Entry]]:
    """``entries`` in the hub's layout: a fused expert tensor as one entry per expert's
    matrix, sharing one gather."""
    out: list[tuple[str, Entry]] = []
    for name, value in entries:
        if not (checkpoint_layout.is_fused_experts(name) and isinstance(value, torch.Tensor)):
            out.append((name, value))
            continue
        parts = list(checkpoint_layout.hub_names(name, tuple(value.shape)))
        fused = _GatheredOnce(value, len(parts))
        out += [(hub, ExpertPart(fused, i, rows)) for hub, i, rows in parts]
    return out


def checkpoint_tensors(
    model: torch.nn.Module, tied_lm_head: bool, lora: LoraConfig | None = None
) -> list[tuple[str, Entry]]:
    """The model's tensors under checkpoint names, in state-dict order (the same on every
    rank): sharded ``DTensor``s under FSDP2, plain tensors otherwise. A LoRA run sends its
    adapter alone under peft's names, or each adapted weight merged (``lora.sync``)."""
    state = model.state_dict(keep_vars=True)
    entries: list[tuple[str, Entry]] = [
        (k, v) for k, v in state.items() if not (tied_lm_head and k == "lm_head.weight")
    ]
    if lora is None or not lora.enabled:
        return hub_entries(entries)
    if lora.sync == "adapter":
        prefix = lora_format.PEFT_PREFIX
        return [(prefix + k, v) for k, v in entries if lora_format.is_adapter_name(k)]
    out: list[tuple[str, Entry]] = []
    for k, v in entries:
        if lora_format.is_adapter_name(k):
            continue
        a_name = k.removesuffix(".weight") + ".lora_A.weight"
        if a_name in state:
            b_name = k.removesuffix(".weight") + ".lora_B.weight"
            out.append((k, MergedWeight(v, state[a_name], state[b_name], lora.scale)))
        else:
            out.append((k, v))
    return out


def _full(t: Entry, alive: _Alive) -> torch.Tensor:
    """The whole tensor: a DTensor's all-gather (collective over its shard dimension,
    counted in ``alive``), a plain tensor itself (the model's own, nothing allocated), a
    merged weight computed from its gathered parts."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, (MergedWeight, ExpertPart)):
        return t.full(alive)
    return alive.track(t.full_tensor()) if isinstance(t, DTensor) else t.detach()


def _buckets(
    entries: Sequence[tuple[str, Entry]],
    header: WeightsHeader,
    device: torch.device,
    alive: _Alive,
    keep: bool,
) -> Iterator[torch.Tensor]:
    """Each bucket of ``header``, gathered and cast into one flat tensor on ``device``
    (``keep``: the leader; the others only take part in the gathers and yield nothing)."""
    for r in header.ranges():
        specs = [header.tensors[i] for i in r]
        if keep and len(specs) == 1:  # a tensor as large as a bucket: sent as it comes
            full = _full(entries[r.start][1], alive)
            flat = full.reshape(-1).to(device=device, dtype=specs[0].dtype)
            if flat.data_ptr() != full.data_ptr():
                alive.track(flat)  # a cast or a move (else a view of the gathered tensor)
            del full
            yield flat
            del flat
            continue
        flat = None
        if keep:
            numel = sum(s.numel for s in specs)
            flat = alive.track(torch.empty(numel, dtype=specs[0].dtype, device=device))
        offset = 0
        for i, spec in zip(r, specs, strict=True):
            full = _full(entries[i][1], alive)
            if flat is not None:
                flat[offset : offset + spec.numel].copy_(full.reshape(-1))
            offset += spec.numel
            del full  # before the next gather
        if flat is not None:
            yield flat
            del flat  # sent: freed before the next bucket is allocated


@torch.no_grad()
def stream_weights(
    model: torch.nn.Module,
    sync: SyncGroup,
    version: int,
    *,
    dtype: torch.dtype,
    bucket_bytes: int,
    tied_lm_head: bool,
    transport: BucketSender | None = None,
    lora: LoraConfig | None = None,
) -> SyncRecord:
    """Stream ``model``'s weights as policy ``version`` to the sync group (see the module
    docstring; every rank of :func:`streaming_ranks` calls it together). ``transport``
    None: buckets on the CPU over the gloo sync group; else on its ``device``."""
    start = time.perf_counter()
    entries = checkpoint_tensors(model, tied_lm_head, lora)
    spec = [TensorSpec(name, dtype, tuple(t.shape)) for name, t in entries]
    header = WeightsHeader(version, tuple(spec), tuple(plan_buckets(spec, bucket_bytes)))
    device = transport.device if transport is not None else torch.device("cpu")
    alive = _Alive()
    leader = sync.is_leader
    buckets = _buckets(entries, header, device, alive, keep=leader)
    if leader:
        sent = p2p.send_stream(sync, header, buckets, transport)
    else:
        for _ in buckets:  # yields nothing here: this rank takes part in the gathers only
            pass
        sent = 0
    # a MoE's expert matrices are sliced from their fused tensor, which is what is gathered
    gathered = [
        (t.fused.source if isinstance(t, ExpertPart) else t).numel() * t.element_size()
        for _, t in entries
    ]
    return SyncRecord(
        version=version,
        # a peer of the leader's group only gathers: "none" leaves its sends
        transport=transport.name if transport is not None else ("gloo" if leader else "none"),
        leader=leader,
        bytes=sent,
        tensors=len(spec),
        buckets=len(header.buckets),
        seconds=time.perf_counter() - start,
        bucket_bytes=bucket_bytes,
        largest_bucket_bytes=max(map(header.bucket_nbytes, range(len(header.buckets))), default=0),
        largest_tensor_bytes=max(gathered, default=0),
        peak_gathered_bytes=alive.peak,
    )


def streaming_ranks(mesh: TrainerMesh, sharded: bool) -> list[int]:
    """The ranks that call :meth:`WeightStreamer.stream` at a sync point: the leader's
    replica group under FSDP2 (its shards make the whole model), the leader alone for a
    replicated model (its copy is whole)."""
    if not sharded:
        return [LEADER]
    return mesh.leader_replica()


class WeightStreamer:
    """What a trainer side keeps between weight syncs: the transport (gloo on CPU; NCCL
    into the vLLM engines under ``resources.device: cuda``, its group kept while the
    layout stands) and the records of the last syncs (the leader's)."""

    def __init__(
        self, config: WeightPathConfig, sync: SyncPairs, mesh: TrainerMesh, history: int = 64
    ) -> None:
        self.sync, self.mesh = sync, mesh
        self.rollout_group_size = config.rollout_group_size
        self.dtype: torch.dtype = getattr(torch, config.dtype)
        self.bucket_bytes = config.bucket_bytes
        self.lora = config.lora
        # NCCL streams straight into load_weights, base weights only; an adapter goes over
        # the gloo group and is loaded from a file by vLLM's LoRA path
        self.cuda = config.nccl
        self._transport: BucketSender | None = None
        self.records: collections.deque[SyncRecord] = collections.deque(maxlen=history)

    def takes_part(self, sharded: bool) -> bool:
        """Whether this rank calls :meth:`stream` at a sync point."""
        return self.sync.rank in streaming_ranks(self.mesh, sharded)

    def stream(
        self, model: torch.nn.Module, version: int, *, tied_lm_head: bool | None = None
    ) -> SyncRecord:
        """Send ``model``'s current weights as ``version`` (the ranks of
        :func:`streaming_ranks` together). ``tied_lm_head``: from the model's config when
        not given."""
        if tied_lm_head is None:
            config = getattr(model, "config", None)
            tied_lm_head = bool(getattr(config, "tie_word_embeddings", False))
        record = stream_weights(
            model,
            self.sync,
            version,
            dtype=self.dtype,
            bucket_bytes=self.bucket_bytes,
            tied_lm_head=tied_lm_head,
            transport=self._leader_transport(),
            lora=self.lora,
        )
        if record.leader:
            self.records.append(record)
        return record

    @property
    def last(self) -> SyncRecord | None:
        return self.records[-1] if self.records else None

    def _leader_transport(self) -> BucketSender | None:
        if not self.cuda or not self.sync.is_leader:
            return None  # gloo; the leader's group peers only gather
        if self._transport is None:
            from runtime.weights.nccl import NcclBucketSender

            self._transport = NcclBucketSender(
                self.sync,
                self.rollout_group_size,
                self.bucket_bytes,
                self.sync.timeout.total_seconds(),
            )
        return self._transport

    def close(self) -> None:
        close = getattr(self._transport, "close", None)
        if close is not None:
            close()
        self._transport = None
