"""LoRA in the simulator: what ``model.lora`` changes in a model profile's costs.

The profiles in ``runtime/sim/profiles.yaml`` are of full-parameter training. A LoRA run
(``model.lora.rank > 0``; runtime/engines/torch/lora.py) freezes the base in the compute
dtype and trains float32 adapters (A [r, in], B [out, r] on each adapted linear layer of
every block; the count is :func:`runtime.config.lora_memory.lora_adapter_params`, from the
model's shape). :func:`lora_profile` turns a profile into that run's, all derived, none
measured:

- **weight sync** (``model.lora.sync: adapter``): the trainer sends the adapters instead
  of the model, both in bf16 (the rollout dtype), so the byte-proportional part of
  ``weight_sync_s`` (and of ``colocated_sync_s``) is scaled by adapter bytes / model bytes;
  the fixed part (``weight_sync_fixed_s``, the setup the estimate holds) stays.
  ``sync: merged`` sends the whole model: unchanged.
- **trainer**: ``train_tok_s`` is counted at 8 N FLOP per token (forward 2 N, the
  checkpointed recompute 2 N, backward 4 N: input gradients 2 N + weight gradients 2 N).
  The frozen base skips its weight-gradient GEMMs, so a LoRA token costs 6 N + 8 A (the
  adapters train in full), at the same MFU: ``train_tok_s`` x 8 N / (6 N + 8 A). The
  old-policy log-prob pass (a forward, the same in both) keeps its seconds.
- **role switches**: the trainer state a rank moves is the bf16 base (2 bytes a
  parameter; it has no master copy, gradients or moments) + 16 bytes per adapter
  parameter, instead of 16 bytes per parameter.

Not modelled: a decode-step overhead of serving the adapter in vLLM (``enable_lora``; no
published figure found, so 0), the engine's adapter slot in the KV budget, and the lower
efficiency of the adapters' skinny GEMMs. A profile with ``params_b: 0`` (rates fitted from
a run folder, :mod:`runtime.sim.fit`) is left as it is: its rates are the run's own.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from runtime.config.architectures import ArchitectureError, ModelShape, model_shape
from runtime.config.lora_memory import lora_adapter_params
from runtime.config.schema import ModelConfig
from runtime.sim.parameters import ModelProfile, ProfileError

# The profiles' weight_sync_s are estimates of the model's bf16 weights on the wire.
PROFILE_SYNC_BYTES = 2
# Training FLOP per parameter per token, activation checkpointing on (the profiles' basis).
FULL_TRAIN_FLOP = 8
LORA_BASE_TRAIN_FLOP = 6  # the frozen base: no weight-gradient GEMMs
ADAPTER_TRAIN_FLOP = 8  # the adapters train as every parameter does in full training
# The trainer state a role switch moves: the bf16 base, and per adapter parameter float32
# weights, gradients and AdamW's two moments (the full profiles count 16 per parameter).
LORA_BASE_STATE_BYTES = 2
ADAPTER_STATE_BYTES = 16


@dataclass(frozen=True)
class LoraCosts:
    """What ``model.lora`` does to one profile's costs (see the module's docstring)."""

    base_params: int
    adapter_params: int
    sync: str  # model.lora.sync
    sync_bytes: float  # one weight sync of this run
    full_sync_bytes: float  # one weight sync of a full-parameter run (bf16)
    weight_sync_s: float
    colocated_sync_s: float | None
    train_speedup: float  # train_tok_s factor

    @property
    def sync_share(self) -> float:
        return self.sync_bytes / self.full_sync_bytes

    @property
    def state_bytes_per_param(self) -> float:
        adapters = ADAPTER_STATE_BYTES * self.adapter_params
        return (LORA_BASE_STATE_BYTES * self.base_params + adapters) / self.base_params


def _shape(model: ModelProfile, recipe: ModelConfig) -> ModelShape:
    """The profile's model (``qwen3-8b`` is the table's Qwen3-8B), else ``model.path``'s."""
    for name in (model.name, recipe.path):
        try:
            return model_shape(name)
        except ArchitectureError:
            continue
    raise ProfileError(
        f"model {model.name}: model.lora needs the model's shape for the adapter's size, and "
        f"neither {model.name!r} nor model.path {recipe.path!r} has a known one"
    )


def scaled_sync_s(seconds: float, fixed_s: float, share: float) -> float:
    """A sync of ``share`` of the bytes: the fixed part, and the rest scaled."""
    fixed = min(fixed_s, seconds)
    return fixed + (seconds - fixed) * share


def lora_costs(model: ModelProfile, recipe: ModelConfig) -> LoraCosts | None:
    """The LoRA run's costs on this profile (``recipe``: the run's ``model`` section); None
    without LoRA or for a fitted profile."""
    lora = recipe.lora
    if not lora.enabled or model.params_b == 0:
        return None
    shape = _shape(model, recipe)
    try:
        adapters = lora_adapter_params(shape, lora)
    except ArchitectureError as exc:
        raise ProfileError(str(exc)) from None
    n = shape.total_params
    full = n * PROFILE_SYNC_BYTES
    # the adapters go in the dtype the weights go in (the profiles': bf16)
    sent = adapters * PROFILE_SYNC_BYTES if lora.sync == "adapter" else full
    share = sent / full
    fixed = model.weight_sync_fixed_s or 0.0
    colocated = model.colocated_sync_s
    flop = FULL_TRAIN_FLOP * n / (LORA_BASE_TRAIN_FLOP * n + ADAPTER_TRAIN_FLOP * adapters)
    return LoraCosts(
        base_params=n,
        adapter_params=adapters,
        sync=lora.sync,
        sync_bytes=sent,
        full_sync_bytes=full,
        weight_sync_s=scaled_sync_s(model.weight_sync_s, fixed, share),
        colocated_sync_s=None if colocated is None else scaled_sync_s(colocated, fixed, share),
        train_speedup=flop,
    )


def lora_profile(model: ModelProfile, recipe: ModelConfig) -> ModelProfile:
    """``model`` as a LoRA run of the ``recipe`` model section costs (the same profile
    without LoRA)."""
    costs = lora_costs(model, recipe)
    if costs is None:
        return model
    state = model.trainer_state_bytes_per_param
    return dataclasses.replace(
        model,
        weight_sync_s=costs.weight_sync_s,
        colocated_sync_s=costs.colocated_sync_s,
        train_tok_s=model.train_tok_s * costs.train_speedup,
        # the log-prob pass is a forward, as long as before: the same seconds per token
        logprob_fraction=model.logprob_fraction * costs.train_speedup,
        trainer_state_bytes_per_param=None if state is None else costs.state_bytes_per_param,
    )


def sync_bytes(model: ModelProfile, recipe: ModelConfig) -> float | None:
    """Bytes one weight sync of this run sends: the adapters, or the model in bf16 (None:
    a fitted profile, whose model is not known)."""
    costs = lora_costs(model, recipe)
    if costs is not None:
        return costs.sync_bytes
    if model.params_b == 0:
        return None
    try:
        return _shape(model, recipe).total_params * PROFILE_SYNC_BYTES
    except ProfileError:
        return model.params_b * 1e9 * PROFILE_SYNC_BYTES
