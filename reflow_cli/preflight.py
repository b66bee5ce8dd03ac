"""What a launch refuses before anything starts, in one place: ``reflow launch`` runs it
before submitting, ``launch --dry-run`` after printing the plan (a dry run is what users
run on a login node to check a recipe, so it refuses exactly what the launch would), and
``reflow plan`` runs its memory check.

Each check raises :class:`jobs.errors.UserError` with one line naming the field or file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from jobs.errors import UserError
from reflow_cli import plan as memory
from runtime.config.schema import Config
from runtime.control.samplers import PluginError, make_replay_filter, make_sampler
from runtime.data.datasets import DatasetError, check_dataset
from runtime.workloads.agents import environment
from runtime.workloads.rewards import custom as custom_reward
from runtime.workloads.rewards.code.spec import record_check
from runtime.workloads.sandbox import SandboxError, check_sandbox
from runtime.workloads.user_code import UserCodeError


@dataclass(frozen=True)
class Where:
    """What the checks need to know of the launch besides the config."""

    source: str  # the recipe, as the user named it (the memory refusal names it)
    backend: str  # "local" or "slurm"
    gpu_memory_gib: float | None = None  # --gpu-memory-gib
    memory_check: bool = True  # False: --no-memory-check


def check_memory(cfg: Config, where: Where) -> None:
    """A GPU run whose memory plan does not fit (reflow_cli/plan.py ``check_fits``)."""
    if where.memory_check:
        memory.check_fits(cfg, where.source, where.backend, where.gpu_memory_gib)


def check_data(cfg: Config, where: Where) -> None:
    """``data.train`` and every ``data.eval`` set: files, fields, the prompt template, and
    the code kinds' test formats."""
    check_dataset(cfg, record_check(cfg.workload.kind))


def check_isolation(cfg: Config, where: Where) -> None:
    """The sandbox a code workload grades in can be set up on this machine."""
    check_sandbox(cfg)


def check_reward(cfg: Config, where: Where) -> None:
    """``workload.reward_fn`` loads and is a function (its path made absolute)."""
    if cfg.workload.reward_fn is not None:
        cfg.workload.reward_fn = custom_reward.check(cfg.workload.reward_fn)


def check_environment(cfg: Config, where: Where) -> None:
    """``workload.agent``: an environment class goes with kind custom, and loads (its path
    made absolute)."""
    if (cfg.workload.kind == "custom") != (cfg.workload.agent is not None):
        raise UserError(
            "workload.agent: an environment class goes with workload.kind custom, and "
            "kind custom needs one"
        )
    if cfg.workload.agent is not None:
        cfg.workload.agent = environment.check(cfg.workload.agent)


def check_plugins(cfg: Config, where: Where) -> None:
    """``reflow.sampler`` and ``reflow.replay_filter`` name a registered class or one of
    the user's that imports and has the methods (else rank 0 fails at its start)."""
    for field, make in (("sampler", make_sampler), ("replay_filter", make_replay_filter)):
        try:
            make(getattr(cfg.reflow, field))
        except PluginError as exc:
            raise UserError(f"reflow.{field}: {exc}") from None


def check_lending(cfg: Config, where: Where) -> None:
    """``scheduler.lend_trainer``: a lent rank drives an engine of its own, so a lend
    cannot make tensor-parallel replicas of the trainer's ranks (not built; the simulator
    models them)."""
    tp = cfg.resources.rollout_gpus_per_replica
    if cfg.scheduler.lend_trainer and tp > 1:
        raise UserError(
            f"scheduler.lend_trainer: a lent trainer rank drives a one-GPU engine; with "
            f"resources.rollout_gpus_per_replica {tp} it would have to join a "
            "tensor-parallel replica, which lends do not build"
        )


Check = Callable[[Config, Where], None]

# in the order a launch runs them: the cheap memory arithmetic first, then what reads files
LAUNCH_CHECKS: tuple[Check, ...] = (
    check_memory,
    check_data,
    check_isolation,
    check_reward,
    check_environment,
    check_plugins,
    check_lending,
)


def preflight(cfg: Config, where: Where, checks: tuple[Check, ...] = LAUNCH_CHECKS) -> Config:
    """Run ``checks`` on ``cfg`` (a launch's: all of them); the first refusal raises
    :class:`UserError`. Returns ``cfg``, its user-code paths made absolute."""
    try:
        for check in checks:
            check(cfg, where)
    except (DatasetError, SandboxError, UserCodeError) as exc:
        raise UserError(str(exc)) from None
    return cfg
