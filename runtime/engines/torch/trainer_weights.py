"""The trainer's weights and state: the full weights in checkpoint format (gathered under
FSDP2), a published policy version, the replicas' fingerprint, and the sharded training
state a checkpoint keeps. A part of :class:`runtime.engines.torch.trainer.TorchTrainer`,
apart so that the class reads as the training step."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch

from runtime import checkpoint_layout
from runtime.engines.torch import policy_files
from runtime.engines.torch.settings import TorchTrainerConfig
from runtime.rank.trainer_mesh import TrainerMesh
from runtime.weights import lora_format


class TrainerWeights:
    # what TorchTrainer sets
    config: TorchTrainerConfig
    model: Any
    opt: Any
    model_path: str
    sharded: bool
    mesh: TrainerMesh | None
    step: int
    version: int

    def gather_weights(self) -> dict[str, torch.Tensor]:
        """The full weights, checkpoint-format, on the leader (collective under FSDP2:
        every trainer rank calls it; the others get ``{}``)."""
        if not self.sharded:
            return self.export_weights()
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        full = get_model_state_dict(
            self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        return self.checkpoint_format(full)

    def checkpoint_format(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """In the dtype rollout runs (``model.dtype``; LoRA adapters stay float32, as peft
        saves them), in the hub's layout (a MoE's experts one by one); a tied ``lm_head``
        left out as HF does."""
        dtype = getattr(torch, self.config.model.dtype)
        tied = getattr(self.model.config, "tie_word_embeddings", False)
        adapter = lora_format.is_adapter_name
        return {
            # a copy: the state dict (and a gathered one, where a rank holds a whole
            # tensor) shares storage with the live parameters the next step updates
            k: v.detach().to("cpu", torch.float32 if adapter(k) else dtype, copy=True).contiguous()
            for k, v in checkpoint_layout.to_hub(state).items()  # a MoE: one per expert
            if not (tied and k == "lm_head.weight")
        }

    def for_rollout(self, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What a weight sync sends of ``weights`` (runtime/engines/torch/policy_files.py)."""
        return policy_files.for_rollout(weights, self.config.model)

    def checksum(self) -> float:
        """A cheap fingerprint of the weights, to check that replicas agree: under FSDP2
        the sum of this replica group's shards (collective over the group)."""
        with torch.no_grad():
            if self.mesh is None:
                return float(sum(p.double().sum() for p in self.model.parameters()))
            local = sum(p.to_local().double().sum() for p in self.model.parameters())
            total = torch.tensor([float(local)], dtype=torch.float64)
            torch.distributed.all_reduce(total, group=self.mesh.shard_group)
            return float(total)

    def export_weights(self) -> dict[str, torch.Tensor]:
        """Checkpoint-format tensors of a replicated model (FSDP2: :meth:`gather_weights`)."""
        if self.sharded:
            raise RuntimeError("a sharded model's weights are gathered with gather_weights")
        return self.checkpoint_format(self.model.state_dict())

    def publish(
        self, weights_dir: Path, weights: dict[str, torch.Tensor] | None = None, keep: int = 2
    ) -> Path:
        """Write this version as ``<weights_dir>/v<N>/`` (atomic): the given full weights (a
        sharded trainer's, gathered), else this replica's; a LoRA run's adapter as a peft
        folder (runtime/engines/torch/policy_files.py)."""
        if weights is None:
            weights = self.export_weights()
        return policy_files.publish(
            weights_dir, self.version, weights, self.config.model, self.model_path, keep
        )

    def save_state(self, folder: Path, group: object | None = None) -> None:
        """Model and AdamW with torch.distributed.checkpoint (collective over the trainer
        ``group``: each rank writes its own shards), step, version and RNG alongside."""
        from runtime.engines.torch.sharded_state import save_sharded

        extra = {
            "step": self.step,
            "version": self.version,
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
        }
        save_sharded(folder, self.model, self.opt, extra, process_group=group)

    def load_state(self, folder: Path, group: object | None = None) -> None:
        """The state :meth:`save_state` wrote, resharded onto this trainer's ranks (their
        number may differ from the saving run's)."""
        from runtime.engines.torch.sharded_state import load_sharded

        extra = load_sharded(folder, self.model, self.opt, process_group=group)
        self.step, self.version = int(extra["step"]), int(extra["version"])
        torch.set_rng_state(extra["torch_rng"])
        random.setstate(extra["python_rng"])
