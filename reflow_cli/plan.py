"""The memory plan in the CLI: ``reflow plan RECIPE``, the plan ``launch --dry-run``
prints, and the check that refuses a recipe whose roles cannot fit on its GPUs
(runtime/config/memory_plan.py computes it; docs/memory-plan.md gives the formulas)."""

from __future__ import annotations

from pathlib import Path

from jobs.errors import UserError
from runtime.config.architectures import ArchitectureError
from runtime.config.memory_plan import (
    DEFAULT_GPU_MEMORY_BYTES,
    DTYPE_BYTES,
    GIB,
    KV_BLOCK_TOKENS,
    MemoryPlan,
    RolloutPlan,
    TrainerPlan,
    plan_memory,
)
from runtime.config.placement_fit import placement_hint
from runtime.config.schema import Config


def gpu_memory(option_gib: float | None) -> tuple[int, str]:
    """Bytes of one GPU and where the figure comes from: ``--gpu-memory-gib``, else this
    machine's first CUDA device, else the default."""
    if option_gib is not None:
        if option_gib <= 0:
            raise UserError(f"--gpu-memory-gib: {option_gib} must be above 0")
        return int(option_gib * GIB), "--gpu-memory-gib"
    # torch takes seconds to import: only where an NVIDIA driver is there to ask
    if Path("/dev/nvidiactl").exists():
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            return int(props.total_memory), f"{props.name} on this machine"
    return DEFAULT_GPU_MEMORY_BYTES, "default; --gpu-memory-gib sets it"


def runs_on_gpus(cfg: Config, backend: str | None) -> bool:
    """Whether the run's ranks get GPUs: ``resources.device: cuda``, or ``auto`` on Slurm
    (a cluster's nodes) or where this machine has CUDA. ``backend`` None (``reflow plan``):
    ``auto`` is planned for GPUs."""
    device = cfg.resources.device
    if device != "auto":
        return device == "cuda"
    if backend is None or backend == "slurm":
        return True
    if not Path("/dev/nvidiactl").exists():
        return False
    import torch

    return torch.cuda.is_available()


def make_plan(cfg: Config, gpu_bytes: int | None) -> MemoryPlan:
    try:
        return plan_memory(cfg, gpu_bytes)
    except ArchitectureError as exc:
        raise UserError(str(exc)) from None


def check_fits(cfg: Config, source: str, backend: str, option_gib: float | None) -> None:
    """Refuse (one line naming the role, needed and available) a GPU run whose plan does
    not fit. A model whose shape cannot be known is not refused: there is nothing to
    check it by (``reflow plan`` says why)."""
    if not runs_on_gpus(cfg, backend):
        return
    gpu_bytes, _ = gpu_memory(option_gib)
    try:
        plan = plan_memory(cfg, gpu_bytes)
    except ArchitectureError:
        return
    refusal = plan.refusal()
    if refusal is not None:
        raise UserError(f"{source}: {refusal}{placement_hint(cfg, plan)}")


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def _size(n: float) -> str:
    """Small figures (the embedded models) in MiB, the rest in GiB."""
    return _gib(n) if abs(n) >= GIB else f"{n / 2**20:.1f} MiB"


def _row(label: str, value: str, note: str = "") -> str:
    return f"  {label:<34} {value:>12}" + (f"   {note}" if note else "")


def _trainer_lines(t: TrainerPlan, plan: MemoryPlan) -> list[str]:
    shape = plan.model
    how = f"fsdp2 over {t.shard_ranks} ranks" if t.strategy == "fsdp2" else "replicate"
    if t.strategy == "fsdp2":
        working_note = (
            f"root unit gathered, parameters and gradients in {t.param_dtype}; 2 blocks "
            "the same + the reduce-scatter's float32 input"
        )
        reduce_note = "the root unit's reduce-scatter, after the backward"
    else:
        working_note = (
            f"autocast's {t.param_dtype} copy of the weights"
            if t.working_bytes
            else "none (float32 compute)"
        )
        reduce_note = "a float32 all-reduce bucket (or the embedding), after the backward"
    used, other = ("with", "without") if t.checkpointing else ("without", "with")
    chosen = t.activations_bytes
    unused = t.activations_full if t.checkpointing else t.activations_checkpointed
    lines = [
        f"trainer role ({how}, param_dtype {t.param_dtype}):",
        *([f"  {t.lora.line()}"] if t.lora is not None else []),
        *(_row(label, _size(n), note) for label, n, note in t.state_rows()),
        _row("working copy", _size(t.working_bytes), working_note),
        _row(
            f"activations {used} checkpointing",
            _size(chosen),
            f"{t.tokens_per_pass:,} tokens per pass ({t.tokens_note})",
        ),
        _row(
            f"  ({other} checkpointing)",
            _size(unused),
            "train.activation_checkpointing: " + ("false" if t.checkpointing else "true"),
        ),
        _row(
            "log-prob head",
            _size(t.logprob_head_bytes),
            f"train.logprob_chunk_tokens x vocabulary {shape.vocab:,}",
        ),
    ]
    if t.reserve_bytes:
        lines.append(_row("reserve", _size(t.reserve_bytes), "CUDA contexts, NCCL, sleeping vLLM"))
    lines += [
        _row("= forward/backward pass", _size(t.pass_bytes), "all of the above"),
        _row("gradient reduction", _size(t.after_backward_bytes), f"state + {reduce_note}"),
        _row("optimizer step", _size(t.optimizer_step_bytes), "state + AdamW's float32 temporary"),
        _row("total (the largest)", _size(t.total_bytes), _verdict(t.total_bytes, plan.gpu_bytes)),
    ]
    if plan.gpu_bytes is not None:

        def fit(n: int | None) -> str:
            return f"{n:,}" if n is not None else "none (one sequence does not fit)"

        lines.append(
            f"  largest train.micro_batch_tokens that fits: {fit(t.largest_pass_tokens)} "
            f"{used} checkpointing"
            + (
                ""
                if t.checkpointing
                else f", {fit(t.largest_pass_tokens_checkpointed)} with checkpointing"
            )
        )
    return lines


def _rollout_lines(r: RolloutPlan, plan: MemoryPlan, cfg: Config) -> list[str]:
    shape = plan.model
    heads = max(1, shape.kv_heads // r.tensor_parallel)
    lines = [
        f"rollout role (vLLM, tensor parallel {r.tensor_parallel}, {r.dtype}):",
        _row("weights", _size(r.weights_bytes), f"{r.dtype}, 1/{r.tensor_parallel} each"),
    ]
    if r.resident_trainer_bytes:
        lines.append(
            _row(
                "replicated trainer kept on the GPU",
                _size(r.resident_trainer_bytes),
                "float32 weights + AdamW (train.strategy: replicate)",
            )
        )
    if r.reserve_bytes:
        lines.append(_row("reserve", _size(r.reserve_bytes), "activation peak, CUDA graphs"))
    if r.kv_bytes is None:
        kv_note = "the engine's CPU default (engine.kv_cache_memory_bytes unset)"
        lines.append(_row("KV cache", "-", kv_note))
    elif r.utilization is not None:
        assert plan.gpu_bytes is not None
        kv_note = (
            f"gpu_memory_utilization {r.utilization:g} x {_gib(plan.gpu_bytes)} - weights - reserve"
        )
        lines.append(_row("KV cache", _size(r.kv_bytes), kv_note))
    else:
        lines.append(_row("KV cache", _size(r.kv_bytes), "engine.kv_cache_memory_bytes"))
    per_token = (
        f"2 x {shape.layers} layers x {heads} KV heads x {shape.head_dim} x "
        f"{DTYPE_BYTES[r.dtype]} B"
    )
    lines.append(_row("KV per token", f"{r.kv_bytes_per_token / 1024:.1f} KiB", per_token))
    tokens = r.kv_tokens
    if tokens is not None:
        lines.append(
            _row("KV tokens", f"{tokens:,}", f"in blocks of {KV_BLOCK_TOKENS}, per engine")
        )
        largest = r.largest_response_tokens
        lines.append(
            _row(
                "largest response that fits",
                f"{largest:,}",
                f"tokens, after a prompt of {r.prompt_tokens:,} (model.max_seq_len - "
                f"workload.max_response_tokens={cfg.workload.max_response_tokens})",
            )
        )
        at_once = tokens // r.max_seq_len
        fits = (
            f"fits: {at_once:,} such sequences at once"
            if r.fits_max_seq_len
            else "does NOT fit one sequence"
        )
        lines.append(_row(f"model.max_seq_len={r.max_seq_len:,}", "", fits))
    total = r.total_bytes
    if total is not None and plan.gpu_bytes is not None:
        used = r.resident_trainer_bytes + (
            int(r.utilization * plan.gpu_bytes) if r.utilization is not None else total
        )
        lines.append(_row("total", _size(used), _verdict(used, plan.gpu_bytes)))
    return lines


def _verdict(needed: int, gpu: int | None) -> str:
    if gpu is None:
        return "CPU run: nothing checked"
    return f"{'fits in' if needed <= gpu else 'EXCEEDS'} {_gib(gpu)}"


def plan_lines(cfg: Config, plan: MemoryPlan, gpu_source: str | None) -> list[str]:
    """The plan as text lines (plain: no markup, to read or compare exactly)."""
    shape = plan.model
    where = (
        f"{_gib(plan.gpu_bytes)} per GPU ({gpu_source})"
        if plan.gpu_bytes is not None
        else "a CPU run (resources.device: cpu): figures only, no GPU to check against"
    )
    lines = [
        f"memory plan: {shape.name}, {shape.total_params:,} parameters "
        f"(shape from {shape.source}); {where}",
    ]
    if plan.trainer is not None:
        lines += _trainer_lines(plan.trainer, plan)
    else:
        lines.append(f"trainer role: engine.trainer {cfg.engine.trainer} holds no model")
    if plan.rollout is not None:
        lines += _rollout_lines(plan.rollout, plan, cfg)
    else:
        lines.append(f"rollout role: engine.rollout {cfg.engine.rollout} holds no model")
    lines += plan_eval_lines(cfg)
    refusal = plan.refusal()
    if plan.gpu_bytes is not None:
        verdict = f"refused at launch: {refusal}{placement_hint(cfg, plan)}" if refusal else "fits"
        lines.append(f"verdict: {verdict}")
    return lines


def plan_eval_lines(cfg: Config) -> list[str]:
    """The held-out evals' share of the episodes generated, before launch: a round's
    episodes (every set's first ``eval.max_prompts`` prompts, once greedily and ``eval.k``
    times sampled) against the fresh samples generated between two rounds (at least
    ``1 - sigma`` of each batch). A share of episodes, so of tokens when eval responses are
    as long as training ones; the GPU time is the simulator's (``reflow simulate``)."""
    sets = cfg.data.eval or {}
    if not sets:
        return []
    per_round = len(sets) * cfg.eval.max_prompts * (1 + cfg.eval.k)
    if not cfg.evals_on_rollout:
        where = "by the trainer leader; training waits"
    elif cfg.reflow.policy.colocated:
        where = "on every rollout engine, in a rollout phase that waits for them"
    else:
        where = "on a rollout replica pinned to one policy version; training goes on"
    lines = [
        f"held-out evals ({where}):",
        f"  per round {per_round:>29,}   episodes: {len(sets)} set(s) x up to "
        f"{cfg.eval.max_prompts} prompts x (1 greedy + {cfg.eval.k} sampled)",
    ]
    every = cfg.train.eval_every
    if every:
        fresh = every * cfg.train.batch_size * (1.0 - cfg.reflow.replay_share)
        lines.append(
            f"  share {per_round / (per_round + fresh):>33.2%}   of the episodes generated: a "
            f"round every {every} steps against {fresh:,.0f} fresh samples; GPU time: "
            "`reflow simulate`"
        )
    else:
        lines.append("  rounds at the start and the end only (train.eval_every: 0)")
    return lines
