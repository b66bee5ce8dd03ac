"""LoRA in the trainer: low-rank adapters on a frozen base (``model.lora``).

Our own small wrapper rather than peft's: the adapted layer stays an ``nn.Linear`` under
its Hugging Face name with two child layers ``lora_A``/``lora_B``, so the state dict keeps
the checkpoint's names (FSDP2's per-block sharding, the weight stream, checkpoints and the
shard handoff walk it unchanged) and the adapter tensors already carry peft's names minus
its prefix (runtime/weights/lora_format.py). peft's wrapper would add ``base_model.model``
and ``base_layer`` to every name and pull in a dependency for a 30-line layer.

``y = x W^T + b + (alpha / r) * dropout(x) A^T B^T``: ``A`` starts as peft starts it
(Kaiming-uniform), ``B`` at zero, so step 0 is the base model exactly. The base is frozen
(``requires_grad`` off: no gradients are allocated, AdamW gets only the adapters) and kept
in the compute dtype (``train.param_dtype``: bfloat16 on CUDA), since it is never updated
and needs no float32 master copy; the adapters and their AdamW state are float32.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
from torch import nn
from torch.nn import functional as F

from runtime.config.lora_config import LoraConfig
from runtime.engines.torch.parallelize import decoder_blocks


class LoraLinear(nn.Linear):
    """An ``nn.Linear`` with a low-rank adapter (made by :func:`apply_lora` from a plain
    one, whose ``weight`` and ``bias`` it keeps)."""

    lora_A: nn.Linear
    lora_B: nn.Linear
    lora_dropout: nn.Module
    scale: float

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight, self.bias)
        # Outside autocast and FSDP2's casts (generation for an eval) a bfloat16 base meets
        # float32 adapters: the adapter runs in its own dtype and adds in the base's.
        h = self.lora_A(self.lora_dropout(x.to(self.lora_A.weight.dtype)))
        return out + (self.lora_B(h) * self.scale).to(out.dtype)


def _adapt(layer: nn.Linear, cfg: LoraConfig) -> None:
    """Turn ``layer`` into a :class:`LoraLinear` in place (its parameters stay the same
    objects, so nothing that holds them goes stale)."""
    device = layer.weight.device
    layer.__class__ = LoraLinear
    layer.lora_A = nn.Linear(layer.in_features, cfg.rank, bias=False, device=device)
    layer.lora_B = nn.Linear(cfg.rank, layer.out_features, bias=False, device=device)
    nn.init.kaiming_uniform_(layer.lora_A.weight, a=math.sqrt(5))  # peft's init
    nn.init.zeros_(layer.lora_B.weight)
    layer.lora_dropout = nn.Dropout(cfg.dropout) if cfg.dropout else nn.Identity()
    layer.scale = cfg.scale


def apply_lora(model: nn.Module, cfg: LoraConfig, base_dtype: torch.dtype) -> list[str]:
    """Adapters on every ``cfg.target_modules`` linear layer of every decoder block, the
    rest frozen in ``base_dtype``; returns the adapted layers' names. Adapters are created
    from torch's RNG: seeded alike on every trainer rank, they start equal."""
    targets = set(cfg.target_modules)
    with torch.no_grad():
        for param in model.parameters():
            param.requires_grad_(False)
            # parameters only: buffers keep their dtype (a bfloat16 rotary ``inv_freq``
            # would shift every position's angle against the rollout engine's float32)
            param.data = param.data.to(base_dtype)
    adapted: list[str] = []
    for block in decoder_blocks(model):
        for name, module in block.named_modules():
            if name.rsplit(".", 1)[-1] in targets and type(module) is nn.Linear:
                _adapt(module, cfg)
                adapted.append(name)
    matched = {name.rsplit(".", 1)[-1] for name in adapted}
    if matched != targets:
        block = decoder_blocks(model)[0].named_modules()
        linear = {n.rsplit(".", 1)[-1] for n, m in block if isinstance(m, nn.Linear)}
        names = sorted(linear - {"lora_A", "lora_B"})
        raise ValueError(
            f"model.lora.target_modules: {', '.join(sorted(targets - matched))} is not a "
            f"linear layer of a decoder block (this model's: {', '.join(names)})"
        )
    return adapted


def trainable(model: nn.Module) -> list[nn.Parameter]:
    """The parameters that train (all of them without LoRA)."""
    return [p for p in model.parameters() if p.requires_grad]


@contextlib.contextmanager
def adapter_dropout_off(model: nn.Module) -> Iterator[None]:
    """The adapters' dropout off for a pass that measures the policy (the old policy's
    log-probs): the update's ratio compares the dropped-out policy with the whole one, as
    with peft. Without dropout nothing changes."""
    dropouts = [m for m in model.modules() if isinstance(m, LoraLinear)]
    dropouts = [m.lora_dropout for m in dropouts if isinstance(m.lora_dropout, nn.Dropout)]
    was = [d.training for d in dropouts]
    for d in dropouts:
        d.eval()
    try:
        yield
    finally:
        for d, training in zip(dropouts, was, strict=True):
            d.train(training)
