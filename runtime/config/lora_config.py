"""The recipe's LoRA section (``model.lora``) and the LoRA limits of the vLLM the project
installs, which the section and the memory plan are checked against."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.config.fields import opt

# The linear layers of a Qwen3/Llama decoder block, the default LoRA targets (all of them,
# as verl's ``target_modules: all-linear`` and the LoRA-in-RL reports train).
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# What a weight publication of a LoRA run sends the rollout engines.
LORA_SYNCS = ("adapter", "merged")
# The ranks vLLM accepts as ``max_lora_rank`` (vllm/config/lora.py); an adapter of a smaller
# rank is served under the next one up; its two adapter slots (runtime/engines/vllm).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
VLLM_LORA_SLOTS = 2


@dataclass
class LoraConfig:
    """Low-rank adapters on a frozen base (runtime/engines/torch/lora.py); ``rank: 0`` trains
    every parameter."""

    rank: int = opt(0, "adapter rank r; 0 = no LoRA (every parameter trains)", ge=0, le=512)
    alpha: float = opt(16.0, "the adapter's output is scaled by alpha / rank", gt=0)
    dropout: float = opt(0.0, "dropout on the adapter's input while training", ge=0, lt=1)
    target_modules: list[str] = opt(
        LORA_TARGETS, "names of the linear layers that get an adapter (each block's)"
    )
    sync: str = opt(
        "adapter",
        "what a weight sync sends rollout: the adapter (vLLM loads it as a LoRA) or the "
        "base with the adapter merged in (a full sync, no LoRA in the engine)",
        choices=LORA_SYNCS,
    )

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @property
    def syncs_adapter(self) -> bool:
        """A LoRA run whose weight syncs send the adapter alone (the engine serves it)."""
        return self.enabled and self.sync == "adapter"
