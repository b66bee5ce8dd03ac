"""Where the trainer runs and how its model is split: device, FSDP2, precision, recompute.

``train.strategy: fsdp2`` applies ``fully_shard`` to every decoder block, then to the root
(torchtitan's order: a block's parameters are gathered just before it runs and freed
after, the root keeps the embeddings, final norm and the tied head), over the 2-D mesh
``("replicate", "shard")`` of :meth:`runtime.rank.trainer_mesh.TrainerMesh.device_mesh`:
parameters, gradients and AdamW state are sharded within a replica group
(``resources.trainer_gpus_per_replica`` ranks) and replicated across groups (HSDP). The
same code runs over gloo on CPU and NCCL on CUDA; only the device type differs. A layout
change rebuilds the model over the new mesh (runtime/engines/torch/shard_handoff.py);
:func:`forget_sharding_decisions` keeps DTensor from reusing the old mesh's groups.

Precision: master weights and AdamW state stay float32; ``train.param_dtype`` is the
dtype of the forward and backward (FSDP2 ``MixedPrecisionPolicy``: parameters cast when
gathered, gradients reduced in float32). ``replicate`` gets the same with ``autocast``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch

from runtime.config.schema import ResourcesConfig


def trainer_device(res: ResourcesConfig, rank: int) -> torch.device:
    """The rank's device: its node-local GPU under ``device: cuda`` (or ``auto`` where CUDA
    is present), else the CPU. The local rank comes from the launcher (``LOCAL_RANK``,
    ``SLURM_LOCALID``), else the global rank modulo the node's GPUs."""
    wanted = res.device
    if wanted == "cpu" or (wanted == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("resources.device: cuda, but torch sees no CUDA device on this rank")
    local = os.environ.get("LOCAL_RANK") or os.environ.get("SLURM_LOCALID")
    index = int(local) if local is not None else rank % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def decoder_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks of a Hugging Face causal LM (``model.model.layers``)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: no model.layers to shard block by block")
    return list(layers)


def apply_fsdp(model: torch.nn.Module, mesh: Any, param_dtype: torch.dtype) -> torch.nn.Module:
    """``fully_shard`` per decoder block, then the root, in place."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    forget_sharding_decisions()
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    blocks = decoder_blocks(model)
    for i, block in enumerate(blocks):
        # the last block's parameters would be gathered again at once for the backward
        reshard = i < len(blocks) - 1
        adapters = lora_layers(block)
        if adapters:  # float32 adapters cannot share a group with a bfloat16 frozen base
            fully_shard(adapters, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


def lora_layers(block: torch.nn.Module) -> list[torch.nn.Module]:
    """A block's LoRA adapter layers (runtime/engines/torch/lora.py names them ``lora_A``
    and ``lora_B``), sharded as one group of their own."""
    return [m for n, m in block.named_modules() if n.rsplit(".", 1)[-1] in ("lora_A", "lora_B")]


def forget_sharding_decisions() -> None:
    """Clear DTensor's cache of sharding decisions before a model is sharded over a mesh.

    DTensor caches each op's output placement keyed by its inputs' specs, and a
    ``DeviceMesh`` equals any other over the same ranks and dimension names whatever its
    process groups. After a layout change back to an earlier trainer grid (one replica
    group, two, one again), a cached decision would carry the earlier mesh, whose groups
    the regroup destroyed: "Could not resolve the process group registered under the
    name N" in the gradient norm. torch offers no public call for this; the one used is
    its own (torch.distributed.tensor.debug)."""
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    _clear_sharding_prop_cache()


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each decoder block in the backward pass (transformers' own hook: the
    blocks are checkpointed, not the head, whose chunks checkpoint themselves)."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


@contextlib.contextmanager
def compute_precision(device: torch.device, dtype: torch.dtype, sharded: bool) -> Iterator[None]:
    """``autocast`` to ``dtype`` for a replicated model; FSDP2 casts by itself."""
    if sharded or dtype == torch.float32:
        yield
        return
    with torch.autocast(device_type=device.type, dtype=dtype):
        yield


def full_norm(norm: torch.Tensor) -> float:
    """A gradient norm as a float; under FSDP2 it is a DTensor to reduce first."""
    from torch.distributed.tensor import DTensor

    return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)
