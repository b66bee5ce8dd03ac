"""What the torch trainer takes of a run's config: its own sections, bundled once at the
edge (the trainer side, a benchmark, a test) by :meth:`TorchTrainerConfig.from_config`, so
the trainer and its loss read no other part of the run's config."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.config.schema import (
    AlgorithmConfig,
    Config,
    ModelConfig,
    ResourcesConfig,
    TrainConfig,
)


@dataclass(frozen=True)
class TorchTrainerConfig:
    train: TrainConfig
    """Steps, optimiser, dtypes, micro-batching, the sharding strategy and the seed."""
    algorithm: AlgorithmConfig
    """The loss: clip, TIS, mismatch mask, aggregation, temperature, recomputed log-probs."""
    model: ModelConfig
    """The policy's dtype for rollout and its LoRA adapters."""
    resources: ResourcesConfig
    """Which device a trainer rank computes on (``device``, the GPUs of a node)."""
    replay_tau: float
    """``reflow.tau``: the loss weight of a replayed sample relative to a fresh one."""

    @classmethod
    def from_config(cls, cfg: Config) -> TorchTrainerConfig:
        return cls(
            train=cfg.train,
            algorithm=cfg.algorithm,
            model=cfg.model,
            resources=cfg.resources,
            replay_tau=cfg.reflow.tau,
        )
