"""LoRA adapters on disk and on the wire, in peft's format, shared by the trainer, the
rollout engines and ``reflow export``.

The trainer's adapted layers keep Hugging Face's names and add ``lora_A``/``lora_B``
(runtime/engines/torch/lora.py), so the model's state dict has
``model.layers.0.self_attn.q_proj.weight`` (the frozen base) beside
``model.layers.0.self_attn.q_proj.lora_A.weight`` ``[r, in]`` and ``...lora_B.weight``
``[out, r]``. peft saves the same tensors under ``base_model.model.`` + that name in
``adapter_model.safetensors``, with ``adapter_config.json`` beside it; transformers
(``load_adapter``), peft and vLLM (``LoRARequest``) load that folder. A weight sync of a
LoRA run sends exactly those tensors (``model.lora.sync: adapter``), or the base with
``W + alpha/r * B @ A`` merged in (``merged``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from runtime.config.lora_config import LoraConfig

PEFT_PREFIX = "base_model.model."
ADAPTER_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
_PARTS = (".lora_A.weight", ".lora_B.weight")


def is_adapter_name(name: str) -> bool:
    """Whether a state-dict (or peft) name is an adapter tensor."""
    return name.endswith(_PARTS)


def base_name(name: str) -> str:
    """``...q_proj.lora_A.weight`` -> ``...q_proj.weight``: the base weight it adapts."""
    for part in _PARTS:
        if name.endswith(part):
            return name[: -len(part)] + ".weight"
    raise ValueError(f"{name}: not an adapter tensor")


def to_peft(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter tensors of a state dict (checkpoint names), under peft's names."""
    return {PEFT_PREFIX + k: v for k, v in state.items() if is_adapter_name(k)}


def from_peft(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """peft's names back to the model's (the inverse of :func:`to_peft`)."""
    out = {}
    for k, v in tensors.items():
        if not k.startswith(PEFT_PREFIX) or not is_adapter_name(k):
            raise ValueError(f"{k}: not a LoRA tensor of a peft adapter")
        out[k[len(PEFT_PREFIX) :]] = v
    return out


def merge(state: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """The base weights with every adapter merged in (``W + scale * B @ A``, float32),
    adapter tensors left out: a plain Hugging Face state dict."""
    out = {k: v for k, v in state.items() if not is_adapter_name(k)}
    for name in state:
        if name.endswith(_PARTS[0]):
            a, b = state[name], state[name[: -len(_PARTS[0])] + _PARTS[1]]
            w = out[base_name(name)]
            out[base_name(name)] = merged_weight(w, a, b, scale, dtype=torch.float32)
    return out


def merged_weight(
    w: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    scale: float,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``W + scale * B @ A`` in float32, returned in ``dtype`` (default W's): a small delta
    rounded through a narrower base dtype first would be lost."""
    delta = (b.float() @ a.float()) * scale
    return (w.float() + delta.to(w.device)).to(dtype or w.dtype)


def adapter_config(cfg: LoraConfig, base_model: str, targets: list[str]) -> dict[str, Any]:
    """peft's ``adapter_config.json`` for an adapter of ``cfg`` on ``base_model``;
    ``targets``: the module names that really got one (what vLLM and peft check)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": cfg.rank,
        "lora_alpha": cfg.alpha,
        "lora_dropout": cfg.dropout,
        "target_modules": sorted(targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "inference_mode": True,
    }


def targets_of(tensors: dict[str, torch.Tensor]) -> list[str]:
    """The module names (``q_proj``, ...) that the adapter tensors adapt."""
    return sorted({base_name(k).split(".")[-2] for k in tensors if is_adapter_name(k)})


def write_adapter(
    folder: Path, peft_tensors: dict[str, torch.Tensor], cfg: LoraConfig, base_model: str
) -> Path:
    """``folder`` as a peft adapter folder (tensors under peft's names); the config is
    written last, so a folder with a config is whole."""
    from safetensors.torch import save_file

    if not peft_tensors:
        raise ValueError("no adapter tensors to write")
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in peft_tensors.items()}
    save_file(tensors, str(folder / ADAPTER_FILE))
    config = adapter_config(cfg, base_model, targets_of(tensors))
    tmp = folder / f".{ADAPTER_CONFIG}.tmp"
    tmp.write_text(json.dumps(config, indent=1))
    os.replace(tmp, folder / ADAPTER_CONFIG)
    return folder


def read_adapter(folder: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """An adapter folder's config and tensors (peft names), checked to be a LoRA of the
    shapes its config says."""
    from safetensors.torch import load_file

    config_file, tensor_file = folder / ADAPTER_CONFIG, folder / ADAPTER_FILE
    if not config_file.is_file() or not tensor_file.is_file():
        raise ValueError(f"{folder}: not an adapter folder (no {ADAPTER_CONFIG} or {ADAPTER_FILE})")
    config = json.loads(config_file.read_text())
    if config.get("peft_type") != "LORA":
        raise ValueError(f"{config_file}: peft_type {config.get('peft_type')!r}, not LORA")
    tensors = load_file(str(tensor_file))
    rank = int(config["r"])
    for k, v in tensors.items():
        if not is_adapter_name(k) or v.dim() != 2:
            raise ValueError(f"{tensor_file}: {k} is not a LoRA matrix")
        if (v.shape[0] if k.endswith(_PARTS[0]) else v.shape[1]) != rank:
            raise ValueError(f"{tensor_file}: {k} has shape {tuple(v.shape)}, rank {rank}")
    return config, tensors


def zero_adapter(model_path: str, cfg: LoraConfig) -> dict[str, torch.Tensor]:
    """An adapter of all zeros for the model at ``model_path`` (peft names): the base model
    exactly, for an engine to serve before the first sync. The shapes come from the model
    built on the meta device (no weights read), the targets as the trainer picks them:
    ``cfg.target_modules`` linear layers of the decoder blocks."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    out: dict[str, torch.Tensor] = {}
    targets = set(cfg.target_modules)
    for i, block in enumerate(model.model.layers):
        for name, module in block.named_modules():
            if name.rsplit(".", 1)[-1] in targets and type(module) is torch.nn.Linear:
                stem = f"{PEFT_PREFIX}model.layers.{i}.{name}"
                out[f"{stem}.lora_A.weight"] = torch.zeros(cfg.rank, module.in_features)
                out[f"{stem}.lora_B.weight"] = torch.zeros(module.out_features, cfg.rank)
    if not out:
        raise ValueError(f"model.lora.target_modules: no linear layer of {model_path} matches")
    return out
