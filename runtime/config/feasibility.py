"""A recipe's cross-field rules (:func:`check_feasible`): what one field's value rules out
in others, and the defaults that depend on other fields, one function per concern. Each
problem is a :class:`FieldError` naming the dotted field; runtime/config/recipe.py, which
parses and builds the config, turns it into the user's one-line :class:`RecipeError`."""

from __future__ import annotations

from runtime.config.layout import LayoutError, check_split, default_split, parse_ratio
from runtime.config.schema import BASELINE_FIXED, BUILTIN_SAMPLERS, Config


class FieldError(Exception):
    """A field that cannot hold its value: the recipe loader makes it a RecipeError line
    naming the file or --set, the dotted field and ``message``."""

    def __init__(self, path: str, message: str, *, not_in_mode: str | None = None) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message
        # Set when the value is refused only because of reflow.mode (why, in a few words):
        # such a value from the recipe file yields to a mode given by --set.
        self.not_in_mode = not_in_mode


def _check_mode(cfg: Config) -> None:
    """What a mode's definition rules out (runtime.config.schema.BASELINE_FIXED), and what
    colocation needs: every rank in a trainer replica and in a rollout replica."""
    rf, res = cfg.reflow, cfg.resources
    if rf.policy.baseline:
        for dotted, why in BASELINE_FIXED.items():
            section, name = dotted.split(".")
            if getattr(getattr(cfg, section), name):
                raise FieldError(
                    dotted, f"true is not part of mode={rf.mode} ({why})", not_in_mode=why
                )
    if not rf.policy.colocated:
        return
    for name in ("trainer_gpus_per_replica", "rollout_gpus_per_replica"):
        size = getattr(res, name)
        if cfg.world_size % size:
            raise FieldError(
                f"resources.{name}",
                f"{size} does not divide the {cfg.world_size} ranks: mode=colocated_sync "
                "puts every rank in both roles",
            )


def check_feasible(cfg: Config) -> None:
    """Cross-field rules, concern by concern in this order (the first problem is the
    one reported); fills in the defaults that depend on other fields."""
    _place(cfg)
    _check_replay(cfg)
    _check_mode(cfg)
    _size_batches(cfg)
    _size_sandbox(cfg)
    _check_schedule(cfg)
    _check_eval(cfg)
    _check_trainer(cfg)
    _check_data_and_engines(cfg)
    _check_control(cfg)
    _check_logging_and_name(cfg)


def _place(cfg: Config) -> None:
    """The allocation's replica sizes and the rollout:trainer split (its default from
    ``resources.rollout_fraction``; colocated_sync has none)."""
    res, rf = cfg.resources, cfg.reflow
    if res.gpus_per_node % res.rollout_gpus_per_replica:
        raise FieldError(
            "resources.rollout_gpus_per_replica",
            f"{res.rollout_gpus_per_replica} does not divide gpus_per_node={res.gpus_per_node}",
        )
    world = cfg.world_size
    if res.trainer_gpus_per_replica > world:
        raise FieldError(
            "resources.trainer_gpus_per_replica",
            f"{res.trainer_gpus_per_replica} exceeds the {world} ranks of the allocation",
        )
    if rf.policy.colocated:
        # every rank generates, then every rank trains: no split (the run starts generating)
        # (the resolved config of a run says f"{world}:0": every rank generating first)
        if res.initial_ratio not in (None, f"{world}:0"):
            raise FieldError(
                "resources.initial_ratio",
                f"{res.initial_ratio!r} does not apply to mode=colocated_sync (every rank plays "
                "both roles in turn): leave it unset (null)",
                not_in_mode="every rank plays both roles in turn",
            )
        res.initial_ratio = f"{world}:0"
    elif res.initial_ratio is None:
        try:
            rollout, trainer = default_split(
                world,
                res.trainer_gpus_per_replica,
                res.rollout_gpus_per_replica,
                res.rollout_fraction,
            )
        except LayoutError as exc:
            raise FieldError("resources", str(exc)) from None
        res.initial_ratio = f"{rollout}:{trainer}"
    try:
        rollout, trainer = parse_ratio(res.initial_ratio)
        if not rf.policy.colocated:  # colocated has no split to check
            check_split(
                rollout,
                trainer,
                world_size=world,
                trainer_group_size=res.trainer_gpus_per_replica,
                rollout_group_size=res.rollout_gpus_per_replica,
            )
    except LayoutError as exc:
        raise FieldError("resources.initial_ratio", str(exc)) from None


def _check_replay(cfg: Config) -> None:
    """Replay and straggler closing are reflow's: a baseline refuses them (each field
    yields to a mode given by --set)."""
    rf = cfg.reflow
    if rf.sigma is None:
        rf.sigma = rf.policy.default_sigma
    elif not rf.policy.replay and rf.sigma > 0:
        raise FieldError(
            "reflow.sigma",
            f"{rf.sigma} needs mode=reflow (replay is off in mode={rf.mode})",
            not_in_mode=f"replay is off in mode={rf.mode}",
        )
    if rf.policy.baseline and (rf.max_stragglers or 0) > 0:
        raise FieldError(
            "reflow.max_stragglers",
            f"{rf.max_stragglers} needs mode=reflow (mode={rf.mode} waits for whole groups)",
            not_in_mode=f"mode={rf.mode} waits for whole groups",
        )


def _size_batches(cfg: Config) -> None:
    """The batch size (from ``batch_prompts`` where given), its mini-batches, the fresh
    order and ``B_max``."""
    rf, train = cfg.reflow, cfg.train
    group = cfg.algorithm.group_size
    if train.batch_prompts is not None:
        b = train.batch_prompts * group
        if train.batch_size is not None and train.batch_size != b:
            raise FieldError(
                "train.batch_size",
                f"{train.batch_size} != batch_prompts x group_size = "
                f"{train.batch_prompts} x {group} = {b} (give one of the two)",
            )
        train.batch_size = b
    elif train.batch_size is None:
        train.batch_size = 32
    if train.batch_size % train.mini_batches:
        raise FieldError(
            "train.mini_batches",
            f"{train.mini_batches} does not divide batch_size={train.batch_size}",
        )
    if rf.fresh_order is None:  # a sampler of one's own chooses its fresh samples too
        rf.fresh_order = "oldest" if rf.sampler in BUILTIN_SAMPLERS else "sampler"
    if rf.B_max_per_gpu is not None:
        # in flight grows with the cluster (the whole world: ranks switch roles)
        derived = rf.B_max_per_gpu * cfg.world_size
        if rf.B_max is not None and rf.B_max != derived:  # equal: a run's saved config
            raise FieldError(
                "reflow.B_max_per_gpu",
                f"set with reflow.B_max={rf.B_max}: give one of the two",
            )
        rf.B_max = derived
    if rf.B_max is None:
        rf.B_max = train.batch_size


def _check_schedule(cfg: Config) -> None:
    """Runs end, and checkpoints are taken, at sync points."""
    train = cfg.train
    if train.steps % train.sync_every:
        raise FieldError(
            "train.steps",
            f"{train.steps} is not a multiple of sync_every={train.sync_every} "
            "(a run ends at a sync point, where its last policy version is published)",
        )
    if train.checkpoint_every and train.checkpoint_every % train.sync_every:
        raise FieldError(
            "train.checkpoint_every",
            f"{train.checkpoint_every} is not a multiple of sync_every={train.sync_every} "
            "(checkpoints are taken at sync points)",
        )


def _check_eval(cfg: Config) -> None:
    """Something to evaluate, and set names that make file names."""
    train = cfg.train
    if train.eval_every:
        from runtime.config.workload_kinds import workload_kind

        if not workload_kind(cfg.workload.kind).trainer_eval and not cfg.data.eval:
            raise FieldError(
                "train.eval_every",
                f"nothing to evaluate: name held-out sets in data.eval (workload.kind "
                f"{cfg.workload.kind!r} has no eval of its own)",
            )
    if cfg.data.eval and cfg.workload.kind == "arith":
        raise FieldError(
            "data.eval",
            "the arith kind scores its own generated prompts and has its own eval "
            "(eval_reward); a file's sums are played by workload.kind custom "
            "(examples/arith_retry)",
        )
    for name in cfg.data.eval:
        if not name or not all(ch.isalnum() or ch in "_-." for ch in name):
            raise FieldError(
                f"data.eval.{name}", "a set's name is letters, digits, '_', '-' or '.'"
            )


def _check_trainer(cfg: Config) -> None:
    """What the trainer can do: LoRA, the mismatch corrections, its strategy and dtype."""
    res, train = cfg.resources, cfg.train
    if cfg.model.lora.enabled and cfg.engine.trainer != "torch":
        raise FieldError(
            "model.lora.rank",
            f"LoRA trains with engine.trainer: torch (this recipe: {cfg.engine.trainer}); "
            "set rank: 0 or that trainer",
        )
    alg = cfg.algorithm
    for name in ("tis_cap", "mismatch_mask"):
        if getattr(alg, name) is not None and not alg.recompute_old_logprobs:
            raise FieldError(
                f"algorithm.{name}",
                "needs algorithm.recompute_old_logprobs: true (without the trainer's own "
                "log-probs there is no rollout mismatch to correct)",
            )
    if alg.router_aux_loss_coef > 0:
        _check_router_aux_loss(cfg)
    if alg.routing_replay != "disabled":
        _check_routing_replay(cfg)
    if alg.freeze_router:
        _check_frozen_router(cfg)
    if train.strategy is None:
        from runtime.embedded.resolve import is_tiny_embedded

        train.strategy = "replicate" if is_tiny_embedded(cfg.model.path) else "fsdp2"
    if train.param_dtype is None and res.device != "auto":
        # with device auto each trainer rank decides by the device it gets
        train.param_dtype = "bfloat16" if res.device == "cuda" else "float32"


def _check_router_aux_loss(cfg: Config) -> None:
    """A router's loss needs a router: a mixture of experts trained by the torch trainer
    (a model whose shape is unknown here is checked when the trainer loads it)."""
    from runtime.config.architectures import ArchitectureError, model_shape

    field = "algorithm.router_aux_loss_coef"
    if cfg.engine.trainer != "torch":
        raise FieldError(field, f"needs engine.trainer: torch (this recipe: {cfg.engine.trainer})")
    try:
        shape = model_shape(cfg.model.path)
    except ArchitectureError:
        return
    if not shape.is_moe:
        raise FieldError(field, f"{cfg.model.path} is a dense model: it has no router; set 0")


def _check_frozen_router(cfg: Config) -> None:
    """Routers to freeze, trained otherwise: a mixture of experts under the torch trainer,
    fully fine-tuned (LoRA keeps them as loaded already), with no loss that trains only
    them."""
    from runtime.config.architectures import ArchitectureError, model_shape

    field = "algorithm.freeze_router"
    if cfg.engine.trainer != "torch":
        raise FieldError(field, f"needs engine.trainer: torch (this recipe: {cfg.engine.trainer})")
    if cfg.model.lora.enabled:
        raise FieldError(field, "LoRA keeps the routers as loaded already; set false")
    if cfg.algorithm.router_aux_loss_coef > 0:
        raise FieldError(
            field,
            "algorithm.router_aux_loss_coef trains the routers only, and would train nothing; "
            "set one of them off",
        )
    try:
        shape = model_shape(cfg.model.path)
    except ArchitectureError:
        return  # checked when the trainer loads the model
    if not shape.is_moe:
        raise FieldError(field, f"{cfg.model.path} is a dense model: it has no router; set false")


def _check_routing_replay(cfg: Config) -> None:
    """Routing replay needs a mixture of experts trained by the torch trainer, and a route
    source: on the CPU the rollout side's probe of the policy it serves
    (runtime/engines/vllm/route_probe.py); vLLM's own routed-experts capture, the source a
    GPU run would use, needs its model runner V2 and is not wired (docs/moe.md)."""
    field = "algorithm.routing_replay"
    if cfg.engine.trainer != "torch" or cfg.engine.rollout != "vllm":
        raise FieldError(field, "needs engine.trainer: torch and engine.rollout: vllm")
    if replay_route_shape(cfg) is None:
        raise FieldError(field, f"{cfg.model.path} is not a known mixture of experts; set disabled")
    if cfg.resources.device != "cpu":
        raise FieldError(
            field,
            "takes its routes from a CPU probe of the served policy; on GPUs vLLM's "
            "routed-experts capture is not wired yet (docs/moe.md): set disabled or device: cpu",
        )


def replay_route_shape(cfg: Config) -> tuple[int, int, int] | None:
    """The routes a sample of this run carries, (MoE layers, top_k, experts), for rank 0's
    check (runtime/control/sample_check.py); None: it carries none (routing replay off, or
    a model that is not a known mixture of experts)."""
    from runtime.config.architectures import ArchitectureError, model_shape

    if cfg.algorithm.routing_replay == "disabled":
        return None
    try:
        shape = model_shape(cfg.model.path)
    except ArchitectureError:
        return None
    return (shape.layers, shape.experts_per_token, shape.experts) if shape.is_moe else None


def _check_data_and_engines(cfg: Config) -> None:
    """Room for the prompt, the prompt sources, and engines by their registered names."""
    if cfg.workload.max_response_tokens >= cfg.model.max_seq_len:
        raise FieldError(
            "workload.max_response_tokens",
            f"{cfg.workload.max_response_tokens} leaves no room for the prompt within "
            f"model.max_seq_len={cfg.model.max_seq_len}",
        )
    from runtime.config.engine_names import PROMPT_SOURCES, ROLLOUT_ENGINES, TRAINER_ENGINES

    if cfg.data.embedded and cfg.data.train not in PROMPT_SOURCES:
        raise FieldError(
            "data.train",
            f"{cfg.data.train!r} is not one of: {', '.join(sorted(PROMPT_SOURCES))} "
            "(or a file path)",
        )
    if isinstance(cfg.data.train, list):
        for i, f in enumerate(cfg.data.train):
            if not f.path or f.path.startswith("embedded:"):
                raise FieldError(
                    f"data.train[{i}].path",
                    "a file or dataset folder is required (embedded sources are not mixed)",
                )

    for key, registry in (("rollout", ROLLOUT_ENGINES), ("trainer", TRAINER_ENGINES)):
        name = getattr(cfg.engine, key)
        if name not in registry:
            raise FieldError(
                f"engine.{key}", f"{name!r} is not one of: {', '.join(sorted(registry))}"
            )


def _check_control(cfg: Config) -> None:
    """Timeouts that can be told apart, and concurrency bounds in order."""
    ctl = cfg.control
    if ctl.peer_timeout_s is not None and ctl.peer_timeout_s >= ctl.heartbeat_timeout_s:
        raise FieldError(
            "control.peer_timeout_s",
            f"{ctl.peer_timeout_s} must be below heartbeat_timeout_s={ctl.heartbeat_timeout_s} "
            "(the leader waiting on a hung receiver would be declared dead first)",
        )
    if cfg.scheduler.min_concurrency > cfg.scheduler.max_concurrency:
        raise FieldError(
            "scheduler.min_concurrency",
            f"{cfg.scheduler.min_concurrency} exceeds max_concurrency="
            f"{cfg.scheduler.max_concurrency}",
        )
    if cfg.control.heartbeat_timeout_s <= 2 * cfg.control.heartbeat_interval_s:
        raise FieldError(
            "control.heartbeat_timeout_s",
            f"{cfg.control.heartbeat_timeout_s} must exceed twice heartbeat_interval_s="
            f"{cfg.control.heartbeat_interval_s}",
        )


def _check_logging_and_name(cfg: Config) -> None:
    """Metrics backends with their packages, and a run name fit for a folder."""
    for switch, package in missing_packages(cfg):
        raise FieldError(
            f"logging.{switch}", f"true needs the {package!r} package (pip install {package})"
        )
    if not cfg.name or any(c in cfg.name for c in "/\\ ") or cfg.name.startswith("."):
        raise FieldError("name", f"{cfg.name!r} must be a non-empty name without spaces or /")


def _size_sandbox(cfg: Config) -> None:
    """The reward pool's concurrency and the node's uid pool, where the recipe leaves them
    to be derived: every conversation of every engine on a node may be in the sandbox at
    once, a grading holding up to max(2, parallel) processes (its program and tests, or
    ``parallel`` test cases)."""
    sb = cfg.sandbox
    concurrency, uid_slots = sandbox_sizes(cfg, sb.concurrency)
    sb.concurrency = concurrency if sb.concurrency is None else sb.concurrency
    sb.uid_slots = uid_slots if sb.uid_slots is None else sb.uid_slots
    last = sb.uid_base + sb.uid_slots - 1
    if last >= 2**31:  # tools that keep uids in a signed int misread those above
        raise FieldError(
            "sandbox.uid_slots",
            f"{sb.uid_slots} uids from uid_base={sb.uid_base} pass 2147483647 (last {last})",
        )


def sandbox_sizes(cfg: Config, concurrency: int | None) -> tuple[int, int]:
    """What ``sandbox.concurrency`` and ``uid_slots`` derive to (the pool from ``concurrency``)."""
    res = cfg.resources
    derived = cfg.scheduler.max_concurrency
    engines = res.gpus_per_node // res.rollout_gpus_per_replica
    uid_slots = engines * (concurrency or derived) * max(2, cfg.sandbox.parallel)
    return derived, uid_slots


# logging.<switch> -> the package its backend needs (runtime/store/metrics_sinks.py
# BACKENDS opens them; a switch on without its package is a recipe error, not a crash)
METRIC_PACKAGES: dict[str, str] = {"tensorboard": "tensorboard", "wandb": "wandb"}


def missing_packages(cfg: Config) -> list[tuple[str, str]]:
    """(switch, package) for each ``logging.<switch>`` that is on without its package."""
    import importlib.util

    return [
        (switch, package)
        for switch, package in METRIC_PACKAGES.items()
        if getattr(cfg.logging, switch) and importlib.util.find_spec(package) is None
    ]
