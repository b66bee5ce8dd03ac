"""What the weight path takes of a run's config: its own section, built once at the edge
(the trainer and rollout sides) by :meth:`WeightPathConfig.from_config`, so the sender and
the receiver read no other part of the run's config."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.config.lora_config import LoraConfig
from runtime.config.schema import Config


@dataclass(frozen=True)
class WeightPathConfig:
    dtype: str
    """The dtype buckets are cast to: the rollout engine's (``model.dtype``)."""
    bucket_bytes: int
    """Bytes of one bucket (``engine.weight_bucket_mb``): at most this much gathered and
    sent at once."""
    lora: LoraConfig
    """``model.lora``: an adapter sync sends the adapters alone, written as a peft folder
    for vLLM's LoRA path."""
    nccl: bool
    """Buckets go over NCCL straight into the engines' workers (``resources.device:
    cuda``, base weights only); else over the gloo sync group."""
    rollout_group_size: int
    """GPUs of one rollout replica (``resources.rollout_gpus_per_replica``): the workers
    each driver's engine brings to an NCCL group."""

    @classmethod
    def from_config(cls, cfg: Config) -> WeightPathConfig:
        lora = cfg.model.lora
        return cls(
            dtype=cfg.model.dtype,
            bucket_bytes=int(cfg.engine.weight_bucket_mb * 2**20),
            lora=lora,
            # an adapter (~1% of the bytes) goes over gloo and is loaded from a file
            nccl=cfg.resources.device == "cuda" and not lora.syncs_adapter,
            rollout_group_size=cfg.resources.rollout_gpus_per_replica,
        )
