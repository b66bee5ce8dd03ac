"""GPU memory per rank, worked out from a recipe before anything starts.

For each role a rank can hold, :func:`plan_memory` adds up what that role keeps on one GPU:

- **trainer**: float32 master weights, float32 gradients and AdamW's two float32 moments,
  divided over the FSDP2 shard group (``resources.trainer_gpus_per_replica``; whole under
  ``replicate``), FSDP2's unsharded working copy, the activations of one forward/backward
  pass (``train.micro_batch_tokens``, with and without ``train.activation_checkpointing``),
  the chunked log-prob head and a fixed reserve. With ``model.lora`` (rank > 0) the base
  is frozen in the compute dtype (no master copy, gradients or AdamW state) and only the
  adapters carry float32 weights, gradients and moments
  (:class:`runtime.config.lora_memory.LoraPlan`, which counts them);
- **rollout**: vLLM's weights in ``model.dtype`` over the tensor-parallel size, its KV cache
  (``gpu_memory_utilization`` x GPU memory - weights - a fixed reserve, or
  ``engine.kv_cache_memory_bytes``), the KV tokens that gives and the longest response
  that fits.

:meth:`MemoryPlan.refusal` is the one line a launch is refused with. Every formula and
its assumption is written out in docs/memory-plan.md; the numbers are estimates of the
allocations, not measurements, and the reserves are deliberately round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from runtime.config.architectures import ModelShape, model_shape
from runtime.config.layout import initial_layout
from runtime.config.lora_memory import (
    LoraPlan,
    lora_activation_bytes_per_token,
    lora_adapter_params,
    lora_module_shapes,
    lora_plan,
    vllm_lora_slot_bytes,
)
from runtime.config.schema import Config

GIB = 1024**3
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# What the plan assumes when no GPU says otherwise (H100/H800: 80 GB; `--gpu-memory-gib`).
DEFAULT_GPU_MEMORY_BYTES = 80 * GIB
# runtime/engines/vllm/rollout.py gives vLLM no gpu_memory_utilization, so the engine runs
# with vLLM's own default: CacheConfig.gpu_memory_utilization in vllm/config/cache.py
# (0.92 in vLLM 0.32; tests/unit/test_memory_plan.py reads the installed value).
VLLM_GPU_MEMORY_UTILIZATION = 0.92
# vLLM's memory outside weights and KV: the profiled activation peak, CUDA graphs, the
# CUDA context and NCCL. Qwen3-8B on one H100 at utilization 0.9 reported 377,024 KV tokens,
# which leaves about 4.2 GiB for these (../shared/notes/cluster-profile.md section 2).
ROLLOUT_RESERVE_BYTES = 4 * GIB
# A trainer rank's GPU besides its tensors: two CUDA contexts (the rank and its sleeping
# vLLM engine's process), NCCL communicators, the sleeping engine's CUDA graphs, and
# slack for the caching allocator's fragmentation.
TRAINER_RESERVE_BYTES = 3 * GIB
KV_BLOCK_TOKENS = 16  # vLLM allocates the KV cache in blocks of this many tokens
# Bytes per logit of one log-prob chunk: the head's output in param_dtype, its float32
# copy, the temperature-scaled copy and logsumexp's float32 workspace (or, in the
# backward, the logits' gradient): runtime/engines/torch/logprobs.py.
_LOGIT_BYTES_BESIDES_OUTPUT = 12


@dataclass(frozen=True)
class TrainerPlan:
    strategy: str
    shard_ranks: int  # ranks a parameter is divided over (1 under replicate)
    param_dtype: str
    params_bytes: int  # float32 master weights on this GPU
    grads_bytes: int  # float32 gradients
    optimizer_bytes: int  # AdamW exp_avg + exp_avg_sq, float32
    working_bytes: int  # FSDP2: unsharded units; replicate: autocast's cast weights
    reduce_bytes: int  # the gradient reduction after the backward, activations freed
    tokens_per_pass: int
    tokens_note: str  # where tokens_per_pass comes from
    checkpointing: bool  # the recipe's train.activation_checkpointing
    activations_checkpointed: int
    activations_full: int
    logprob_head_bytes: int
    reserve_bytes: int
    largest_pass_tokens: int | None  # the most tokens per pass that fit (None: CPU run)
    largest_pass_tokens_checkpointed: int | None
    lora: LoraPlan | None = None  # model.lora: params_bytes = base_bytes + adapter_bytes
    base_bytes: int = 0  # LoRA: the frozen base's shard in base_dtype (no grads, no AdamW)
    adapter_bytes: int = 0  # LoRA: the float32 adapters' shard

    @property
    def activations_bytes(self) -> int:
        return self.activations_checkpointed if self.checkpointing else self.activations_full

    @property
    def state_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def optimizer_step_bytes(self) -> int:
        """AdamW's step (foreach, the CUDA default) holds a float32 temporary per local
        parameter (the sqrt of exp_avg_sq) next to the state; activations are gone then.
        A LoRA run's AdamW steps the adapters only."""
        trained = self.adapter_bytes if self.lora is not None else self.params_bytes
        return self.state_bytes + trained + self.reserve_bytes

    def state_rows(self) -> list[tuple[str, int, str]]:
        """(label, bytes, note) of the state on this GPU, as the plan prints it."""
        share = f"1/{self.shard_ranks} each" if self.shard_ranks > 1 else "whole"
        lora = self.lora
        if lora is None:
            return [
                ("parameters (float32 master)", self.params_bytes, share),
                ("gradients (float32)", self.grads_bytes, share),
                ("AdamW state (2 x float32)", self.optimizer_bytes, share),
            ]
        return [
            (
                f"frozen base ({lora.base_dtype})",
                self.base_bytes,
                f"{share}; no gradients, no AdamW state",
            ),
            (
                f"LoRA adapters r={lora.rank} (float32)",
                self.adapter_bytes,
                f"{share} of {lora.adapter_params:,} parameters",
            ),
            ("adapter gradients (float32)", self.grads_bytes, share),
            ("adapter AdamW state (2 x float32)", self.optimizer_bytes, share),
        ]

    @property
    def pass_bytes(self) -> int:
        return (
            self.state_bytes
            + self.working_bytes
            + self.activations_bytes
            + self.logprob_head_bytes
            + self.reserve_bytes
        )

    @property
    def after_backward_bytes(self) -> int:
        return self.state_bytes + self.reduce_bytes + self.reserve_bytes

    @property
    def total_bytes(self) -> int:
        """The peak of the three phases: the pass, the last gradient reduction, the step."""
        return max(self.pass_bytes, self.after_backward_bytes, self.optimizer_step_bytes)


@dataclass(frozen=True)
class RolloutPlan:
    tensor_parallel: int
    dtype: str
    weights_bytes: int  # this GPU's share of the engine's weights
    resident_trainer_bytes: int  # replicate: the trainer's copy that stays on every rank
    reserve_bytes: int
    utilization: float | None  # None when engine.kv_cache_memory_bytes sets the KV cache
    kv_bytes: int | None  # None: a CPU run with the engine's default KV cache
    kv_bytes_per_token: int  # on this GPU
    max_seq_len: int
    prompt_tokens: int  # the prompt room the recipe leaves: max_seq_len - max_response_tokens

    @property
    def kv_tokens(self) -> int | None:
        if self.kv_bytes is None:
            return None
        blocks = max(0, self.kv_bytes) // (self.kv_bytes_per_token * KV_BLOCK_TOKENS)
        return blocks * KV_BLOCK_TOKENS

    @property
    def largest_response_tokens(self) -> int | None:
        """The longest response one sequence can have in the whole KV cache, after the
        prompt (the engine stops a sequence at max_seq_len anyway)."""
        tokens = self.kv_tokens
        return None if tokens is None else max(0, tokens - self.prompt_tokens)

    @property
    def fits_max_seq_len(self) -> bool | None:
        tokens = self.kv_tokens
        return None if tokens is None else tokens >= self.max_seq_len

    @property
    def sequence_kv_bytes(self) -> int:
        """KV of one sequence of model.max_seq_len on this GPU."""
        return self.kv_bytes_per_token * self.max_seq_len

    @property
    def engine_bytes(self) -> int | None:
        """What the engine takes of the GPU: its utilization share, or weights + the set
        KV cache + the reserve."""
        if self.kv_bytes is None:
            return None
        return self.weights_bytes + self.reserve_bytes + max(0, self.kv_bytes)

    @property
    def total_bytes(self) -> int | None:
        engine = self.engine_bytes
        return None if engine is None else self.resident_trainer_bytes + engine


@dataclass(frozen=True)
class MemoryPlan:
    model: ModelShape
    gpu_bytes: int | None  # None: a CPU run, nothing to check against
    trainer: TrainerPlan | None  # None: a trainer engine without a model (synthetic)
    rollout: RolloutPlan | None  # None: a rollout engine other than vLLM

    def refusal(self) -> str | None:
        """The one line a launch is refused with (role, needed, available), or None."""
        gpu = self.gpu_bytes
        if gpu is None:
            return None
        t, r = self.trainer, self.rollout
        if t is not None and t.total_bytes > gpu:
            how = (
                f"fsdp2 over {t.shard_ranks} rank{'s' if t.shard_ranks > 1 else ''}"
                if t.strategy == "fsdp2"
                else "replicate: a whole copy per rank"
            )
            hint = _trainer_hint(t, gpu)
            return (
                f"trainer role needs {_gib(t.total_bytes)} GiB per GPU, {_gib(gpu)} GiB "
                f"available ({self.model.name}, {how}){hint}"
            )
        if r is None or r.kv_bytes is None:
            return None
        where = f"{self.model.name}, TP {r.tensor_parallel}"
        if r.utilization is not None:
            budget = r.utilization * gpu
            if r.resident_trainer_bytes + budget > gpu:
                return (
                    f"rollout role needs {_gib(r.resident_trainer_bytes + budget)} GiB per "
                    f"GPU (the replicated trainer's {_gib(r.resident_trainer_bytes)} GiB that "
                    f"stays on every rank + gpu_memory_utilization {r.utilization:g} x "
                    f"{_gib(gpu)} GiB), {_gib(gpu)} GiB available ({where})"
                )
            if not r.fits_max_seq_len:
                need = r.weights_bytes + r.reserve_bytes + r.sequence_kv_bytes
                return (
                    f"rollout role needs {_gib(need)} GiB per GPU for one sequence of "
                    f"model.max_seq_len={r.max_seq_len}, {_gib(budget)} GiB available "
                    f"(gpu_memory_utilization {r.utilization:g} of {_gib(gpu)} GiB; {where})"
                )
            return None
        total = r.total_bytes
        assert total is not None
        if total > gpu:
            return (
                f"rollout role needs {_gib(total)} GiB per GPU (weights, reserve and "
                f"engine.kv_cache_memory_bytes), {_gib(gpu)} GiB available ({where})"
            )
        if not r.fits_max_seq_len:
            return (
                f"rollout role needs {_gib(r.sequence_kv_bytes)} GiB of KV cache per GPU "
                f"for one sequence of model.max_seq_len={r.max_seq_len}, "
                f"engine.kv_cache_memory_bytes gives {_gib(r.kv_bytes)} GiB ({where})"
            )
        return None


def _trainer_hint(t: TrainerPlan, gpu: int) -> str:
    """What would make the trainer role fit, for the refusal line."""
    fixed = t.state_bytes + t.working_bytes + t.reserve_bytes
    state = max(fixed, t.after_backward_bytes, t.optimizer_step_bytes)
    if state > gpu:
        fix = (
            "shard it over more ranks (resources.trainer_gpus_per_replica)"
            if t.strategy == "fsdp2"
            else "shard it (train.strategy: fsdp2)"
        )
        return f"; its state alone needs {_gib(state)} GiB: {fix}"
    if t.largest_pass_tokens_checkpointed is None:
        return "; not even one sequence of model.max_seq_len per pass fits"
    if t.checkpointing:
        return f"; train.micro_batch_tokens <= {t.largest_pass_tokens} would fit"
    if t.largest_pass_tokens is None:
        return (
            f"; with train.activation_checkpointing, train.micro_batch_tokens <= "
            f"{t.largest_pass_tokens_checkpointed} would fit"
        )
    return (
        f"; train.micro_batch_tokens <= {t.largest_pass_tokens} would fit, "
        f"<= {t.largest_pass_tokens_checkpointed} with train.activation_checkpointing"
    )


def _gib(n: float) -> str:
    return f"{n / GIB:.1f}"


def layer_activation_bytes_per_token(shape: ModelShape, p: int, r: int) -> int:
    """Bytes one decoder block saves for its backward, per token, in Hugging Face's
    implementation with the SDPA kernel given a padding mask (so GQA's k and v are
    repeated to every head): ``p`` is the compute dtype's size, ``r`` the residual
    stream's. Term by term in docs/memory-plan.md."""
    h, i, d = shape.hidden, shape.intermediate, shape.head_dim
    a, kv = shape.heads, shape.kv_heads
    norms = 2 * (4 + r + p) * h  # input and post-attention RMSNorm: fp32 input, normed, out
    # q_norm/k_norm: fp32 copy, normed, output (RoPE's input); rotate_half's output.
    # Without them RoPE's inputs (q, k) and rotate_half's outputs.
    qk = (a + kv) * d * ((4 + 3 * p) if shape.qk_norm else 2 * p)
    # rotated q; k and v repeated to every head (v is saved only so); the kernel's output
    # and its reshaped copy, o_proj's input
    attention = p * a * d * (1 + 2 + 2)
    if shape.is_moe:
        # per expert a token is routed to (transformers' Qwen3MoeExperts): its gathered
        # input, gate, silu(gate), up, their product, the expert's output before the
        # routing weight; the router's logits and their fp32 softmax. Derived from the
        # code, not measured as the dense terms were (docs/memory-plan.md)
        k, e, m = shape.experts_per_token, shape.experts, shape.moe_intermediate
        mlp = k * p * (2 * h + 4 * m) + e * (p + 4)
    else:
        mlp = 4 * p * i  # gate, silu(gate), up, their product
    return norms + qk + attention + mlp


def activation_bytes(
    shape: ModelShape,
    tokens: int,
    max_seq_len: int,
    p: int,
    r: int,
    checkpointed: bool,
    extra_per_layer: int = 0,
) -> int:
    """One forward/backward pass of ``tokens`` padded tokens (rows of at most
    ``max_seq_len``), the log-prob head excluded; ``extra_per_layer``: bytes per token a
    block saves besides the base's (LoRA adapters)."""
    h = shape.hidden
    per_layer = layer_activation_bytes_per_token(shape, p, r) + extra_per_layer
    if checkpointed:  # each block keeps its input; one block is recomputed at a time
        blocks = tokens * (shape.layers * r * h + per_layer)
    else:
        blocks = tokens * shape.layers * per_layer
    # embedding output, final norm (fp32 input, normed, output), the response positions'
    # hidden states picked for the head, the residual stream's gradient in the backward
    outside = tokens * h * (r + (4 + r + p) + p + 2 * r)
    row = min(tokens, max_seq_len)
    mask = tokens * row  # the [rows, 1, row, row] boolean attention mask
    return blocks + outside + mask


def logprob_head_bytes(shape: ModelShape, tokens: int, chunk: int, p: int) -> int:
    return min(chunk, tokens) * shape.vocab * (p + _LOGIT_BYTES_BESIDES_OUTPUT)


def _pass_tokens(cfg: Config) -> tuple[int, str]:
    """Padded tokens of the largest forward/backward pass a trainer rank runs."""
    budget, longest = cfg.train.micro_batch_tokens, cfg.model.max_seq_len
    if budget is not None:
        if budget >= longest:
            return budget, f"train.micro_batch_tokens={budget}"
        return longest, (
            f"one sequence of model.max_seq_len={longest} (longer than "
            f"train.micro_batch_tokens={budget}: it gets a pass of its own)"
        )
    ranks = max(1, initial_layout(cfg).n_trainer_ranks)
    assert cfg.train.batch_size is not None  # filled in by the recipe checks
    samples = math.ceil(cfg.train.batch_size / cfg.train.mini_batches / ranks)
    return samples * longest, (
        f"train.micro_batch_tokens none: a rank's whole share of an update in one pass, "
        f"{samples} samples x model.max_seq_len={longest}"
    )


def plan_trainer(cfg: Config, shape: ModelShape, gpu_bytes: int | None) -> TrainerPlan:
    train = cfg.train
    param_dtype = train.param_dtype or ("float32" if gpu_bytes is None else "bfloat16")
    p = DTYPE_BYTES[param_dtype]
    n = shape.total_params
    sharded = train.strategy == "fsdp2"
    shards = cfg.resources.trainer_gpus_per_replica if sharded else 1
    local = math.ceil(n / shards)
    lora = lora_plan(cfg, shape, param_dtype, DTYPE_BYTES[cfg.model.dtype])
    if lora is None:
        trained, base, adapter_bytes = local, 0, 0
        params_bytes = 4 * local  # float32 master weights
    else:
        # the base frozen in param_dtype (runtime/engines/torch/lora.py), sharded as the
        # model is; only the float32 adapters have gradients and AdamW moments
        trained = math.ceil(lora.adapter_params / shards)
        base, adapter_bytes = p * local, 4 * trained
        params_bytes = base + adapter_bytes
    state = params_bytes + 12 * trained  # + float32 gradients and 2 AdamW moments
    block_adapters = lora.adapter_params // shape.layers if lora else 0
    if sharded:
        # The root unit (embedding, final norm, head) stays gathered from the forward to
        # the end of the backward (FSDP2 does not reshard the root after forward), its
        # gradients too from the head's backward on. Blocks are gathered one at a time,
        # the next one prefetched: parameters and gradients in param_dtype, and the
        # reduce-scatter's float32 input. The root's own reduction comes last, once the
        # activations are freed. LoRA: the frozen root and blocks are gathered without
        # gradients; the adapters (a unit of their own per block) as trained parameters.
        if lora is None:
            working = shape.root_params * 2 * p + 2 * shape.block_params * (2 * p + 4)
            reduce = shape.root_params * (2 * p + 4)
        else:
            adapters_unit = block_adapters * (2 * p + 4)
            working = shape.root_params * p + 2 * (shape.block_params * p + adapters_unit)
            reduce = shape.root_params * p + adapters_unit  # the first block's, last
        residual = p
    else:
        # autocast caches a cast copy of each float32 weight that trains (a LoRA run's
        # base is already in param_dtype)
        working = (lora.adapter_params if lora else n) * p if p < 4 else 0
        # the all-reduce copies gradients into float32 buckets; a tensor larger than a
        # bucket (the embedding) gets one of its own (runtime/rank/collective.py)
        bucket = int(cfg.engine.weight_bucket_mb * 2**20)
        if lora is None:
            reduce = max(bucket, 4 * shape.embedding_params)
        else:
            widest = max(sum(io) for io in lora_module_shapes(shape).values())
            reduce = max(min(bucket, 4 * lora.adapter_params), 4 * lora.rank * widest)
        # autocast leaves the float32 embedding and the residual adds in float32; a LoRA
        # run's base is in param_dtype, so is its residual stream
        residual = 4 if lora is None else p
    tokens, note = _pass_tokens(cfg)
    chunk = train.logprob_chunk_tokens
    longest = cfg.model.max_seq_len
    extra = lora_activation_bytes_per_token(shape, cfg.model.lora, p)

    def acts(t: int, checkpointed: bool) -> int:
        return activation_bytes(shape, t, longest, p, residual, checkpointed, extra)

    def pass_total(t: int, checkpointed: bool) -> int:
        head = logprob_head_bytes(shape, t, chunk, p)
        return state + working + acts(t, checkpointed) + head + TRAINER_RESERVE_BYTES

    def largest(checkpointed: bool) -> int | None:
        if gpu_bytes is None:
            return None
        if pass_total(longest, checkpointed) > gpu_bytes:
            return None  # a pass is never shorter than one sequence
        lo, hi = longest, 2 * longest  # lo fits; hi is doubled until it does not
        while pass_total(hi, checkpointed) <= gpu_bytes:
            lo, hi = hi, 2 * hi
        while hi - lo > 1:  # pass_total grows with t: the last t that fits
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if pass_total(mid, checkpointed) <= gpu_bytes else (lo, mid)
        return max(longest, lo // 1024 * 1024)  # a round figure for the recipe

    return TrainerPlan(
        strategy=train.strategy or "fsdp2",
        shard_ranks=shards,
        param_dtype=param_dtype,
        params_bytes=params_bytes,
        grads_bytes=4 * trained,
        optimizer_bytes=8 * trained,
        working_bytes=working,
        reduce_bytes=reduce,
        tokens_per_pass=tokens,
        tokens_note=note,
        checkpointing=train.activation_checkpointing,
        activations_checkpointed=acts(tokens, True),
        activations_full=acts(tokens, False),
        logprob_head_bytes=logprob_head_bytes(shape, tokens, chunk, p),
        reserve_bytes=TRAINER_RESERVE_BYTES if gpu_bytes is not None else 0,
        largest_pass_tokens=largest(train.activation_checkpointing),
        largest_pass_tokens_checkpointed=largest(True),
        lora=lora,
        base_bytes=base,
        adapter_bytes=adapter_bytes,
    )


def kv_bytes_per_token(shape: ModelShape, dtype: str, tensor_parallel: int) -> int:
    """K and V of every layer for one token on one GPU of a tensor-parallel engine (vLLM
    gives each GPU kv_heads / TP heads, and at least one: a head is replicated when the
    engine has more GPUs than KV heads)."""
    heads = max(1, shape.kv_heads // tensor_parallel)
    return 2 * shape.layers * heads * shape.head_dim * DTYPE_BYTES[dtype]


def plan_rollout(cfg: Config, shape: ModelShape, gpu_bytes: int | None) -> RolloutPlan:
    tp = cfg.resources.rollout_gpus_per_replica
    dtype = cfg.model.dtype
    weights = math.ceil(shape.total_params * DTYPE_BYTES[dtype] / tp)
    resident = 0
    lora = cfg.model.lora
    if cfg.train.strategy == "replicate" and gpu_bytes is not None:
        # every rank builds the replicated trainer on its GPU; a rank that has trained
        # keeps its AdamW state when it turns to rollout (runtime/engines/torch/trainer.py):
        # float32 weights + AdamW, or a LoRA run's frozen base + float32 adapters + AdamW
        resident = 12 * shape.total_params
        if lora.enabled:
            base_dtype = cfg.train.param_dtype or "bfloat16"
            adapters = lora_adapter_params(shape, lora)
            resident = DTYPE_BYTES[base_dtype] * shape.total_params + 12 * adapters
    weights += vllm_lora_slot_bytes(shape, lora, DTYPE_BYTES[dtype], tp)
    reserve = ROLLOUT_RESERVE_BYTES if gpu_bytes is not None else 0
    set_kv = cfg.engine.kv_cache_memory_bytes
    # engine.gpu_memory_utilization is read once the schema has it; until then the
    # engine runs at vLLM's default (runtime/engines/vllm/rollout.py passes none)
    util = getattr(cfg.engine, "gpu_memory_utilization", None) or VLLM_GPU_MEMORY_UTILIZATION
    utilization: float | None = None
    if set_kv:
        kv: int | None = set_kv
    elif gpu_bytes is None:
        kv = None  # the CPU build's own default; nothing to plan against
    else:
        utilization = util
        kv = math.floor(util * gpu_bytes) - weights - reserve
    return RolloutPlan(
        tensor_parallel=tp,
        dtype=dtype,
        weights_bytes=weights,
        resident_trainer_bytes=resident,
        reserve_bytes=reserve,
        utilization=utilization,
        kv_bytes=kv,
        kv_bytes_per_token=kv_bytes_per_token(shape, dtype, tp),
        max_seq_len=cfg.model.max_seq_len,
        prompt_tokens=cfg.model.max_seq_len - cfg.workload.max_response_tokens,
    )


def plan_memory(cfg: Config, gpu_bytes: int | None, shape: ModelShape | None = None) -> MemoryPlan:
    """The plan of a loaded recipe on GPUs of ``gpu_bytes`` each (None: a CPU run, whose
    figures are shown but checked against nothing). Raises
    :class:`runtime.config.architectures.ArchitectureError` when the model's shape cannot
    be known."""
    shape = shape or model_shape(cfg.model.path)
    trainer = plan_trainer(cfg, shape, gpu_bytes) if cfg.engine.trainer == "torch" else None
    rollout = plan_rollout(cfg, shape, gpu_bytes) if cfg.engine.rollout == "vllm" else None
    return MemoryPlan(shape, gpu_bytes, trainer, rollout)
