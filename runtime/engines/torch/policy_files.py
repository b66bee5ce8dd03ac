"""What the trainer's policy becomes outside it: the tensors a weight sync sends, and the
version folders of ``<run>/weights/`` (``reflow export`` reads them)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from runtime import checkpoint_layout
from runtime.config.schema import ModelConfig
from runtime.store.run_dir import write_json_atomic
from runtime.weights import lora_format


def for_rollout(weights: dict[str, torch.Tensor], model: ModelConfig) -> dict[str, torch.Tensor]:
    """What a weight sync sends of checkpoint-format ``weights``: all of them, or for a LoRA
    run the adapter alone (peft's names) or the base with it merged in (``model.lora.sync``),
    in ``model.dtype`` (``model``: the recipe's section)."""
    lora = model.lora
    if not lora.enabled:
        return weights
    dtype = getattr(torch, model.dtype)
    if lora.sync == "adapter":  # in the rollout dtype, as the weight stream sends them
        return {k: v.to(dtype) for k, v in lora_format.to_peft(weights).items()}
    return {k: v.to(dtype) for k, v in lora_format.merge(weights, lora.scale).items()}


def publish(
    weights_dir: Path,
    version: int,
    weights: dict[str, torch.Tensor],
    model: ModelConfig,
    base_model: str,
    keep: int = 2,
) -> Path:
    """``weights`` (checkpoint format) as ``<weights_dir>/v<version>/model.safetensors``, or
    for a LoRA run its adapter as a peft folder there; atomic (written beside, renamed), then
    ``latest.json``; only the newest ``keep`` versions stay."""
    from safetensors.torch import save_file

    weights_dir.mkdir(exist_ok=True)
    final = weights_dir / f"v{version}"
    tmp = weights_dir / f".v{version}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    if model.lora.enabled:
        adapter = lora_format.to_peft(weights)
        lora_format.write_adapter(tmp, adapter, model.lora, base_model)
    else:
        save_file(weights, str(tmp / "model.safetensors"))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    write_json_atomic(weights_dir / "latest.json", {"version": version, "dir": final.name})
    versions = sorted(int(d.name[1:]) for d in weights_dir.glob("v*") if d.name[1:].isdigit())
    for v in versions[:-keep] if len(versions) > keep else []:
        shutil.rmtree(weights_dir / f"v{v}", ignore_errors=True)
    return final


def plain_model(
    model_path: str, weights: dict[str, torch.Tensor] | None, settings: ModelConfig
) -> torch.nn.Module:
    """A plain Hugging Face model of ``weights`` (checkpoint format; None: the model folder's
    own), for a sharded trainer's leader to generate with: a LoRA run's adapters merged in,
    since a plain model has no place for them."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path)
    if weights is None:
        return model
    if settings.lora.enabled:
        weights = lora_format.merge(weights, settings.lora.scale)
    # a tied head is left out; a MoE's experts come one by one and the model fuses them
    _, unexpected = model.load_state_dict(checkpoint_layout.to_fused(weights), strict=False)
    if unexpected:
        raise RuntimeError(f"weights the model does not have: {', '.join(unexpected[:3])}")
    model.tie_weights()
    return model
