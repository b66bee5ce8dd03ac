"""What the vLLM engine takes of a run's config: its own sections, bundled once at the edge
(the rollout side, a test) by :meth:`VLLMEngineConfig.from_config`, so
runtime/engines/vllm/engine.py reads no other part of it."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.config.schema import Config, EngineConfig, ModelConfig, ResourcesConfig


@dataclass(frozen=True)
class VLLMEngineConfig:
    engine: EngineConfig
    """vLLM's own knobs: eager mode, sequences per step, KV cache size, memory share."""
    model: ModelConfig
    """The served dtype, the context length and a LoRA run's adapter settings."""
    resources: ResourcesConfig
    """The device, the GPUs of one rollout replica (tensor parallel) and of a node."""
    temperature: float
    """``algorithm.temperature``: sampling temperature; log-probs are returned after it."""
    detokenize: bool
    """Whether the workload's agent stops on strings (a tool call's close tag), which needs
    the tokenizer; token ids in and out otherwise."""

    @classmethod
    def from_config(cls, cfg: Config) -> VLLMEngineConfig:
        from runtime.workloads.agents.registry import NEEDS_STOP_STRINGS

        return cls(
            engine=cfg.engine,
            model=cfg.model,
            resources=cfg.resources,
            temperature=cfg.algorithm.temperature,
            detokenize=cfg.workload.kind in NEEDS_STOP_STRINGS,
        )
