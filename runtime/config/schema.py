"""The typed configuration tree of a run: one dataclass per recipe section.

A recipe (YAML) is turned into a :class:`Config` by :mod:`runtime.config.recipe`, which
checks every key, type and range using the metadata each field declares
(:func:`runtime.config.fields.opt`), then the cross-field rules in
:func:`runtime.config.feasibility.check_feasible`. The LoRA section is in
:mod:`runtime.config.lora_config`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from runtime.config import modes
from runtime.config.engine_names import EVAL_ROLLOUT_ENGINES
from runtime.config.fields import opt
from runtime.config.lora_config import LoraConfig
from runtime.config.modes import BASELINES as BASELINES
from runtime.config.modes import DEFAULT_MODE, MODES, ModePolicy
from runtime.config.workload_kinds import KIND_NAMES

# The execution modes: their names and what each does are declared in
# runtime/config/modes.py (one ModePolicy per mode; ``ReflowConfig.policy`` is the run's).
# Each baseline keeps its placement and fixed caps (``BASELINE_FIXED``); ``reflow`` adds
# replay, the allocator and adaptive caps (docs/architecture.md, "Execution modes").
# Modes renamed since a recipe may have been written: the one-line error says to what.
RENAMED_MODES = {"sync": "disaggregated_sync (the colocated baseline is colocated_sync)"}
# What a baseline mode leaves out, as part of its definition: a recipe asking for one of
# these in a baseline mode is refused rather than run as something else.
BASELINE_FIXED = {
    "scheduler.auto_rebalance": "the baselines keep their placement",
    "scheduler.adaptive_caps": "the baselines keep fixed concurrency caps",
    "scheduler.lend_trainer": "the baselines never lend their trainer",
}


@dataclass
class ModelConfig:
    path: str = opt(
        "embedded:tiny-qwen3",
        "Hugging Face folder, embedded:tiny-qwen3 (arithmetic; embedded:tiny-qwen3-moe its "
        "mixture of experts, embedded:tiny-qwen3-moe-sft80 the same after the dense model's "
        "80 SFT steps, embedded:tiny-qwen3-sft86 the dense one after 86, "
        "embedded:tiny-qwen3-moe-upcycled the dense one upcycled into 4 experts) or "
        "embedded:tiny-qwen3-chat (text)",
    )
    dtype: str = opt("float32", "parameter dtype", choices=("float32", "bfloat16", "float16"))
    max_seq_len: int = opt(512, "prompt + response token limit", ge=16)
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class TrainFile:
    """One file of a weighted mix (``data.train`` as a list)."""

    path: str = opt("", "a JSONL/JSON/Parquet file or a dataset folder (required)")
    weight: float = opt(1.0, "its share of the prompts, relative to the other files'", gt=0)


@dataclass
class DataConfig:
    train: str | list[TrainFile] = opt(
        "embedded:synthetic",
        "training prompts: embedded:NAME, a JSONL/JSON/Parquet file, a folder written by "
        "datasets' save_to_disk (one split), a folder of Parquet shards, or a list of "
        "{path, weight}: files mixed by weight (runtime/data/prompts.py; checked at launch)",
    )
    eval: dict[str, str] | str | None = opt(
        {},
        "named held-out sets, name -> file (same formats as train), e.g. {gsm8k: test.jsonl}; "
        "one file alone is a set named after it: "
        "each is played by the workload's agent and reward, greedy and eval.k samples, at the "
        "start, every train.eval_every steps and at the end (runtime/workloads/eval_sets.py)",
    )
    format: str = opt(
        "auto",
        "file format; auto = from the name (.jsonl, .json, .parquet, optionally .gz) or the "
        "folder (state.json: hf_disk; .parquet files: parquet)",
        choices=("auto", "jsonl", "json", "parquet", "hf_disk"),
    )
    fields: dict[str, str] = opt(
        {}, "role -> the file's field name, e.g. {prompt: question} (runtime/data/datasets.py)"
    )
    shuffle: bool = opt(True, "shuffle file prompts each epoch (seeded by train.seed)")
    prompt_template: str = opt(
        "{prompt}", "the first user message; {field} is any record field or role"
    )

    def __post_init__(self) -> None:
        # one file (and null: how configs saved before named sets wrote no eval) as sets
        if self.eval is None:
            self.eval = {}
        elif isinstance(self.eval, str):
            self.eval = {Path(self.eval).name.split(".")[0] or "eval": self.eval}

    @property
    def embedded(self) -> bool:
        """Whether the training prompts are generated (``embedded:NAME``), not read."""
        return isinstance(self.train, str) and self.train.startswith("embedded:")

    def files(self) -> list[TrainFile]:
        """The training files with their weights (none for an embedded source)."""
        if isinstance(self.train, str):
            return [] if self.embedded else [TrainFile(self.train, 1.0)]
        return list(self.train)


@dataclass
class WorkloadConfig:
    kind: str = opt("arith", "agent loop", choices=KIND_NAMES)
    max_response_tokens: int = opt(256, "generation limit per turn", ge=1)
    max_turns: int = opt(
        1,
        "model turns per episode: code attempts (code_agent), tool calls + 1 (tool_reasoning)",
        ge=1,
    )
    reward_timeout_s: float = opt(
        10.0, "wall-clock limit of one reward or tool computation; then it scores 0", gt=0
    )
    agent: str | None = opt(
        None,
        "kind custom: your own environment, PATH.py:Class or module:Class with reset(record, "
        "tools) and step(action) -> Step (runtime/workloads/agents/environment.py)",
    )
    reward_fn: str | None = opt(
        None,
        "your own reward, PATH.py:NAME or module:NAME, called as verl calls one (keyword "
        "arguments data_source, solution_str, ground_truth, extra_info; returns a float or a "
        "dict with score): replaces the kind's reward (docs/your-task.md)",
    )
    public_tests: int = opt(
        1,
        "code_agent: tests whose failures are fed back (at most total - 1); the final reward uses "
        "the rest",
        ge=0,
    )
    tool_open: str = opt("<code>", "tool_reasoning: text that opens a code block")
    tool_close: str = opt("</code>", "tool_reasoning: text that closes it (a stop string)")


@dataclass
class AlgorithmConfig:
    name: str = opt("grpo", "advantage estimator", choices=("grpo",))
    group_size: int = opt(8, "samples per prompt (n)", ge=1)
    temperature: float = opt(1.0, "sampling temperature", gt=0)
    clip_low: float = opt(0.2, "PPO clip epsilon below 1", ge=0, lt=1)
    clip_high: float = opt(0.28, "PPO clip epsilon above 1", ge=0)
    dual_clip_cap: float | None = opt(
        None,
        "dual clip: for negative advantages the token loss is at most this x |A| "
        "(verl's clip_ratio_c); none = off",
        gt=1,
    )
    recompute_old_logprobs: bool = opt(
        False,
        "the trainer's own log-probs of the batch before the step's updates are the PPO "
        "ratio's denominator (the rollout engine's are then only the behaviour policy)",
    )
    tis_cap: float | None = opt(
        None,
        "truncated importance sampling: each token's loss is weighted by "
        "min(exp(old - rollout log-prob), this); needs recompute_old_logprobs; none = off",
        gt=0,
    )
    mismatch_mask: float | None = opt(
        None,
        "mask a sample whose geometric-mean ratio exp(mean(old - rollout log-prob)) is "
        "outside [1/this, this]; needs recompute_old_logprobs; none = off",
        gt=1,
    )
    routing_replay: str = opt(
        "disabled",
        "a mixture of experts' routing replay (R3): the trainer's routers take the experts "
        "the rollout policy chose for each token (runtime/data/routes.py), for the old "
        "log-probs and the update; disabled: its own (not 'off', which YAML reads as false)",
        choices=("disabled", "rollout"),
    )
    router_aux_loss_coef: float = opt(
        0.0,
        "a mixture of experts' router load-balancing loss (transformers' "
        "load_balancing_loss_func) added to the policy loss times this; 0 = off, as the "
        "peers' RL recipes run MoE",
        ge=0,
    )
    freeze_router: bool = opt(
        False,
        "a mixture of experts' routers kept as loaded: the update trains the experts and "
        "the rest, not which experts a token goes to (prime-rl's freeze_moe_router)",
    )
    loss_agg: str = opt(
        "token_mean",
        "loss aggregation: every token counts the same, or every sample "
        "(runtime/engines/torch/loss.py)",
        choices=("token_mean", "seq_mean_token_mean"),
    )


@dataclass
class TrainConfig:
    steps: int = opt(100, "training steps of the run (one batch each)", ge=1)
    batch_size: int | None = opt(
        None,
        "samples per training batch (b); none = batch_prompts x algorithm.group_size, or 32",
        ge=1,
    )
    batch_prompts: int | None = opt(
        None, "prompts per training batch (b = batch_prompts x algorithm.group_size)", ge=1
    )
    mini_batches: int = opt(
        1,
        "optimizer updates per step: the batch is split into this many mini-batches "
        "(verl's ppo_mini_batch_size = b / mini_batches)",
        ge=1,
    )
    lr: float = opt(1e-6, "learning rate", gt=0, lt=1)
    strategy: str | None = opt(
        None,
        "data parallelism of the trainer: fsdp2 shards parameters, gradients and AdamW "
        "state within a replica group and replicates across groups (HSDP); replicate keeps a "
        "whole copy per rank; none = replicate for the tiny embedded models, else fsdp2",
        choices=("fsdp2", "replicate"),
    )
    param_dtype: str | None = opt(
        None,
        "dtype of the forward and backward (fp32 master weights and gradient reduction); "
        "none = bfloat16 on CUDA, float32 on CPU",
        choices=("float32", "bfloat16"),
    )
    activation_checkpointing: bool = opt(
        False, "recompute each decoder block's activations in the backward pass"
    )
    micro_batch_tokens: int | None = opt(
        None,
        "padded tokens per forward/backward pass; a rank's share of an update is packed "
        "into micro-batches under it and their gradients accumulate; none = one pass",
        ge=1,
    )
    logprob_chunk_tokens: int = opt(
        1024,
        "positions whose vocabulary log-softmax is computed at once (bounds the logits "
        "held in memory: chunk x vocabulary)",
        ge=1,
    )
    sync_every: int = opt(
        1,
        "steps between weight syncs to rollout; the policy version (what delta and sample "
        "ages count) goes up by one at each sync",
        ge=1,
    )
    checkpoint_every: int = opt(
        0, "steps between checkpoints (a multiple of sync_every); 0 = only at a stop", ge=0
    )
    keep_checkpoints: int = opt(3, "complete checkpoints kept (the newest)", ge=1)
    eval_every: int = opt(
        0,
        "steps between held-out evals (data.eval sets, on a pinned rollout replica or, where "
        "the rollout engines cannot play them, by the trainer leader; and the arith kind's "
        "own eval_reward); 0 = at the start and the end",
        ge=0,
    )
    seed: int = opt(0, "global seed", ge=0)

    # Versions are counted as the paper counts them: one per weight sync, so a delta of 1
    # keeps the samples of the latest and the one-earlier published weights.
    def version_at(self, step: int) -> int:
        """The policy version after ``step`` training steps."""
        return step // self.sync_every

    def last_step_for(self, oldest_version: int, delta: int) -> int:
        """The last step whose batch may take a sample with this oldest version: step
        ``s`` samples at ``version_at(s - 1)``, which may be at most ``delta`` newer."""
        return (oldest_version + delta + 1) * self.sync_every


# The batch samplers registered by name (runtime/control/samplers.py SAMPLERS); any other
# value of reflow.sampler is a dotted path to a user's class.
BUILTIN_SAMPLERS = ("random", "medium_reward")


@dataclass
class ReflowConfig:
    mode: str = opt(
        DEFAULT_MODE,
        "execution mode: the baselines colocated_sync, disaggregated_sync, one_step_off, async "
        "(docs/architecture.md) or reflow",
        choices=MODES,
        renamed=RENAMED_MODES,
    )
    B_max: int | None = opt(None, "max samples in flight at rollout; none = batch_size", ge=1)
    B_max_per_gpu: int | None = opt(
        None,
        "B_max as samples per GPU of the allocation (B_max = this x nodes x gpus_per_node), "
        "so that what may be in flight grows with the cluster; none = B_max as given",
        ge=1,
    )
    sigma: float | None = opt(
        None, "max replay fraction of a batch; none = 0.5 (reflow) or 0 (others)", ge=0, lt=1
    )
    tau: float = opt(0.5, "loss weight of replayed samples", gt=0, le=1)
    delta: int = opt(1, "max policy-version age of a sample", ge=0)
    sampler: str = opt("random", "batch sampler: random, medium_reward or a dotted path")
    replay_filter: str = opt("accept_all", "replay filter: accept_all or a dotted path")
    fresh_order: str | None = opt(
        None,
        "which unused samples a batch takes: oldest (oldest version first, then arrival: "
        "none left to expire for a newer one) or sampler (the sampler's select); none = "
        "oldest with a built-in sampler, sampler with one of your own",
        choices=("oldest", "sampler"),
    )
    max_stragglers: int | None = opt(
        None,
        "members a group may still lack when a batch is the last that delta lets take its "
        "finished ones: it then trains without them (advantages over the members in) and "
        "drops them when they arrive; none = 1 (reflow) or 0 (the baselines: a group "
        "waits for all its members)",
        ge=0,
    )
    age_from: str = opt(
        "oldest_span",
        "the version a partial rollout's age counts from for delta: oldest_span, or "
        "newest_span (older spans' tokens then rely on the loss's importance ratios)",
        choices=("oldest_span", "newest_span"),
    )

    @property
    def policy(self) -> ModePolicy:
        """What the run's mode does (runtime/config/modes.py): ask it, not the mode's name."""
        return modes.policy(self.mode)

    @property
    def replays(self) -> bool:
        """Batches replay samples: the mode allows it and sigma > 0 (the one place this is
        decided; a validated recipe has sigma 0 where the mode does not replay)."""
        return self.policy.replay and (self.sigma or 0.0) > 0

    @property
    def stragglers_allowed(self) -> int:
        """``max_stragglers``, or the mode's default where the recipe leaves it unset: 1
        in reflow, 0 in a baseline (which waits for whole groups)."""
        if self.max_stragglers is not None:
            return self.max_stragglers
        return 0 if self.policy.baseline else 1

    @property
    def replay_share(self) -> float:
        """sigma where the run replays, else 0."""
        return float(self.sigma or 0.0) if self.replays else 0.0


@dataclass
class ResourcesConfig:
    nodes: int = opt(1, "nodes of the allocation", ge=1)
    gpus_per_node: int = opt(4, "ranks (GPUs) per node; on CPU, worker processes", ge=1)
    trainer_gpus_per_replica: int = opt(1, "ranks of one trainer replica group", ge=1)
    rollout_gpus_per_replica: int = opt(1, "ranks of one rollout replica (tensor parallel)", ge=1)
    initial_ratio: str | None = opt(
        None, "rollout:trainer ranks at start, e.g. 24:8; none = from rollout_fraction"
    )
    rollout_fraction: float = opt(
        0.5, "share of ranks for rollout at start when initial_ratio is none", gt=0, lt=1
    )
    device: str = opt("auto", "accelerator", choices=("auto", "cpu", "cuda"))
    torch_threads: int = opt(1, "torch intra-op threads per rank", ge=1)


@dataclass
class SchedulerConfig:
    auto_rebalance: bool = opt(False, "let the allocator move replica groups (docs/scheduling.md)")
    cooldown_steps: int = opt(5, "min training steps between two placement changes", ge=0)
    window_steps: int = opt(5, "training steps the allocator measures rates over", ge=1)
    rebalance_margin: float = opt(0.1, "a new placement's least gain in |log coverage|", ge=0)
    adaptive_caps: bool = opt(False, "AIMD control of each rollout rank's cap by its engine load")
    cap_interval_s: float = opt(2.0, "seconds between two cap updates of a rank", gt=0)
    token_admission: bool = opt(
        True, "admit a request only if its expected tokens fit the engine's KV budget"
    )
    min_concurrency: int = opt(1, "lower bound of a rollout rank's cap", ge=1)
    max_concurrency: int = opt(256, "upper bound of a rollout rank's cap (its start value)", ge=1)
    target_kv_util: float = opt(
        0.8, "AIMD: the cap grows while KV utilisation is below this minus 0.1", gt=0, le=1
    )
    lend_trainer: bool = opt(False, "lend the waiting trainer to rollout (docs/scheduling.md)")
    lend_margin: float = opt(1.5, "lend when the wait is this many switch round trips", ge=1, le=8)
    lend_estimate_s: float = opt(10.0, "a lend's switch cost until one is measured, s", gt=0)


@dataclass
class EngineConfig:
    rollout: str = opt("vllm", "rollout engine (registry name)")
    trainer: str = opt("torch", "trainer engine (registry name)")
    kv_cache_memory_bytes: int | None = opt(None, "KV-cache size; none = engine default", ge=1)
    gpu_memory_utilization: float | None = opt(
        None, "vLLM's share of a GPU's memory; none = vLLM's default (0.92)", gt=0, le=1
    )
    max_num_seqs: int = opt(256, "engine's max running sequences", ge=1)
    enforce_eager: bool = opt(True, "disable graph capture / compilation")
    weight_bucket_mb: float = opt(
        32.0, "bucket size of weight and trainer-state broadcasts (torch.distributed)", gt=0
    )
    synthetic_token_s: float = opt(0.0004, "synthetic rollout: seconds per generated token", ge=0)
    synthetic_train_token_s: float = opt(
        0.0, "synthetic trainer: seconds per trained token, split over trainer ranks", ge=0
    )
    synthetic_kv_tokens: int = opt(
        0,
        "synthetic rollout: token budget of running generations (longer responses, fewer "
        "at once); 0 = no limit",
        ge=0,
    )
    synthetic_length_schedule: dict[str, float] = opt(
        {},
        "synthetic rollout: response-length multiplier by policy version, linear between "
        "points, e.g. {0: 1, 30: 4, 60: 1}",
    )


@dataclass
class SandboxConfig:
    isolation: str = opt(
        "auto",
        "bwrap (namespaces, seccomp, cgroup, rlimits, own uid) or rlimits (+ cgroup) only; "
        "auto = bwrap if installed",
        choices=("auto", "bwrap", "rlimits"),
    )
    python: str = opt(
        "/usr/bin/python3", "interpreter of sandboxed programs (under /usr with bwrap)"
    )
    test_timeout_s: float = opt(6.0, "wall-clock limit of one test case", gt=0)
    memory_mb: int = opt(1024, "address space per process (RLIMIT_AS)", ge=64)
    max_processes: int = opt(
        16, "processes per program (RLIMIT_NPROC of its own uid, and its cgroup's pids.max)", ge=1
    )
    file_size_mb: int = opt(16, "largest file a program may write (RLIMIT_FSIZE)", ge=1)
    scratch_mb: int = opt(
        64, "size of each of the program's writable tmpfs mounts (/sandbox, /tmp, /dev/shm)", ge=1
    )
    output_kb: int = opt(1024, "stdout + stderr kept; more kills the program", ge=1)
    parallel: int = opt(4, "test cases of one program run at once", ge=1)
    reward_workers: int = opt(2, "processes computing rewards next to each rollout engine", ge=1)
    concurrency: int | None = opt(
        None,
        "sandbox calls one rollout engine runs at once; none = scheduler.max_concurrency",
        ge=1,
    )
    running: int | None = opt(
        None, "sandboxed programs running at once on a node, all ranks'; none = its CPUs", ge=1
    )
    # 0x78000000: a range no account scheme uses (runtime/workloads/sandbox/uids.py)
    uid_base: int = opt(2013265920, "first uid of the node's pool for sandboxed programs", ge=1000)
    uid_slots: int | None = opt(
        None,
        "uids in the node's pool, one per sandboxed process running at once; none = rollout "
        "engines per node x concurrency x max(2, parallel)",
        ge=2,
    )


@dataclass
class SlurmConfig:
    partition: str | None = opt(None, "partition (-p)")
    account: str | None = opt(None, "account (-A)")
    qos: str | None = opt(None, "quality of service")
    constraint: str | None = opt(None, "node features (-C)")
    time_min: int = opt(60, "time limit in minutes", ge=1)
    cpus_per_task: int = opt(8, "CPUs per rank", ge=1)
    mem_gb: int | None = opt(None, "memory per node in GB; none = cluster default", ge=1)
    exclusive: bool = opt(False, "exclusive nodes")
    additional: dict[str, str] = opt({}, "extra sbatch parameters (name: value)")


@dataclass
class ControlConfig:
    heartbeat_interval_s: float = opt(1.0, "worker heartbeat period", gt=0)
    heartbeat_timeout_s: float = opt(15.0, "silence after which a rank is declared dead", gt=0)
    register_timeout_s: float = opt(300.0, "time for all ranks to register", gt=0)
    stop_grace_s: float = opt(30.0, "time ranks get to leave after a stop", gt=0)
    max_restarts: int = opt(
        0,
        "automatic restarts from the last checkpoint after a rank is lost mid-training "
        "(Slurm: requeue; local: resubmit)",
        ge=0,
    )
    checkpoint_timeout_s: float = opt(
        300.0, "time the trainer leader gets to write its part of a checkpoint", gt=0
    )
    max_generation_failures: int = opt(
        64, "a rank's generations failing in a row that fail the run (0: never)", ge=0
    )
    collective_timeout_s: float = opt(
        300.0, "torch.distributed timeout: a rank that never joins a collective fails it", gt=0
    )
    peer_timeout_s: float | None = opt(
        None,
        "a weight sync drops a receiver that does not take a header or a bucket this long "
        "(dead or hung; the others still get the weights); none = a third of "
        "heartbeat_timeout_s. Below heartbeat_timeout_s, since the leader does not beat "
        "while it waits",
        gt=0,
    )
    request_timeout_s: float = opt(
        1800.0,
        "a generation request out this long is requeued (lost on the way, or an engine that "
        "hangs while its rank heartbeats); long agent episodes need a longer one",
        gt=0,
    )
    step_timeout_s: float = opt(
        3600.0, "a batch in training this long without a step report fails the run", gt=0
    )

    @property
    def peer_wait_s(self) -> float:
        """The weight sync's wait on one receiver: ``peer_timeout_s``, or a third of the
        heartbeat timeout (so a user who shortens the heartbeat gets a valid recipe)."""
        if self.peer_timeout_s is not None:
            return self.peer_timeout_s
        return self.heartbeat_timeout_s / 3


@dataclass
class LoggingConfig:
    runs_dir: str = opt("runs", "where run folders are created (env REFLOW_RUNS_DIR wins)")
    level: str = opt("INFO", "log level", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    tensorboard: bool = opt(False, "write TensorBoard event files to the run's tensorboard/")
    wandb: bool = opt(False, "log each step to Weights & Biases (needs the wandb package)")
    wandb_project: str = opt("reflow", "W&B project")
    wandb_mode: str = opt(
        "online",
        "W&B mode: offline keeps the run under the run folder",
        choices=("online", "offline"),
    )
    samples: bool = opt(
        False, "write every delivered trajectory (tokens, loss mask, reward) to samples.jsonl"
    )


@dataclass
class EvalConfig:
    """How the ``data.eval`` sets are played (runtime/workloads/eval_sets.py)."""

    k: int = opt(4, "sampled episodes per prompt, for mean@k and pass@k", ge=1, le=64)
    temperature: float = opt(1.0, "sampling temperature of those k episodes", gt=0)
    max_prompts: int = opt(64, "prompts per set: the first ones of its file, in order", ge=1)
    solved_at: float = opt(1.0, "an episode with at least this reward counts as solved (pass@k)")
    timeout_s: float = opt(
        1800.0, "an eval round on the rollout engines longer than this ends incomplete", gt=0
    )


@dataclass
class Config:
    """A whole run. Sections map one to one onto the recipe's top-level keys."""

    name: str = opt("run", "run name (prefix of the run folder)")
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    reflow: ReflowConfig = field(default_factory=ReflowConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    control: ControlConfig = field(default_factory=ControlConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    @property
    def world_size(self) -> int:
        return self.resources.nodes * self.resources.gpus_per_node

    @property
    def evals_on_rollout(self) -> bool:
        """Whether the rollout engines play the ``data.eval`` sets (rank 0's eval rounds,
        runtime/control/evals.py), not the trainer leader: wherever they can (in
        colocated_sync, inside a rollout phase, on every engine)."""
        return bool(self.data.eval) and self.engine.rollout in EVAL_ROLLOUT_ENGINES


# Engine pairs whose trainer broadcasts weights to the rollout engines over
# torch.distributed: every rank joins the run's process group for them (and a rank of such
# a group cannot be lost without the group: runtime/control/coordinator.py).
WEIGHT_TRANSPORT: frozenset[tuple[str, str]] = frozenset({("vllm", "torch")})


# Trainer engines whose ranks each train their own share of a batch (data parallel): rank
# 0 sends each trainer rank only the samples its micro-batch plan gives it. The others
# train the whole batch on the leader and get it whole.
DATA_PARALLEL_TRAINERS = frozenset({"torch"})


def needs_collective(cfg: Config) -> bool:
    return (cfg.engine.rollout, cfg.engine.trainer) in WEIGHT_TRANSPORT
