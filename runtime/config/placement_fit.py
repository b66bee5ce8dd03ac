"""What a refused memory plan would fit with (runtime/config/memory_plan.py computes the
plan): the smallest FSDP2 shard group and vLLM tensor parallelism at which each role
fits, the rest of the recipe as it is, for the refusal line of ``reflow plan`` and
``reflow launch`` (docs/memory-plan.md, "When a launch is refused")."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.config.architectures import ModelShape
from runtime.config.memory_plan import MemoryPlan, plan_rollout, plan_trainer
from runtime.config.schema import Config

# The replica sizes :func:`fitting_sizes` tries: powers of two, as FSDP2 groups and vLLM's
# tensor parallelism are laid out on 8-GPU nodes.
_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass
class FittingSizes:
    """The smallest size at which each role fits (None: none tried does)."""

    trainer: int | None = None  # FSDP2 shard group, ``resources.trainer_gpus_per_replica``
    rollout: int | None = None  # vLLM tensor parallelism, ``rollout_gpus_per_replica``
    trainer_tried: int | None = None  # the largest shard group tried


def fitting_sizes(cfg: Config, gpu_bytes: int, shape: ModelShape) -> FittingSizes:
    """The smallest trainer replica group (``resources.trainer_gpus_per_replica``, FSDP2's
    shard group) and rollout replica (``rollout_gpus_per_replica``, vLLM's tensor
    parallelism) at which each role fits on GPUs of ``gpu_bytes``, the rest of the recipe
    as it is; None where no size does (a role whose memory does not shrink with more
    ranks: two gathered blocks and one sequence's activations, or a KV head per rank).
    ``trainer_tried``: the largest group tried. Without ``train.micro_batch_tokens`` a
    pass is the batch over the trainer ranks, which the recipe's layout gives: a group it
    cannot hold is not tried."""
    import copy

    from runtime.config.layout import LayoutError

    def with_sizes(**sizes: int) -> Config:
        # copies, set past the recipe's checks: a size larger than the recipe's pool of
        # ranks is what the hint may need to name (the plan reads the sizes only)
        resources = copy.copy(cfg.resources)
        for name, value in sizes.items():
            setattr(resources, name, value)
        out = copy.copy(cfg)
        out.resources = resources
        return out

    out = FittingSizes()
    if cfg.engine.trainer == "torch" and cfg.train.strategy == "fsdp2":
        for n in _SIZES:
            try:
                t = plan_trainer(with_sizes(trainer_gpus_per_replica=n), shape, gpu_bytes)
            except LayoutError:
                break
            out.trainer_tried = n
            if t.total_bytes <= gpu_bytes:
                out.trainer = n
                break
    if cfg.engine.rollout == "vllm":
        for tp in _SIZES[:5]:  # up to 16: one engine on at most two nodes
            plan = MemoryPlan(
                shape,
                gpu_bytes,
                None,
                plan_rollout(with_sizes(rollout_gpus_per_replica=tp), shape, gpu_bytes),
            )
            if plan.refusal() is None:
                out.rollout = tp
                break
    return out


def placement_hint(cfg: Config, plan: MemoryPlan) -> str:
    """What a refused plan would fit with, for its refusal line ("" when it fits or no GPU
    size is known)."""
    if plan.gpu_bytes is None or plan.refusal() is None:
        return ""
    sizes = fitting_sizes(cfg, plan.gpu_bytes, plan.model)
    res = cfg.resources
    fixes, nowhere = [], []
    t_refused = plan.trainer is not None and plan.trainer.total_bytes > plan.gpu_bytes
    if t_refused and cfg.train.strategy == "fsdp2":
        n = sizes.trainer
        if n is not None:
            fixes.append(
                f"resources.trainer_gpus_per_replica={n} (now {res.trainer_gpus_per_replica})"
            )
        else:
            nowhere.append(
                f"the trainer fits at no shard group size up to {sizes.trainer_tried}: "
                "what a rank holds besides its shard (two gathered blocks, one pass's "
                "activations) exceeds the GPU (fewer train.micro_batch_tokens, shorter "
                "sequences or larger GPUs)"
            )
    r_alone = MemoryPlan(plan.model, plan.gpu_bytes, None, plan.rollout)
    if plan.rollout is not None and r_alone.refusal() is not None:
        tp = sizes.rollout
        if tp is not None:
            fixes.append(
                f"resources.rollout_gpus_per_replica={tp} (now {res.rollout_gpus_per_replica})"
            )
        else:
            nowhere.append("the rollout role fits at no tensor parallelism up to 16")
    out = "; would fit with " + " and ".join(fixes) if fixes else ""
    return out + "".join(f"; {x}" for x in nowhere)
