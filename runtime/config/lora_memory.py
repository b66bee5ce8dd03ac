"""The LoRA part of the memory plan: what ``model.lora`` (rank > 0) adds to a rank's GPU.

It counts the adapters' parameters from the model's shape (A [r, in] + B [out, r] on each
adapted linear layer of every decoder block), the bytes one weight sync sends (the
adapters, or the merged model), what the adapters save for the backward per token, and
the adapter slots vLLM sets aside next to its weights (:func:`vllm_lora_slot_bytes`).

It is apart from :mod:`runtime.config.memory_plan` because it is a self-contained piece of
accounting with callers of its own (the simulator's LoRA costs, :mod:`runtime.sim.lora`)
that need the adapter count without the whole plan. ``memory_plan`` imports it and never
the other way round, so byte sizes come in as arguments rather than from that module's
``DTYPE_BYTES``. The formulas are in docs/memory-plan.md and docs/lora.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from runtime.config.architectures import ArchitectureError, ModelShape
from runtime.config.lora_config import VLLM_LORA_RANKS, VLLM_LORA_SLOTS, LoraConfig
from runtime.config.schema import Config

# The plan's unit: memory_plan.GIB, written out because memory_plan imports this module.
_GIB = 2**30


@dataclass(frozen=True)
class LoraPlan:
    """``model.lora`` in numbers: the adapters and what one weight sync sends."""

    rank: int
    modules: tuple[str, ...]  # the target modules this model has (adapted in every block)
    adapter_params: int  # A [r, in] + B [out, r] of every adapted layer, all blocks
    base_params: int
    base_dtype: str  # the frozen base's dtype: train.param_dtype
    sync: str  # model.lora.sync
    sync_bytes: int  # one weight sync: the adapters or the merged model, in model.dtype
    full_sync_bytes: int  # a full-parameter run's sync: the model in model.dtype

    def line(self) -> str:
        """The plan's LoRA line."""
        share, sent = self.adapter_params / self.base_params, self.sync_bytes / _GIB
        sent_as = (
            f"the adapter, {sent:.2f} GiB ({self.sync_bytes / self.full_sync_bytes:.2%}"
            f" of the model's {self.full_sync_bytes / _GIB:.2f} GiB)"
            if self.sync == "adapter"
            else f"the merged model, {sent:.2f} GiB"
        )
        return (
            f"LoRA rank {self.rank} on {', '.join(self.modules)}: {self.adapter_params:,} "
            f"adapter parameters ({share:.2%} of {self.base_params:,}), base frozen in "
            f"{self.base_dtype}; a weight sync sends {sent_as}"
        )


def lora_module_shapes(shape: ModelShape) -> dict[str, tuple[int, int]]:
    """(in, out) features of each linear layer of a decoder block, by its Hugging Face name."""
    h, q, kv, i = shape.hidden, shape.q_width, shape.kv_width, shape.intermediate
    names = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    io = ((h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h))
    return dict(zip(names, io, strict=True))


def lora_modules(shape: ModelShape, lora: LoraConfig) -> tuple[str, ...]:
    """The target modules that are linear layers of this model's blocks: the ones the
    trainer adapts (runtime/engines/torch/lora.py ``apply_lora`` refuses a name that is
    not one of its block's linear layers)."""
    known = lora_module_shapes(shape)
    modules = tuple(m for m in known if m in set(lora.target_modules))
    if not modules:
        raise ArchitectureError(
            f"model.lora.target_modules: none of {sorted(lora.target_modules)} is a linear "
            f"layer of a decoder block ({', '.join(known)})"
        )
    return modules


def lora_adapter_params(shape: ModelShape, lora: LoraConfig) -> int:
    """Adapter parameters of the whole model: A [r, in] and B [out, r] for each adapted
    linear layer of every decoder block."""
    known = lora_module_shapes(shape)
    per_block = sum(lora.rank * sum(known[m]) for m in lora_modules(shape, lora))
    return shape.layers * per_block


def lora_plan(
    cfg: Config, shape: ModelShape, base_dtype: str, sync_dtype_bytes: int
) -> LoraPlan | None:
    """``model.lora`` of ``cfg`` in numbers, None without LoRA. ``sync_dtype_bytes`` is
    the size of ``model.dtype``: a LoRA run's weight sync sends the adapters in the rollout
    dtype, as every weight (runtime/weights/send.py; vLLM casts them to its
    LoRA dtype anyway); ``model.lora.sync: merged`` sends the model."""
    lora = cfg.model.lora
    if not lora.enabled:
        return None
    if shape.is_moe:
        raise ArchitectureError(
            f"model.lora: {shape.name} is a mixture of experts; LoRA on its experts is not "
            "built (dense models only)"
        )
    adapters = lora_adapter_params(shape, lora)
    full = shape.total_params * sync_dtype_bytes
    return LoraPlan(
        rank=lora.rank,
        modules=lora_modules(shape, lora),
        adapter_params=adapters,
        base_params=shape.total_params,
        base_dtype=base_dtype,
        sync=lora.sync,
        sync_bytes=adapters * sync_dtype_bytes if lora.sync == "adapter" else full,
        full_sync_bytes=full,
    )


def lora_activation_bytes_per_token(shape: ModelShape, lora: LoraConfig, p: int) -> int:
    """What a block's adapters save for the backward besides the base's activations, per
    token: A's output (r values) for B's weight gradient, and with dropout the dropped
    input and its mask; the input itself is the base layer's, saved already."""
    if not lora.enabled:
        return 0
    known = lora_module_shapes(shape)
    dropped = [known[m][0] * (p + 1) if lora.dropout else 0 for m in lora_modules(shape, lora)]
    return sum(lora.rank * p + d for d in dropped)


def vllm_lora_slot_bytes(
    shape: ModelShape, lora: LoraConfig, dtype_bytes: int, tensor_parallel: int
) -> int:
    """This GPU's share of the adapter slots a vLLM engine allocates beside its weights
    when it is sent adapters (0 otherwise): VLLM_LORA_SLOTS adapters at the smallest
    served rank that holds ``lora.rank``, on every LoRA module whatever the targets, in
    ``model.dtype`` of ``dtype_bytes`` each."""
    if not lora.syncs_adapter:
        return 0
    rank = min(r for r in VLLM_LORA_RANKS if r >= lora.rank)
    per_rank = sum(map(sum, lora_module_shapes(shape).values())) * shape.layers
    return math.ceil(VLLM_LORA_SLOTS * rank * per_rank * dtype_bytes / tensor_parallel)
